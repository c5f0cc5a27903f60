#!/usr/bin/env bash
# A separate, cached environment with a real vLLM, for the conformance tests
# (tests/test_blocksize_vllm_conformance.py). The main .venv stays light.
#
#   .venv-vllm/       CPU torch==2.13.0 first (so pip keeps it), then vllm==0.32.0, then the
#                     torch add-ons vLLM pulls that do not match the CPU torch are removed
#                     (torchvision, torchaudio, torchcodec: with them `import vllm` fails).
#
# About 100 s and 5.8 GB the first time. Idempotent: a stamp file records the hash of this
# script; when it matches and `import vllm` works, the script does nothing.
# Environment: PYTHON (default python3), VLLM_SPEC (default vllm==0.32.0),
# TORCH_SPEC (default torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VLLM_SPEC=${VLLM_SPEC:-vllm==0.32.0}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
env_dir=.venv-vllm
stamp=$env_dir/.vllm-stamp
want=$( (cat scripts/vllm_env.sh; echo "$VLLM_SPEC $TORCH_SPEC") | sha256sum | cut -c1-16)

# pip warns once per package about this machine's unused local index folders; hide only that line.
quiet_pip() {
  "$env_dir/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

imports_ok() {
  "$env_dir/bin/python" -c "import vllm.v1.worker.utils, vllm.v1.attention.backend" >/dev/null 2>&1
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && imports_ok; then
  exit 0
fi

echo "== vllm env: creating $env_dir ($VLLM_SPEC on $TORCH_SPEC, CPU)"
[ -x "$env_dir/bin/python" ] || "$PYTHON" -m venv "$env_dir"
quiet_pip install -q --upgrade pip
# CPU torch first: vllm pins this torch version, and an installed matching torch is kept.
if ! "$env_dir/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('${TORCH_SPEC#torch==}') else 1)" 2>/dev/null; then
  quiet_pip install -q "$TORCH_SPEC"
fi
quiet_pip install -q "$VLLM_SPEC" "$TORCH_SPEC"
# These come as CUDA builds that do not match the CPU torch; vLLM's pure-Python modules
# import without them, and with them present the import fails.
quiet_pip uninstall -q -y torchvision torchaudio torchcodec || true

if ! imports_ok; then
  echo "== vllm env: import vllm still fails in $env_dir:" >&2
  "$env_dir/bin/python" -c "import vllm.v1.worker.utils" >&2 || true
  exit 1
fi
echo "$want" > "$stamp"
echo "== vllm env: done ($("$env_dir/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>/dev/null))"
