"""The two-phase MTA backward: ``dC_far`` made once at the forward's rate, then its products, chunk by chunk.

The one-pass kernels of :mod:`mta.conv_backward` hold ``cq`` shifted copies of a tile's queries (or folded keys)
side by side and accumulate products ``cq'`` head dims wide in registers. Those blocks crowd the chip (d = 128 at
6 x 11: ``[64, 768]`` 16-bit operands and fp32 accumulators), their tiles shrink to 32-64 rows, and each side
makes ``C`` again. Here the backward walks chunks of keys, and for each:

1. one Triton kernel (:mod:`mta.conv_dc_kernels`) makes ``C`` with the forward's streamed pieces, then ``P``,
   ``dP``, ``dC`` and its far part, stores ``dC_far`` for the chunk's keys in a 16-bit rows-major scratch, and
   sums ``dV = P^T dO`` of a query head in registers: the chunk's ``dv``, complete (a GQA group's heads' parts
   are summed once after the last chunk);
2. the dK side: one GEMM, ``U = dC_far^T Qshift`` (the shifted queries side by side, ``cq d`` wide), written once,
   and :func:`mta.conv_backward.conv_dk_fold_kernel` folds it into ``dk`` and the far part of ``dW`` as soon as
   the keys it reads are made (a key reads ``U`` rows ``c - pk .. c + pk``: this chunk's and the previous one's);
3. the dQ side, folded at once into an fp32 running ``dq`` (the fold is linear): at 128-wide head-dim tiles
   :func:`mta.conv_dq_kernels.conv_dq_far_kernel`, one product of depth ``cq x keys`` per row tile from the
   scratch's shifted rows (no ``Gq``); elsewhere the chunk's part of
   ``Gq = dC_far Kf`` (the folded keys side by side) by GEMMs over blocks of rows, each folded by
   :func:`mta.conv_backward.conv_dq_fold_kernel` (``ACCUMULATE``): row ``r`` reads ``Gq`` rows ``r .. r + cq - 1``,
   so a block is made ``cq - 1`` rows longer.

``C`` is made once: ``cq' + 2`` product units in the Triton kernel, ``2 cq'`` in phase 2. Extra memory: the scratch
(:data:`mta.conv_plan.SCRATCH_BYTES`, or where that is more, a tile of keys of every head, or enough key tiles of
every head for :data:`PHASE_ONE_PROGRAMS_PER_SM` programs an SM, up to :data:`mta.conv_plan.SCRATCH_MAX_BYTES`), two
chunks of ``U``, one block of ``Gq`` (:attr:`mta.conv_plan.ConvPlan.gq_bytes`) where GEMMs make it, the fp32 running
``dq``, and the folded keys and shifted queries laid out for the products (each ``cq`` times q's size): O(N).
Deterministic: every output row has one owner, and the products, folds and sums over chunks run in a fixed order.
Rounding: ``Gq`` and ``U`` leave cuBLAS in the inputs' dtype, and phase 1 sums the score product in other pieces
than the forward that made the lse, so at logits of order 1e3 ``P`` is off by their fp32 rounding (fp32 inputs,
forced: ``dv`` near 4e-4 from float64 where the one-pass kernels give 1e-6), well under bf16's own rounding.
"""

from __future__ import annotations

import torch

from . import runtime, tuning
from .conv_plan import GQ_BYTES, SCRATCH_BYTES, SCRATCH_MAX_BYTES, ConvPlan, post_pass_tile
from .tma import descriptor, stream_descriptors
from .conv_backward import conv_dk_fold_kernel, conv_dk_fold_product_kernel, conv_dq_fold_kernel
from .conv_dc_kernels import conv_dc_kernel, shifted_queries_kernel
from .conv_dq_kernels import conv_dq_far_kernel
from .decode import sm_count
from .launch import CallLaunches, Launch, cdiv, empty_contiguous, next_power_of_2

