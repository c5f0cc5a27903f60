"""The shape of the library: no module over about 800 lines, and imports that flow one way (STYLE.md: a module
imports only those above it in the list below; a package's modules may import each other)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "workbench"
# the order of the data flow: a module may import the ones before it, never the ones after
ORDER = ["jsonio", "device", "pow2", "decode_metadata", "design_log", "blocksize", "upstream", "expand", "mla", "metadata",
         "qlen", "perfmodel", "since_pr", "viz", "bench", "codegen", "cli", "__main__", "__init__"]
MAX_LINES = 800


def _unit(path: Path) -> str:
    """The layer a file belongs to: its package under workbench, or its module name."""
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    """Every workbench layer a file imports, anywhere in it (inside functions too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "workbench"]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for n in names:
            parts = n.split(".")
            if parts[0] == "workbench" and len(parts) > 1:
                out.add(parts[1])
    return out


FILES = sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_is_over_800_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES, f"{path.relative_to(SRC)}: split it by job"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_flow_one_way(path):
    unit = _unit(path)
    assert unit in ORDER, f"{unit} is not in the layer list of tests/test_layout.py (and STYLE.md's table)"
    rank = ORDER.index(unit)
    upward = sorted(u for u in _imports(path) if u in ORDER and ORDER.index(u) > rank and u != unit)
    assert not upward, f"{path.relative_to(SRC)} imports {upward}, which come after {unit!r}"
