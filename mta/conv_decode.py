"""``mta.conv_decode_attention``: Multi-Token Attention for the newest positions of each sequence, split-K.

A call checks its inputs, turns them into a :class:`mta.decode.DecodePlan` (:func:`plan_conv_decode`) and runs
it (:func:`run_conv_decode`): two launches, the split kernel of :mod:`mta.decode_kernels` (each program folds the
new queries' convolution into its rows, as :func:`fold_queries` does on its own; far keys from the folded queries,
one more split for the band of ``E`` keys next to each diagonal, computed exactly), and the merge of the splits;
or, where the split kernel's tiles do not fit the GPU, the same rows unfused (:mod:`mta.conv_decode_rows`).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from triton.runtime.errors import OutOfResources

from . import conv_forward, decode, tuning
from .checks import check_weight, is_int, resolve_scale
from .conv_decode_rows import conv_decode_rows
from .decode import (DecodePlan, DeviceFacts, call_signature, check_new_queries, check_no_transforms,
                     check_num_splits, check_seqlens, checked_once, choose_num_splits, decode_launches, device_facts,
                     in_batch_chunks, plan_tile, run_decode, seqlens_argument, split_plan, wide_offsets)
from .decode_kernels import fold_queries_kernel
from .launch import LaunchPlans, check_kernel_inputs, head_dim_block, launch


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
    launch(fold_queries_kernel, (B * Hq, ck), q_cache, weight, lens, qf, *q_cache.stride(), *qf.stride(),
           n_max=n_max, n_new=n_new, num_heads=Hq, HAS_LENS=lens is not None, CQ=cq, CK=ck, D=D, BLOCK_D=block_d,
           BLOCK_T=16, WIDE=wide_offsets(q_cache), num_warps=4)
    return qf


@functools.lru_cache(maxsize=1024)  # one plan per call signature: a decode step asks at every layer and token
def plan_conv_decode(batch: int, heads: int, kv_heads: int, n_new: int, n_max: int, head_dim: int,
                     dtype: torch.dtype, kernel_size: tuple[int, int], num_splits: int | None = None,
                     gpu: DeviceFacts | None = None) -> DecodePlan:
    """The plan of :func:`conv_decode_attention` for the ``n_new`` newest rows of caches
    ``[batch, heads | kv_heads, n_max, head_dim]`` of ``dtype``, kernel ``kernel_size = (cq, ck)``, on a device of
    facts ``gpu`` (default the current one's). Always the ``"split"`` form (:func:`run_conv_decode` turns to the
    ``"rows"`` form where its launch is refused); the far splits besides the band:

    * ``num_splits`` given: that many (at most the key tiles);
    * a ``1 x 1`` kernel (no fold, no band): plain decode's wave rule (:func:`mta.decode.choose_num_splits`);
    * 16 bits on a GPU whose memory feeds each SM fast (:func:`mta.decode.mta_fast_memory`, which also picks the
      tile): the wave rule over :data:`mta.tuning.MTA_FAST_PROGRAMS_PER_SM` programs an SM, at 95%;
    * otherwise the wave rule over :data:`mta.decode.MTA_PROGRAMS_PER_SM` programs an SM (1 at ``ck = 1``) at
      :data:`mta.decode.MTA_SPLIT_EFFICIENCY`, the band counted as one more program where a far split then holds
      at most :data:`mta.decode.BAND_COUNTS_BELOW` keys.
    """
    gpu = gpu or device_facts()
    tile = plan_tile(batch, heads, kv_heads, n_new, n_max, head_dim, dtype, kernel_size, gpu, interleave=False)
    units = batch * kv_heads * decode.row_tiles(heads, kv_heads, n_new, tile["rows"])
    rule = functools.partial(choose_num_splits, units, n_max, tile["own"])
    mta_rule = functools.partial(rule, gpu.sms * (decode.MTA_PROGRAMS_PER_SM if kernel_size[1] > 1 else 1),
                                 efficiency=decode.MTA_SPLIT_EFFICIENCY)
    if num_splits is not None:
        return split_plan(tile, num_splits)
    if kernel_size == (1, 1):
        return split_plan(tile, rule(gpu.sms))
    if decode.mta_fast_memory(head_dim_block(head_dim), dtype, gpu, n_max):
        return split_plan(tile, rule(gpu.sms * tuning.MTA_FAST_PROGRAMS_PER_SM))
    if tile["band"] != "none" and n_max <= decode.BAND_COUNTS_BELOW * mta_rule():
        return split_plan(tile, mta_rule(extra=1))
    return split_plan(tile, mta_rule())


def run_conv_decode(plan: DecodePlan, q_cache, k_cache, v_cache, weight, lens, scale: float) -> torch.Tensor:
    """``[B, Hq, n_new, D]`` in q_cache's dtype: ``plan`` run. ``q_cache [B, Hq, Nmax, D]``, ``k_cache, v_cache
    [B, Hkv, Nmax, D]``, ``weight [Hq, cq, ck]`` fp32 contiguous, ``lens [B]`` int on the caches' device or None.
    The ``"split"`` form by :func:`mta.decode.run_decode`, or, where Triton refuses its launch (the tiles do not fit
    in the GPU's shared memory: fp32 with wide key-axis kernels at head dims over 64), as the ``"rows"`` form
    (:func:`mta.conv_decode_rows.conv_decode_rows`, PyTorch, unfused)."""
    if plan.form == "split":
        try:
            return run_decode(plan, q_cache, k_cache, v_cache, lens, scale, weight=weight)
        except OutOfResources:
            plan = dataclasses.replace(plan, form="rows")
    if plan.form != "rows":
        raise ValueError(f"run_conv_decode runs a plan of form 'split' or 'rows', not {plan.form!r}")
    decode.check_plan(plan, q_cache, k_cache, weight)
    return conv_decode_rows(q_cache, k_cache, v_cache, weight, lens, plan.n_new, scale)


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
        num_splits: key splits per sequence besides the band; default :func:`plan_conv_decode`'s choice.

    Returns:
        ``[B, Hq, num_queries, D]`` in q_cache's dtype. Where the split kernel does not fit in the GPU's shared
        memory (fp32 with wide key-axis kernels at head dims over 64), the same rows from
        :func:`mta.conv_decode_rows.conv_decode_rows` (PyTorch, unfused, one pass over the cache).
        Head dims 1 to 256; on the CPU (Triton's interpreter) fp16 and fp32 only. For inference: the result
        carries no gradient, even where an input requires one (eager or compiled). The folded queries are
        tensor-core operands in the input dtype: in fp16 they must stay under 65504 in magnitude.
    """
    signature = call_signature(q_cache, k_cache, v_cache, cache_seqlens, weight, num_queries, scale, num_splits)
    if (launches := CHECKED_CALLS.find(signature)) is not None:
        return launches(q_cache, k_cache, v_cache, cache_seqlens, weight)
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
        return torch.ops.mta.conv_decode_attention(q_cache, k_cache, v_cache, weight,
                                                   seqlens_argument(cache_seqlens, q_cache.device), num_queries,
                                                   resolve_scale(scale, D), check_num_splits(num_splits))
    check_no_transforms("conv_decode_attention")
    lens = check_seqlens(cache_seqlens, B, n_max, num_queries, q_cache.device, what="num_queries")
    scale = resolve_scale(scale, D)
    w = weight.detach().float().contiguous()
    num_splits = check_num_splits(num_splits)
    gpu = device_facts(q_cache.device)

    def plan(batch: int) -> DecodePlan:
        return plan_conv_decode(batch, Hq, Hkv, num_queries, n_max, D, q_cache.dtype, (cq, ck),
                                num_splits=num_splits, gpu=gpu)

    # Kept where the weight as the kernels take it (fp32, contiguous) is the caller's own: a call of this
    # signature passes it as it is.
    if signature is not None and checked_once(cache_seqlens, lens, B, Hkv) and w.data_ptr() == weight.data_ptr():
        split = plan(B)
        launches = decode_launches(split, q_cache, k_cache, v_cache, lens, scale, w)
        if launches is not None:
            try:
                out = launches(q_cache, k_cache, v_cache, lens, w)
            except OutOfResources:  # the tiles do not fit this GPU: the "rows" form, at every call
                return run_conv_decode(dataclasses.replace(split, form="rows"), q_cache, k_cache, v_cache, w, lens,
                                       scale)
            CHECKED_CALLS.keep(signature, launches)
            return out
    return in_batch_chunks(lambda q, k, v, lens: run_conv_decode(plan(k.shape[0]), q, k, v, w, lens, scale), Hkv,
                           q_cache, k_cache, v_cache, lens)


#: The launches of :func:`conv_decode_attention` calls whose inputs passed the checks, by their
#: :func:`mta.decode.call_signature`.
CHECKED_CALLS = LaunchPlans()
