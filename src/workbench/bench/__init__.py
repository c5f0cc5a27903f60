"""What the benchmarks share with the library, and what the book reads of their results.

The benchmarks themselves live outside the package, in the ``benchmarks/`` folder of a source checkout (one per
kernel family: ``expand.py``, ``decode.py``; ``compare.py`` compares two revisions), and ``workbench bench NAME``
runs them. Here: :mod:`workbench.bench.common` (CUDA-graph timing, the copy ceiling, provenance, JSON writing) and
:mod:`workbench.bench.results` (the committed bars, read by ``workbench results`` and the book). Benchmarks are
never tests: tests never time. Nothing here imports plotly, so a benchmark runs on a GPU machine that has only torch
and triton.
"""
