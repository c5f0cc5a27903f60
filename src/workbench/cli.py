"""The ``workbench`` command.

Subcommands (each registered by one ``_add_*`` function below; keep them in the order of the book):

* ``workbench info``            where code runs here (``workbench.device.describe()``)
* ``workbench bench NAME``      GPU benchmarks (``_bench_group``; results are JSON with provenance)

Exit codes: 0 success / compatible, 1 a negative verdict (incompatible, a bar missed), 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def _add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="where code runs here: device, Triton mode, aiter and vLLM availability")

    def run(args: argparse.Namespace) -> int:
        from workbench import device

        print(device.describe())
        return 0

    p.set_defaults(func=run)


def _bench_group(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Get or create the ``workbench bench`` group; benchmark registrars add their subcommand to it."""
    if "bench" not in sub.choices:
        p = sub.add_parser("bench", help="GPU benchmarks that write JSON with provenance (need a GPU)")
        p.set_defaults(_bench_sub=p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK"))
    return sub.choices["bench"].get_default("_bench_sub")


# Each capability adds one registrar here (it may create nested subcommands, e.g. ``bench``).
REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = [_add_info]


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
