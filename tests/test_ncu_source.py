"""``workbench.bench.ncu_source``: Nsight Compute's source page summed by warp-specialised partition, on a small
hand-written CSV in the tool's format (ncu itself needs a GPU)."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.bench import ncu_source

ROOT = Path(__file__).resolve().parents[1]
HEAD = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
        "Instructions Executed", "stall_long_sb", "stall_wait", "stall_barrier", "stall_long_sb (Not Issued)"]
# (sass, samples, executed, long_sb, wait, barrier): a prologue, a consumer partition, a loader partition
PROGRAM = [
    ("LDC R1, c[0x0][0x28]", 1, 10, 0, 1, 0),
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8", 0, 10, 0, 0, 0),
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ+-0x20], R12", 2, 40, 2, 0, 0),
    ("IADD3 R5, R4, -0x10000, RZ", 1, 40, 0, 1, 0),
    ("@!P0  BRA 0x7f00000013a0", 10, 40, 10, 0, 0),
    ("HGMMA.64x32x16.F32.BF16 R152, gdesc[UR56], R152", 6, 40, 0, 6, 0),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 20, 40, 0, 0, 20),
    ("@!P1  BRA 0x7f0000001500", 3, 40, 0, 3, 0),
    ("BAR.ARV 0xb, 0x100", 2, 40, 0, 0, 2),
    ("FMUL R8, R8, R9", 6, 400, 0, 6, 0),
    ("USETMAXREG.DEALLOC.CTAPOOL 0x28", 0, 10, 0, 0, 0),
    ("LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64]", 4, 80, 4, 0, 0),
    ("SHF.R.S32.HI R20, RZ, 0x1f, R19", 30, 80, 30, 0, 0),
]


def _csv(tmp_path: Path, program=PROGRAM) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(["Kernel Name", "mla_decode_gluon_ws_kernel"])
    w.writerow(HEAD)
    for n, (sass, samples, executed, long_sb, wait, barrier) in enumerate(program):
        w.writerow([hex(0x7F0000001000 + 16 * n), f"      {sass}", samples, samples, f"{executed:,}", long_sb, wait,
                    barrier, long_sb])
    path = tmp_path / "sass.csv"
    path.write_text(buf.getvalue())
    return path


def test_rows_carry_their_samples_executions_and_stall_reasons(tmp_path):
    rows = ncu_source.read_source_csv(_csv(tmp_path))
    assert len(rows) == len(PROGRAM) and rows[0]["sass"] == "LDC R1, c[0x0][0x28]"
    assert rows[9] == dict(sass="FMUL R8, R8, R9", samples=6, executed=400,
                           stalls={"long_sb": 0, "wait": 6, "barrier": 0})


def test_partitions_start_at_setmaxnreg_and_keep_their_registers(tmp_path):
    rows = ncu_source.read_source_csv(_csv(tmp_path))
    assert [len(p) for p in ncu_source.partitions(rows)] == [1, 9, 3]
    s = ncu_source.summarize(rows, min_share=0.05)
    assert s["samples"] == 85 and s["executed"] == sum(p[2] for p in PROGRAM)
    consumer, loader = s["partitions"]  # the one-instruction prologue holds under 5 % of the samples
    assert (consumer["registers"], consumer["instructions"], consumer["executed"]) == (232, 9, 690)
    assert loader["registers"] == 40 and loader["share"] == pytest.approx(34 / 85)
    assert consumer["stalls"] == pytest.approx({"barrier": 22 / 50, "wait": 16 / 50, "long_sb": 12 / 50})
    assert consumer["top"][0] == dict(sass="WARPGROUP.DEPBAR.LE gsb0, 0x0", kind="wgmma wait", share=20 / 50,
                                      executed=40, stall="barrier")


def test_each_sample_is_put_to_what_the_warp_waits_on(tmp_path):
    """The try-wait and the branch on its predicate are the mbarrier's polling loop; a branch on another
    predicate is not."""
    consumer = ncu_source.summarize(ncu_source.read_source_csv(_csv(tmp_path)))["partitions"][0]
    assert consumer["kinds"] == pytest.approx({"wgmma wait": 20 / 50, "mbarrier wait": 12 / 50,
                                               "math and other": 10 / 50, "wgmma issue": 6 / 50,
                                               "named barrier": 2 / 50})
    assert ncu_source.instruction_kind("@!P0  BRA 0x10", ["TRYWAIT P1, [R1], R2"]) == "math and other"
    assert ncu_source.instruction_kind("LDSM.16.M88.4 R152, [R229+UR56+0x37000]") == "memory"


def test_samples_without_a_reason_column_are_kept_as_unlisted(tmp_path):
    """The source page lacks a column for some reasons (warpgroup arrive on Hopper): an instruction's samples
    beyond its listed reasons are counted as ``unlisted``, so the reasons still add up to the samples."""
    program = [("WARPGROUP.ARRIVE", 1, 40, 0, 1, 0),
               ("HGMMA.64x32x16.F32.BF16 R152, gdesc[UR40], R152", 12, 40, 0, 2, 0)]
    rows = ncu_source.read_source_csv(_csv(tmp_path, program))
    assert rows[1]["stalls"] == {"long_sb": 0, "wait": 2, "barrier": 0, "unlisted": 10}
    assert "unlisted" not in rows[0]["stalls"]
    part = ncu_source.summarize(rows)["partitions"][0]
    assert part["stalls"] == pytest.approx({"unlisted": 10 / 13, "wait": 3 / 13})
    assert part["top"][0]["stall"] == "unlisted"
    assert "wgmma issue     unlisted     HGMMA" in ncu_source.format_summary(ncu_source.summarize(rows))


def test_a_kernel_without_setmaxnreg_is_one_partition(tmp_path):
    program = [p for p in PROGRAM if "USETMAXREG" not in p[0]]
    s = ncu_source.summarize(ncu_source.read_source_csv(_csv(tmp_path, program)))
    assert len(s["partitions"]) == 1 and s["partitions"][0]["registers"] is None
    assert "whole kernel" in ncu_source.format_summary(s)


def test_the_wrong_file_is_named_with_what_it_lacks(tmp_path):
    bad = tmp_path / "raw.csv"
    bad.write_text('"ID","Kernel Name"\n"0","k"\n')
    with pytest.raises(ValueError, match="no 'Address' header row"):
        ncu_source.read_source_csv(bad)
    bad.write_text('"Address","Source","Instructions Executed"\n"0x1","NOP","1"\n')
    with pytest.raises(ValueError, match="SourceCounters"):
        ncu_source.read_source_csv(bad)
    unsampled = [(sass, 0, ex, 0, 0, 0) for sass, _, ex, *_ in PROGRAM]
    with pytest.raises(ValueError, match="no warp-state samples"):
        ncu_source.summarize(ncu_source.read_source_csv(_csv(tmp_path, unsampled)))


def test_the_script_prints_one_report_per_file(tmp_path):
    path = _csv(tmp_path)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "stall_summary.py"), str(path), "--top", "2"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"== {path}\n85 warp-state samples")
    assert "partition (setmaxnreg 232, 9 SASS instructions): 59% of the samples" in out
    assert "at: wgmma wait 40%, mbarrier wait 24%" in out
