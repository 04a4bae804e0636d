"""``mta.conv_decode_attention``: Multi-Token Attention for the newest positions of each sequence, split-K.

Two launches: the split kernel of :mod:`mta.decode_kernels` (each program folds the new queries' convolution
into its rows, as :func:`fold_queries` does on its own; far keys from the folded queries, one more split for
the band of ``E`` keys next to each diagonal, computed exactly), and the merge of the splits.
"""

from __future__ import annotations

import torch
from triton.runtime.errors import OutOfResources

from . import conv_forward
from .checks import check_weight, is_int, resolve_scale
from .conv_decode_rows import conv_decode_rows
from .decode import check_new_queries, check_num_splits, check_seqlens, launch_decode, wide_offsets
from .decode_kernels import fold_queries_kernel
from .launch import check_kernel_inputs, head_dim_block, launch


def fold_queries(q_cache, weight, lens, n_new: int) -> torch.Tensor:
    """``Qf[b, h, kb, t] = sum_a w[h, a, kb] q[L - n + t - (cq-1) + a]`` (rows before 0 count as 0), in
    q_cache's dtype: the convolution of the ``n`` newest queries of each sequence, folded into them.

    Args:
        q_cache: ``[B, Hq, Nmax, D]``; weight: ``[Hq, cq, ck]`` fp32 contiguous; lens: ``[B]`` or None.
    Returns:
        ``[B, Hq, ck, n, D]``.
    """
    B, Hq, n_max, D = q_cache.shape
    _, cq, ck = weight.shape
    qf = torch.empty((B, Hq, ck, n_new, D), device=q_cache.device, dtype=q_cache.dtype)
    block_d = head_dim_block(D)
    launch(fold_queries_kernel, (B * Hq, ck),
        q_cache, weight, lens, qf, *q_cache.stride(), *qf.stride(), n_max, n_new, Hq, HAS_LENS=lens is not None,
        CQ=cq, CK=ck, D=D, BLOCK_D=block_d, BLOCK_T=16, WIDE=wide_offsets(q_cache), num_warps=4)
    return qf


def conv_decode_attention(q_cache, k_cache, v_cache, weight, *, cache_seqlens=None, num_queries: int = 1,
                          scale: float | None = None, num_splits: int | None = None) -> torch.Tensor:
    """MTA outputs of the last ``num_queries`` positions of each sequence, from its query and KV caches.

    Per sequence ``b`` of length ``L = cache_seqlens[b]``, exactly rows ``L - n .. L - 1`` of
    ``mta.conv_attention(q_cache[b:b+1, :, :L], k_cache[b:b+1, :, :L], v_cache[b:b+1, :, :L], weight)``
    (``docs/mta-semantics.md``, "Decode"). Reads the last ``cq - 1 + n`` valid query rows and keys
    ``0 .. L - 1``; nothing past ``L``.

    The keys ``j <= i - E`` (``E = cq - 1 + pk``) of query ``i`` are split over programs as in
    :func:`mta.decode_attention`, their scores from the folded queries (``ck`` products per key tile, each
    split reading a halo of ``pk`` keys each side); the ``E`` keys next to the diagonal, where the mask before
    the convolution matters, are one extra split per (batch, kv head).

    Args:
        q_cache: ``[B, Hq, Nmax, D]`` the queries so far (the new ones included); fp16, bf16 or fp32.
        k_cache, v_cache: ``[B, Hkv, Nmax, D]``, ``Hq % Hkv == 0``.
        weight: ``[Hq, cq, ck]``, ``1 <= cq <= 32``, odd ``ck <= 33``; any float dtype, used in fp32.
        cache_seqlens: ``[B]`` int32 (or int64) valid positions per sequence, or None (all ``Nmax``). A list or
            a CPU tensor is checked (``num_queries <= L <= Nmax``); on the GPU the values are the caller's
            responsibility (checking would synchronise), clamped to ``[0, Nmax]`` by the kernels.
        num_queries: ``n``, 1 to 16.
        scale: default ``D ** -0.5``, applied before the convolution.
        num_splits: key splits per sequence besides the band; default :func:`mta.decode.choose_num_splits`.

    Returns:
        ``[B, Hq, num_queries, D]`` in q_cache's dtype. Where the split kernel does not fit in the GPU's shared
        memory (fp32 with wide key-axis kernels at head dims over 64), the same rows from
        :func:`mta.conv_decode_rows.conv_decode_rows` (PyTorch, unfused, one pass over the cache).
        Head dims 1 to 256; on the CPU (Triton's interpreter) fp16 and fp32 only. For inference: the result
        carries no gradient, even where an input requires one (eager or compiled). The folded queries are
        tensor-core operands in the input dtype: in fp16 they must stay under 65504 in magnitude.
    """
    B, Hq, Hkv, n_q, n_max, D = check_kernel_inputs(q_cache, k_cache, v_cache, per_kv_head=True,
                                                    names=("q_cache", "k_cache", "v_cache"))
    if n_q != n_max:
        raise ValueError(f"q_cache and k_cache must hold as many positions, got {n_q} and {n_max}")
    if not is_int(num_queries):
        raise TypeError(f"num_queries must be an int, got {type(num_queries).__name__}")
    num_queries = int(num_queries)
    check_new_queries(num_queries, n_max, "num_queries")
    cq, ck = check_weight(weight, num_heads=Hq, device=q_cache.device)
    if cq > conv_forward.MAX_CQ or ck > conv_forward.MAX_CK:
        raise ValueError(f"kernel {cq} x {ck} is not supported: at most cq={conv_forward.MAX_CQ} and "
                         f"ck={conv_forward.MAX_CK} here")
    if torch.compiler.is_compiling():  # traced: the custom op (mta.ops) checks the lengths when it runs
        from . import ops
        return ops.conv_decode_attention(q_cache, k_cache, v_cache, weight, cache_seqlens=cache_seqlens,
                                         num_queries=num_queries, scale=scale, num_splits=num_splits)
    lens = check_seqlens(cache_seqlens, B, n_max, num_queries, q_cache.device, what="num_queries")
    scale = resolve_scale(scale, D)
    w = weight.detach().float().contiguous()
    num_splits = check_num_splits(num_splits)
    try:
        return launch_decode(q_cache, k_cache, v_cache, lens, num_queries, scale, num_splits, weight=w,
                             kernel_size=(cq, ck))
    except OutOfResources:  # the split kernel's tiles do not fit on this GPU: the same rows, unfused
        return conv_decode_rows(q_cache, k_cache, v_cache, w, lens, num_queries, scale)
