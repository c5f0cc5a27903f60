#!/usr/bin/env bash
# Execute every chapter and build the site into _build/html (warnings are errors).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# --all rewrites every page (executions stay cached in _build/.jupyter_cache); --keep-going reports every
# warning before failing; --warningiserror makes each one an error.
jupyter-book build . --all --warningiserror --keep-going --path-output .
# Execution reports of failed chapters stay in _build/html/reports (QuantEcon's habit).
echo
echo "Site built: file://$PWD/_build/html/index.html"
echo "Serve it:   python3 -m http.server -d _build/html 8000   (then open http://127.0.0.1:8000)"
