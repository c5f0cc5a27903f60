"""Execute the book's chapters one by one and report, per chapter, whether every cell ran.

    python scripts/run_chapters.py OUT_DIR [CHAPTER ...]

Each ``book/*.md`` chapter (or the ones named, by file name or stem) is read with jupytext and executed with
nbclient in its own kernel, from ``book/`` as the working directory. The executed notebook is written to
``OUT_DIR/<stem>.ipynb`` (outputs included, so the cells' GPU results can be read afterwards), and
``OUT_DIR/chapters.json`` records per chapter: ok, seconds, the failing cell's first line and the error, and
each code cell's wall time. Exit status 1 if any chapter failed.

The site build (``scripts/book.sh``) executes the chapters too, but on this project's CPU machines only: this
script is how the chapters' GPU branches (``device.on_gpu()``: live timings, compiled kernels) are run on the
device machine (``scripts/gpu_check.sh``). It does not set ``TRITON_INTERPRET``: without a GPU the library
picks the interpreter itself.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jupytext
import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"


def _cell_seconds(cell) -> float | None:
    ex = cell.get("metadata", {}).get("execution", {})
    start, end = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
    if not (start and end):
        return None
    from datetime import datetime
    return (datetime.fromisoformat(end.replace("Z", "+00:00"))
            - datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()


def run_chapter(md: Path, out_dir: Path, timeout: int) -> dict:
    nb = jupytext.read(md)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=True,
                                     resources={"metadata": {"path": str(BOOK)}})
    t0 = time.perf_counter()
    row: dict = {"chapter": md.name, "ok": True}
    try:
        client.execute()
    except Exception as e:  # nbclient raises CellExecutionError (or a timeout) naming the cell
        row["ok"] = False
        row["error"] = f"{type(e).__name__}: {str(e)[-2000:]}"
        failing = next((c for c in nb.cells if c.cell_type == "code"
                        and any(o.get("output_type") == "error" for o in c.get("outputs", []))), None)
        if failing is not None:
            row["failing_cell"] = failing.source.splitlines()[0][:120] if failing.source else ""
    row["seconds"] = round(time.perf_counter() - t0, 1)
    row["cells"] = [{"first_line": (c.source.splitlines() or [""])[0][:80], "seconds": _cell_seconds(c)}
                    for c in nb.cells if c.cell_type == "code"]
    nbformat.write(nb, out_dir / f"{md.stem}.ipynb")
    return row


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {Path(a).stem for a in argv[1:]}
    chapters = [md for md in sorted(BOOK.glob("*.md")) if not wanted or md.stem in wanted]
    unknown = wanted - {md.stem for md in chapters}
    if unknown:
        print(f"error: no chapter named {sorted(unknown)} in {BOOK}", file=sys.stderr)
        return 2
    rows = []
    for md in chapters:
        row = run_chapter(md, out_dir, timeout=900)
        rows.append(row)
        print(f"{'OK    ' if row['ok'] else 'FAILED'} {md.name} ({row['seconds']} s)"
              + ("" if row["ok"] else f"\n  cell: {row.get('failing_cell')}\n  {row['error'][-1500:]}"), flush=True)
        (out_dir / "chapters.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
