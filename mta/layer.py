"""``mta.MultiTokenAttention``: an attention layer whose scores go through MTA's key-query convolution.

``x [B, N, dim]`` -> projections -> heads ``[B, H, N, D]`` -> RoPE (optional) -> causal MTA (the fused kernels
of :func:`mta.conv_attention`; under ``torch.compile``, the ``mta::conv_attention`` op of :mod:`mta.ops`) ->
``o_proj``.
With ``kernel_size=(1, 1)`` it is a plain causal attention layer (:func:`mta.flash_attention`), with no kernel.

The kernel ``conv_weight [H, cq, ck]`` (fp32) starts as the identity (a 1 on the current query and key), so a new
layer computes exactly causal attention and training moves it away from there, as in the MTA paper.

Generation: :meth:`MultiTokenAttention.new_cache` makes a :class:`mta.KVCache`; :meth:`~MultiTokenAttention.prefill`
runs the fused forward on the prompt and fills the cache; :meth:`~MultiTokenAttention.step` appends a few new
tokens per sequence and runs the decode kernels. ``layer(x, cache=cache)`` does whichever of the two applies.
A step never waits for the device, so a model's decode step can be captured in a CUDA graph
(:func:`mta.capture_step`) or compiled whole.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from . import ops  # noqa: F401  (registers the custom ops the functions below call while torch.compile traces)
from .conv import conv_attention
from .conv_decode import conv_decode_attention
from .flash import flash_attention
from .checks import check_count, is_int
from .conv_forward import MAX_CK, MAX_CQ
from .decode import MAX_NEW_QUERIES, decode_attention
from .kv_cache import KVCache
from .rope import check_theta, rope_rotation, rotate
from .reference import conv_attention_probabilities, expand_kv

#: The MTA paper's other options, which this layer does not implement (pre-softmax key-query convolution only).
UNSUPPORTED_OPTIONS = {
    "post_softmax_conv": "a key-query convolution after the softmax",
    "after_sm_kernel_size": "a key-query convolution after the softmax",
    "head_mixing": "the head-mixing convolution",
    "head_kernel_size": "the head-mixing convolution",
    "pre_sm_linear_head": "head mixing before the softmax",
    "post_sm_linear_head": "head mixing after the softmax",
    "group_norm": "group normalisation of the heads' outputs",
    "gating": "gating of the heads' outputs",
    "add_gating": "gating of the heads' outputs",
}


def identity_kernel(num_heads: int, cq: int, ck: int) -> torch.Tensor:
    """``[num_heads, cq, ck]`` fp32: 1 at ``[:, cq - 1, (ck - 1) // 2]`` (current query, current key), else 0."""
    w = torch.zeros(num_heads, cq, ck, dtype=torch.float32)
    w[:, cq - 1, (ck - 1) // 2] = 1.0
    return w


class MultiTokenAttention(nn.Module):
    """Causal Multi-Token Attention (pre-softmax key-query convolution), with GQA and optional RoPE.

    Args:
        dim: model width; ``dim % num_heads == 0``, head dim ``D = dim // num_heads`` (at most 256).
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads (grouped-query attention), a divisor of ``num_heads``; default ``num_heads``.
        kernel_size: ``(cq, ck)`` of the convolution, ``cq`` queries back, ``ck`` keys centred (odd). ``(1, 1)``:
            plain causal attention, no ``conv_weight``.
        rope_theta: apply RoPE with this base to queries and keys (needs an even ``D``); None: no positions.

    Parameters: ``q_proj [H D, dim]``, ``k_proj``, ``v_proj [Hkv D, dim]``, ``o_proj [dim, H D]`` (bias-free),
    ``conv_weight [H, cq, ck]`` fp32 (identity at init; None for ``(1, 1)``).

    The paper's post-softmax convolution, head mixing and group norm are not implemented: asking for them
    (``post_softmax_conv=True``, ``head_mixing=True``, ``group_norm=True``, ...) raises ``NotImplementedError``;
    passing them switched off (``False`` or ``None``) is accepted.
    """

    def __init__(self, dim: int, num_heads: int, *, num_kv_heads: Optional[int] = None,
                 kernel_size: tuple[int, int] = (6, 11), rope_theta: Optional[float] = None, **options):
        super().__init__()
        asked = sorted(name for name, value in options.items() if name in UNSUPPORTED_OPTIONS and value)
        options = {name: value for name, value in options.items() if name not in UNSUPPORTED_OPTIONS}  # off: fine
        if asked:
            what = "; ".join(f"{name} ({UNSUPPORTED_OPTIONS[name]})" for name in asked)
            raise NotImplementedError(f"MultiTokenAttention implements the pre-softmax key-query convolution only; "
                                      f"not supported: {what}")
        if options:
            raise TypeError(f"MultiTokenAttention got unexpected keyword arguments: {sorted(options)}")
        dim, num_heads = check_count("dim", dim), check_count("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else check_count("num_kv_heads", num_kv_heads)
        if dim % num_heads:
            raise ValueError(f"dim must be a multiple of num_heads, got dim={dim}, num_heads={num_heads}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads must be a multiple of num_kv_heads (GQA), got num_heads={num_heads}, "
                             f"num_kv_heads={num_kv_heads}")
        if not isinstance(kernel_size, (tuple, list)):
            raise TypeError(f"kernel_size must be two ints (cq, ck), got {kernel_size!r}")
        kernel_size = tuple(kernel_size)
        if len(kernel_size) != 2 or not all(is_int(s) for s in kernel_size):  # numpy ints too, as dim and heads
            raise TypeError(f"kernel_size must be two ints (cq, ck), got {kernel_size!r}")
        cq, ck = kernel_size = tuple(int(s) for s in kernel_size)
        if cq < 1 or ck < 1:
            raise ValueError(f"kernel_size must be at least (1, 1), got {kernel_size}")
        if ck % 2 == 0:
            raise ValueError(f"the key-axis kernel size ck must be odd (it is centred on the key), got ck={ck}")
        if cq > MAX_CQ or ck > MAX_CK:
            raise ValueError(f"kernel {cq} x {ck} is not supported: at most cq={MAX_CQ} and ck={MAX_CK}")
        head_dim = dim // num_heads
        if head_dim > 256:
            raise ValueError(f"head dim dim // num_heads = {head_dim} is not supported (at most 256)")
        if rope_theta is not None:
            if head_dim % 2:
                raise ValueError(f"RoPE needs an even head dim, got dim // num_heads = {head_dim}")
            rope_theta = check_theta(rope_theta, head_dim, "rope_theta")
        self.dim, self.num_heads, self.num_kv_heads, self.head_dim = dim, num_heads, num_kv_heads, head_dim
        self.kernel_size = (cq, ck)
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(dim, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, dim, bias=False)
        if self.is_mta:
            self.conv_weight = nn.Parameter(identity_kernel(num_heads, cq, ck))
        else:
            self.register_parameter("conv_weight", None)

    @property
    def is_mta(self) -> bool:
        """True unless the kernel is 1 x 1 (then the layer is plain causal attention)."""
        return self.kernel_size != (1, 1)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"kernel_size={self.kernel_size}, rope_theta={self.rope_theta}")

    def reset_conv_weight(self) -> None:
        """Back to the identity kernel (plain causal attention)."""
        if self.conv_weight is not None:
            with torch.no_grad():
                self.conv_weight.copy_(identity_kernel(self.num_heads, *self.kernel_size))

    def reset_parameters(self) -> None:
        """The layer's own parameter, ``conv_weight``, back to the identity (the projections reset theirs): what
        meta-device initialisation calls on each module after ``to_empty`` (FSDP's default does)."""
        self.reset_conv_weight()

    # --- projections ------------------------------------------------------------------------------------------

    def _check_input(self, x) -> None:
        """``x`` is a floating-point ``[B, N, dim]`` tensor."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a tensor [B, N, dim={self.dim}], got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [B, N, dim={self.dim}], got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")

    def _check_cache(self, x: torch.Tensor, cache) -> None:
        """Before anything is written: ``cache`` is a :class:`KVCache` made for this layer (queries kept for MTA,
        its heads and head dim), holding ``x``'s batch, on ``x``'s device."""
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be an mta.KVCache (see new_cache), got {type(cache).__name__}")
        if (cache.q is not None) != self.is_mta:
            raise ValueError("this cache was not made for this layer: an MTA layer needs a cache that keeps the "
                             "queries, plain attention one that does not (make it with this layer's new_cache)")
        if x.shape[0] != cache.batch:
            raise ValueError(f"x has batch {x.shape[0]} but the cache holds {cache.batch} sequences")
        if cache.k.shape[2:] != (self.num_kv_heads, self.head_dim):
            raise ValueError(f"this cache was not made for this layer: its keys and values have {cache.k.shape[2]} "
                             f"heads of dim {cache.k.shape[3]}, this layer's {self.num_kv_heads} heads of dim "
                             f"{self.head_dim} (make it with this layer's new_cache)")
        if cache.q is not None and cache.q.shape[2:] != (self.num_heads, self.head_dim):
            raise ValueError(f"this cache was not made for this layer: its queries have {cache.q.shape[2]} heads "
                             f"of dim {cache.q.shape[3]}, this layer's {self.num_heads} heads of dim {self.head_dim}")
        if cache.k.device != x.device:
            raise ValueError(f"x is on {x.device} but the cache is on {cache.k.device}")
        cache.check_lengths()

    def _project(self, x: torch.Tensor, positions: Optional[torch.Tensor]):
        """``x [B, n, dim]`` -> ``q [B, n, H, D]``, ``k, v [B, n, Hkv, D]`` in one dtype, RoPE applied at
        ``positions`` (``[n]`` or ``[B, n]``)."""
        B, n, _ = x.shape
        q = self.q_proj(x).view(B, n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(B, n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, n, self.num_kv_heads, self.head_dim)
        if self.rope_theta is not None:
            # One rotation for the queries and the keys; it works on [B, H, n, D], and transposes are views.
            rotation = rope_rotation(q.transpose(1, 2), positions, self.rope_theta)
            q = rotate(q.transpose(1, 2), rotation).transpose(1, 2)
            k = rotate(k.transpose(1, 2), rotation).transpose(1, 2)
        # The kernels want q, k, v in one dtype (autocast gives the projections' dtype to all three already).
        return q, k.to(q.dtype), v.to(q.dtype)

    def _attend(self, q, k, v) -> torch.Tensor:
        """Causal attention on ``[B, H, N, D]`` heads through the custom ops: ``[B, H, N, D]``."""
        if self.is_mta:
            return conv_attention(q, k, v, self.conv_weight, causal=True)
        return flash_attention(q, k, v, causal=True)

    def _merge_heads(self, o: torch.Tensor) -> torch.Tensor:
        B, _, n, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, n, self.num_heads * self.head_dim))

    # --- forward, prefill, decode -----------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """``x [B, N, dim]`` -> ``[B, N, dim]``.

        Without a cache: the causal layer on all ``N`` positions (fused forward and backward). With a cache:
        :meth:`prefill` if it is empty, else :meth:`step` (``N`` new tokens per sequence).
        """
        if cache is not None:  # each checks x and the cache itself
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache must be an mta.KVCache (see new_cache), got {type(cache).__name__}")
            return self.prefill(x, cache) if cache.is_empty else self.step(x, cache)
        self._check_input(x)
        N = x.shape[1]
        q, k, v = self._project(x, torch.arange(N, device=x.device))
        return self._merge_heads(self._attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)))

    @torch.no_grad()
    def attention_probabilities(self, x: torch.Tensor, *, with_output: bool = False):
        """What each head attends to on ``x [B, N, dim]``: ``P [B, H, N, N]`` (fp32), materialized with
        :func:`mta.reference.conv_attention_probabilities`. For inspection at small ``N``. With ``with_output``,
        also the layer's output computed from them, ``o_proj(P @ v)`` ``[B, N, dim]`` (the forward's value up to
        rounding, without the kernels): ``(P, out)``."""
        self._check_input(x)
        N = x.shape[1]
        q, k, v = self._project(x, torch.arange(N, device=x.device))
        weight = self.conv_weight if self.is_mta else torch.ones(self.num_heads, 1, 1, device=x.device)
        probs = conv_attention_probabilities(q.transpose(1, 2).float(), k.transpose(1, 2).float(), weight.float(),
                                             causal=True)
        if not with_output:
            return probs
        o = probs @ expand_kv(v.transpose(1, 2).float(), self.num_heads)
        return probs, self._merge_heads(o.to(x.dtype))

    def new_cache(self, batch: int, max_len: int, *, dtype: Optional[torch.dtype] = None, device=None) -> KVCache:
        """An empty :class:`mta.KVCache` for this layer (queries kept for MTA). ``dtype``: that of the activations
        the projections produce (default: the projections' weight dtype, autocast or not: pass ``torch.bfloat16``
        under bf16 autocast)."""
        weight = self.q_proj.weight
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        return KVCache.empty(batch, max_len, self.num_heads, self.num_kv_heads, self.head_dim,
                             keep_queries=self.is_mta, dtype=dtype or weight.dtype, device=device or weight.device)

    def prefill(self, x: torch.Tensor, cache: KVCache, lengths=None) -> torch.Tensor:
        """Run the fused causal forward on a prompt ``x [B, N, dim]`` and fill the empty ``cache`` with it.

        ``lengths`` ``[B]`` (ints): a right-padded batch's real lengths (default: all ``N``); a causal layer's
        rows before a sequence's end never see the padding (zeroed first: it may hold anything, NaN included), and
        decoding continues at each sequence's length. Given on the host (a list, a CPU tensor) they are checked;
        a tensor on the cache's device is not read (that would synchronise): its values are clamped to
        ``1 .. N``. Returns ``[B, N, dim]`` (rows at or past a sequence's length are padding).
        """
        self._check_input(x)
        self._check_cache(x, cache)
        if not cache.is_empty:
            raise ValueError("prefill needs an empty cache (every length 0)")
        N = x.shape[1]
        if lengths is not None:
            lengths = cache.prompt_lengths(lengths, N)
            # Zeroed: a row's later keys get probability 0 in the kernels, but 0 * NaN (or inf) in P @ V is NaN,
            # so non-finite padding would reach the rows before a sequence's end.
            if isinstance(lengths, list):  # on the host: the mask only where some sequence is padded
                if min(lengths) < N:
                    pad = torch.arange(N) >= torch.tensor(lengths)[:, None]
                    x = x.masked_fill(pad.to(x.device, non_blocking=True)[..., None], 0.0)
            else:
                x = x.masked_fill((torch.arange(N, device=x.device) >= lengths[:, None])[..., None], 0.0)
        q, k, v = self._project(x, torch.arange(N, device=x.device))
        # Attend in the cache's dtype, as the decode steps will; the cache is filled once that has worked.
        qc, kc, vc = (t.to(cache.k.dtype).transpose(1, 2) for t in (q, k, v))
        o = self._attend(qc, kc, vc)
        cache.fill(q, k, v, lengths)
        return self._merge_heads(o.to(q.dtype))

    @torch.no_grad()
    def step(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Decode ``n`` new tokens per sequence, ``x [B, n, dim]`` (``1 <= n <= 16``), at positions
        ``cache.lengths[b] .. + n - 1``: append them to ``cache``, then attend with the decode kernels
        (:func:`mta.conv_decode_attention` for MTA, :func:`mta.decode_attention` for plain attention).

        Exactly the rows of :meth:`forward` on each whole sequence so far. Returns ``[B, n, dim]``.

        Nothing here waits for the device: positions are computed and tokens written on the device, and the
        bound check reads the cache's host-side bound (:meth:`mta.KVCache.check_room`). So a step can be captured
        in a CUDA graph and replayed token after token (:func:`mta.capture_step` does it for a whole model and
        keeps the checks, before each replay), or compiled with ``torch.compile(fullgraph=True,
        mode="reduce-overhead")``. Inside a capture or a compiled step nothing is checked on the host: a write
        past the cache's end is clamped to it (nothing outside the cache is written), and the cache's host bound
        becomes unknown until the next eager call reads it back.
        """
        self._check_input(x)
        self._check_cache(x, cache)
        n = x.shape[1]
        if not 1 <= n <= MAX_NEW_QUERIES:  # before the cache advances: a refused step leaves it as it was
            raise ValueError(f"a step decodes 1 to {MAX_NEW_QUERIES} new tokens per sequence, got {n}")
        cache.check_room(n)
        positions = cache.positions(n)
        q, k, v = self._project(x, positions)
        # Written past the lengths, which advance once the attention has worked: a failed step leaves the cache as
        # it was.
        cache.write(q, k, v, positions)
        lengths = cache.lengths + n
        qc, kc, vc = cache.views()
        if self.is_mta:
            o = conv_decode_attention(qc, kc, vc, self.conv_weight, cache_seqlens=lengths, num_queries=n)
        else:
            o = decode_attention(q.to(kc.dtype).transpose(1, 2), kc, vc, cache_seqlens=lengths)
        cache.advance(n)
        return self._merge_heads(o.to(q.dtype))


__all__ = ["MultiTokenAttention", "UNSUPPORTED_OPTIONS", "identity_kernel"]
