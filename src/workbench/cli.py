"""The ``workbench`` command.

Subcommands (each registered by one ``_add_*`` function below; keep them in the order of the book):

* ``workbench info``            where code runs here (``workbench.device.describe()``)
* ``workbench check``           target + Eagle3 draft: their common kernel block size (``workbench.blocksize``)
* ``workbench catalog``         the backends' declared kernel block sizes, as the docs table
* ``workbench bench NAME``      GPU benchmarks, ``benchmarks/NAME.py`` of a source checkout (JSON with provenance):
  ``bench expand`` (the index expansion), ``bench decode`` (the MLA decode, against FlashMLA with ``--peer-path``),
  ``bench tile_rates`` (the tensor-core rate of the decode tile's two products by tile width)
* ``workbench probe-qlen``      every query length on one decode backend vs the golden (``workbench.qlen``)
* ``workbench results``         the committed H200 bars of both benchmarks (``workbench.bench.results``)

Exit codes: 0 success / compatible, 1 a negative verdict (incompatible, a bar missed), 2 bad usage, 3 an unexpected
error (an allocation that failed, a bug): one line ``workbench <cmd>: unexpected error: <Type>: <message>`` on
stderr, never a traceback, and never the code of a verdict. ``--json`` output is strict JSON (NaN written as null).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any


EXIT_UNEXPECTED = 3  # not 0, 1 or 2: an error that is neither a verdict nor bad usage


def _strict_json(value: Any) -> str:
    from workbench import jsonio

    return jsonio.dumps(value, indent=2)


def _add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="where code runs here: device, Triton mode, aiter and vLLM availability")

    def run(args: argparse.Namespace) -> int:
        from workbench import device

        print(device.describe())
        return 0

    p.set_defaults(func=run)


def _add_check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check", help="can a target backend and an Eagle3 draft backend share their KV-cache group?",
        description="Select the kernel block size of the KV-cache group shared by a target backend and an "
                    "Eagle3 draft backend, with vLLM's rule. Exit 0 compatible, 1 incompatible, 2 bad usage.")
    p.add_argument("--target", required=True, help="target attention backend, e.g. ROCM_AITER_MLA")
    p.add_argument("--draft", required=True, help="draft attention backend, e.g. ROCM_ATTN")
    p.add_argument("--block-size", type=int, default=None, help="manager block size in tokens (default: 16)")
    p.add_argument("--vllm", default="0.20", help="catalog: 0.19 (before PR #39616), 0.20 (after), 0.33 (newer) or installed")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    def run(args: argparse.Namespace) -> int:
        from workbench import blocksize

        report = blocksize.check_spec_decode(args.target, args.draft, args.block_size, args.vllm)
        print(_strict_json(report.to_dict()) if args.json else str(report))
        return 0 if report.compatible else 1

    p.set_defaults(func=run)


def _add_catalog(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("catalog", help="the declared kernel block sizes of every attention backend")
    p.add_argument("--vllm", default="0.20", help="catalog: 0.19, 0.20, 0.33 or installed (default 0.20)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table (like vLLM's docs table)")

    def run(args: argparse.Namespace) -> int:
        from workbench import blocksize

        print(blocksize.catalog_table(args.vllm, markdown=args.markdown))
        if args.vllm.strip().lower() == "installed":
            reading = blocksize.read_installed_backends()
            print(f"\n{reading.reason}")
            for name, why in sorted(reading.failures.items()):
                print(f"  not read: {name}: {why}")
        return 0

    p.set_defaults(func=run)


# benchmarks/<name>.py of a source checkout: add_arguments(parser), main(args)
BENCHMARKS = ("expand", "decode", "tile_rates")


def benchmarks_dir() -> Path:
    """The ``benchmarks/`` folder: ``$WORKBENCH_BENCHMARKS``, else the one beside ``src/`` in a source checkout
    (the benchmarks are not part of the wheel)."""
    import workbench

    env = os.environ.get("WORKBENCH_BENCHMARKS")
    return Path(env) if env else Path(workbench.__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module, or a ValueError saying where it was looked for."""
    path = benchmarks_dir() / f"{name}.py"
    if not path.exists():
        raise ValueError(f"benchmark {name!r}: {path} does not exist; the benchmarks live in the benchmarks/ folder "
                         "of a source checkout (git clone, then pip install -e .), or set WORKBENCH_BENCHMARKS to it")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # the benchmarks import each other by module name
    module = importlib.import_module(name)
    if Path(module.__file__).resolve() != path.resolve():
        raise ValueError(f"benchmark {name!r}: the module {name!r} already imported is {module.__file__}, not {path}")
    return module


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="GPU benchmarks that write JSON with provenance (benchmarks/, need a GPU)",
                       description="Run benchmarks/<name>.py of this checkout: `workbench bench NAME --help` lists "
                                   "its options. Exit 0 every bar passed, 1 a bar missed, 2 bad usage or no GPU.")
    p.add_argument("name", choices=BENCHMARKS, help="expand (block table -> indices), decode (MLA decode) or "
                   "tile_rates (the decode tile's products)")
    p.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")

    def run(args: argparse.Namespace) -> int:
        module = load_benchmark(args.name)
        parser = argparse.ArgumentParser(prog=f"workbench bench {args.name}", description=module.__doc__.split("\n")[0])
        module.add_arguments(parser)
        options = parser.parse_args(args.options)
        try:
            return int(module.main(options))
        except RuntimeError as exc:  # no GPU, or the interpreter forced on
            print(f"workbench bench {args.name}: error: {exc}", file=sys.stderr)
            return 2

    p.set_defaults(func=run)