#: ``(rows, warps)`` of the dK fold's pointer-kernel programs on a GPU up to 128-wide head dims: 8 rows on one
#: warp, the fastest on Hopper at d = 64 and 128 (elsewhere :func:`mta.conv_plan.post_pass_tile`'s).
DK_FOLD_TILE = (8, 1)
#: ``(rows, warps)`` of the dQ fold's programs on a GPU up to 128-wide head dims: 16 rows on 4 warps, the fastest
#: on Hopper at d = 64 and 128 (elsewhere :func:`mta.conv_plan.post_pass_tile`'s).
DQ_FOLD_TILE = (16, 4)
#: Phase-1 programs per SM that a chunk of keys is made long enough for (two waves; evened out over the chunks, a
#: chunk may give a few less), though the scratch then passes :data:`mta.conv_plan.SCRATCH_BYTES`: on Hopper a
#: chunk of a few key tiles leaves SMs idle (at B 1, 8 heads, N = 16384, d = 64, 64 programs make a forward +
#: backward 13.2 ms, 256 make it 9.8 ms: ``docs/decisions.md``).
PHASE_ONE_PROGRAMS_PER_SM = 2
#: ``(keys, warps)`` of the product dK fold's programs: 16 keys on 2 warps, the fastest on Hopper at d = 64, 128.
DK_FOLD_PRODUCT_TILE = (16, 2)


def phase_one_tile(block_d: int, dtype: torch.dtype, causal: bool) -> dict:
    """The tile of the phase-1 kernel: the forward's streamed tile (128 x 128, 8 warps, 3 stages on Hopper at 16
    bits) and the depth of one streamed product, ``WIDTH``: at most 64 (whole head dims to 64; half of 128), faster
    on Hopper than the forward's 32 at d = 64 and than 128 (which fits only in two stages) at d = 128."""
    return {**tuning.config_for("conv_forward_streamed", block_d, dtype, causal), "WIDTH": min(block_d, 64)}


