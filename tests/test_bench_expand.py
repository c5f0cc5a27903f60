"""benchmarks/expand.py, the expansion's one benchmark: its case list, byte formula, bars, the schema of the
committed H200 result, the tuner's bookkeeping and its command line. Nothing here times anything on the CPU
(benchmarks are not tests); the two GPU tests run the benchmark and the tuner once, small, and check what they
write."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import expand as E
from workbench.expand import policy as P

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("benchmarks_expand", ROOT / "benchmarks" / "expand.py")
B = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # registered first: its dataclasses need it
_spec.loader.exec_module(B)

COMMITTED = json.loads((Path(P.__file__).resolve().parents[1] / "data" / "bench_expand_h200.json").read_text())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    B.add_arguments(parser)
    return parser


def test_cases_hold_the_bars_cases():
    assert {bar.case for bar in B.BARS} == {(512, 131_072), (1, 97_000), (256, 4_096)}
    assert {bar.case for bar in B.BARS} <= set(B.CASES) and len(set(B.CASES)) == len(B.CASES)


def test_byte_formula():
    # 4 bytes per block-table entry read (ceil) + 4 bytes per token written.
    assert B.expand_bytes([0, 1, 16, 17], 16) == 4 * (0 + 1 + 1 + 2) + 4 * (0 + 1 + 16 + 17)
    assert B.expand_bytes([131_072] * 512, 16) == 512 * 4 * (131_072 // 16 + 131_072)  # 285 MB
    assert B.expand_bytes([], 16) == 0


def test_bars_from_a_payload():
    cases = [
        {"num_reqs": 512, "seq_len": 131_072, "K": 16, "kernel_frac_copy": 0.93},
        {"num_reqs": 1, "seq_len": 97_000, "K": 16, "kernel_us": 2.5, "speedup_vs_serial": 12.0},
        {"num_reqs": 256, "seq_len": 4_096, "K": 16, "kernel_us": 1.9},
        {"num_reqs": 256, "seq_len": 4_096, "K": 64, "kernel_us": 9.9},  # another K: no bar reads it
    ]
    verdicts = {b["name"]: b["verdict"] for b in B.check_bars(cases)}
    assert verdicts == {
        "bandwidth at 512 x 128k": "PASS", "latency at 1 x 97k": "MISS",
        "latency at 256 x 4k": "PASS", "speed-up over serial at 1 x 97k": "PASS",
    }
    assert B.check_bars(cases[2:]) == [b for b in B.check_bars(cases) if b["case"] == (256, 4_096)]


def test_committed_result_has_the_schema_the_benchmark_writes():
    assert {"benchmark", "provenance", "byte_formula", "timing", "copy", "copy_runs", "fill", "launch_floor_us",
            "launch_floor_device_us", "cases", "bars", "notes"} == set(COMMITTED)
    assert COMMITTED["benchmark"] == "expand" and COMMITTED["provenance"]["device"] == "NVIDIA H200"
    assert {(c["num_reqs"], c["seq_len"]) for c in COMMITTED["cases"]} == set(B.CASES)
    fields = {f.name for f in dataclasses.fields(E.ExpandConfig)}
    for c in COMMITTED["cases"]:
        assert set(B.CASE_KEYS) <= set(c), set(B.CASE_KEYS) - set(c)
        assert c["bytes"] == B.expand_bytes([c["seq_len"]] * c["num_reqs"], c["K"])  # the formula stated up front
        assert all(v for k, v in c.items() if k.startswith("agree")), c  # every output was checked and agreed
        # the measured launch is the one the rule picks now, and loads as an ExpandConfig
        assert set(c["config"]) == fields and E.ExpandConfig(**c["config"]) == E.expand_config(c["num_reqs"],
                                                                                                c["seq_len"])
        if "loose_bound_config" in c:
            assert E.ExpandConfig(**c["loose_bound_config"]) == E.expand_config(
                c["num_reqs"], c["loose_bound"], loose_bound=True)
    assert [(b["name"], b["value"], b["verdict"]) for b in COMMITTED["bars"]] == [
        (b["name"], b["value"], b["verdict"]) for b in B.check_bars(COMMITTED["cases"])]
    table = B.format_table(COMMITTED)
    assert "latency at 256 x 4k" in table and "MISS" in table and "store only" in table


def test_every_threshold_has_a_knob_with_valid_candidates(tmp_path):
    assert [k.name for k in B.TUNE] and {k.name for k in B.TUNE} == set(P.TUNED_THRESHOLDS)
    current = P.load_tuned()
    for knob in B.TUNE:
        assert current[knob.name] in knob.candidates and knob.cases, knob.name
        for value in knob.candidates:  # each candidate makes a table the library accepts
            table = json.loads(P.TUNED_TABLE.read_text())
            table["thresholds"][knob.name] = value
            (tmp_path / "t.json").write_text(json.dumps(table))
            assert P.load_tuned(tmp_path / "t.json")[knob.name] == value


def test_thresholds_are_set_for_the_block_and_restored():
    with B.thresholds({"few_reqs": 7, "group_programs": 3}):
        assert (P.FEW_REQS, P.GROUP_PROGRAMS) == (7, 3) and E.expand_config(8, 4096).num_warps == 1
    assert (P.FEW_REQS, P.GROUP_PROGRAMS) == (64, 512) and E.expand_config(8, 4096).num_warps == 4
    with pytest.raises(KeyError), B.thresholds({"few_reqs": 7}):
        raise KeyError("inside")
    assert P.FEW_REQS == 64


def test_format_tune():
    table = {"device": "NVIDIA H200", "date_utc": "2026-12-01T00:00:00+00:00",
             "tune": {"few_reqs": {"chosen": 64, "relative_time": {"32": 1.05, "64": 1.0}}}}
    assert "few_reqs" in B.format_tune(table) and "64* 1.000" in B.format_tune(table)


def test_command_line_flags():
    args = _parser().parse_args(["--case", "256x4096", "--case", "1X97000", "--no-dense"])
    assert args.case == [(256, 4096), (1, 97_000)] and args.no_dense and not args.tune and args.out is None
    args = _parser().parse_args(["--tune", "--margin", "0.05", "--knob", "few_reqs", "--knob", "prefix_block"])
    assert args.tune and args.margin == 0.05 and args.knob == ["few_reqs", "prefix_block"]


@pytest.mark.parametrize("case, match", [("1y100", "--case must look like 256x4096"),
                                         ("0x100", "requests and tokens must both be >= 1")])
def test_bad_case_is_a_usage_error(capsys, case, match):
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["--case", case])
    assert exc.value.code == 2 and match in capsys.readouterr().err


@pytest.mark.interpreter
def test_main_without_gpu_says_why(capsys):
    assert B.main(_parser().parse_args(["--case", "1x100", "--out", "/dev/null"])) == 2
    assert "need a CUDA or ROCm GPU" in capsys.readouterr().err
    assert B.main(_parser().parse_args(["--tune", "--out", "/dev/null"])) == 2


def test_script_help_runs_without_a_gpu():
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "expand.py"), "--help"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "--tune" in res.stdout and "--case" in res.stdout


@pytest.mark.gpu
def test_gpu_benchmark_writes_the_schema(tmp_path):
    payload = B.run(((1, 4_096), (256, 1_000)), dense=False, out=str(tmp_path / "b.json"))
    assert json.loads((tmp_path / "b.json").read_text())["cases"] == json.loads(json.dumps(payload["cases"]))
    for c in payload["cases"]:
        assert set(B.CASE_KEYS) <= set(c) and c["store_only_us"] > 0 and c["agree_loose_bound"]
        assert all(v for k, v in c.items() if k.startswith("agree")), c


@pytest.mark.gpu
def test_gpu_tune_writes_a_table_the_library_reads(tmp_path):
    table = B.tune((B.Knob("few_reqs", (32, 64), ((32, 4_096), (64, 2_048))),))
    assert set(table["tune"]) == {"few_reqs"} and table["thresholds"]["few_reqs"] in (32, 64)
    (tmp_path / "t.json").write_text(json.dumps(table))
    assert P.load_tuned(tmp_path / "t.json") == table["thresholds"]
    assert P.FEW_REQS == 64  # restored after tuning
