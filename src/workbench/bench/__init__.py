"""GPU benchmarks that write JSON with provenance (device, versions, date, command).

One submodule per benchmark (``bench/expand.py``, ``bench/decode.py``, ...); shared timing and
provenance live in :mod:`workbench.bench.common`. Benchmarks are never tests: tests never time.
Nothing here imports plotly, so a benchmark runs on a GPU machine that has only torch and triton.
"""
