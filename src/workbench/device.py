"""Where code runs, and what is available there, with reasons.

Three places, decided once at import:

* ``"cuda"``  an NVIDIA GPU (``torch.cuda.is_available()`` and ``torch.version.hip is None``);
* ``"rocm"``  an AMD GPU through ROCm (``torch.version.hip`` is set; aiter may be importable);
* ``"cpu"``   no GPU: Triton kernels run under the Triton interpreter.

On CPU this module sets ``TRITON_INTERPRET=1`` in the environment *before* any kernel module of the
workbench is imported (``import workbench`` imports this module first), because ``@triton.jit``
reads the variable when it decorates a function: set later, it has no effect and the first launch
fails with ``RuntimeError: 0 active drivers``. A value the user set explicitly is respected.

The interpreter computes bfloat16 on raw bit patterns (triton issues #11584 and #10945): a bf16
``tl.dot`` returns values near 1e10. :func:`check_kernel_dtype` refuses bf16 there with a message
that says what to do instead.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
import platform as _platform

import torch

__all__ = [
    "Availability",
    "Platform",
    "aiter_status",
    "check_kernel_dtype",
    "compiled_nvidia",
    "default_device",
    "describe",
    "gluon_available",
    "hopper",
    "interpreter_active",
    "max_shared_memory",
    "on_gpu",
    "pdl_available",
    "platform",
    "sm90_or_newer",
    "vllm_status",
]


def _choose_interpreter() -> bool:
    """Set ``TRITON_INTERPRET=1`` when there is no GPU and the user did not decide; return the choice."""
    explicit = os.environ.get("TRITON_INTERPRET")
    if explicit is not None:
        return explicit == "1"
    if torch.cuda.is_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


_INTERPRETER_AT_IMPORT = _choose_interpreter()


@dataclasses.dataclass(frozen=True)
class Platform:
    """Facts about the place this process runs."""

    kind: str  # "cuda" | "rocm" | "cpu"
    device_name: str  # e.g. "NVIDIA H200", "AMD Instinct MI300X", or the CPU's name
    interpreter: bool  # Triton kernels run under TRITON_INTERPRET=1
    torch_version: str
    triton_version: str | None
    gpu_arch: str | None  # "sm_90", "gfx942", ...

    @property
    def device(self) -> torch.device:
        return torch.device("cpu" if self.kind == "cpu" else "cuda")


@dataclasses.dataclass(frozen=True)
class Availability:
    """Whether an optional package can be used here, and if not, why."""

    name: str
    available: bool
    version: str | None
    reason: str

    def __str__(self) -> str:
        state = "available" if self.available else "unavailable"
        ver = f" {self.version}" if self.version else ""
        return f"{state}{ver}: {self.reason}"


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.cache
def platform() -> Platform:
    """Detect the platform once per process."""
    triton_version = _dist_version("triton", "pytorch-triton-rocm", "triton-rocm")
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        if torch.version.hip is not None:
            arch = getattr(props, "gcnArchName", "gfx?").split(":")[0]
            return Platform("rocm", props.name, interpreter, torch.__version__, triton_version, arch)
        arch = f"sm_{props.major}{props.minor}"
        return Platform("cuda", props.name, interpreter, torch.__version__, triton_version, arch)
    cpu = _platform.processor() or _platform.machine() or "CPU"
    return Platform("cpu", cpu, interpreter, torch.__version__, triton_version, None)


def interpreter_active() -> bool:
    """True when Triton kernels run under the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def on_gpu() -> bool:
    """True on an NVIDIA or AMD GPU with compiled (not interpreted) Triton kernels."""
    return platform().kind != "cpu" and not interpreter_active()


def compiled_nvidia(dev: torch.device) -> bool:
    """Kernels on ``dev`` are compiled for NVIDIA (not the interpreter, not ROCm): PTX-only features apply."""
    return dev.type == "cuda" and torch.version.hip is None and not interpreter_active()


def sm90_or_newer(dev: torch.device) -> bool:
    """Compiled Triton on an NVIDIA GPU of compute capability 9.0 or newer (Hopper: PDL, ``wgmma``)."""
    return compiled_nvidia(dev) and torch.cuda.get_device_capability(dev)[0] >= 9


def hopper(dev: torch.device) -> bool:
    """Compiled Triton on an NVIDIA Hopper GPU (compute capability 9.x: H100, H200, GH200). The Gluon split
    kernels are written with Hopper's ``wgmma``, which only sm_90a has: Blackwell (10.x: B200, GB200; 12.x:
    RTX 50 series) replaced it with ``tcgen05``, and compiling them there aborts in LLVM ("Cannot select:
    intrinsic %llvm.nvvm.wgmma..."), so they are chosen, and accepted, only here."""
    return compiled_nvidia(dev) and torch.cuda.get_device_capability(dev)[0] == 9


GLUON_MIN_TRITON = (3, 6)  # Gluon is experimental; its API before 3.6 differs from the one the kernels use


def gluon_available() -> bool:
    """The Gluon split kernels can run here: compiled Triton of version :data:`GLUON_MIN_TRITON` or newer on an
    NVIDIA Hopper GPU (:func:`hopper`: they are written with ``wgmma``, so a B200 gets the Triton kernels)."""
    import triton

    try:
        version = tuple(int(x) for x in triton.__version__.split(".")[:2])
    except ValueError:
        return False
    return version >= GLUON_MIN_TRITON and torch.cuda.is_available() and hopper(torch.device("cuda"))