def _add_probe_qlen(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "probe-qlen", help="does a decode backend give every query position its own output? (aiter #2720)",
        description="Decode with every query length (default 1..16) on one backend and compare with the fp32 "
                    "golden: ok, broadcast-fault (every position got position 0's output, the aiter #2720 "
                    "symptom) or wrong. Exit 0 all ok, 1 some length not ok, 2 bad usage or backend unavailable, "
                    "3 an unexpected error (e.g. the probe's tensors could not be allocated: lower --heads or "
                    "--kv-len).")
    p.add_argument("--backend", required=True, choices=["triton", "aiter", "aiter-pow2-fault", "torch", "auto"],
                   help="aiter runs on ROCm only; aiter-pow2-fault is a labelled emulation of the #2720 symptom")
    p.add_argument("--qlens", default="1-16", help="query lengths, e.g. 1-16 or 3,6,8 (default 1-16)")
    p.add_argument("--heads", type=int, default=16, help="query heads (aiter: 16 or 128; default 16)")
    p.add_argument("--kv-len", type=int, default=40, help="keys of the first request (default 40)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    def run(args: argparse.Namespace) -> int:
        from workbench import qlen

        try:
            report = qlen.probe_qlen(args.backend, qlen.parse_qlens(args.qlens), heads=args.heads, kv_len=args.kv_len)
        except qlen.BackendUnavailable as exc:
            print(f"workbench probe-qlen: {exc}", file=sys.stderr)
            return 2
        print(report.to_json() if args.json else report)
        return 0 if report.all_ok else 1

    p.set_defaults(func=run)


def _add_results(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "results", help="the committed H200 benchmark bars (expand and decode): measured, PASS/MISS, how far off",
        description="Every bar of the benchmark results committed under src/workbench/data/ (measured on an H200 "
                    "with `workbench bench expand` and `workbench bench decode`), with each run's provenance; for a "
                    "missed bar, what it would need, from numbers measured in the same run. Nothing is timed: "
                    "this reads the committed JSON, on any machine. Exit 0 (it reports; the bench commands judge).")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--markdown", action="store_true", help="print the table as Markdown (the README's)")
    form.add_argument("--json", action="store_true", help="print the rows and provenance lines as JSON")
    p.add_argument("--device", default="h200", help="which committed results: data/bench_<name>_<device>.json")

    def run(args: argparse.Namespace) -> int:
        from workbench.bench import results

        rows, lines = results.committed_bars(args.device)
        if not rows:  # neither benchmark is committed for this device: say so, as bad usage
            print(f"workbench results: error: no committed results for --device {args.device!r}:\n  "
                  + "\n  ".join(lines), file=sys.stderr)
            return 2
        if args.json:
            print(_strict_json({"provenance": lines, "bars": [r.to_dict() for r in rows]}))
        elif args.markdown:
            print(results.format_markdown(rows))
        else:
            print(results.format_text(rows, lines))
        return 0

    p.set_defaults(func=run)


# Each capability adds one registrar here (it may create nested subcommands, e.g. ``bench``).
REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = [_add_info, _add_check, _add_catalog,
                                                                   _add_bench, _add_probe_qlen, _add_results]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description="The AITER MLA x Eagle3 workbench.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, TypeError) as exc:  # bad input: the message names the argument and the rule
        print(f"workbench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`workbench results | head`): nothing is wrong with the run
        sys.stderr.close()
        return 0
    except Exception as exc:  # anything else (an allocation that failed, a bug): one line, its own exit code
        message = " ".join(str(exc).split())  # torch's messages span lines; the report is one
        print(f"workbench {args.command}: unexpected error: {type(exc).__name__}: {message}", file=sys.stderr)
        return EXIT_UNEXPECTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
