"""`workbench` as it runs on an NVIDIA GPU that is not Hopper and gives a program 99 KB of shared memory (an RTX
4090's or 5090's), emulated on the GPU at hand:

    PYTHONPATH=src python3 scripts/decode_small_gpu_probe.py bench decode --quick --no-torch --out OUT.json

Triton is told the GPU's shared-memory limit is 101,376 bytes (it then refuses to load any kernel that asks for
more, as it would there) and the Gluon kernels are off (they need Hopper). The decode's defaults then step down
``mla.shared_memory_ladder``; the JSON's ``chosen_configs`` show where each point ended. The timings are this GPU's
with those tiles, not another GPU's. ``tests/test_other_gpus.py`` checks the same emulation against the golden.
"""

import sys

from triton.runtime import driver

import workbench  # noqa: F401
from workbench import cli, mla

SHARED_MEMORY = 101_376

utils = driver.active.utils
_real = utils.get_device_properties
utils.get_device_properties = lambda dev: dict(_real(dev), max_shared_mem=SHARED_MEMORY)
mla.gluon_available = lambda: False

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
