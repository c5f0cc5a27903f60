"""MLA decode over flat per-token indices: references, the Triton and Gluon kernels, the launch policy, the aiter
adapter and one entry point over them.

Absorbed MLA (DeepSeek-V2/V3, Kimi-K2): the KV cache holds one row of ``D = 576`` values per token, a 512-value
latent ``c`` plus 64 rotary values ``k_rope``. After the key/value up-projections are absorbed into the query and
the output projection, every head attends over the *same* rows:

* ``K = row[:, :576]`` (latent and rope together), ``V = row[:, :512]`` (the latent alone);
* ``q`` is ``(total_q, H, 576)``, the output ``(total_q, H, 512)``;
* ``out[t, h] = softmax(q[t, h] . K^T * sm_scale) V`` over the request's keys, with, for a request of ``s_q``
  query tokens and ``s_k`` keys, query ``i`` seeing keys ``0 .. s_k - s_q + i`` (a bottom-right-aligned causal
  mask: the query tokens are the last ``s_q`` tokens of the cache);
* ``lse[t, h] = log(sum(exp(scores)))`` (natural log, scores already scaled).

The cache is addressed with page size 1 (aiter's convention; vLLM passes ``kv_cache.view(-1, 1, 1, 576)``):
``kv_indices[kv_indptr[b] : kv_indptr[b+1]]`` are the cache rows of request ``b`` in token order.

The modules, in the order chapter 3 introduces them (each has one job):

* :mod:`~workbench.mla.inputs`: the dimensions and the input rules every backend applies;
* :mod:`~workbench.mla.ref`: :func:`mla_decode_ref` (fp32 golden), :func:`mla_decode_paged_ref`,
  :func:`mla_decode_torch` (the same in the input precision);
* :mod:`~workbench.mla.triton_kernels`: the split-KV kernel and the merge of its splits;
* :mod:`~workbench.mla.gluon`, :mod:`~workbench.mla.gluon_ws`, :mod:`~workbench.mla.gluon_swap`: the Hopper
  kernels (imported only when launched); :mod:`~workbench.mla.tile_rates`: the tensor-core rate of their tile's
  two products by tile width (a benchmark's kernels);
* :mod:`~workbench.mla.policy`: :class:`TritonConfig`, the tuned tables, the split count;
* :mod:`~workbench.mla.launch`: :func:`mla_decode_triton`, the host side of all of them;
* :mod:`~workbench.mla.aiter`: :func:`mla_decode_aiter` (ROCm);
* :mod:`~workbench.mla.dispatch`: :func:`mla_decode` over ``"auto" | "triton" | "torch" | "aiter"``;
* :mod:`~workbench.mla.examples`: aiter #2996's failure with the golden, and :func:`make_decode_example`.
"""

from workbench.mla.aiter import AITER_HEADS, aiter_unsupported_reasons, mla_decode_aiter
from workbench.mla.dispatch import BACKENDS, INTERPRETER_MAX_WORK, DecodeOutput, choose_backend, mla_decode
from workbench.mla.examples import DecodeExample, PageIndexMistake, demo_page_indices_as_token_indices, make_decode_example
from workbench.mla.inputs import (KV_LORA_RANK, MAX_QLEN, QK_HEAD_DIM, QK_ROPE_HEAD_DIM, check_indptr, check_values,
                                  flat_cache)
from workbench.mla.launch import (SHARED_MEMORY_FALLBACKS, compiled_kernel_report, merge_programs, mla_decode_triton,
                                  triton_launch_plan)
from workbench.mla.policy import (KERNELS, TritonConfig, choose_num_splits, default_splits, interpreter_config,
                                  partial_dtype, shared_memory_ladder, table_config, triton_config, tuned_table)
from workbench.mla.ref import (GoldenCheck, check_against_golden, default_sm_scale, mla_decode_paged_ref,
                               mla_decode_ref, mla_decode_torch, tolerance)

__all__ = [
    "AITER_HEADS", "BACKENDS", "GoldenCheck", "check_against_golden", "tolerance", "INTERPRETER_MAX_WORK", "KERNELS", "KV_LORA_RANK", "MAX_QLEN", "QK_HEAD_DIM",
    "QK_ROPE_HEAD_DIM", "SHARED_MEMORY_FALLBACKS", "DecodeExample", "DecodeOutput", "PageIndexMistake",
    "TritonConfig", "aiter_unsupported_reasons", "check_indptr", "check_values", "choose_backend",
    "choose_num_splits", "compiled_kernel_report", "default_sm_scale", "default_splits",
    "demo_page_indices_as_token_indices", "flat_cache", "interpreter_config", "make_decode_example", "merge_programs",
    "mla_decode", "mla_decode_aiter", "mla_decode_paged_ref", "mla_decode_ref", "mla_decode_torch",
    "mla_decode_triton", "partial_dtype", "shared_memory_ladder", "table_config", "triton_config", "triton_launch_plan",
    "tuned_table",
]
