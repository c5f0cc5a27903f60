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
    assert [(r.benchmark, r.verdict, r.value) for r in rows] == [(n, b["verdict"], b["value"]) for n, b in expected]
    assert len(lines) == 2 and all("NVIDIA H200" in line and "python -m workbench bench" in line for line in lines)


def test_the_readme_table_is_the_commands_output():
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- workbench results --markdown: begin -->\n(.*?)\n<!-- workbench results --markdown: end -->",
                  readme, re.S)
    assert m, "README.md has no block between the 'workbench results --markdown' markers"
    assert m.group(1) == results.format_markdown(results.committed_bars()[0]), (
        "README's results table differs from the committed JSON: paste `workbench results --markdown` between the markers")


def _decode_payload(t1_us: float, tq_us: float, tflops: float, matmul: float = 1000.0) -> dict:
    pts = [(16, 1, 16, 4096, t1_us, 50.0), (16, 8, 16, 4096, tq_us, tflops)]
    return {"ceilings": {"matmul_bf16": {"tflops": matmul}, "copy": {"gb_s": 4000.0}},
            "results": [dict(heads=h, qlen=q, batch=b, context=l, triton_us=t, tflops=f) for h, q, b, l, t, f in pts]}


def test_qlen_bar_needs_is_the_flops_over_the_allowed_time():
    data = _decode_payload(t1_us=20.0, tq_us=40.0, tflops=333.0)
    (n,) = results.qlen_bar_needs(data, qlen=8, pairs=[(16, 4096)])
    flops = 16 * 2.0 * 16 * 8 * 4096 * (576 + 512)  # B * 2 * H * qlen * L * (576 + 512)
    assert n["allowed_us"] == pytest.approx(25.0)
    assert n["needs_tflops"] == pytest.approx(flops / 25e-6 / 1e12)
    assert n["of_matmul"] == pytest.approx(n["needs_tflops"] / 1000.0)
    assert n["measured_tflops"] == 333.0 and n["qlen1_us"] == 20.0


def test_qlen_bar_needs_on_the_committed_run_matches_chapter_3s_claim():
    """Two qlen-8 points need more than the matmul rate measured in the same run (the README's 'why')."""
    needs = results.qlen_bar_needs(_committed("decode"), qlen=8)
    over = sorted(round(n["of_matmul"], 2) for n in needs if n["of_matmul"] > 1)
    assert [(n["batch"], n["context"]) for n in needs if n["of_matmul"] > 1] == [(64, 32768), (128, 8192)]
    assert over == [1.05, 1.06]


def test_a_missed_ratio_bar_says_what_it_needs():
    rows, _ = results.committed_bars()
    missed = [r for r in rows if r.benchmark == "decode" and r.verdict == "MISS"]
    assert missed and all("of the bf16 matmul measured in the same run" in r.note for r in missed)
    expand_missed = [r for r in rows if r.benchmark == "expand" and r.verdict == "MISS"]
    assert all("fill_ of the output bytes" in r.note for r in expand_missed)


def test_a_missing_benchmark_is_reported_not_invented(tmp_path):
    (tmp_path / "bench_expand_h200.json").write_text((perfmodel.DATA_DIR / "bench_expand_h200.json").read_text())
    rows, lines = results.committed_bars(data_dir=tmp_path)
    assert {r.benchmark for r in rows} == {"expand"}
    assert "bench_decode_h200.json is not committed" in lines[1]


def test_an_unknown_decode_bar_is_an_error(tmp_path):
    payload = _committed("decode")
    payload["bars"] = [dict(payload["bars"][0], name="16 heads qlen 3 B=1 L=1k: something new")]
    (tmp_path / "bench_decode_h200.json").write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="not one of bench.decode.BARS"):
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
