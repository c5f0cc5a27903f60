#!/usr/bin/env bash
# The whole test suite and every chapter on a GPU machine: the device tool's H200, whose image has torch,
# triton, pytest, pytest-xdist and hypothesis but no plotly, ipywidgets or Jupyter, and no network.
#
#   bash scripts/gpu_check.sh wheels              # here (with network): the missing packages' wheels -> .gpu-wheels/
#   bash scripts/gpu_check.sh tests OUT [ARGS]    # there: pytest over tests/ on 14 workers, log + junit in OUT
#   bash scripts/gpu_check.sh chapters OUT [CH]   # there: every chapter (or CH...) executed, notebooks in OUT
#
# On the device machine pip adds the wheels (only the missing packages) to the environment of the image's
# python3, a throwaway machine: its torch and triton are the ones tested. Carry .gpu-wheels (an ignored
# folder, about 30 MB) with the run: carry=[".gpu-wheels"].
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:?usage: gpu_check.sh wheels | tests OUT [pytest args] | chapters OUT [chapter ...]}"
shift

if [ "$mode" = wheels ]; then
    rm -rf .gpu-wheels && mkdir .gpu-wheels
    # cp312 manylinux: the device image's Python (3.12) and platform, whatever runs this
    python3 -m pip download jupytext nbclient ipykernel ipywidgets "plotly>=6" -d .gpu-wheels -q \
        --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --only-binary=:all:
    du -sh .gpu-wheels
    exit 0
fi

out="${1:?give an output folder}"
shift
mkdir -p "$out"
[ -d .gpu-wheels ] || { echo "error: .gpu-wheels is missing: run 'bash scripts/gpu_check.sh wheels' here and carry it" >&2; exit 2; }
if ! python3 -c "import jupytext, nbclient, ipykernel, ipywidgets, plotly" 2>/dev/null; then
    # into the environment that holds the image's torch and triton (a venv there: --system-site-packages
    # from it would not see them); pip adds only what is missing
    python3 -m pip install -q --no-index --find-links .gpu-wheels --break-system-packages \
        jupytext nbclient ipykernel ipywidgets plotly
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"

case "$mode" in
    tests)
        # -v: one line per test in the log, so a run stopped by a time limit still shows what passed
        python3 -m pytest tests -n "${WORKERS:-14}" -v -p no:cacheprovider -m "not browser" \
            --junitxml="$out/junit.xml" "$@" > "$out/pytest.log" 2>&1 && rc=0 || rc=$?
        grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -40 || true
        tail -1 "$out/pytest.log"
        exit "$rc"
        ;;
    chapters)
        python3 scripts/run_chapters.py "$out" "$@"
        ;;
    *)
        echo "error: unknown mode '$mode' (wheels, tests or chapters)" >&2
        exit 2
        ;;
esac
