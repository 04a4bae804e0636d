"""MTA decode rows in plain PyTorch, the ``"rows"`` form of :class:`mta.decode.DecodePlan`: what
:func:`mta.conv_decode_attention` returns where its split kernel does not fit in a GPU program's shared memory
(fp32 with wide key-axis kernels at head dims over 64, e.g. 32 x 33 at d = 128; Triton refuses such a launch before
it runs).

Per sequence of length ``L``, the ``n + cq - 1`` newest query rows (their convolution's reach) against every key:
``S0`` masked before the convolution, the convolution, the mask after it, the softmax and ``P V``, for the ``n``
newest positions. Keys and values past ``L`` are zeroed before they enter a product (a cache poisoned with NaN there
stays out), nothing is read to the host (no synchronisation), and the heads go a block at a time so that the fp32
scores stay near :data:`ROWS_BYTES` (or the caller's ``rows_bytes``): O(N) memory, one pass over the cache, unfused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .conv_chunked import exact_convolutions

#: About this many bytes of fp32 work per block of heads: ``[B, heads, n + cq - 1, Nmax]`` scores (three live at
#: once) and the heads' keys and values.
ROWS_BYTES = 256 * 2 ** 20


def conv_decode_rows(q_cache, k_cache, v_cache, weight, lens, n_new: int, scale: float,
                     rows_bytes: int = ROWS_BYTES) -> torch.Tensor:
    """``[B, Hq, n_new, D]`` in q_cache's dtype: rows ``L - n_new .. L - 1`` of causal MTA per sequence.

    ``q_cache [B, Hq, Nmax, D]``, ``k_cache, v_cache [B, Hkv, Nmax, D]``, ``weight [Hq, cq, ck]`` (fp32),
    ``lens [B]`` on the caches' device or None (every sequence ``Nmax`` long). A position before 0 outputs 0.
    ``rows_bytes``: about this many bytes of fp32 work per block of heads (at least one head a block)."""
    B, Hq, n_max, D = q_cache.shape
    group = Hq // k_cache.shape[1]
    cq, ck = weight.shape[1:]
    dev = q_cache.device
    lens = (torch.full((B,), n_max, device=dev, dtype=torch.int64) if lens is None
            else lens.to(torch.int64).clamp(0, n_max))
    rows = n_new + cq - 1
    pos = lens[:, None] - rows + torch.arange(rows, device=dev)  # [B, rows]: the positions of the rows
    keys = torch.arange(n_max, device=dev)
    key_ok = keys[None, :] < lens[:, None]  # [B, Nmax]
    out = torch.empty((B, Hq, n_new, D), device=dev, dtype=q_cache.dtype)
    per_head = 4 * B * n_max * (3 * rows + 2 * D)  # scores, convolved, probabilities; K and V in fp32
    heads = max(1, min(Hq, rows_bytes // max(1, per_head)))
    pad_k = (ck - 1) // 2
    with exact_convolutions(dev):
        for h0 in range(0, Hq, heads):
            h1 = min(Hq, h0 + heads)
            kv_heads = torch.arange(h0, h1, device=dev) // group  # query head h reads kv head h // group
            k = torch.where(key_ok[:, None, :, None], k_cache[:, kv_heads].float(), 0.0)  # [B, h, Nmax, D]
            v = torch.where(key_ok[:, None, :, None], v_cache[:, kv_heads].float(), 0.0)
            idx = pos.clamp(0, n_max - 1)[:, None, :, None].expand(B, h1 - h0, rows, D)
            q = torch.gather(q_cache[:, h0:h1], 2, idx).float()
            q = torch.where((pos >= 0)[:, None, :, None], q, 0.0)  # rows before 0: the zero padding
            s = scale * (q @ k.transpose(-1, -2))  # [B, h, rows, Nmax]
            s = torch.where(keys <= pos[:, None, :, None], s, 0.0)  # no future key in S0
            c = F.conv2d(F.pad(s, (pad_k, pad_k)), weight[h0:h1, None].float(), groups=h1 - h0)  # [B, h, n, Nmax]
            c = torch.where(keys <= pos[:, None, cq - 1:, None], c, float("-inf"))
            p = torch.softmax(c, dim=-1).nan_to_num(0.0)  # a position before 0 sees no key: 0
            out[:, h0:h1] = (p @ v).to(out.dtype)
    return out
