#!/usr/bin/env bash
# Set up everything the workbench needs, from nothing but python3, pip and apt. Idempotent:
# it does the work only when pyproject.toml or this script changed since the last successful run.
#
#   .venv/            the environment (CPU torch first, so nothing pulls a multi-GB CUDA build)
#   chromium          Debian's package, for the browser test (installed with apt when missing)
#
# Environment: PYTHON (default python3); TORCH_SPEC (default torch==2.13.0, the CPU wheel); set
# WB_SKIP_APT=1 to skip the apt step (then install chromium yourself to run the browser test).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
stamp=.venv/.setup-stamp
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && command -v chromium >/dev/null; then
  exit 0
fi

echo "== setup: python environment in .venv"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# Keep a torch that is already there (a CUDA or ROCm build on a GPU machine); else the CPU wheel.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "$TORCH_SPEC"
fi
# triton 3.7.1 runs the interpreter beside the CPU torch; on a GPU machine torch brings its own.
extra_triton=""
if .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.version.cuda is None and torch.version.hip is None else 1)"; then
  extra_triton="triton==3.7.1"
fi
.venv/bin/python -m pip install -q $extra_triton -e '.[book,test]'

# JupyterLab in this venv opens the MyST chapters (book/*.md) as notebooks on double click (jupytext's
# "Jupytext Notebook" viewer); the setting lives in the venv, not in the user's home.
mkdir -p .venv/share/jupyter/lab/settings
cat > .venv/share/jupyter/lab/settings/overrides.json <<'JSON'
{"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}}}
JSON

if ! command -v chromium >/dev/null && [ "${WB_SKIP_APT:-0}" != 1 ]; then
  echo "== setup: chromium (apt)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
fi

echo "$want" > "$stamp"
echo "== setup: done ($(.venv/bin/python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'))"
