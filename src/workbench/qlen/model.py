"""A tiny MLA language model, the target of the speculative-decoding demo.

:class:`TinyMLA` is a seeded, random-weight decoder whose attention is absorbed MLA decode over a paged
cache, through :func:`workbench.qlen.decode` with a selectable backend (the emulated fault included).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from workbench import device, mla
from workbench.pow2 import check_count as _check_count
from workbench.qlen._shared import flat_metadata
from workbench.qlen.fault import decode

__all__ = ["ForwardOutput", "KVState", "TinyMLA", "TinyMLAConfig"]


@dataclasses.dataclass(frozen=True)
class TinyMLAConfig:
    """Shape of :class:`TinyMLA`. The cache row is fixed at 576 = 512 latent + 64 rope: the decode entry
    point (:func:`workbench.mla.mla_decode`) fixes V's width at 512, and the Triton kernel and aiter need
    rows of exactly 576, so a narrower latent would leave the Triton path out."""

    vocab_size: int = 64
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    mlp_mult: int = 4
    kernel_block_size: int = 16
    attn_gain: float = 1.5  # scales the attention output so that the context matters to the prediction
    pos_scale: float = 1.0  # scale of the learned-style absolute position embedding added to the input
    max_positions: int = 512
    sm_scale: float = 0.08  # softmax scale of the decode (aiter's default 1/sqrt(576) is 0.042)
    rope_theta: float = 10000.0
    dtype: torch.dtype = torch.float32  # dtype of q and of the cache (fp16/fp32 under the interpreter)
    seed: int = 0


def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE. ``x`` ``(..., 64)``, ``pos`` broadcastable to ``x.shape[:-1]`` (token positions)."""
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    ang = pos.to(torch.float32)[..., None] * inv  # (..., 32)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@dataclasses.dataclass
class KVState:
    """Per-request KV cache of :class:`TinyMLA`: one ``[num_blocks * K, 576]`` tensor per layer (unused
    rows NaN), a block table ``(num_reqs, max_blocks) int32`` (block 0 reserved, blocks permuted) and
    ``seq_lens`` (host ints: tokens committed to the cache per request)."""

    caches: list[torch.Tensor]
    block_table: torch.Tensor
    seq_lens: list[int]
    kernel_block_size: int

    @property
    def capacity(self) -> int:
        return self.block_table.shape[1] * self.kernel_block_size


@dataclasses.dataclass
class ForwardOutput:
    """``logits`` ``(R, s, V)`` fp32; ``hidden`` ``(R, s, d)`` final hidden states (before the head);
    ``attn`` one ``(R, s, d)`` attention output per layer (after the absorbed output projection)."""

    logits: torch.Tensor
    hidden: torch.Tensor
    attn: list[torch.Tensor]


