"""The AITER MLA x Eagle3 workbench.

``import workbench`` imports :mod:`workbench.device` first, which decides where code runs and, on a
machine without a GPU, sets ``TRITON_INTERPRET=1`` before any kernel module is imported. The other
modules load on first use (``workbench.blocksize``, ``workbench.expand``, ...), in the order of the
design: device -> blocksize -> expand -> mla -> metadata -> qlen -> perfmodel -> viz -> bench/cli.
"""

from __future__ import annotations

import importlib

from workbench import device  # noqa: F401  (must come first: sets TRITON_INTERPRET on CPU)

__version__ = "0.1.0"

_SUBMODULES = ("blocksize", "expand", "mla", "metadata", "qlen", "perfmodel", "viz", "bench", "cli")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"workbench.{name}")
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
