"""MTA in row chunks, in plain PyTorch: for kernels too tall for the fused backward's tiles (and any fused
launch that the GPU refuses for its shared memory).

The fused backward (:mod:`mta.conv_backward`) holds ``cq`` shifted copies of a tile's rows on chip; past
:func:`mta.conv.backward_fits` (e.g. ``cq > 12`` at d = 256 in bf16, ``cq > 12`` at d = 96 in fp32) they do not
fit in a GPU program's shared memory. There, :func:`conv_attention_backward_chunked` gives the same gradients a
block of query rows at a time: the rows' convolved scores against every key they see (their ``cq - 1`` rows of
halo above included), the softmax, the output, and the chain rule back to ``q``, ``k``, ``v`` and the weight. A row's
softmax needs only its own row of scores, so each chunk is exact; the gradients of the chunks are summed in
their fixed order (deterministic: cuDNN in its deterministic mode, without TF32). Memory: a few fp32
``[B, Hq, rows, N]`` blocks, with ``rows`` chosen to keep them near :data:`CHUNK_BYTES`, so O(N) for a fixed
budget; time O(N^2) with no fusion: much slower than the fused kernels.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from .reference import autocast_off, causal_future, expand_kv

#: About this many bytes of fp32 ``[B, Hq, rows, N]`` blocks live at once (eight of them: scores, padded
#: scores, convolved scores, probabilities and their gradients).
CHUNK_BYTES = 256 * 2 ** 20
LIVE_BLOCKS = 8


def chunk_rows(batch: int, heads: int, n: int, budget: int = CHUNK_BYTES) -> int:
    """Query rows per chunk: :data:`LIVE_BLOCKS` fp32 ``[batch, heads, rows, n]`` blocks within ``budget``."""
    return max(1, min(n, budget // max(1, LIVE_BLOCKS * 4 * batch * heads * n)))


def _chunk_scores(q_rows, k_seen, w, halo: int, causal: bool, scale: float):
    """``(s_pad, pre, c)`` of a block of query rows: ``q_rows [B, Hq, halo + rows, D]`` holds them with the
    ``halo`` rows above (``cq - 1``, fewer at the top, where the convolution's zero padding stands in), ``k_seen
    [B, Hq, keys, D]`` all keys the rows see, per query head (causal: up to the last row's own key; the keys after
    are in every row's future), ``w [Hq, 1, cq, ck]`` fp32. ``s_pad``: the scaled scores, the future zeroed and
    padded for the convolution; ``pre``: that future (None when not causal); ``c [B, Hq, rows, keys]``: the
    convolved scores (fp32, ``-inf`` in the future)."""
    cq, ck = w.shape[2:]
    rows, n_keys = q_rows.shape[2] - halo, k_seen.shape[2]
    s = scale * (q_rows.float() @ k_seen.float().transpose(-1, -2))  # [B, Hq, halo + rows, keys]
    pre = causal_future(halo + rows, n_keys, s.device) if causal else None
    if causal:  # zero the future before the convolution, -inf after it (the keys end where the rows end)
        s = s.masked_fill(pre, 0.0)
    pad_k = (ck - 1) // 2
    s_pad = F.pad(s, (pad_k, pad_k, cq - 1 - halo, 0))
    c = F.conv2d(s_pad, w, groups=w.shape[0])
    if causal:
        c = c.masked_fill(causal_future(rows, n_keys, c.device), float("-inf"))
    return s_pad, pre, c


def _chunks(n: int, rows: int, cq: int, causal: bool):
    """``(r0, r1, halo, keys)`` per block of query rows ``[r0, r1)``: its halo of rows above and the keys it sees."""
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        yield r0, r1, min(cq - 1, r0), r1 if causal else n


@contextlib.contextmanager
def exact_convolutions(device):
    """cuDNN deterministic and without TF32 (fp32 convolutions as exact as the rest), and autocast off for
    ``device`` (the fused kernels compute in fp32 under autocast too; :func:`mta.reference.autocast_off`)."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False), \
            autocast_off(device):
        yield


def conv_attention_backward_chunked(do, q, k, v, weight, causal: bool, scale: float, rows: int | None = None):
    """``dq, dk, dv, dweight`` of :func:`mta.conv_attention` (``dq, dk, dv`` in the dtypes of ``q, k, v``;
    ``dweight [Hq, cq, ck]`` fp32, summed over the batch), ``rows`` query rows at a time (default
    :func:`chunk_rows`). ``do, q [B, Hq, N, D]``, ``k, v [B, Hkv, N, D]``, ``weight [Hq, cq, ck]``.

    The chain rule is written out (the backward of ``docs/mta-semantics.md``), not asked of autograd: this runs
    inside the backward of a custom op too (:mod:`mta.ops`, under ``torch.compile``), where autograd is off."""
    B, Hq, N, D = q.shape
    Hkv, (cq, ck) = k.shape[1], weight.shape[1:]
    pad_k = (ck - 1) // 2
    dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    dk = torch.zeros(k.shape, device=k.device, dtype=torch.float32)
    dv = torch.zeros(v.shape, device=v.device, dtype=torch.float32)
    dweight = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32)
    w = weight.detach().float()[:, None]  # [Hq, 1, cq, ck]: one depthwise kernel per head
    with torch.no_grad(), exact_convolutions(q.device):
        for r0, r1, halo, n_keys in _chunks(N, rows or chunk_rows(B, Hq, N), cq, causal):
            q_rows = q[:, :, r0 - halo:r1].float()
            k_seen, v_seen = (expand_kv(t[:, :, :n_keys], Hq).float() for t in (k, v))
            s_pad, pre, c = _chunk_scores(q_rows, k_seen, w, halo, causal, scale)
            p = torch.softmax(c, dim=-1)
            do_rows = do[:, :, r0:r1].float()
            dp = do_rows @ v_seen.transpose(-1, -2)
            dc = p * (dp - (dp * p).sum(-1, keepdim=True))  # the softmax's backward; 0 where masked after
            ds_pad = torch.nn.grad.conv2d_input(s_pad.shape, w, dc, groups=Hq)  # the convolution transposed
            dweight += torch.nn.grad.conv2d_weight(s_pad, w.shape, dc, groups=Hq)[:, 0]  # a correlation
            ds = ds_pad[:, :, cq - 1 - halo:, pad_k:pad_k + n_keys]
            if causal:  # the future was zeroed before the convolution: no gradient reaches it
                ds = ds.masked_fill(pre, 0.0)
            dq[:, :, r0 - halo:r1] += scale * (ds @ k_seen)
            per_group = (B, Hkv, Hq // Hkv, n_keys, D)  # dk, dv sum over a GQA group's query heads
            dk[:, :, :n_keys] += (scale * (ds.transpose(-1, -2) @ q_rows)).view(per_group).sum(2)
            dv[:, :, :n_keys] += (p.transpose(-1, -2) @ do_rows).view(per_group).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dweight


def conv_attention_forward_chunked(q, k, v, weight, causal: bool, scale: float, rows: int | None = None):
    """``o [B, Hq, N, D]`` (q's dtype) and ``lse [B, Hq, N]`` (fp32) of :func:`mta.conv_attention`, ``rows`` query
    rows at a time (default :func:`chunk_rows`): where the fused forward's tiles do not fit on the GPU."""
    B, Hq, N, _ = q.shape
    cq = weight.shape[1]
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty((B, Hq, N), device=q.device, dtype=torch.float32)
    with torch.no_grad(), exact_convolutions(q.device):
        for r0, r1, halo, n_keys in _chunks(N, rows or chunk_rows(B, Hq, N), cq, causal):
            c = _chunk_scores(q[:, :, r0 - halo:r1], expand_kv(k[:, :, :n_keys], Hq), weight.float()[:, None], halo,
                              causal, scale)[2]
            lse[:, :, r0:r1] = torch.logsumexp(c, dim=-1)
            o[:, :, r0:r1] = (torch.softmax(c, dim=-1) @ expand_kv(v[:, :, :n_keys], Hq).float()).to(q.dtype)
    return o, lse
