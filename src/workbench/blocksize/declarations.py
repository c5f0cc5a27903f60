"""The declared kernel block sizes of vLLM's attention backends, one table per vLLM release.

Plain data, read by :mod:`workbench.blocksize.catalog`. Each table was read from the sources of the
released wheel (``vllm/v1/attention/backends/``). A backend without its own declaration inherits its
base class's: ``AttentionBackend``'s default ``[MultipleOf(1)]``, or its parent backend's.

To add a release: copy the newest table under the new version key, edit the rows that changed, and
add the backends that ``get_preferred_block_size()`` overrides to :data:`PREFERRED`.

A row: ``(name, sizes, kind, class_path, platform, reported_name, note)``:

* ``name``: the registry name (``AttentionBackendEnum`` member, what ``--attention-backend`` takes);
* ``sizes``: the declaration in the notation of vLLM's docs (``"%16"``, ``"16, 32, 64"``);
* ``kind``: ``"mla"`` (its layers have MLA specs) or ``"full"`` (standard attention);
* ``class_path``: where vLLM defines the class, relative to ``vllm.v1.attention.backends.`` (or a full
  ``vllm.``-path for classes that live elsewhere, e.g. under ``vllm.models``);
* ``platform``: ``"cuda"``, ``"rocm"``, ``"cpu"`` or ``"any"`` (informational);
* ``reported_name``: what the class's ``get_name()`` returns when it differs from ``name``, else ``None``;
* ``note``: provenance or caveat.
"""

from __future__ import annotations

CLASS_PREFIX = "vllm.v1.attention.backends."