HOPPER_SHARED_MEMORY = 232_448  # bytes of shared memory one program may use on an H100/H200 (227 KB, opt-in)


def max_shared_memory(dev: torch.device) -> int:
    """Shared memory one program (thread block) may use on ``dev``, in bytes, with the opt-in a kernel needing
    more than 48 KB makes (Triton does): 227 KB on Hopper and B200, 163 KB on A100, 99 KB on Ada and the RTX 50
    series. Off CUDA (the interpreter, no GPU) Hopper's figure, the GPU the library's configs were tuned on."""
    if dev.type != "cuda" or not torch.cuda.is_available():
        return HOPPER_SHARED_MEMORY
    props = torch.cuda.get_device_properties(dev)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or HOPPER_SHARED_MEMORY)


def pdl_available(dev: torch.device) -> bool:
    """Programmatic dependent launch (PDL): compiled Triton on an NVIDIA GPU of compute capability 9.0 or newer.

    A kernel launched with PDL may start before the kernel ahead of it in the stream has finished; it must call
    ``griddepcontrol.wait`` (``tl.extra.cuda.gdc_wait``) before it reads anything that kernel may write."""
    return sm90_or_newer(dev)


def default_device() -> torch.device:
    """The device tensors should live on for kernels here: ``cuda`` on a GPU, else ``cpu``."""
    return platform().device


def check_kernel_dtype(dtype: torch.dtype, arg: str = "q") -> None:
    """Refuse bfloat16 under the Triton interpreter, which computes it on raw bit patterns.

    Raises:
        TypeError: naming ``arg``, the rule and the fix.
    """
    if dtype == torch.bfloat16 and interpreter_active():
        raise TypeError(
            f"{arg} has dtype torch.bfloat16, but the Triton interpreter (TRITON_INTERPRET=1, used on CPU) "
            "computes bfloat16 on raw bit patterns and returns garbage (triton issues #11584, #10945). "
            "Use torch.float16 or torch.float32 on CPU, or run on a GPU for bf16."
        )


@functools.cache
def aiter_status() -> Availability:
    """Whether ``aiter`` (AMD's kernel library, PyPI ``amd-aiter``) is usable here.

    ``import aiter`` runs ``hipconfig``/``hipcc`` at import and raises RuntimeError (not ImportError)
    without ROCm, so it is only attempted on ROCm, and both errors are caught. An unrelated PyPI
    package is also named ``aiter`` (async iterators); it is told apart by the missing ``aiter.mla``.
    """
    version = _dist_version("amd-aiter", "aiter")
    if importlib.util.find_spec("aiter") is None:
        return Availability("aiter", False, None, "not installed (ROCm only: pip install '.[rocm]')")
    if torch.version.hip is None:
        return Availability(
            "aiter", False, version,
            "needs ROCm (this torch has no HIP; import aiter would raise RuntimeError)",
        )
    try:
        import aiter  # noqa: F401
        import aiter.mla  # noqa: F401
    except (ImportError, RuntimeError, OSError) as exc:  # RuntimeError: no ROCm toolchain
        return Availability("aiter", False, version, f"import failed: {type(exc).__name__}: {exc}")
    if not hasattr(aiter.mla, "mla_decode_fwd"):
        return Availability("aiter", False, version, "aiter.mla has no mla_decode_fwd (wrong package or version?)")
    return Availability("aiter", True, version, "aiter.mla.mla_decode_fwd importable")


@functools.cache
def vllm_status() -> Availability:
    """Whether a real vLLM is importable here (for the conformance checks)."""
    version = _dist_version("vllm")
    if importlib.util.find_spec("vllm") is None:
        return Availability("vllm", False, None, "not installed here (conformance env: scripts/vllm_env.sh)")
    try:
        import vllm.v1.attention.backend  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - report any failure as the reason
        return Availability("vllm", False, version, f"import failed: {type(exc).__name__}: {exc}")
    return Availability("vllm", True, version, "vllm.v1.attention.backend importable")


def describe() -> str:
    """A short summary of where code runs here; shown at the top of every chapter."""
    p = platform()
    where = {
        "cuda": f"NVIDIA GPU {p.device_name} ({p.gpu_arch})",
        "rocm": f"AMD GPU {p.device_name} ({p.gpu_arch}, ROCm {torch.version.hip})",
        "cpu": f"CPU ({p.device_name}), no GPU",
    }[p.kind]
    mode = "Triton interpreter (TRITON_INTERPRET=1; fp16/fp32 only)" if interpreter_active() \
        else "compiled Triton kernels"
    if p.kind == "cuda" and not interpreter_active():
        dev = torch.device("cuda")
        decode = ("the Gluon kernels (Hopper)" if gluon_available()
                  else "the Triton tiles (the Gluon kernels need Hopper and Triton >= "
                  f"{'.'.join(map(str, GLUON_MIN_TRITON))})")
        mode += f"; MLA decode: {decode}, {max_shared_memory(dev) // 1024} KB of shared memory per program"
    lines = [
        f"device : {where}",
        f"kernels: {mode}",
        f"torch  : {p.torch_version}   triton: {p.triton_version or 'not installed'}",
        f"aiter  : {aiter_status()}",
        f"vllm   : {vllm_status()}",
    ]
    return "\n".join(lines)