class TinyMLA:
    """A seeded, random-weight decoder whose attention is absorbed MLA decode through :func:`decode`.

    Per layer (pre-norm residual): ``h = rms(x)``; the cache row of a token is ``[h W_dkv (512),
    rope(h W_kr) (64)]``; each head's query is ``[h W_q (512, the absorbed no-rope part), rope(h W_qr)
    (64)]``; the decode returns each head's weighted sum of latents ``(512)``, mapped back to the model
    width by the absorbed output projection ``W_o`` (all heads concatenated); then a ReLU MLP. A final
    RMS norm and an untied head give the logits. Weights are ``N(0, 1/fan_in)`` from ``config.seed``.
    Everything runs on :func:`workbench.device.default_device`.
    """

    def __init__(self, config: TinyMLAConfig = TinyMLAConfig()):
        c = self.config = config
        _check_count("vocab_size", c.vocab_size, 2)
        _check_count("num_heads", c.num_heads, 1)
        _check_count("num_layers", c.num_layers, 1)
        if c.dtype == torch.bfloat16 and device.interpreter_active():
            device.check_kernel_dtype(c.dtype, "config.dtype")
        self.device = device.default_device()
        g = torch.Generator().manual_seed(c.seed)
        d, H, L, R = c.d_model, c.num_heads, mla.KV_LORA_RANK, mla.QK_ROPE_HEAD_DIM

        def w(*shape: int, fan_in: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / math.sqrt(fan_in)).to(self.device)

        self.embed = torch.randn(c.vocab_size, d, generator=g).to(self.device)
        self.pos_embed = (c.pos_scale * torch.randn(c.max_positions, d, generator=g)).to(self.device)
        self.layers = [dict(
            w_dkv=w(d, L, fan_in=d), w_kr=w(d, R, fan_in=d), w_q=w(d, H, L, fan_in=d), w_qr=w(d, H, R, fan_in=d),
            w_o=w(H * L, d, fan_in=H * L), w_1=w(d, c.mlp_mult * d, fan_in=d),
            w_2=w(c.mlp_mult * d, d, fan_in=c.mlp_mult * d),
        ) for _ in range(c.num_layers)]
        self.head = w(d, c.vocab_size, fan_in=d)

    # -- cache --------------------------------------------------------------------------------
    def new_state(self, num_reqs: int, max_tokens: int, *, seed: int = 0) -> KVState:
        """An empty cache for ``num_reqs`` requests of up to ``max_tokens`` tokens each."""
        _check_count("num_reqs", num_reqs, 1)
        _check_count("max_tokens", max_tokens, 1)
        K = self.config.kernel_block_size
        per_req = -(-max_tokens // K)
        num_blocks = 1 + num_reqs * per_req
        g = torch.Generator().manual_seed(seed)
        perm = 1 + torch.randperm(num_blocks - 1, generator=g)
        block_table = perm.view(num_reqs, per_req).to(torch.int32).to(self.device)
        caches = [torch.full((num_blocks * K, mla.QK_HEAD_DIM), float("nan"), dtype=self.config.dtype,
                             device=self.device) for _ in range(self.config.num_layers)]
        return KVState(caches, block_table, [0] * num_reqs, K)

    # -- the target ---------------------------------------------------------------------------
    def forward(self, state: KVState, req_ids: Sequence[int], tokens: torch.Tensor, *, backend: str = "torch",
                pad_to_pow2: bool = False) -> ForwardOutput:
        """Run ``tokens`` ``(R, s)`` (int64) as the next ``s`` tokens of requests ``req_ids``: writes their
        cache rows at positions ``seq_lens[r] .. seq_lens[r] + s - 1`` and attends over everything up to
        each token (one MLA decode call per layer with ``max_qo_len = s``). Does not advance ``seq_lens``:
        the caller commits what it keeps (rejected drafts' rows are overwritten later)."""
        req_ids = list(req_ids)
        R, s = tokens.shape
        if R != len(req_ids):
            raise ValueError(f"tokens has {R} rows but req_ids has {len(req_ids)} entries; one row per request")
        c, K = self.config, state.kernel_block_size
        start = torch.tensor([state.seq_lens[r] for r in req_ids], device=self.device)
        if int(start.max()) + s > state.capacity:
            raise ValueError(f"a request would hold {int(start.max()) + s} tokens but the cache holds "
                             f"{state.capacity} per request; make new_state(max_tokens=...) larger")
        pos = start[:, None] + torch.arange(s, device=self.device)  # (R, s)
        bt = state.block_table[req_ids]  # (R, max_blocks)
        slots = (bt.gather(1, pos // K).long() * K + pos % K).flatten()  # (R*s,) cache rows
        md = flat_metadata(bt, [state.seq_lens[r] + s for r in req_ids], [s] * R, K)
        if int(pos.max()) >= c.max_positions:
            raise ValueError(f"position {int(pos.max())} is beyond config.max_positions {c.max_positions}")
        x = self.embed[tokens] + self.pos_embed[pos]  # (R, s, d)
        attn = []
        for layer, cache in zip(self.layers, state.caches):
            h = _rms_norm(x)
            row = torch.cat([h @ layer["w_dkv"], _rope(h @ layer["w_kr"], pos, c.rope_theta)], dim=-1)
            cache[slots] = row.reshape(R * s, -1).to(cache.dtype)
            q_lat = torch.einsum("rsd,dhl->rshl", h, layer["w_q"])
            q_rope = _rope(torch.einsum("rsd,dhe->rshe", h, layer["w_qr"]), pos[:, :, None], c.rope_theta)
            q = torch.cat([q_lat, q_rope], dim=-1).reshape(R * s, c.num_heads, -1).to(c.dtype).contiguous()
            res = decode(q, cache, md, sm_scale=c.sm_scale, backend=backend, pad_to_pow2=pad_to_pow2)
            a = (res.out.float().reshape(R, s, -1) @ layer["w_o"]) * c.attn_gain
            attn.append(a)
            x = self._after_attention(layer, x, a)
        hidden = _rms_norm(x)
        return ForwardOutput(hidden @ self.head, hidden, attn)

    def _after_attention(self, layer: dict, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = x + a
        return x + torch.relu(_rms_norm(x) @ layer["w_1"]) @ layer["w_2"]

    def forward_frozen(self, tokens: torch.Tensor, positions: torch.Tensor,
                       attn: Sequence[torch.Tensor]) -> torch.Tensor:
        """The token-local part of the model with each layer's attention output given: ``tokens`` and
        ``positions`` ``(R,)``, ``attn`` one ``(R, d)`` per layer -> final hidden ``(R, d)``. No cache is
        read or written."""
        x = self.embed[tokens] + self.pos_embed[positions]
        for layer, a in zip(self.layers, attn):
            x = self._after_attention(layer, x, a)
        return _rms_norm(x)
