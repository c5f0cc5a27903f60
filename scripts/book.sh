#!/usr/bin/env bash
# Execute every chapter and build the site into _build/html (warnings are errors).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# jupyter-cache keys a chapter's outputs on its own cells only, so a changed library or committed benchmark
# JSON would leave stale outputs (and nbval reference outputs) behind: drop the cache when they change.
stamp=$(find src/workbench -type f \( -name '*.py' -o -name '*.json' \) -print0 | sort -z | xargs -0 sha256sum \
        | sha256sum | cut -d' ' -f1)
if [ -d _build/.jupyter_cache ] && [ "$(cat _build/.library_stamp 2>/dev/null)" != "$stamp" ]; then
    echo "library or data changed since the last build: re-executing every chapter"
    rm -rf _build/.jupyter_cache
fi
mkdir -p _build
echo "$stamp" > _build/.library_stamp
# --all rewrites every page (executions stay cached in _build/.jupyter_cache); --keep-going reports every
# warning before failing; --warningiserror makes each one an error.
jupyter-book build . --all --warningiserror --keep-going --path-output .
# Execution reports of failed chapters stay in _build/html/reports (QuantEcon's habit).
echo
echo "Site built: file://$PWD/_build/html/index.html"
echo "Serve it:   python3 -m http.server -d _build/html 8000   (then open http://127.0.0.1:8000)"
