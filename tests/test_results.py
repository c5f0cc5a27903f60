"""``workbench results``: the committed H200 bars in one table (``workbench.bench.results``), and the README's copy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from workbench import cli, perfmodel
from workbench.bench import results

ROOT = Path(__file__).resolve().parents[1]


def _committed(name: str) -> dict:
    return json.loads((perfmodel.DATA_DIR / f"bench_{name}_h200.json").read_text())


def test_every_committed_bar_is_a_row_with_the_json_verdict_and_value():
    rows, lines = results.committed_bars()
    expected = [("expand", b) for b in _committed("expand")["bars"]] + [("decode", b) for b in _committed("decode")["bars"]]
    assert [(r.benchmark, r.verdict) for r in rows] == [(n, b["verdict"]) for n, b in expected]
    assert all(r.value == b["value"] or (b["value"] is None and r.value != r.value) for r, (_, b) in zip(rows, expected))
    assert len(lines) == 2 and all("NVIDIA H200" in line and "made by `" in line for line in lines)
    assert "bench expand" in lines[0] and "benchmarks/decode.py --peer-path" in lines[1]


def test_the_readme_table_is_the_commands_output():
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- workbench results --markdown: begin -->\n(.*?)\n<!-- workbench results --markdown: end -->",
                  readme, re.S)
    assert m, "README.md has no block between the 'workbench results --markdown' markers"
    assert m.group(1) == results.format_markdown(results.committed_bars()[0]), (
        "README's results table differs from the committed JSON: paste `workbench results --markdown` between the markers")


def test_a_missed_bar_says_how_far_off_from_the_same_run():
    rows, _ = results.committed_bars()
    peer_missed = [r for r in rows if r.benchmark == "decode" and r.verdict == "MISS" and "FlashMLA" in r.bar]
    assert peer_missed and all("FlashMLA" in r.note and "repeats" in r.note for r in peer_missed)
    decode = _committed("decode")
    for r in (r for r in rows if r.benchmark == "decode" and "FlashMLA" in r.bar):
        point = next(p for p in decode["results"] if r.bar.startswith(p["key"] + ":"))
        bar = next(b for b in decode["bars"] if b["name"] == r.bar)
        digits = 3 if round(point["ratio"], 2) == bar["target"] else 2  # a near miss is not shown as the target
        assert f"{point['ratio']:.{digits}f}x ({point['workbench_us']:.1f} against {point['flashmla_us']:.1f} us)" \
            == r.measured
        if r.verdict == "MISS":  # memory-bound points are measured by their stream, compute-bound ones by FLOP/s
            memory_bound = point["heads"] * point["qlen"] <= 32
            assert ("TB/s of KV" in r.note and "copy" in r.note) if memory_bound else ("matmul" in r.note), r.note


def test_a_scattered_near_miss_shows_three_decimals_and_its_repeats(tmp_path):
    """A scattered-layout ratio that rounds to its bar (1.0502 against 1.05) is shown as 1.050x, not 1.05x, and a
    miss lists the spread of its per-repeat ratios (scattered / paged, each repeat's own pair)."""
    payload = _committed("decode")
    bar = next(b for b in payload["bars"] if b["kind"] == "scattered_ratio")
    point = next(p for p in payload["results"] if p["key"] == bar["point"])
    point["repeats"] = [dict(t, scattered=t["workbench"] * f) for t, f in zip(point["repeats"], (1.04, 1.0502, 1.06))]
    point["repeats"] = point["repeats"][:3]
    bar.update(value=1.0502, verdict="MISS")
    (tmp_path / "bench_decode_h200.json").write_text(json.dumps(payload))
    row = next(r for r in results.committed_bars(data_dir=tmp_path)[0] if r.bar == bar["name"])
    assert row.measured.startswith("1.050x (") and row.note == "3 repeats, 1.040-1.060", row
    bar.update(value=1.03, verdict="PASS")
    (tmp_path / "bench_decode_h200.json").write_text(json.dumps(payload))
    row = next(r for r in results.committed_bars(data_dir=tmp_path)[0] if r.bar == bar["name"])
    assert row.measured.startswith("1.03x (") and row.note == "", row


def test_a_missing_benchmark_is_reported_not_invented(tmp_path):
    (tmp_path / "bench_expand_h200.json").write_text((perfmodel.DATA_DIR / "bench_expand_h200.json").read_text())
    rows, lines = results.committed_bars(data_dir=tmp_path)
    assert {r.benchmark for r in rows} == {"expand"}
    assert "bench_decode_h200.json is not committed" in lines[1]


def test_an_unknown_decode_bar_is_an_error(tmp_path):
    payload = _committed("decode")
    payload["bars"] = [dict(payload["bars"][0], kind="something_new")]
    (tmp_path / "bench_decode_h200.json").write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="has kind 'something_new', which this table does not know"):
        results.committed_bars(data_dir=tmp_path)


@pytest.mark.parametrize("device", ["../h200", "H200", "", "h200/x"])
def test_a_device_that_is_not_a_plain_name_is_refused(device):
    with pytest.raises(ValueError, match="device="):
        results.committed_bars(device)


def test_cli_results_json_and_exit_codes(capsys):
    assert cli.main(["results", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["bars"]) == len(_committed("expand")["bars"]) + len(_committed("decode")["bars"])
    assert cli.main(["results", "--device", "b200"]) == 2
    assert "no committed results for --device 'b200'" in capsys.readouterr().err
    assert cli.main(["results"]) == 0
    text = capsys.readouterr().out
    passed = sum(b["verdict"] == "PASS" for n in ("expand", "decode") for b in _committed(n)["bars"])
    assert f"{passed} of {len(out['bars'])} bars pass" in text
