"""``mta.conv_attention``: Multi-Token Attention, fused in Triton, differentiable.

The kernels are in :mod:`mta.conv_forward` and :mod:`mta.conv_backward`; this
module checks inputs, folds the key axis of the convolution into the keys,
launches them and ties them together with ``torch.autograd.Function``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from triton.runtime.errors import OutOfResources

from . import conv_two_phase, runtime, tuning
from .checks import check_causal, check_weight, resolve_scale
from .differentiable_once import differentiable_once
from .flash import KernelFunction, needs_autograd, wrapped_by_functorch
from .conv_chunked import conv_attention_backward_chunked, conv_attention_forward_chunked
from .conv_backward import (conv_dk_fold_kernel, conv_dkdv_kernel, conv_dq_fold_kernel, conv_dq_kernel,
                            conv_near_kernel)
from .conv_forward import (MAX_CK, MAX_CQ, query_shift_groups, conv_forward_kernel, diagonal_scores_kernel, fit_stream_descriptors,
                           fold_keys_kernel, fold_keys_product_kernel, held_shared_bytes, holds_queries,
                           past_scores_kernel, past_scores_product_kernel)
from .conv_plan import ConvPlan, fit_backward_tile, plan_conv, post_pass_tile
from .flash_backward import rowsum_do_o_kernel
from .graphed_calls import GraphedCalls
from .launch import (CallLaunches, Launch, LaunchPlan, LaunchPlans, batch_chunks, cdiv, check_kernel_device, check_kernel_inputs, compile_ahead, concat_chunks,
                     dot_precision, empty_contiguous, head_dim_block, next_power_of_2, tiled_launch,
                     shared_memory_limit, shifted_head_dim_block, tensor_facts, wants_gradients,
                     within_int32_indexing)
from .tma import descriptor, stream_descriptors, tma_ready
from .tuning import size_bucket



def fold_keys(k: torch.Tensor, weight: torch.Tensor, num_q_heads: int, keys_major: bool = False, *,
              by_product: bool = False) -> torch.Tensor:
    """``Kf[b, h, a, j] = sum_b' w[h, a, b'] * k[b, h // G, j - pk + b']`` (zero outside ``[0, N)``).

    The key axis of the convolution, applied to the keys once (O(N) memory).

    Args:
        k: ``[B, Hkv, N, D]``.
        weight: ``[Hq, cq, ck]``.
        by_product: 16-bit keys by band-matrix products on the tensor cores (:attr:`ConvPlan.fold_by_product`).
        keys_major: lay the result out as ``[B, Hq, N, cq, D]`` in memory (a view of it is returned), so that
            ``[B * Hq, N, cq * D]``, each key's folded copies side by side, is a view too (the two-phase
            backward's GEMM operand, :mod:`mta.conv_two_phase`).
    Returns:
        ``[B, Hq, cq, N, D]`` in k's dtype (accumulated in fp32).
    """
    check_kernel_device(k=k, weight=weight)
    B, Hkv, N, D = k.shape
    cq = weight.shape[1]
    w = weight.detach().float().contiguous()
    kf = folded_keys_buffer(k, num_q_heads, cq, keys_major)
    fold_keys_launch(k, w, kf, by_product)()
    return kf


def folded_keys_buffer(k: torch.Tensor, num_q_heads: int, cq: int, keys_major: bool = False) -> torch.Tensor:
    """An empty ``[B, Hq, cq, N, D]`` for :func:`fold_keys`'s result, laid out keys-major where ``keys_major``."""
    B, _, N, D = k.shape
    if keys_major:
        return torch.empty((B, num_q_heads, N, cq, D), device=k.device, dtype=k.dtype).permute(0, 1, 3, 2, 4)
    return torch.empty((B, num_q_heads, cq, N, D), device=k.device, dtype=k.dtype)


def fold_keys_launch(k: torch.Tensor, w: torch.Tensor, kf: torch.Tensor, by_product: bool) -> Launch:
    """:func:`fold_keys`'s :class:`mta.launch.Launch` from ``k [B, Hkv, N, D]`` and ``w [Hq, cq, ck]`` (fp32,
    contiguous) into ``kf [B, Hq, cq, N, D]`` (any strides)."""
    B, Hkv, N, D = k.shape
    num_q_heads, cq, ck = w.shape
    block_d = head_dim_block(D)
    args = (k, w, kf, *k.stride(), *kf.stride(), N, num_q_heads, num_q_heads // Hkv)
    if by_product and k.dtype in (torch.float16, torch.bfloat16):
        block_n, warps = FOLD_PRODUCT_TILE
        return Launch(fold_keys_product_kernel, (cdiv(N, block_n), B * num_q_heads), args,
                      dict(CQ=cq, CK=ck, D=D, BLOCK_D=block_d, BLOCK_N=block_n,
                           WINDOW=next_power_of_2(block_n + ck - 1), num_warps=warps))
    # The interpreter pays per operation, not per element. On a GPU short tiles keep the ck shifted
    # loads of a tile in L1 across the cq kernel rows (8 rows, 2 warps: fastest on an H200 at d = 128).
    block_n, warps = (128, 4) if runtime.INTERPRET else (8, 2)
    return Launch(fold_keys_kernel, (cdiv(N, block_n), B * num_q_heads), args,
                  dict(CQ=cq, CK=ck, D=D, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=warps))


#: ``(keys, warps)`` of the band-matrix fold's programs: 16 keys on 2 warps, the fastest on Hopper at d = 64 and 128.
FOLD_PRODUCT_TILE = (16, 2)


def diagonal_reach(cq: int, ck: int) -> tuple[int, int]:
    """``(E, E')``: the pre-convolution mask changes scores ``C[i, j]`` with ``0 <= i - j < E = cq - 1 + pk``;
    they are made of past scores ``S[r, r - e]``, ``0 <= e <= E' = ck + cq - 3``."""
    pk = (ck - 1) // 2
    return cq - 1 + pk, ck + cq - 3


def _pad16(x: int) -> int:
    return max(16, next_power_of_2(x))


#: ``(rows, warps)`` of :func:`past_scores`'s product kernel: 32 rows on 4 warps, the fastest on Hopper at d = 64
#: and 128.
PAST_PRODUCT_TILE = (32, 4)


def past_scores(q: torch.Tensor, k: torch.Tensor, reach: int, *, by_product: bool = False) -> torch.Tensor:
    """``P[b, h, r, e] = q[b, h, r] . k[b, h // G, r - e]`` for ``0 <= e <= reach`` (0 before key 0), unscaled.

    The scores near the diagonal that the convolution's masked rows are made of.

    Args:
        q: ``[B, Hq, N, D]``; k: ``[B, Hkv, N, D]``.
        by_product: 16-bit inputs by one product per row tile where the band fits it
            (:attr:`ConvPlan.past_by_product`), else one dot product per row and diagonal.
    Returns:
        ``[B, Hq, N, max(16, next_pow2(reach + 1))]`` fp32; columns past ``reach`` are 0.
    """
    check_kernel_device(q=q, k=k)
    B, Hq, N, _ = q.shape
    p = torch.empty((B, Hq, N, _pad16(reach + 1)), device=q.device, dtype=torch.float32)
    past_scores_launch(q, k, p, reach, by_product)()
    return p


def past_scores_launch(q: torch.Tensor, k: torch.Tensor, p: torch.Tensor, reach: int, by_product: bool) -> Launch:
    """:func:`past_scores`'s :class:`mta.launch.Launch` into ``p [B, Hq, N, max(16, next_pow2(reach + 1))]``."""
    B, Hq, N, D = q.shape
    Hkv = k.shape[1]
    width = p.shape[-1]
    if by_product and q.dtype in (torch.float16, torch.bfloat16) and width <= PAST_PRODUCT_TILE[0]:
        kernel, (block_r, warps) = past_scores_product_kernel, PAST_PRODUCT_TILE
    else:  # 16 rows per program is the fastest on Hopper at d = 64 and 128; the interpreter pays per operation
        kernel, block_r, warps = past_scores_kernel, 128 if runtime.INTERPRET else 16, 4
    return Launch(kernel, (cdiv(N, block_r), B * Hq),
                  (q, k, p, *q.stride(), *k.stride(), *p.stride()[:3], N, Hq, Hq // Hkv),
                  dict(EP=reach, EP_PAD=width, D=D, BLOCK_D=head_dim_block(D), BLOCK_R=block_r, num_warps=warps))


def diagonal_scores(q: torch.Tensor, k: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None, *,
                    by_product: bool = False) -> torch.Tensor:
    """``CD[b, h, i, delta] = C[i, i - delta] / scale``, the causal convolved scores on the diagonals
    ``0 <= delta < E = cq - 1 + pk`` where folded keys would be wrong (zero for ``delta >= E``).

    Two small pre-passes: the past scores (:func:`past_scores`), then ``cq``
    tiny products per row block that convolve them.

    Args:
        q: ``[B, Hq, N, D]``; k: ``[B, Hkv, N, D]``; weight: ``[Hq, cq, ck]`` fp32.
        by_product: the past scores' kernel (:func:`past_scores`).
        past: the past scores ``past_scores(q, k, E')`` if already made (the backward needs them too).
    Returns:
        ``[B, Hq, N, max(16, next_pow2(E))]`` fp32, contiguous.
    """
    check_kernel_device(weight=weight)
    weight = weight.detach().float().contiguous()
    B, Hq, N, _ = q.shape
    cq, ck = weight.shape[1:]
    e, e_past = diagonal_reach(cq, ck)
    p = past_scores(q, k, e_past, by_product=by_product) if past is None else past
    cd = torch.empty((B, Hq, N, _pad16(e)), device=q.device, dtype=torch.float32)
    diagonal_scores_launch(p, weight, cd)()
    return cd


def diagonal_scores_launch(p: torch.Tensor, w: torch.Tensor, cd: torch.Tensor) -> Launch:
    """:func:`diagonal_scores`'s :class:`mta.launch.Launch` from the past scores ``p`` and ``w [Hq, cq, ck]``
    (fp32, contiguous) into ``cd [B, Hq, N, max(16, next_pow2(E))]``."""
    B, Hq, N, _ = p.shape
    cq, ck = w.shape[1:]
    e, _ = diagonal_reach(cq, ck)
    block_r = 16 if runtime.INTERPRET else 64
    return Launch(diagonal_scores_kernel, (cdiv(N, block_r), B * Hq),
                  (p, w, cd, *p.stride()[:3], N, Hq),
                  dict(CQ=cq, CK=ck, E=e, E_PAD=cd.shape[-1], EP_PAD=p.shape[-1], BLOCK_R=block_r, num_warps=4))


def unread_stand_in(device: torch.device) -> torch.Tensor:
    """A 16-float fp32 tensor passed where a kernel takes the diagonal scores ``CD`` or the near score gradients
    ``G`` but reads none (not causal, or no diagonal within the mask's reach: ``E = 0``). Left unfilled: a fill
    would be one more launch per call; tests that allocate every ``torch.empty`` as NaN show that it is never read."""
    return torch.empty(16, device=device, dtype=torch.float32)


def conv_prepasses(q, k, weight, causal: bool, plan: ConvPlan | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(kf, cd)``: the folded keys (:func:`fold_keys`) and, when causal, the diagonal scores
    (:func:`diagonal_scores`; :func:`unread_stand_in` when no diagonal needs them)."""
    w = weight.detach().float().contiguous()
    plan = plan or plan_of(q, weight, causal)
    kf = fold_keys(k.detach(), w, q.shape[1], by_product=plan.fold_by_product)
    e, _ = diagonal_reach(*w.shape[1:])
    if causal and e > 0:
        cd = diagonal_scores(q.detach(), k.detach(), w, by_product=plan.past_by_product)
    else:  # no mask before the convolution (or a 1 x 1 kernel): the folded scores are exact
        cd = unread_stand_in(q.device)
    return kf, cd


def _hold_or_stream(config: dict, q: torch.Tensor, cq: int, causal: bool, hold: bool = True) -> dict:
    """``config`` where its rows' ``cq`` shifted query tiles fit on chip (:func:`mta.conv_forward.holds_queries`)
    and ``hold`` (:attr:`mta.conv_plan.ConvPlan.hold_queries`), its pipeline made shallower, then its key tiles
    shorter, until the program fits in shared memory (:func:`mta.conv_forward.held_shared_bytes`: the table's tiles
    are sized for ``cq`` of 4 or more, where d = 128 streams); else the table's streamed tile. ``RESIDENT`` is
    added: whether the kernel holds the queries on that tile."""
    block_d = shifted_head_dim_block(q.shape[-1], q.dtype)
    if not (hold and holds_queries(config["BLOCK_M"], cq, block_d, q.element_size())):
        config = tuning.config_for("conv_forward_streamed", block_d, q.dtype, causal)
        return {**config, "RESIDENT": hold and holds_queries(config["BLOCK_M"], cq, block_d, q.element_size())}
    config = {**config, "RESIDENT": True}
    if runtime.INTERPRET:
        return config
    limit = shared_memory_limit(q.device)
    while (held_shared_bytes(config, cq, block_d, q.element_size()) > limit
           and (config["num_stages"] > 2 or config["BLOCK_N"] > 16)):
        if config["num_stages"] > 2:
            config["num_stages"] -= 1
        else:
            config["BLOCK_N"] //= 2
    return config


def conv_forward_config(q: torch.Tensor, cq: int, causal: bool, hold: bool = True) -> dict:
    """The table's tile for the fused kernel on ``q [B, Hq, N, D]``: the held-query tile where its ``cq`` shifted
    query tiles fit on chip (and ``hold``), else the streamed tile (what :func:`conv_forward_launch` launches)."""
    config = tuning.config_for("conv_forward", shifted_head_dim_block(q.shape[-1], q.dtype), q.dtype, causal)
    return _hold_or_stream(config, q, cq, causal, hold)


def conv_forward_launch(q, v, kf, cd, o, lse, kernel_size: tuple[int, int], causal: bool, scale: float,
                        plan: ConvPlan) -> Launch:
    """The fused kernel's :class:`mta.launch.Launch` writing ``o`` and ``lse``, its tile from the table fitted on chip
    (held or streamed queries, :func:`_hold_or_stream`) and the TMA boxes fitted to it."""
    B, Hq, N, D = q.shape
    cq, ck = kernel_size
    e, _ = diagonal_reach(cq, ck)
    qd, kfd, vd = stream_descriptors(q, v, kf, plan.copy_engine)
    return tiled_launch(
        "conv_forward", conv_forward_kernel, lambda tile: (cdiv(N, tile["BLOCK_M"]), B * Hq),
        (q, kf, v, cd, o, lse, qd, kfd, vd, *q.stride(), *v.stride(), *kf.stride(), *o.stride(),
         N, N, Hq, Hq // v.shape[1], scale, size_bucket(N)),
        dict(CAUSAL=causal, CQ=cq, CK=ck, E=e, E_PAD=_pad16(e), D=D, BLOCK_D=shifted_head_dim_block(D, q.dtype),
             PRECISION=dot_precision(q.dtype, split_fp32=False)),
        dtype=q.dtype, fit=lambda tile: _hold_or_stream(tile, q, cq, causal, plan.hold_queries),
        pre_hook=fit_stream_descriptors, key=("N_BUCKET", "BLOCK_D", "CAUSAL", "CQ", "CK"))


def conv_attention_forward(q, k, v, weight, causal: bool, scale: float, plan: ConvPlan | None = None):
    """The pre-passes, then the fused kernel: ``o [B, Hq, N, D]`` (q's dtype) and ``lse [B, Hq, N]`` (fp32).
    ``plan``: default :func:`mta.conv_plan.plan_conv`'s for the inputs."""
    plan = plan or plan_of(q, weight, causal)
    if (chunks := batch_chunks(q.shape[0], q.shape[1])) is not None:  # more programs than a grid axis takes
        return concat_chunks(chunks, conv_attention_forward, (q, k, v), weight, causal, scale, plan)
    q, k, v = within_int32_indexing(q, k, v, rows_per_head=weight.shape[1])
    try:
        if plan.replay_graphs:
            return FORWARD_GRAPHS.run((*map(tensor_facts, (q, k, v, weight)), causal, scale, plan),
                                      lambda q, k, v, weight: planned_forward(q, k, v, weight, causal, scale, plan),
                                      q, k, v, weight)
        return planned_forward(q, k, v, weight, causal, scale, plan)
    except OutOfResources:  # a tile this GPU's shared memory cannot hold: the same outputs, unfused
        return conv_attention_forward_chunked(q, k, v, weight, causal, scale)


@dataclass(frozen=True, eq=False)
class ForwardLaunches:
    """The forward's launches for one call signature (:data:`FORWARD_PLANS`): the fold, the past and diagonal
    scores (None where no diagonal needs them), the fused kernel and the TMA boxes of ``q, kf, v`` (None without the
    copy engine). It keeps no tensor: one made at a signature's first call, which may run inside
    ``torch.compile``'s warm-up, would stay in inductor's memory pool, which inductor refuses."""

    fold: LaunchPlan
    past: LaunchPlan | None
    diagonal: LaunchPlan | None
    fused: LaunchPlan
    boxes: tuple | None


#: :class:`ForwardLaunches` per call signature: everything the launches depend on but the tensors' addresses.
FORWARD_PLANS = LaunchPlans()
#: The forward's CUDA graphs per call signature (:attr:`mta.conv_plan.ConvPlan.replay_graphs`).
FORWARD_GRAPHS = GraphedCalls()


def planned_forward(q, k, v, weight, causal: bool, scale: float, plan: ConvPlan):
    """The pre-passes (:func:`conv_prepasses`) and the fused kernel (:func:`conv_forward_launch`), their launches
    made once per call signature:
    ``o [B, Hq, N, D]`` (q's dtype) and ``lse [B, Hq, N]`` (fp32). Runs eagerly only (a graphed call replays it), so
    only there does it ask for its kernels to be compiled ahead."""
    compile_ahead("conv_forward", lambda *x: conv_attention_forward(*x, scale, plan), q, k, v, weight, causal)
    B, Hq, N, D = q.shape
    w = weight.detach().float().contiguous()
    cq, ck = w.shape[1:]
    e, e_past = diagonal_reach(cq, ck)
    kf = torch.empty((B, Hq, cq, N, D), device=q.device, dtype=k.dtype)
    diagonals = causal and e > 0
    p = torch.empty((B, Hq, N, _pad16(e_past + 1)), device=q.device, dtype=torch.float32) if diagonals else None
    cd = torch.empty((B, Hq, N, _pad16(e)), device=q.device, dtype=torch.float32) if diagonals else None
    o = empty_contiguous(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    signature = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device, w.shape, causal,
                 scale, plan, tma_ready(q), tma_ready(v))
    launches = FORWARD_PLANS.get(signature, lambda: _forward_launches(q, k, v, w, kf, p, cd, o, lse, causal, scale,
                                                                      plan))
    launches.fold(k, w, kf)
    if diagonals:
        launches.past(q, k, p)
        launches.diagonal(p, w, cd)
    else:
        cd = unread_stand_in(q.device)
    qd = kfd = vd = None
    if launches.boxes is not None:
        qd, kfd, vd = (descriptor(t, box) for t, box in zip((q, kf, v), launches.boxes))
    launches.fused(q, kf, v, cd, o, lse, qd, kfd, vd)
    return o, lse


def _forward_launches(q, k, v, w, kf, p, cd, o, lse, causal: bool, scale: float, plan: ConvPlan) -> ForwardLaunches:
    check_kernel_device(q=q, k=k, weight=w)
    cq, ck = w.shape[1:]
    past = diagonal = None
    if cd is not None:
        _, e_past = diagonal_reach(cq, ck)
        past = past_scores_launch(q, k, p, e_past, plan.past_by_product).plan(3)
        diagonal = diagonal_scores_launch(p, w, cd).plan(3)
    cd = unread_stand_in(q.device) if cd is None else cd  # made, not kept
    fused = conv_forward_launch(q, v, kf, cd, o, lse, (cq, ck), causal, scale, plan)
    descriptors = fused.args[6:9]
    boxes = None if descriptors[0] is None else tuple(list(d.block_shape) for d in descriptors)
    return ForwardLaunches(fold_keys_launch(k, w, kf, plan.fold_by_product).plan(3), past, diagonal, fused.plan(9),
                           boxes)


def plan_of(q: torch.Tensor, weight: torch.Tensor, causal: bool, graphs: bool = True) -> ConvPlan:
    """:func:`mta.conv_plan.plan_conv` for ``q [B, Hq, N, D]`` and ``weight [Hq, cq, ck]``, on q's GPU.
    ``graphs``: False for the custom ops (:mod:`mta.ops`), which ``torch.compile``'s code calls: under
    ``mode="reduce-overhead"`` inductor captures the whole step, and a graph of ours captured while inductor warms
    up would keep its static copies in inductor's memory pool, which inductor refuses."""
    family = None if q.device.type != "cuda" else tuning.gpu_family(q.device)
    return plan_conv(q.dtype, q.shape[-1], tuple(weight.shape[1:]), causal, family, graphs)


def _one_stage_for_groups(config: dict) -> dict:
    """The dK/dV side's tile with queries as rows, for GQA: its program loops over a group's query heads around
    its pipelined walk, and with two stages there Triton 3.6 on an H100 gives wrong dK and dweight at some tiles
    (fp16, d = 16, 29 x 3, 4 heads a group); with one stage they are exact."""
    return {**config, "num_stages": 1}


def conv_attention_backward(do, q, k, v, o, lse, weight, causal: bool, scale: float, plan: ConvPlan | None = None):
    """``dq, dk, dv, dweight`` of :func:`conv_attention` (the split into far and near parts:
    :mod:`mta.conv_backward`). ``dq, dk, dv`` in the dtypes of ``q, k, v``; ``dweight`` ``[Hq, cq, ck]`` fp32,
    summed over the batch. ``plan.backward`` says how: the fused kernels in one pass or in two phases
    (:func:`_fused_backward`), or the row chunks of :mod:`mta.conv_chunked` where no fused tile fits on chip.
    """
    plan = plan or plan_of(q, weight, causal)
    if (chunks := batch_chunks(q.shape[0], q.shape[1])) is not None:  # more programs than a grid axis takes
        parts = [conv_attention_backward(*(t[a:b] for t in (do, q, k, v, o, lse)), weight, causal, scale, plan)
                 for a, b in chunks]
        dq, dk, dv = (torch.cat(x) for x in list(zip(*parts))[:3])
        return dq, dk, dv, functools.reduce(torch.add, (p[3] for p in parts))  # summed in batch order
    do, q, k, v, o = within_int32_indexing(do, q, k, v, o, rows_per_head=weight.shape[1])
    if plan.backward == "chunked":
        return conv_attention_backward_chunked(do, q, k, v, weight, causal, scale)
    try:
        if plan.replay_graphs:
            return BACKWARD_GRAPHS.run((*map(tensor_facts, (do, q, k, v, o, lse, weight)), causal, scale, plan),
                                       lambda *t: _fused_backward(*t, causal, scale, plan), do, q, k, v, o, lse, weight)
        return _fused_backward(do, q, k, v, o, lse, weight, causal, scale, plan)
    except OutOfResources:  # a tile the shared-memory model let through and this GPU refuses: unfused
        return conv_attention_backward_chunked(do, q, k, v, weight, causal, scale)


#: The backward's launches per call signature (:class:`mta.launch.CallLaunches`: everything they depend on but the
#: tensors' addresses; the two-phase backward's chunks each have their own).
BACKWARD_LAUNCHES = LaunchPlans()
#: The fused backward's CUDA graphs per call signature (:attr:`mta.conv_plan.ConvPlan.replay_graphs`).
BACKWARD_GRAPHS = GraphedCalls()


def _fused_backward(do, q, k, v, o, lse, weight, causal: bool, scale: float, plan: ConvPlan):
    """:func:`conv_attention_backward`'s fused kernels. Order: the pre-passes again (folded keys, past and
    diagonal scores: recomputed, cheaper than keeping ``cq`` folded copies of K alive between forward and
    backward), ``Delta``, the near-diagonal kernel (causal), then the dQ side and the dK/dV side: one pass each
    (:func:`_one_pass_sides`), or two phases (:mod:`mta.conv_two_phase`). Each launch is made once per call
    signature (:data:`BACKWARD_LAUNCHES`)."""
    compile_ahead("conv_backward", lambda *x: conv_attention_backward(*x, scale, plan), do, q, k, v, o, lse, weight,
                  causal)
    B, Hq, N, D = q.shape
    cq, ck = weight.shape[1:]
    e, e_past = diagonal_reach(cq, ck)
    near = causal and e > 0
    block_d = shifted_head_dim_block(D, q.dtype)
    qa, qb = query_shift_groups(cq)
    w = weight.detach().float().contiguous()
    two_phase = plan.backward == "two_phase"
    signature = (*tensor_facts(do), *tensor_facts(q), *tensor_facts(k), *tensor_facts(v), o.stride(), lse.stride(),
                 w.shape, causal, scale, plan, tma_ready(q), tma_ready(v), tma_ready(do))
    launches = BACKWARD_LAUNCHES.get(signature, CallLaunches)
    dev = q.device
    if near:  # dO_i . v_{i - delta} on the E masked diagonals
        pv = torch.empty((B, Hq, N, _pad16(e)), device=dev, dtype=torch.float32)
        launches.run("past_do_v", lambda do, v, pv: past_scores_launch(do, v, pv, e - 1, plan.past_by_product),
                     do, v, pv)
    # Handed to the sides in a list that they empty, so that the folded keys are freed as soon as they are done.
    kf = folded_keys_buffer(k, Hq, cq, keys_major=two_phase)
    launches.run("fold", lambda k, w, kf: fold_keys_launch(k, w, kf, plan.fold_by_product), k, w, kf)
    kf = [kf]
    if near:
        pq = torch.empty((B, Hq, N, _pad16(e_past + 1)), device=dev, dtype=torch.float32)
        launches.run("past_q_k", lambda q, k, pq: past_scores_launch(q, k, pq, e_past, plan.past_by_product),
                     q, k, pq)
        cd = torch.empty((B, Hq, N, _pad16(e)), device=dev, dtype=torch.float32)
        launches.run("diagonal", diagonal_scores_launch, pq, w, cd)
    else:
        cd = unread_stand_in(dev)
    e_pad = _pad16(e)

    delta = empty_contiguous(lse)
    launches.run("rowsum", lambda o, do, delta: Launch(
        rowsum_do_o_kernel, (cdiv(N, ROWSUM_ROWS), B * Hq), (o, do, delta, *o.stride(), *do.stride(), N, Hq),
        dict(D=D, BLOCK_D=block_d, BLOCK_M=ROWSUM_ROWS)), o, do, delta)

    # True fp32 products for fp32, as in the forward: P recomputed here must match the forward's lse (at
    # logits of 1e3, tf32x3's 4x larger product error moves dV by 4x the fp32 rounding of the same method).
    meta = dict(CAUSAL=causal, CQ=cq, CK=ck, E=e, E_PAD=e_pad, QA=qa, QB=qb, D=D, BLOCK_D=block_d,
                PRECISION=dot_precision(q.dtype, split_fp32=False))
    ep_pad = _pad16(e_past + 1)
    dw_parts = []
    if near:
        g = torch.empty((B, Hq, N, ep_pad), device=dev, dtype=torch.float32)
        near_rows, near_warps = post_pass_tile(ep_pad, 128)
        dwn = torch.empty((cdiv(N, near_rows), B, Hq, cq, ck), device=dev, dtype=torch.float32)
        launches.run("near", lambda *t: Launch(
            conv_near_kernel, (cdiv(N, near_rows), B * Hq), (*t, N, Hq, scale),
            dict(CQ=cq, CK=ck, E=e, E_PAD=e_pad, EP_PAD=ep_pad, BLOCK_R=near_rows, num_warps=near_warps)),
            cd, pv, pq, lse, delta, w, g, dwn)
        del pv
        dw_parts.append(dwn)
    else:
        g = unread_stand_in(dev)

    if two_phase:
        dq, dk, dv = conv_two_phase.two_phase_sides(do, q, k, v, lse, delta, kf, cd, g, w, causal, scale, near, meta,
                                                    dw_parts, plan, launches)
    else:
        dq, dk, dv = _one_pass_sides(do, q, k, v, lse, delta, kf, cd, g, w, causal, scale, near, meta, dw_parts, plan,
                                     launches)
    # Fixed-order reductions over the per-program partials: deterministic.
    dweight = torch.cat(dw_parts).sum(dim=(0, 1)) * scale
    return dq, dk, dv, dweight


#: Rows of ``o`` and ``dO`` per program of the ``Delta = rowsum(dO * o)`` pre-pass.
ROWSUM_ROWS = 64


def _one_pass_sides(do, q, k, v, lse, delta, kf_held, cd, g, w, causal: bool, scale: float, near: bool,
                    meta: dict, dw_parts: list, plan: ConvPlan, launches: CallLaunches):
    """``dq, dk, dv`` by the one-pass tiled kernels of :mod:`mta.conv_backward` and their folds, the far part of the
    kernel's gradient appended to ``dw_parts``. ``kf_held``: a list holding the folded keys, emptied here;
    ``launches``: the call signature's. The dQ side runs first: the two ``cq``-fold fp32 buffers ``Gq`` and ``U``
    are never alive together."""
    kf = kf_held.pop()
    B, Hq, N, D = q.shape
    Hkv = k.shape[1]
    cq, ck = w.shape[1:]
    block_d = meta["BLOCK_D"]
    e_past = ck + cq - 3
    ep_pad = _pad16(e_past + 1)
    dev = q.device
    bucket = size_bucket(N)
    gq = torch.empty((B, Hq, cq, N, D), device=dev, dtype=torch.float32)
    launches.run("dq", lambda q, kf, v, do, lse, delta, cd, gq: tiled_launch(
        "conv_dq", conv_dq_kernel, lambda tile: (cdiv(N, tile["BLOCK_M"]), B * Hq),
        (q, kf, v, do, lse, delta, cd, gq, *q.stride(), *v.stride(), *kf.stride(), *do.stride(),
         N, N, Hq, Hq // Hkv, scale, bucket), meta, dtype=q.dtype,
        fit=lambda tile: fit_backward_tile(tile, "BLOCK_M", "BLOCK_N", cq, block_d, q.element_size()),
        key=("N_BUCKET", "BLOCK_D", "CAUSAL", "CQ", "CK")), q, kf, v, do, lse, delta, cd, gq)
    dq = empty_contiguous(q)
    dq_rows, dq_warps = post_pass_tile(block_d, 64, warps=4)
    head = cq * N * D  # gq and u: contiguous [B, Hq, cq, N, D], read from row 0 (no previous chunk)
    launches.run("dq_fold", lambda gq, g, k, dq: Launch(
        conv_dq_fold_kernel, (cdiv(N, dq_rows), B * Hq), (gq, g, k, dq, dq, head, N * D, D, *k.stride(), *dq.stride()),
        dict(n=N, cur0=0, cur1=N, f0=0, f1=N, num_heads=Hq, group_size=Hq // Hkv, scale=scale, NEAR=near,
             ACCUMULATE=False, CQ=cq, EP=e_past, EP_PAD=ep_pad, D=D, BLOCK_D=block_d, BLOCK_R=dq_rows,
             num_warps=dq_warps)), gq, g, k, dq)
    del gq

    u = torch.empty((B, Hq, cq, N, D), device=dev, dtype=torch.float32)
    dv = empty_contiguous(v)
    launches.run("dkdv", functools.partial(_dkdv_launch, causal, scale, meta, plan), q, kf, v, do, lse, delta, cd, u,
                 dv)
    del kf
    dk = empty_contiguous(k)
    fold_rows, fold_warps = post_pass_tile(block_d, 64)
    dwf = torch.empty((cdiv(N, fold_rows), B, Hq, cq, ck), device=dev, dtype=torch.float32)
    launches.run("dk_fold", lambda u, prev, g, q, k, w, dk, dwf: Launch(
        conv_dk_fold_kernel, (cdiv(N, fold_rows), B * Hkv),
        (u, prev, g, q, k, w, dk, dwf, head, N * D, D, head, *q.stride(), *k.stride(), *dk.stride()),
        dict(n=N, cur0=0, prev0=0, f0=0, f1=N, num_kv_heads=Hkv, group_size=Hq // Hkv, scale=scale, NEAR=near,
             HAS_PREV=False, CQ=cq, CK=ck, CK_PAD=next_power_of_2(ck), EP=e_past, EP_PAD=ep_pad, D=D,
             BLOCK_D=block_d, BLOCK_R=fold_rows, num_warps=fold_warps)), u, u, g, q, k, w, dk, dwf)
    dw_parts.append(dwf)
    return dq, dk, dv


def _dkdv_launch(causal: bool, scale: float, meta: dict, plan: ConvPlan, *tensors) -> Launch:
    """The one-pass dK/dV kernel's :class:`mta.launch.Launch` on ``tensors`` ``(q, kf, v, do, lse, delta, cd, u,
    dv)``: keys as rows where the plan gives that tile; for GQA the table's tile in one stage."""
    q, kf, v, do, dv = (tensors[i] for i in (0, 1, 2, 3, 8))
    B, Hq, N, _ = q.shape
    Hkv = v.shape[1]
    cq, block_d = meta["CQ"], meta["BLOCK_D"]
    keys_as_rows = tuning.as_config(plan.keys_as_rows_tile) if plan.keys_as_rows_tile else None

    def fit_dkdv(tile):
        return fit_backward_tile(tile, "BLOCK_N", "BLOCK_M", cq, block_d, q.element_size())
    tile = keys_as_rows
    if tile is None and Hq > Hkv:  # the table's tile in one stage, never an autotuned pick with two
        tile = _one_stage_for_groups(fit_dkdv(tuning.config_for("conv_dkdv", block_d, q.dtype, causal)))
    args = (*tensors, *q.stride(), *v.stride(), *kf.stride(), *do.stride(), *dv.stride(), N, N, Hkv, Hq // Hkv, scale,
            size_bucket(N))
    meta = {**meta, "KEYS_AS_ROWS": keys_as_rows is not None}
    if tile is not None:
        return Launch(conv_dkdv_kernel, (cdiv(N, tile["BLOCK_N"]), B * Hkv), args, {**meta, **tile})
    return tiled_launch("conv_dkdv", conv_dkdv_kernel, lambda tile: (cdiv(N, tile["BLOCK_N"]), B * Hkv), args, meta,
                        dtype=q.dtype, fit=fit_dkdv, key=("N_BUCKET", "BLOCK_D", "CAUSAL", "CQ", "CK"))


def compile_conv_ahead(q, k, v, weight, causal: bool, scale: float, plan: ConvPlan | None = None) -> None:
    """Before a first call that will be differentiated: compile the forward's and the backward's kernels side
    by side (:func:`mta.launch.compile_ahead`; the forward and backward compile their own otherwise)."""
    if wants_gradients(q, k, v, weight):
        plan = plan or plan_of(q, weight, causal)

        def forward_backward(q, k, v, weight, causal):
            # The backward's launches are queued first: its dK/dV kernel is the longest compile of all (the
            # first call waits for it), so it starts before the forward's are queued.
            o = empty_contiguous(q)
            lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
            conv_attention_backward(empty_contiguous(o), q, k, v, o, lse, weight, causal, scale, plan)
            conv_attention_forward(q, k, v, weight, causal, scale, plan)
        compile_ahead("conv_forward_backward", forward_backward, q, k, v, weight, causal)


class ConvAttention(KernelFunction):
    """Forward saves ``q, k, v, o``, the fp32 ``lse`` and the weight; backward recomputes the folded keys and
    diagonal scores (cheap, O(N)) and the tiles of ``C`` and ``P`` from them."""

    @staticmethod
    def forward(q, k, v, weight, causal, scale, plan):  # setup_context and vmap apart: for torch.func's transforms
        return conv_attention_forward(q, k, v, weight, causal, scale, plan)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, weight, causal, scale, plan = inputs
        o, lse = output
        ctx.save_for_backward(q, k, v, o, lse, weight)
        ctx.causal, ctx.scale, ctx.plan = causal, scale, plan
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # lse's gradient stays None: no zeros made and filled per call

    @staticmethod
    @differentiable_once  # a second derivative raises, never reads as 0 (mta.differentiable_once)
    def backward(ctx, do, _dlse):
        if do is None:
            return None, None, None, None, None, None, None
        q, k, v, o, lse, weight = ctx.saved_tensors
        if wrapped_by_functorch(do):  # the op unwraps the transforms' tensors for Triton (and plans for itself)
            dq, dk, dv, dweight = torch.ops.mta.conv_attention_backward(do, q, k, v, o, lse, weight, ctx.causal,
                                                                        ctx.scale)
        else:
            dq, dk, dv, dweight = conv_attention_backward(do, q, k, v, o, lse, weight, ctx.causal, ctx.scale, ctx.plan)
        return dq, dk, dv, dweight.to(weight.dtype), None, None, None


def conv_attention(q, k, v, weight, *, causal: bool = True, scale: float | None = None, return_lse: bool = False):
    """Multi-Token Attention (key-query convolution before the softmax), fused, O(N) memory, differentiable.

    Exactly :func:`mta.conv_attention_reference` (the definition in ``docs/mta-semantics.md``)
    without materializing any N x N matrix.

    Args:
        q: ``[B, Hq, N, D]``; fp16, bf16 or fp32.
        k, v: ``[B, Hkv, N, D]``, ``Hq % Hkv == 0``.
        weight: ``[Hq, cq, ck]``, ``1 <= cq <= 32``, odd ``ck <= 33``; any float dtype, used in fp32.
        causal: the MTA case (default).
        scale: default ``D ** -0.5``, applied before the convolution.
        return_lse: also return the fp32 log-sum-exp of each row of the convolved scores (not differentiable).

    Differentiable once in ``q``, ``k``, ``v`` and ``weight`` (fused backward, :mod:`mta.conv_backward`; a second
    derivative raises): the gradients come in the dtypes of their inputs, the weight's summed over the batch. On a
    GPU the fused backward of the tallest kernels at the widest head dims does not fit in shared memory
    (:func:`backward_fits`; e.g. ``cq > 12`` at d = 256 in bf16): their gradients come from
    :mod:`mta.conv_chunked`, exact and deterministic but unfused (blocks of query rows in PyTorch, much slower).

    Head dims 1 to 256; on the CPU (Triton's interpreter) fp16 and fp32 only. The folded keys
    ``Kf_a[j] = sum_b W[a, b] k[j - pk + b]`` are tensor-core operands in the input dtype: one rounding of that
    dtype that the definition (scores in fp32 from the inputs) does not have. It weighs as much as the terms of the
    scores are large: at most ``2^-8`` (bf16) or ``2^-11`` (fp16) of the sum of ``|q_d Kf_a[j]_d|`` over a score's
    products, however small the score (fp16 with logits in the hundreds: gradients off by percents, where flash attention's are not), and in
    fp16 each ``Kf_a`` entry must stay under 65504 in magnitude (keys of 3000 under a 1 x 33 kernel of ones
    already overflow, to NaN rows).
    """
    causal, scale, return_lse = check_conv_call(q, k, v, weight, causal, scale, return_lse)
    if torch.compiler.is_compiling():  # traced: the custom op (mta.ops) keeps the launchers out of the graph
        o, lse = torch.ops.mta.conv_attention(q, k, v, weight, causal, scale)
        return (o, lse) if return_lse else o
    o, lse = planned_conv_attention(q, k, v, weight, causal, scale, plan_of(q, weight, causal))
    return (o, lse) if return_lse else o


def planned_conv_attention(q, k, v, weight, causal: bool, scale: float, plan: ConvPlan):
    """``(o, lse)`` of checked inputs by ``plan``: through :class:`ConvAttention` where autograd (or a forward-mode
    tangent, which its ``jvp`` refuses by name) needs it, else the kernels alone, without autograd's bookkeeping."""
    if needs_autograd(q, k, v, weight):
        compile_conv_ahead(q, k, v, weight, causal, scale, plan)
        return ConvAttention.run(q, k, v, weight, causal, scale, plan)
    return conv_attention_forward(q, k, v, weight, causal, scale, plan)


def check_conv_call(q, k, v, weight, causal, scale, return_lse) -> tuple[bool, float, bool]:
    """:func:`conv_attention`'s inputs checked (a clear error for each problem): ``(causal, scale, return_lse)``
    resolved."""
    _, Hq, _, Nq, Nk, D = check_kernel_inputs(q, k, v)
    if Nq != Nk:
        raise ValueError(f"conv attention needs as many queries as keys, got Nq={Nq}, Nk={Nk}")
    cq, ck = check_weight(weight, num_heads=Hq, device=q.device)
    causal, return_lse = check_causal(causal), check_causal(return_lse, "return_lse")
    if cq > MAX_CQ or ck > MAX_CK:
        raise ValueError(f"kernel {cq} x {ck} is not supported: at most cq={MAX_CQ} and ck={MAX_CK} here")
    return causal, resolve_scale(scale, D), return_lse
