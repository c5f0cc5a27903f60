#!/usr/bin/env bash
# A separate, cached environment with a real vLLM, for the conformance and upstream-fidelity tests
# (tests/test_blocksize_vllm_conformance.py, tests/test_upstream_*.py). The main .venv stays light.
#
#   .venv-vllm/       CPU torch first, then vllm (VLLM_SPEC) and its Python requirements, then a CPU
#                     triton so vLLM's own Triton kernels run under TRITON_INTERPRET=1.
#
# vLLM pins an exact torch (vllm 0.33.0: torch==2.14.0), and the registry's Linux wheels of that
# torch are CUDA builds. When the pin matches the CPU torch, pip resolves vLLM normally. When it
# does not, vLLM is installed without its dependencies and then its own requirement list is
# installed less the torch family (kept at the CPU build) and the GPU kernel packages in SKIP_REQS
# (no test imports them; tokenspeed-mla would also bring a Triton fork that shadows `triton`).
# FlashInfer stays: with it the FLASHINFER* backend classes import, so their declarations can be
# read. The tests only import vLLM's Python modules and run its Triton kernels in the interpreter.
#
# About 2-4 minutes and 6 GB the first time. Idempotent: a stamp file records the hash of this
# script and the specs; when it matches and the imports work, the script does nothing.
# Environment: PYTHON (default python3), VLLM_SPEC (default vllm==0.33.0),
# TORCH_SPEC (default torch==2.13.0), TRITON_SPEC (default triton==3.7.1, as in the main .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VLLM_SPEC=${VLLM_SPEC:-vllm==0.33.0}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TRITON_SPEC=${TRITON_SPEC:-triton==3.7.1}
env_dir=.venv-vllm
stamp=$env_dir/.vllm-stamp
want=$( (cat scripts/vllm_env.sh; echo "$VLLM_SPEC $TORCH_SPEC $TRITON_SPEC") | sha256sum | cut -c1-16)

# vLLM requirements skipped when vLLM is installed beside a torch it does not pin: the torch family
# and GPU kernel libraries that nothing here imports.
SKIP_REQS="torch torchaudio torchvision torchcodec tilelang nvtx fastsafetensors instanttensor
quack-kernels tokenspeed-mla humming-kernels pynvvideocodec"

# pip warns once per package about this machine's unused local index folders; hide only that line.
quiet_pip() {
  "$env_dir/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

imports_ok() {
  "$env_dir/bin/python" -c "import vllm.v1.worker.utils, vllm.v1.attention.backend, triton" >/dev/null 2>&1
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && imports_ok; then
  exit 0
fi

echo "== vllm env: creating $env_dir ($VLLM_SPEC on $TORCH_SPEC, CPU, $TRITON_SPEC)"
[ -x "$env_dir/bin/python" ] || "$PYTHON" -m venv "$env_dir"
quiet_pip install -q --upgrade pip
# CPU torch first: an installed torch that satisfies vLLM's pin is kept.
if ! "$env_dir/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('${TORCH_SPEC#torch==}') else 1)" >/dev/null 2>&1; then
  quiet_pip install -q "$TORCH_SPEC"
fi
torch_version=$("$env_dir/bin/python" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null)

quiet_pip install -q --no-deps "$VLLM_SPEC"
# vLLM's own requirement list (markers evaluated, extras left out), as pip would read it.
vllm_reqs() {
  "$env_dir/bin/python" - "$1" <<'PY'
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
skip = {canonicalize_name(n) for n in sys.argv[1].split()}
for line in requires("vllm") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(r.name) not in skip:
        print(str(r).split(";")[0].strip())
PY
}
torch_pin=$("$env_dir/bin/python" -c "
from importlib.metadata import requires
print(next((r.split(';')[0].split('==')[1].strip() for r in requires('vllm') or []
            if r.replace(' ', '').startswith('torch==')), ''))")
constraints=$(mktemp)
trap 'rm -f "$constraints" "$constraints.reqs"' EXIT
echo "torch==$torch_version" > "$constraints"
if [ "$torch_pin" = "$torch_version" ]; then
  vllm_reqs "torch" > "$constraints.reqs"
else
  echo "== vllm env: $VLLM_SPEC pins torch==$torch_pin, kept at the CPU torch $torch_version;" \
       "skipping these requirements: $(echo $SKIP_REQS)"
  vllm_reqs "$SKIP_REQS" > "$constraints.reqs"
fi
quiet_pip install -q -r "$constraints.reqs" -c "$constraints" "$TRITON_SPEC"
rm -f "$constraints.reqs"
# These come as CUDA builds that do not match the CPU torch; vLLM's pure-Python modules
# import without them, and with them present the import fails.
quiet_pip uninstall -q -y torchvision torchaudio torchcodec || true

if ! imports_ok; then
  echo "== vllm env: import vllm still fails in $env_dir:" >&2
  "$env_dir/bin/python" -c "import vllm.v1.worker.utils, vllm.v1.attention.backend, triton" >&2 || true
  exit 1
fi
echo "$want" > "$stamp"
echo "== vllm env: done ($("$env_dir/bin/python" -c 'import vllm, torch, triton; print("vllm", vllm.__version__, "torch", torch.__version__, "triton", triton.__version__)' 2>/dev/null))"
