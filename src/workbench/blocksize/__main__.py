"""``python -m workbench.blocksize --oracle``: the vLLM oracle that :func:`ask_real_vllm` starts."""

import sys

from workbench.blocksize.oracle import main

if __name__ == "__main__":  # pragma: no cover - runs in the vLLM environment
    sys.exit(main())