DECLARED: dict[str, tuple[tuple, ...]] = {
    # vLLM v0.19.1, before PR #39616.
    "0.19": (
        ("FLASH_ATTN", "%16", "full", "flash_attn.FlashAttentionBackend", "cuda", None,
         "16, 32, 64 instead for hybrid models with a float32 Mamba cache"),
        ("FLASHINFER", "16, 32, 64", "full", "flashinfer.FlashInferBackend", "cuda", None, ""),
        ("TRITON_ATTN", "%16", "full", "triton_attn.TritonAttentionBackend", "any", None, ""),
        ("TREE_ATTN", "%16", "full", "tree_attn.TreeAttentionBackend", "any", None, ""),
        ("FLEX_ATTENTION", "%1", "full", "flex_attention.FlexAttentionBackend", "any", None,
         "inherits the base class default"),
        ("FLASH_ATTN_DIFFKV", "%16", "full", "flash_attn_diffkv.FlashAttentionDiffKVBackend", "cuda", None,
         "inherits FLASH_ATTN's declaration"),
        ("CPU_ATTN", "%1", "full", "cpu_attn.CPUAttentionBackend", "cpu", None, "inherits the base class default"),
        ("ROCM_ATTN", "%16", "full", "rocm_attn.RocmAttentionBackend", "rocm", None, ""),
        ("ROCM_AITER_FA", "16, 32", "full", "rocm_aiter_fa.AiterFlashAttentionBackend", "rocm", "FLASH_ATTN",
         "the class's get_name() returns 'FLASH_ATTN'"),
        ("ROCM_AITER_UNIFIED_ATTN", "%16", "full", "rocm_aiter_unified_attn.RocmAiterUnifiedAttentionBackend",
         "rocm", None, "asks for --block-size 64 when none is given"),
        ("FLASHMLA", "64", "mla", "mla.flashmla.FlashMLABackend", "cuda", None, ""),
        ("FLASHMLA_SPARSE", "64", "mla", "mla.flashmla_sparse.FlashMLASparseBackend", "cuda", None, ""),
        ("FLASH_ATTN_MLA", "%16", "mla", "mla.flashattn_mla.FlashAttnMLABackend", "cuda", None, ""),
        ("CUTLASS_MLA", "128", "mla", "mla.cutlass_mla.CutlassMLABackend", "cuda", None, ""),
        ("TRITON_MLA", "%16", "mla", "mla.triton_mla.TritonMLABackend", "any", None, ""),
        ("FLASHINFER_MLA", "32, 64", "mla", "mla.flashinfer_mla.FlashInferMLABackend", "cuda", None, ""),
        ("ROCM_AITER_MLA", "1", "mla", "mla.rocm_aiter_mla.AiterMLABackend", "rocm", None,
         "declared [1] before PR #39616"),
        ("ROCM_AITER_TRITON_MLA", "1", "mla", "mla.aiter_triton_mla.AiterTritonMLABackend", "rocm",
         "AITER_TRITON_MLA", "inherits ROCM_AITER_MLA's declaration"),
        ("ROCM_AITER_MLA_SPARSE", "1", "mla", "mla.rocm_aiter_mla_sparse.ROCMAiterMLASparseBackend", "rocm", None, ""),
    ),
    # vLLM v0.20.0: PR #39616 changed ROCM_AITER_MLA (and the subclass that inherits it); TURBOQUANT is new.
    "0.20": (
        ("FLASH_ATTN", "%16", "full", "flash_attn.FlashAttentionBackend", "cuda", None,
         "16, 32, 64 instead for hybrid models with a float32 Mamba cache"),
        ("FLASHINFER", "16, 32, 64", "full", "flashinfer.FlashInferBackend", "cuda", None, ""),
        ("TRITON_ATTN", "%16", "full", "triton_attn.TritonAttentionBackend", "any", None, ""),
        ("TREE_ATTN", "%16", "full", "tree_attn.TreeAttentionBackend", "any", None, ""),
        ("FLEX_ATTENTION", "%1", "full", "flex_attention.FlexAttentionBackend", "any", None,
         "inherits the base class default"),
        ("FLASH_ATTN_DIFFKV", "%16", "full", "flash_attn_diffkv.FlashAttentionDiffKVBackend", "cuda", None,
         "inherits FLASH_ATTN's declaration"),
        ("CPU_ATTN", "%1", "full", "cpu_attn.CPUAttentionBackend", "cpu", None, "inherits the base class default"),
        ("TURBOQUANT", "16, 32, 64, 128", "full", "turboquant_attn.TurboQuantAttentionBackend", "any", None,
         "new in v0.20.0"),
        ("ROCM_ATTN", "%16", "full", "rocm_attn.RocmAttentionBackend", "rocm", None, ""),
        ("ROCM_AITER_FA", "16, 32", "full", "rocm_aiter_fa.AiterFlashAttentionBackend", "rocm", "FLASH_ATTN",
         "the class's get_name() returns 'FLASH_ATTN'"),
        ("ROCM_AITER_UNIFIED_ATTN", "%16", "full", "rocm_aiter_unified_attn.RocmAiterUnifiedAttentionBackend",
         "rocm", None, "asks for --block-size 64 when none is given"),
        ("FLASHMLA", "64", "mla", "mla.flashmla.FlashMLABackend", "cuda", None, ""),
        ("FLASHMLA_SPARSE", "64", "mla", "mla.flashmla_sparse.FlashMLASparseBackend", "cuda", None, ""),
        ("FLASH_ATTN_MLA", "%16", "mla", "mla.flashattn_mla.FlashAttnMLABackend", "cuda", None, ""),
        ("CUTLASS_MLA", "128", "mla", "mla.cutlass_mla.CutlassMLABackend", "cuda", None, ""),
        ("TRITON_MLA", "%16", "mla", "mla.triton_mla.TritonMLABackend", "any", None, ""),
        ("FLASHINFER_MLA", "32, 64", "mla", "mla.flashinfer_mla.FlashInferMLABackend", "cuda", None, ""),
        ("ROCM_AITER_MLA", "%1", "mla", "mla.rocm_aiter_mla.AiterMLABackend", "rocm", None,
         "PR #39616 changed [1] to [MultipleOf(1)]"),
        ("ROCM_AITER_TRITON_MLA", "%1", "mla", "mla.aiter_triton_mla.AiterTritonMLABackend", "rocm",
         "AITER_TRITON_MLA", "inherits ROCM_AITER_MLA's declaration"),
        ("ROCM_AITER_MLA_SPARSE", "1", "mla", "mla.rocm_aiter_mla_sparse.ROCMAiterMLASparseBackend", "rocm", None, ""),
    ),
    # vLLM 0.33.0 (the release .venv-vllm installs), read from its classes by
    # `.venv-vllm/bin/python` (the conformance test re-reads them: tests/test_blocksize_vllm_conformance.py).
    # TREE_ATTN is gone from the registry; many backends are new.
    "0.33": (
        ("FLASH_ATTN", "%16", "full", "flash_attn.FlashAttentionBackend",
         "cuda", None, "16, 32, 64 instead for hybrid models with a float32 Mamba cache"),
        ("FLASH_ATTN_DIFFKV", "%16", "full", "flash_attn_diffkv.FlashAttentionDiffKVBackend",
         "cuda", None, "inherits FLASH_ATTN's declaration"),
        ("TRITON_ATTN", "%16", "full", "triton_attn.TritonAttentionBackend", "any", None, ""),
        ("TRITON_ATTN_DIFFKV", "%16", "full", "triton_attn_diffkv.TritonAttentionDiffKVBackend",
         "any", None, "new after v0.20.0"),
        ("TRITON_FLASH_ATTN", "%16", "full", "triton_flash_attn.TritonFlashAttentionBackend",
         "any", None, "new after v0.20.0"),
        ("ROCM_ATTN", "%16", "full", "rocm_attn.RocmAttentionBackend", "rocm", None, ""),
        ("ROCM_SEGMENTED_ATTN", "%16", "full", "rocm_segmented_attn.RocmSegmentedAttentionBackend",
         "rocm", None, "new after v0.20.0"),
        ("ROCM_AITER_MLA", "%1", "mla", "mla.rocm_aiter_mla.AiterMLABackend",
         "rocm", None, "PR #39616 changed [1] to [MultipleOf(1)]"),
        ("ROCM_AITER_TRITON_MLA", "%1", "mla", "mla.aiter_triton_mla.AiterTritonMLABackend",
         "rocm", "AITER_TRITON_MLA", "inherits ROCM_AITER_MLA's declaration"),
        ("ROCM_AITER_FA", "16, 32", "full", "rocm_aiter_fa.AiterFlashAttentionBackend",
         "rocm", "FLASH_ATTN", "the class's get_name() returns 'FLASH_ATTN'"),
        ("ROCM_AITER_MLA_SPARSE", "1, %16", "mla", "mla.rocm_aiter_mla_sparse.ROCMAiterMLASparseBackend",
         "rocm", None, "was 1 in v0.20.0"),
        ("XPU_MLA_SPARSE", "%1", "mla", "mla.xpu_mla_sparse.XPUMLASparseBackend",
         "any", None, "new after v0.20.0; Intel XPU"),
        ("FLASHINFER", "16, 32, 64", "full", "flashinfer.FlashInferBackend", "cuda", None, ""),
        ("TRITON_FLASHINFER", "64", "full", "triton_flashinfer.TritonFlashInferBackend",
         "cuda", None, "new after v0.20.0"),
        ("FLASHINFER_MLA", "32, 64", "mla", "mla.flashinfer_mla.FlashInferMLABackend", "cuda", None, ""),
        ("TOKENSPEED_MLA", "32, 64", "mla", "mla.tokenspeed_mla.TokenspeedMLABackend",
         "cuda", None, "new after v0.20.0"),
        ("FLASHINFER_MLA_SPARSE", "%32", "mla", "mla.flashinfer_mla_sparse.FlashInferMLASparseTRTLLMBackend",
         "cuda", None, "new after v0.20.0"),
        ("FLASHINFER_MLA_SPARSE_SM120", "%64", "mla", "mla.flashinfer_mla_sparse.FlashInferMLASparseSM120Backend",
         "cuda", None, "new after v0.20.0"),
        ("FLASHINFER_MLA_SPARSE_SM90", "%64", "mla", "mla.flashinfer_mla_sparse_sm90.FlashInferMLASparseSM90Backend",
         "cuda", None, "new after v0.20.0"),
        ("TRITON_MLA", "%16", "mla", "mla.triton_mla.TritonMLABackend", "any", None, ""),
        ("FLASHMLA", "64", "mla", "mla.flashmla.FlashMLABackend", "cuda", None, ""),
        ("FLASHMLA_SPARSE", "%64", "mla", "mla.flashmla_sparse.FlashMLASparseBackend",
         "cuda", None, "was 64 in v0.20.0"),
        ("FLASHMLA_SPARSE_DSV4", "256", "mla", "vllm.models.deepseek_v4.sparse_mla.DeepseekV4FlashMLABackend",
         "cuda", None, "new after v0.20.0"),
        ("FLASHINFER_MLA_SPARSE_DSV4", "256", "mla",
         "vllm.models.deepseek_v4.nvidia.flashinfer_sparse.DeepseekV4FlashInferMLASparseBackend",
         "cuda", None, "new after v0.20.0"),
        ("FLASHMLA_SPARSE_DSV41", "128", "mla", "vllm.models.deepseek_v41.sparse_mla.DeepseekV4FlashMLABackend",
         "cuda", None, "new after v0.20.0"),
        ("FLASHINFER_MLA_SPARSE_DSV41", "128", "mla",
         "vllm.models.deepseek_v41.nvidia.flashinfer_sparse.DeepseekV4FlashInferMLASparseBackend",
         "cuda", None, "new after v0.20.0"),
        ("FLASHMLA_MEGA_ATTN_DSV41", "128", "mla", "vllm.models.deepseek_v41.sparse_mla.FlashMLAMegaAttnBackend",
         "cuda", None, "new after v0.20.0"),
        ("B12X", "64, 128", "full", "b12x.B12xPagedAttentionBackend", "cuda", None, "new after v0.20.0"),
        ("FLASH_ATTN_MLA_SPARSE", "%64", "mla", "mla.flashattn_mla_sparse.FlashAttnMLASparseBackend",
         "cuda", None, "new after v0.20.0"),
        ("FLASH_ATTN_MLA_SPARSE_FA4", "%64", "mla", "mla.flashattn_mla_sparse.FlashAttnMLASparseFA4Backend",
         "cuda", None, "new after v0.20.0"),
        ("CUTLASS_MSA", "128", "full",
         "vllm.models.minimax_m3.nvidia.sparse_attention_msa.MiniMaxM3SparseCutlassBackend",
         "cuda", None, "new after v0.20.0"),
        ("TRITON_MSA", "128", "full",
         "vllm.models.minimax_m3.nvidia.sparse_attention_msa.MiniMaxM3SparseTritonBackend",
         "any", None, "new after v0.20.0"),
        ("FLEX_ATTENTION", "%16", "full", "flex_attention.FlexAttentionBackend", "any", None, "was %1 in v0.20.0"),
        ("HPC_ATTN", "64", "full", "hpc_attn.HpcAttentionBackend", "cuda", None, "new after v0.20.0"),
        ("CPU_ATTN", "%32", "full", "cpu_attn.CPUAttentionBackend", "cpu", None, "was %1 in v0.20.0"),
        ("CPU_MLA", "16", "mla", "mla.cpu_mla.CPUMLABackend", "cpu", None, "new after v0.20.0"),
        ("AMX_MLA", "%32", "mla", "mla.amx_mla.AMXMLABackend", "cpu", None, "new after v0.20.0"),
        ("TURBOQUANT", "16, 32, 64, 128", "full", "turboquant_attn.TurboQuantAttentionBackend",
         "any", None, "new in v0.20.0"),
        ("ROCM_OCTAVE", "%16", "full", "rocm_octave_attn.RocmOctaveAttentionBackend",
         "rocm", None, "new after v0.20.0"),
        # Their classes do not import on this CPU-only environment (they need CUDA, ROCm or a left-out
        # package at import): read from the wheel's source, each class's get_supported_kernel_block_sizes.
        ("CUTLASS_MLA", "128", "mla", "mla.cutlass_mla.CutlassMLABackend",
         "cuda", None, "read from the source (needs CUDA to import)"),
        ("FLASH_ATTN_MLA", "%16", "mla", "mla.flashattn_mla.FlashAttnMLABackend",
         "cuda", None, "read from the source (needs the CUDA flash-attn build to import)"),
        ("ROCM_AITER_UNIFIED_ATTN", "%16", "full", "rocm_aiter_unified_attn.RocmAiterUnifiedAttentionBackend",
         "rocm", None, "asks for --block-size 64 when none is given; read from the source (needs ROCm to import)"),
        ("MINIMAX_M3_SPARSE", "128", "full", "vllm.models.minimax_m3.common.sparse_attention.MiniMaxM3SparseBackend",
         "cuda", None,
         "new after v0.20.0; read from the source (its module needs torchvision, which the CPU environment "
         "leaves out; it imports only when another module has loaded what it needs)"),
        ("ROCM_FLASHMLA_SPARSE_DSV41", "64, 128", "mla",
         "vllm.models.deepseek_v41.amd.rocm.DeepseekV41ROCMAiterMLASparseBackend",
         "rocm", None, "new after v0.20.0; read from the source (needs ROCm to import)"),
    ),
}

# Backends that override get_preferred_block_size(): the --block-size they ask for when none is given.
PREFERRED: dict[str, dict[str, int]] = {
    "0.19": {"ROCM_AITER_UNIFIED_ATTN": 64},
    "0.20": {"ROCM_AITER_UNIFIED_ATTN": 64},
    # B12X asks for 128 unless the default is one of its page sizes; FLASH_ATTN's override changes the
    # answer only on FA4/XPU configurations, not for the default 16.
    "0.33": {"ROCM_AITER_UNIFIED_ATTN": 64, "B12X": 128},
}

# What changed the declarations of a release against the one before it (shown by catalog_table).
CHANGED_BY: dict[str, str] = {"0.20": "PR #39616", "0.33": "vLLM releases after v0.20.0"}
