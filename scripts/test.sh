#!/usr/bin/env bash
# The whole test suite: unit tests, every chapter under nbval, the site build, the browser test.
# One pytest run at the end, so its closing line counts everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== vLLM conformance environment (.venv-vllm, cached; before the site build so chapter 1 can show the real vLLM answer)"
bash scripts/vllm_env.sh || echo "vllm env could not be created: the vLLM conformance tests will skip with that reason"

echo "== build the site (executes every chapter)"
bash scripts/book.sh

echo "== chapters -> notebooks for nbval (_build/nbval), the site build's outputs as reference"
rm -rf _build/nbval
python scripts/nbval_notebooks.py

echo "== pytest: unit tests, chapters (nbval-lax), browser"
# one worker per core; --dist loadfile keeps a file's tests on one worker (a notebook's cells run in order in one
# kernel, and the compile fixtures are compiled once per file)
pytest tests _build/nbval --nbval-lax -p no:cacheprovider -n "${WB_TEST_WORKERS:-auto}" --dist loadfile "$@"
