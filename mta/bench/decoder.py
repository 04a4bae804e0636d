"""The decoder-only language model that ``python -m mta.bench model`` times: :class:`Decoder`.

A pre-norm stack of :class:`Block` (RMSNorm, attention, RMSNorm, SwiGLU MLP, residuals), a token embedding, a final
RMSNorm and a head tied to the embedding (``logits = h @ embed.weight.T``). Three variants share everything but the
attention module:

* ``"mta"``: :class:`mta.MultiTokenAttention` with ``kernel_size`` (6 x 11) in the layers of
  :meth:`DecoderConfig.mta_layer_indices`, ``(1, 1)`` (plain causal attention through mta's flash and decode
  kernels) in the others;
* ``"plain_ours"``: ``kernel_size=(1, 1)`` in every layer;
* ``"plain_sdpa"``: :class:`SDPAAttention` in every layer, the same projections and RoPE around
  ``torch.nn.functional.scaled_dot_product_attention``, decoding from a static :class:`SDPACache`.

The MTA layers: every fourth, from index 2 (0-based: 2, 6, 10 of 12), as the MTA authors' public training configs
place them (``mta_layers: "2,6,10,14,18"`` of 20 layers); their configs also tie the head to the embedding and use
RoPE base 100000, as here. The MLP's hidden width, 2816, is ``2/3 * 4 * dim`` rounded up to a multiple of 256
(Llama's rule, which those configs follow).

Built under one seed, the three variants have the same weights: they create their parameters in the same order,
and the MTA kernel (``conv_weight``, the identity at init) draws no random numbers.

Generation: :meth:`Decoder.new_caches` (one cache per layer: :class:`mta.KVCache` for mta's layers,
:class:`SDPACache` for SDPA's), :meth:`Decoder.prefill` on the prompt, then :meth:`Decoder.next_tokens` per decode
step (greedy, on the device: no host synchronisation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from mta import MultiTokenAttention
from mta.rope import rope_rotation, rotate

VARIANTS = ("mta", "plain_ours", "plain_sdpa")
EMBED_STD = 0.02  # of the embedding (and so the tied head): logits of about unit scale after the final RMSNorm


@dataclass(frozen=True)
class DecoderConfig:
    """The model: ``layers`` blocks of width ``dim``, ``heads`` query and ``kv_heads`` key/value heads (GQA),
    an MLP of hidden width ``ffn_dim``, ``vocab`` tokens. ``mta_layers``: the indices of the MTA layers of the
    ``"mta"`` variant (None: every fourth from index 2)."""

    vocab: int = 32000
    dim: int = 1024
    layers: int = 12
    heads: int = 16
    kv_heads: int = 4
    ffn_dim: int = 2816
    kernel_size: tuple[int, int] = (6, 11)
    mta_layers: Optional[tuple[int, ...]] = None
    rope_theta: float = 100_000.0
    norm_eps: float = 1e-5

    def mta_layer_indices(self) -> tuple[int, ...]:
        """The indices of the MTA layers, checked to lie in ``0 .. layers - 1``."""
        indices = tuple(range(2, self.layers, 4)) if self.mta_layers is None else tuple(self.mta_layers)
        if any(not 0 <= i < self.layers for i in indices):
            raise ValueError(f"mta_layers must lie in 0 .. {self.layers - 1}, got {indices}")
        return indices

    def parameters(self) -> int:
        """Parameters of the plain model (the tied head counted once; MTA adds ``heads * cq * ck`` per MTA layer)."""
        head_dim = self.dim // self.heads
        attention = self.dim * head_dim * 2 * (self.heads + self.kv_heads)
        block = attention + 3 * self.dim * self.ffn_dim + 2 * self.dim
        return self.vocab * self.dim + self.layers * block + self.dim


# --- SDPA attention and its static cache ----------------------------------------------------------------------

@dataclass(eq=False)
class SDPACache:
    """A static KV cache for :class:`SDPAAttention`: ``k, v [B, Hkv, Nmax, D]`` and ``lengths [B]`` int64 on the
    cache's device, so that a decode step is fixed-shape device work (CUDA-graph capturable)."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def empty(cls, batch: int, max_len: int, num_kv_heads: int, head_dim: int, *, dtype: torch.dtype,
              device=None) -> "SDPACache":
        def buffer():
            return torch.zeros(batch, num_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        return cls(k=buffer(), v=buffer(), lengths=torch.zeros(batch, dtype=torch.int64, device=device))

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


class SDPAAttention(nn.Module):
    """Causal GQA attention with RoPE through ``F.scaled_dot_product_attention``, with the parameters of
    :class:`mta.MultiTokenAttention` (``q_proj [H D, dim]``, ``k_proj``, ``v_proj [Hkv D, dim]``,
    ``o_proj [dim, H D]``, bias-free, created in that order), so the two load each other's state dicts.

    ``forward(x [B, N, dim])``: ``is_causal`` and ``enable_gqa``. :meth:`prefill` also fills an empty
    :class:`SDPACache`; :meth:`step` appends one token per sequence at its device-side length and attends over the
    whole static cache with a length mask.
    """

    def __init__(self, dim: int, num_heads: int, *, num_kv_heads: Optional[int] = None, rope_theta: float):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"need dim % num_heads == 0 and num_heads % num_kv_heads == 0, got dim={dim}, "
                             f"num_heads={num_heads}, num_kv_heads={num_kv_heads}")
        self.dim, self.num_heads, self.num_kv_heads = dim, num_heads, num_kv_heads
        self.head_dim, self.rope_theta = dim // num_heads, rope_theta
        self.q_proj = nn.Linear(dim, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.head_dim, dim, bias=False)

    def _project(self, x: torch.Tensor, positions: torch.Tensor):
        """``x [B, n, dim]`` -> ``q [B, H, n, D]``, ``k, v [B, Hkv, n, D]``, RoPE at ``positions`` (``[n]`` or
        ``[B, n]``), in one dtype."""
        B, n, _ = x.shape
        q = self.q_proj(x).view(B, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        rotation = rope_rotation(q, positions, self.rope_theta)  # as mta.MultiTokenAttention: one for q and k
        q, k = rotate(q, rotation), rotate(k, rotation)
        return q, k.to(q.dtype), v.to(q.dtype)

    def _merge_heads(self, o: torch.Tensor) -> torch.Tensor:
        B, _, n, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, n, self.num_heads * self.head_dim))

    def _causal(self, x: torch.Tensor):
        q, k, v = self._project(x, torch.arange(x.shape[1], device=x.device))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.num_heads != self.num_kv_heads)
        return o, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, N, dim]`` -> ``[B, N, dim]``, causal."""
        return self._merge_heads(self._causal(x)[0])

    def new_cache(self, batch: int, max_len: int, *, dtype: Optional[torch.dtype] = None, device=None) -> SDPACache:
        weight = self.q_proj.weight
        return SDPACache.empty(batch, max_len, self.num_kv_heads, self.head_dim, dtype=dtype or weight.dtype,
                               device=device or weight.device)

    def prefill(self, x: torch.Tensor, cache: SDPACache) -> torch.Tensor:
        """The causal layer on a prompt ``x [B, N, dim]``; its keys and values fill positions ``0 .. N-1``."""
        N = x.shape[1]
        if N > cache.max_len:
            raise ValueError(f"a prompt of {N} tokens does not fit a cache of {cache.max_len} positions")
        o, k, v = self._causal(x)
        cache.k[:, :, :N] = k.detach()
        cache.v[:, :, :N] = v.detach()
        cache.lengths.fill_(N)
        return self._merge_heads(o)

    @torch.no_grad()
    def step(self, x: torch.Tensor, cache: SDPACache) -> torch.Tensor:
        """One new token per sequence, ``x [B, 1, dim]`` -> ``[B, 1, dim]``: written at ``cache.lengths`` (no
        bounds check: that would synchronise with the device), attended over the cache's ``Nmax`` positions with a
        mask of those at or before it, then the lengths advance."""
        B, n, _ = x.shape
        if n != 1:
            raise ValueError(f"SDPAAttention.step decodes one token per sequence, got {n}")
        lengths = cache.lengths
        q, k, v = self._project(x, lengths[:, None])
        where = lengths.view(B, 1, 1, 1).expand(B, self.num_kv_heads, 1, self.head_dim)
        cache.k.scatter_(2, where, k.to(cache.k.dtype))
        cache.v.scatter_(2, where, v.to(cache.v.dtype))
        mask = torch.arange(cache.max_len, device=lengths.device) <= lengths[:, None]  # [B, Nmax]
        # The G = H / Hkv query heads of a KV head (GQA's repeat_interleave order) as G query rows of it: one
        # attention per KV head, with no copy of the cache.
        groups = self.num_heads // self.num_kv_heads
        qg = q.reshape(B, self.num_kv_heads, groups, self.head_dim).to(cache.k.dtype)
        o = F.scaled_dot_product_attention(qg, cache.k, cache.v, attn_mask=mask[:, None, None, :])
        cache.lengths.add_(1)
        return self._merge_heads(o.reshape(B, self.num_heads, 1, self.head_dim).to(q.dtype))


# --- the model ------------------------------------------------------------------------------------------------

class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``, gate and up in one matrix ``[2 ffn_dim, dim]``."""

    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * ffn_dim, bias=False)
        self.down = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    """``x + attn(norm(x))``, then ``+ mlp(norm(x))``; :meth:`prefill` and :meth:`step` pass a cache to the
    attention."""

    def __init__(self, config: DecoderConfig, attn: nn.Module):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attn = attn
        self.mlp_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.mlp = SwiGLU(config.dim, config.ffn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))

    def prefill(self, x: torch.Tensor, cache) -> torch.Tensor:
        x = x + self.attn.prefill(self.attn_norm(x), cache)
        return x + self.mlp(self.mlp_norm(x))

    def step(self, x: torch.Tensor, cache) -> torch.Tensor:
        x = x + self.attn.step(self.attn_norm(x), cache)
        return x + self.mlp(self.mlp_norm(x))


