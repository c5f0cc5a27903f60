"""Write the chapters as notebooks for nbval, with the outputs of the site build as the reference.

For each ``book/*.md`` chapter (MyST, read with jupytext) this takes the outputs that the site build
stored in its execution cache (``_build/.jupyter_cache``, jupyter-cache) and writes
``_build/nbval/<chapter>.ipynb``. nbval then executes each notebook again and, with ``--nbval-lax``,
compares the cells tagged ``nbval-check-output`` with those stored outputs: an output that is not
reproducible from one run to the next fails the test. A chapter missing from the cache (the site was not
built, or the chapter is not in _toc.yml) is an error, not a silent pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import nbformat
from jupyter_cache import get_cache

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    cache = get_cache(ROOT / "_build" / ".jupyter_cache")
    out_dir = ROOT / "_build" / "nbval"
    out_dir.mkdir(parents=True, exist_ok=True)
    missing = []
    for md in sorted((ROOT / "book").glob("*.md")):
        nb = jupytext.read(md)
        try:
            _, merged = cache.merge_match_into_notebook(nb)
        except KeyError:
            missing.append(md.name)
            continue
        nbformat.write(merged, out_dir / f"{md.stem}.ipynb")
        print(f"nbval notebook: {md.name} (reference outputs from the site build)")
    if missing:
        print(f"error: no executed outputs in the site build's cache for {missing}: build the site first "
              "(scripts/book.sh) and list every chapter in _toc.yml", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