def dq_far_tile(block_d: int, dtype: torch.dtype) -> dict:
    """The tile of :func:`mta.conv_dq_kernels.conv_dq_far_kernel`: ``BLOCK_M`` rows of ``dq`` (the whole head dim)
    over steps of ``BLOCK_K`` keys of one query shift, as a GEMM's tile; small in the interpreter (which pays per
    element) and for fp32 (twice the bytes a stage)."""
    if runtime.INTERPRET:
        return {"BLOCK_M": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
    if dtype == torch.float32:
        return {"BLOCK_M": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
    if block_d > 128:
        return {"BLOCK_M": 64, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2}
    return {"BLOCK_M": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 4}  # 4 stages: faster than 3 on Hopper


def dk_fold_launch(by_product: bool, u_dtype: torch.dtype, block_d: int, ck: int, e_past: int) -> tuple:
    """``(kernel, rows, constexprs)`` of the dK fold over a ``U`` of ``u_dtype``: the product kernel's tile and
    windows where ``by_product`` (:attr:`mta.conv_plan.ConvPlan.dk_fold_by_product`) and ``U`` is 16-bit, else
    the pointer kernel's tile."""
    if by_product and u_dtype in (torch.float16, torch.bfloat16):
        rows, warps = DK_FOLD_PRODUCT_TILE
        return conv_dk_fold_product_kernel, rows, dict(
            BLOCK_R=rows, num_warps=warps, WINDOW=next_power_of_2(rows + ck - 1),
            NEAR_WINDOW=next_power_of_2(rows + e_past))
    rows, warps = _measured_tile(DK_FOLD_TILE, block_d) or post_pass_tile(block_d, 64)
    return conv_dk_fold_kernel, rows, dict(BLOCK_R=rows, num_warps=warps)


def fold_dk(u, prev, prev0: int, c0: int, f0: int, f1: int, g, q, k, w, dk, dwf, scale: float, near: bool,
            block_d: int, by_product: bool, launches: CallLaunches | None = None, name="dk_fold") -> None:
    """The dK fold of one chunk of keys: ``dk[:, :, f0:f1]`` and the far ``dW`` partials ``dwf`` ``[tiles, B, Hq,
    cq, ck]`` (one per :func:`dk_fold_launch` tile of rows) from the chunk's ``U`` ``[B * Hq, keys, cq * D]``
    (its rows from key ``c0``) and, where its keys read back past ``c0``, the previous chunk's ``prev`` (rows
    from ``prev0``; None for the first chunk). ``g``: the near part's score gradients ``[B, Hq, N, E'_PAD]``,
    read where ``near``; ``by_product``: :func:`dk_fold_launch`'s. ``launches``: the call signature's, where the
    launch is kept under ``name`` (None: made here)."""
    B, Hq, N, D = q.shape
    Hkv = k.shape[1]
    cq, ck = w.shape[1:]
    e_past = ck + cq - 3

    def make(u, before, g, q, k, w, dk, dwf):
        kernel, rows, tile = dk_fold_launch(by_product, u.dtype, block_d, ck, e_past)
        return Launch(kernel, (cdiv(f1 - f0, rows), B * Hkv),
                      (u, before, g, q, k, w, dk, dwf, u.stride(0), D, cq * D, before.stride(0), *q.stride(),
                       *k.stride(), *dk.stride()),
                      dict(n=N, cur0=c0, prev0=prev0, f0=f0, f1=f1, num_kv_heads=Hkv, group_size=Hq // Hkv,
                           scale=scale, NEAR=near, HAS_PREV=prev is not None, CQ=cq, CK=ck,
                           CK_PAD=next_power_of_2(ck), EP=e_past, EP_PAD=max(16, next_power_of_2(e_past + 1)), D=D,
                           BLOCK_D=block_d, **tile))
    (launches or CallLaunches()).run(name, make, u, u if prev is None else prev, g, q, k, w, dk, dwf)


def chunk_size(batch_heads: int, n: int, tile: dict, halo: int, chunk: int | None = None,
               programs: int = 0) -> int:
    """Keys per chunk: ``chunk`` where given, else as many as :data:`mta.conv_plan.SCRATCH_BYTES` of 16-bit
    ``dC_far`` hold for ``batch_heads`` heads of ``n`` rows, or, where that is more, enough key tiles for phase 1 to
    run ``programs`` programs (a tile of keys of each head is one) as far as :data:`mta.conv_plan.SCRATCH_MAX_BYTES`
    hold, then evened out over as many chunks; a multiple of both tile sides and at least ``halo`` (the keys a fold
    reads past its own)."""
    step = max(tile["BLOCK_M"], tile["BLOCK_N"])
    least = step * cdiv(max(halo, 1), step)
    if chunk is not None:
        return min(max(chunk // step * step, least), step * cdiv(n, step))
    row_bytes = 2 * batch_heads * max(n, 1)  # a key of every head
    rows = max(SCRATCH_BYTES // row_bytes, min(tile["BLOCK_N"] * cdiv(programs, batch_heads),
                                               SCRATCH_MAX_BYTES // row_bytes))
    rows = min(max(rows // step * step, least), step * cdiv(n, step))
    # Even chunks: N = 8192 in 1024-key chunks, not seven of 1152 and one of 128 (a tail chunk costs a whole
    # chunk's launches for a sliver of the work)
    return max(step * cdiv(cdiv(n, cdiv(n, rows)), step), least)


def gq_block_rows(batch_heads: int, width: int, chunk: int, budget: int = GQ_BYTES) -> int:
    """Rows of ``Gq`` made (and folded) at once: as many as ``budget`` bytes hold, at least a chunk's."""
    return max(chunk, budget // (2 * batch_heads * width) // chunk * chunk)


def shifted_queries_side_by_side(q: torch.Tensor, cq: int, out: torch.Tensor | None = None,
                                 launches: CallLaunches | None = None) -> torch.Tensor:
    """``[B * Hq, N, cq * D]``: column ``a * D + d`` of row ``i`` holds ``q[i - (cq-1) + a, d]`` (0 before row 0),
    the queries of every shift of the convolution side by side: the right operand of ``U = dC_far^T Qshift``.
    Contiguous, made once (:func:`mta.conv_dc_kernels.shifted_queries_kernel`): an overlapping view, rows ``D``
    apart and ``cq * D`` long, is no GEMM operand, and cuBLAS's wrapper would copy it for every chunk. Written to
    ``out`` where given; ``launches``: the call signature's (None: the launch is made here)."""
    B, Hq, N, D = q.shape
    qs = torch.empty((B * Hq, N, cq * D), device=q.device, dtype=q.dtype) if out is None else out
    rows = 128 if runtime.INTERPRET else 32
    (launches or CallLaunches()).run("shifted_queries", lambda q, qs: Launch(
        shifted_queries_kernel, (cdiv(N, rows), B * Hq), (q, qs, *q.stride(), N, Hq),
        dict(CQ=cq, D=D, BLOCK_D=next_power_of_2(D), BLOCK_R=rows, num_warps=4)), q, qs)
    return qs


def _measured_tile(tile: tuple[int, int] | None, block_d: int) -> tuple[int, int] | None:
    """A fold's ``(rows, warps)`` measured on a GPU (:data:`DK_FOLD_TILE`, :data:`DQ_FOLD_TILE`), where it applies:
    not in the interpreter (which pays per operation: long tiles), head dims up to 128 wide (as measured)."""
    return tile if tile is not None and not runtime.INTERPRET and block_d <= 128 else None


def _dq_far_descriptors(dcs: torch.Tensor, kf: torch.Tensor, dq: torch.Tensor, tile: dict, block_d: int):
    """``(DCD, KFD, DQD)`` for :func:`mta.conv_dq_kernels.conv_dq_far_kernel`: over the chunk's scratch ``dcs``
    ``[B * Hq, rows, keys]`` (rows outside it and keys past the chunk load as zeros), the folded keys and the
    fp32 running ``dq``."""
    return (descriptor(dcs, [1, tile["BLOCK_M"], tile["BLOCK_K"]]), descriptor(kf, [1, 1, 1, tile["BLOCK_K"], block_d]),
            descriptor(dq, [1, 1, tile["BLOCK_M"], block_d]))


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` batched: in the inputs' dtype on a GPU (cuBLAS accumulates in fp32), in fp32 on the CPU."""
    if a.device.type == "cuda":
        return torch.matmul(a, b)
    return torch.matmul(a.float(), b.float())


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def _descriptors(q, v, kf, do, tile: dict, block_d: int, copy_engine: bool) -> tuple:
    """``(QD, KFD, DOD)``: TMA descriptors for the phase-1 kernel (as the forward's streamed path, and ``dO``'s like
    ``q``'s), boxes fitted to ``tile``; all None where the copy engine does not apply to any of them, or is not
    wanted (:attr:`mta.conv_plan.ConvPlan.copy_engine`)."""
    qd, kfd, _ = stream_descriptors(q, v, kf, copy_engine)
    dod = stream_descriptors(do, v, kf, copy_engine)[0] if qd is not None else None
    if dod is None:
        return None, None, None
    qd.block_shape = [1, 1, tile["BLOCK_M"], tile["WIDTH"]]
    kfd.block_shape = [1, 1, 1, tile["BLOCK_N"], tile["WIDTH"]]
    dod.block_shape = [1, 1, tile["BLOCK_M"], block_d]
    return qd, kfd, dod


def _scratch_descriptor(dcs: torch.Tensor, tile: dict):
    """A TMA descriptor over the chunk's scratch ``[B * Hq, rows, keys]``, box ``[1, BLOCK_M, BLOCK_N]``: the
    stores of its bounds' far side (rows past N) are dropped."""
    return descriptor(dcs, [1, tile["BLOCK_M"], tile["BLOCK_N"]])


def two_phase_sides(do, q, k, v, lse, delta, kf_held, cd, g, w, causal: bool, scale: float, near: bool,
                    meta: dict, dw_parts: list, plan: ConvPlan, launches: CallLaunches | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dq, dk, dv`` (the dtypes of ``q, k, v``) by the two phases, the far part of the kernel's gradient
    appended to ``dw_parts`` (per-program partials over ``scale``, as :func:`mta.conv._fused_backward`'s).

    ``kf_held``: a list holding the folded keys ``[B, Hq, cq, N, D]`` laid out keys-major
    (:func:`mta.conv.fold_keys` with ``keys_major=True``, so that ``[B * Hq, N, cq * D]`` is a view of them),
    emptied here; ``cd``, ``g``: the diagonal scores and the near part's score gradients (causal), ``meta``: the
    one-pass kernels' constexprs; ``plan``: the chunk, dq's far part and the dK fold's kernel; ``launches``: the
    call signature's (:class:`mta.launch.CallLaunches`, each chunk's launches its own; None: made here).
    """
    kf = kf_held.pop()
    launches = launches or CallLaunches()
    B, Hq, N, D = q.shape
    Hkv = k.shape[1]
    cq, ck = w.shape[1:]
    pk = (ck - 1) // 2
    block_d = meta["BLOCK_D"]
    tile = phase_one_tile(block_d, q.dtype, causal)
    constexprs = {name: meta[name] for name in ("CAUSAL", "CQ", "CK", "E", "E_PAD", "D", "BLOCK_D", "PRECISION")}
    size = chunk_size(B * Hq, N, tile, 2 * pk, plan.chunk, PHASE_ONE_PROGRAMS_PER_SM * sm_count(q.device))
    scratch = torch.empty((B * Hq, N, size), device=q.device, dtype=q.dtype)  # a chunk's rows x its keys
    descriptors = _descriptors(q, v, kf, do, tile, block_d, plan.copy_engine)
    e_past = ck + cq - 3
    fold_meta = dict(NEAR=near, CQ=cq, EP=e_past, EP_PAD=max(16, next_power_of_2(e_past + 1)), D=D, BLOCK_D=block_d)

    kf_cat = kf.permute(0, 1, 3, 2, 4).reshape(B * Hq, N, cq * D)  # a view: kf is laid out keys-major
    qs = shifted_queries_side_by_side(q, cq, launches=launches)
    far_kernel = plan.dq_far_kernel
    # dq's parts, summed over chunks (the dq kernel's first chunk writes every row; the GEMM path adds to zeros)
    dq_sum = (torch.empty if far_kernel else torch.zeros)((B, Hq, N, D), device=q.device, dtype=torch.float32)
    dk, dv = empty_contiguous(k), empty_contiguous(v)
    # phase 1 runs a program per query head: a GQA group's parts of dv, in fp32, are summed after the chunks
    dv_parts = dv if Hq == Hkv else torch.empty((B, Hq, N, D), device=q.device, dtype=torch.float32)
    dq_rows, dq_warps = _measured_tile(DQ_FOLD_TILE, block_d) or post_pass_tile(block_d, 64, warps=4)
    # U leaves cuBLAS in the inputs' dtype on a GPU (fp32 on the CPU: _product)
    fold_rows = dk_fold_launch(plan.dk_fold_by_product, q.dtype if q.is_cuda else torch.float32, block_d, ck,
                               e_past)[1]
    gq_rows = gq_block_rows(B * Hq, cq * D, size, plan.gq_bytes)
    dq_tile = dq_far_tile(block_d, q.dtype)
    # The dK folds' dW partials, all chunks in one buffer: the fold of a chunk takes its keys [f0, f1).
    chunks = _chunks(N, size)
    folds = [(max(c0 - pk, 0) if c0 > 0 else 0, c1 - pk if c1 < N else N) for c0, c1 in chunks]
    fold_tiles = [cdiv(max(f1 - f0, 0), fold_rows) for f0, f1 in folds]
    dw_far = torch.empty((sum(fold_tiles), B, Hq, cq, ck), device=q.device, dtype=torch.float32)
    dw_parts.append(dw_far)

    def dq_far_part(dcs, chunk, c0, c1, row0, accumulate):
        """dQ side: dq[r] += scale sum_a sum_j dC_far[r + cq-1-a, j] Kf_a[j] over the chunk's keys, for the rows from
        row0 - (cq-1) (the first that read a row of the chunk's). The first chunk writes dq's rows, the others add
        to them."""
        r_lo = max(row0 - (cq - 1), 0)
        dq_descriptors = (_dq_far_descriptors(dcs, kf, dq_sum, dq_tile, block_d) if descriptors[0] is not None
                          else (None, None, None))
        launches.run(("dq_far", chunk), lambda dcs, kf, dq_sum, *descriptors: Launch(
            conv_dq_far_kernel, (cdiv(N - r_lo, dq_tile["BLOCK_M"]), B * Hq),
            (dcs, kf, dq_sum, *descriptors, dcs.stride(0), dcs.stride(1), *kf.stride(), *dq_sum.stride(), N, c0, c1,
             row0, r_lo, Hq, scale, tuning.size_bucket(N)),
            dict(CAUSAL=causal, CQ=cq, E=meta["E"], D=D, BLOCK_D=block_d, PRECISION=meta["PRECISION"],
                 ACCUMULATE=accumulate, **dq_tile)), dcs, kf, dq_sum, *dq_descriptors)

    prev, prev0 = None, 0
    for chunk, (c0, c1) in enumerate(chunks):
        row0 = c0 if causal else 0
        # dC_far of the rows from row0 and the chunk's keys: [B * Hq, rows, keys], rows-major; a row's keys start
        # 16-byte aligned (the copy engine, cuBLAS): size is a multiple of the tiles.
        dcs = scratch[:, :N - row0, :c1 - c0]
        dcd = _scratch_descriptor(dcs, tile) if descriptors[0] is not None else None
        launches.run(("dc", chunk), lambda q, kf, v, do, lse, delta, cd, dcs, dv, *descriptors: Launch(
            conv_dc_kernel, (cdiv(c1 - c0, tile["BLOCK_N"]), B * Hq),
            (q, kf, v, do, lse, delta, cd, dcs, dv, *descriptors, *q.stride(), *v.stride(), *kf.stride(),
             *do.stride(), *dv.stride(), dcs.stride(0), dcs.stride(1), N, N, c0, row0, Hq, Hq // Hkv, scale,
             tuning.size_bucket(N)), {**constexprs, **tile}), q, kf, v, do, lse, delta, cd, dcs, dv_parts, *descriptors,
            dcd)
        # dK side: U = dC_far^T Qshift for the chunk's keys, written once; key c's fold reads U rows c - pk ..
        # c + pk, so the keys within pk of the chunk's end wait for the next chunk.
        u = _product(dcs.transpose(1, 2), qs[:, row0:])  # [B * Hq, keys, cq * D]
        (f0, f1), t0 = folds[chunk], sum(fold_tiles[:chunk])
        if f1 > f0:
            dwf = dw_far[t0:t0 + fold_tiles[chunk]]
            fold_dk(u, prev, prev0, c0, f0, f1, g, q, k, w, dk, dwf, scale, near, block_d,
                    plan.dk_fold_by_product, launches, ("dk_fold", chunk))
        prev, prev0 = u, c0
        if far_kernel:
            dq_far_part(dcs, chunk, c0, c1, row0, c0 > 0)

        # dQ side by GEMMs (not far_kernel): this chunk's part of Gq = dC_far Kf (rows from row0), in blocks of
        # rows, each folded into dq's running sum at once: row r reads Gq rows r .. r + cq - 1, so a block is made
        # cq - 1 rows longer (the first reaches back cq - 1 rows). The first chunk's fold adds the near part.
        for b0 in range(row0, N, gq_rows) if not far_kernel else ():
            r0, r1 = max(b0 - (cq - 1), 0) if b0 == row0 else b0, min(b0 + gq_rows, N)
            g0, g1 = max(r0, row0), min(r1 + cq - 1, N)
            gq = _product(dcs[:, g0 - row0:g1 - row0], kf_cat[:, c0:c1])  # [B * Hq, rows, cq * D]
            launches.run(("dq_fold", chunk, b0), lambda gq, g, k, dq_sum, dq_out: Launch(
                conv_dq_fold_kernel, (cdiv(r1 - r0, dq_rows), B * Hq),
                (gq, g, k, dq_sum, dq_out, gq.stride(0), D, cq * D, *k.stride(), *dq_sum.stride()),
                dict(n=N, cur0=g0, cur1=g1, f0=r0, f1=r1, num_heads=Hq, group_size=Hq // Hkv, scale=scale,
                     ACCUMULATE=True, BLOCK_R=dq_rows, num_warps=dq_warps, **{**fold_meta, "NEAR": near and c0 == 0})),
                gq, g, k, dq_sum, dq_sum)
            del gq  # one block alive at a time
    dq = None
    if far_kernel and near:  # dq's near part (no Gq rows: cur0 = cur1) added to the far parts, stored as dq
        dq = empty_contiguous(q)
        launches.run("dq_near", lambda no_gq, g, k, dq_sum, dq: Launch(
            conv_dq_fold_kernel, (cdiv(N, dq_rows), B * Hq), (no_gq, g, k, dq_sum, dq, 0, 0, 0, *k.stride(),
                                                              *dq_sum.stride()),
            dict(n=N, cur0=0, cur1=0, f0=0, f1=N, num_heads=Hq, group_size=Hq // Hkv, scale=scale, ACCUMULATE=True,
                 BLOCK_R=dq_rows, num_warps=dq_warps, **fold_meta)), dq_sum, g, k, dq_sum, dq)
    if dv_parts is not dv:
        dv.copy_(dv_parts.view(B, Hkv, Hq // Hkv, N, D).sum(2))
    del kf, kf_cat, qs, prev, scratch
    return dq if dq is not None else dq_sum.to(q.dtype), dk, dv