def attention(config: DecoderConfig, variant: str, index: int) -> nn.Module:
    """Layer ``index``'s attention module in ``variant``."""
    if variant == "plain_sdpa":
        return SDPAAttention(config.dim, config.heads, num_kv_heads=config.kv_heads, rope_theta=config.rope_theta)
    kernel = config.kernel_size if variant == "mta" and index in config.mta_layer_indices() else (1, 1)
    return MultiTokenAttention(config.dim, config.heads, num_kv_heads=config.kv_heads, kernel_size=kernel,
                               rope_theta=config.rope_theta)


class Decoder(nn.Module):
    """Tokens ``[B, N]`` (int64) -> logits ``[B, N, vocab]``, or with ``targets [B, N]`` the mean cross-entropy.

    ``variant``: one of :data:`VARIANTS` (the module docstring). The head is tied to the embedding.
    """

    def __init__(self, config: DecoderConfig, variant: str):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.config, self.variant = config, variant
        self.embed = nn.Embedding(config.vocab, config.dim)
        nn.init.normal_(self.embed.weight, std=EMBED_STD)
        self.blocks = nn.ModuleList(Block(config, attention(config, variant, i)) for i in range(config.layers))
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The final norm and the tied head: ``h [..., dim]`` -> ``[..., vocab]``."""
        return F.linear(self.norm(h), self.embed.weight)

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        logits = self.logits(h)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def new_caches(self, batch: int, max_len: int, *, dtype: Optional[torch.dtype] = None, device=None) -> list:
        """One empty cache per layer (:class:`mta.KVCache` or :class:`SDPACache`) of ``max_len`` positions."""
        return [block.attn.new_cache(batch, max_len, dtype=dtype, device=device) for block in self.blocks]

    def prefill(self, tokens: torch.Tensor, caches: list) -> torch.Tensor:
        """Run the prompt ``tokens [B, N]`` through the model, filling the empty ``caches``: the logits of its last
        position, ``[B, vocab]``."""
        h = self.embed(tokens)
        for block, cache in zip(self.blocks, caches, strict=True):
            h = block.prefill(h, cache)
        return self.logits(h[:, -1])

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, caches: list) -> torch.Tensor:
        """One decode step: ``tokens [B, 1]`` -> the logits of the next token, ``[B, vocab]``; every cache grows
        by one position."""
        h = self.embed(tokens)
        for block, cache in zip(self.blocks, caches, strict=True):
            h = block.step(h, cache)
        return self.logits(h[:, -1])

    def next_tokens(self, tokens: torch.Tensor, caches: list) -> torch.Tensor:
        """Greedy decoding: ``tokens [B, 1]`` -> the argmax of :meth:`step`, ``[B, 1]`` int64, on the device."""
        return self.step(tokens, caches).argmax(-1, keepdim=True)


def build(config: DecoderConfig, variant: str, *, seed: int = 0, device=None,
          dtype: Optional[torch.dtype] = None) -> Decoder:
    """``Decoder(config, variant)`` built under ``seed`` (so every variant gets the same weights), on ``device``,
    its parameters cast to ``dtype`` if given, except the MTA kernels, which stay fp32 as the layer keeps them."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Decoder(config, variant)
    model.to(device)
    if dtype is not None:
        model.to(dtype)
        for module in model.modules():
            if isinstance(module, MultiTokenAttention) and module.conv_weight is not None:
                module.conv_weight.data = module.conv_weight.data.float()
    return model


__all__ = ["Block", "Decoder", "DecoderConfig", "SDPAAttention", "SDPACache", "SwiGLU", "VARIANTS", "build"]
