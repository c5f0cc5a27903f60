"""Two changes to when the warp-specialised gluon kernel's data arrive (round 39), each alone and together, against
the committed hand-over schedule and the plain 64-row gluon kernel:

* ``ws_idx_ahead``: the loader warpgroup loads tile t+1's indices right after issuing tile t's copies, so their
  latency overlaps the wait for the next free buffer (round 38c measured it faster with one 64-row block per
  request and slower at 128 heads, on a throwaway patch);
* ``ws_early_q``: the query tile's copies are not waited for before the partitions start; they arrive on an
  mbarrier the consumer warpgroups wait on, so the loader's first index loads and gathers overlap them. A program
  of 512 tokens has 16 tiles: its start is a visible share of its time.

Points: 16 heads qlen 3/4 (one row block per request) over batch 1-128 and context 1k/4k, the large qlen-4
points, and points of two row blocks per request (16 heads qlen 8, 128 heads); each at the split count the plain
kernel gets (the rule's, which the ws kernel shares); the library's qlen-1 call at B=16 L=4k for the qlen-4 ratio.
Three interleaved rounds under CUDA-graph replay, bf16; ``identical``: ``ho`` and ``wia_weq`` bit for bit.
``focus`` (third argument): only the qlen-4 points of the benchmark's bars (B=16 L=4k, B=64 L=4k, B=64 L=32k,
B=128 L=8k) and the qlen-1 reference, on the plain kernel, the committed loader and ``ws_idx_ahead``. ``multi``:
two or more row blocks per request (16 heads qlen 6 and 8, 128 heads qlen 1) over batch 1-128 and context 1k-8k,
on the committed loader and ``ws_idx_ahead`` (where round 39's first run found ``ws_idx_ahead`` faster with short
programs and slower with long ones).
Run on an H200: PYTHONPATH=src python3 scripts/decode_ws_loader_probe.py [OUT.json] [rounds] [focus|multi]
"""
import dataclasses
import sys

from workbench import mla
from workbench.bench import decode as d

HO = mla.GLUON_WS_CONFIG
ONE_BLOCK = tuple((16, q, b, l) for q in (3, 4) for b in (1, 4, 16, 32, 64, 128) for l in (1024, 4096))
POINTS = ((16, 1, 16, 4096), *ONE_BLOCK, (16, 4, 64, 32768), (16, 4, 128, 8192), (16, 8, 16, 4096),
          (16, 8, 64, 4096), (128, 1, 16, 4096), (128, 1, 64, 4096), (128, 1, 16, 1024))


FOCUS = ((16, 1, 16, 4096), (16, 4, 16, 4096), (16, 4, 64, 4096), (16, 4, 64, 32768), (16, 4, 128, 8192))
MULTI = tuple((h, q, b, l) for h, q in ((16, 6), (16, 8), (128, 1)) for b in (1, 4, 16, 32, 64, 128)
              for l in (1024, 4096, 8192) if b * l <= 128 * 4096)


def variants(cfg: mla.TritonConfig, mode: str = "") -> list[tuple[str, mla.TritonConfig]]:
    if cfg.gluon_swap or not cfg.gluon:  # the qlen-1 reference: the library's own call
        return [("default", cfg)]
    wia = ("wia", dataclasses.replace(HO, ws_idx_ahead=True))
    if mode == "multi":
        return [("ho", HO), wia]
    both = [("gluon", cfg), ("ho", HO), wia]
    return both if mode == "focus" else both + [("weq", dataclasses.replace(HO, ws_early_q=True)),
                                                ("wia_weq", dataclasses.replace(HO, ws_idx_ahead=True,
                                                                                ws_early_q=True))]


def base(rows: int, tokens: int, batch: int, sm: int) -> mla.TritonConfig:
    return d.library_config(rows, tokens, batch, sm) if rows <= 32 else mla.GLUON_CONFIG


if __name__ == "__main__":
    out = (sys.argv[1:] or [None])[0]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    mode = (sys.argv[3:4] or [""])[0]
    d.variant_probe({"focus": FOCUS, "multi": MULTI}.get(mode, POINTS), lambda cfg: variants(cfg, mode),
                    "mla_decode_ws_loader_probe",
                    " ".join(["PYTHONPATH=src python3 scripts/decode_ws_loader_probe.py OUT.json", *sys.argv[2:]]),
                    out, rounds=rounds, same=("ho", "wia" if mode else "wia_weq"), base_config=base)
