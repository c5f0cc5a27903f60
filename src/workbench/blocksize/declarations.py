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
* ``class_path``: where vLLM defines the class, relative to ``vllm.v1.attention.backends.``;
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
}

# Backends that override get_preferred_block_size(): the --block-size they ask for when none is given.
PREFERRED: dict[str, dict[str, int]] = {
    "0.19": {"ROCM_AITER_UNIFIED_ATTN": 64},
    "0.20": {"ROCM_AITER_UNIFIED_ATTN": 64},
}

# What changed the declarations of a release against the one before it (shown by catalog_table).
CHANGED_BY: dict[str, str] = {"0.20": "PR #39616"}
