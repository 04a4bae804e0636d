"""The plan of a ``conv_attention`` call: which kernels run, and in which form its backward runs.

:func:`plan_conv` turns what a call's kernels depend on (dtype, head dim, kernel size, causal flag, where the
kernels run) into a :class:`ConvPlan`; the launchers of :mod:`mta.conv` and :mod:`mta.conv_two_phase` run it. The
rules read top to bottom in :func:`plan_conv`. A plan is immutable and hashable, so it is made once per call
signature; tests force a path by building a plan (``dataclasses.replace``) and running it.

The tile rules that the plan and the launchers share live here too: how a backward tile is fitted on chip
(:func:`fit_backward_tile`), whether the smallest one fits at all (:func:`backward_fits`), the dK/dV side's
keys-as-rows tile (:func:`keys_as_rows_tile`) and the post-passes' tiles (:func:`post_pass_tile`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import runtime, tuning
from .conv_forward import query_shift_groups
from .launch import shifted_head_dim_block

SIXTEEN_BIT = (torch.float16, torch.bfloat16)

#: Fewest query shifts (``cq``) at which bf16 on Hopper takes the two-phase backward: below it the one-pass
#: kernels are faster (``docs/decisions.md``).
MIN_QUERY_SHIFTS = 3
#: Bytes of ``dC_far`` scratch (one chunk of keys of every head) the two-phase backward allocates, unless phase 1
#: needs longer chunks to fill the GPU (:data:`mta.conv_two_phase.PHASE_ONE_PROGRAMS_PER_SM`, up to
#: :data:`SCRATCH_MAX_BYTES`); a chunk is at least one tile. At 6 x 11, bf16, N = 8192 it holds 1024 keys of 16
#: heads (d = 128), 2048 of 8.
SCRATCH_BYTES = 256 * 2 ** 20
#: Most bytes the scratch grows to where phase 1 needs longer chunks: at B 1, 8 heads of 16384 rows, 4096 keys.
SCRATCH_MAX_BYTES = 2 ** 30
#: Most bytes of one block of ``Gq`` rows (16-bit, ``cq d`` wide, every head) made at once; at least a chunk's rows.
GQ_BYTES = 64 * 2 ** 20

#: fp32 accumulator registers per thread a tiled backward program may use (``[owned, (QA + QB) * BLOCK_D]``):
#: the fastest Hopper tiles sit at this bound.
ACC_REGISTERS = 192
#: Most warps a tiled backward program gets when its accumulator is wide (two warpgroups).
MAX_WARPS = 8
#: Registers per thread for the accumulator plus one streamed ``[streamed, (QA + QB) * BLOCK_D]`` tile (the
#: operand of the score product): over it, the streamed rows halve.
TILE_REGISTERS = 256
#: Shared memory for the held 16-bit block and the streamed tiles, in bytes (an H100 has 227 KiB per block).
SHARED_BYTES = 200 * 1024


@dataclass(frozen=True)
class ConvPlan:
    """How one ``conv_attention`` call runs.

    Attributes:
        hold_queries: the forward holds its rows' shifted query tiles for the whole key walk where they fit in
            :data:`mta.conv_forward.RESIDENT_BYTES` (else, and where False, it reloads them per key tile).
        copy_engine: reloaded tiles come through Hopper's copy engine where it can read them
            (:func:`mta.tma.stream_descriptors`), else by pointer loads.
        fold_by_product: the key fold by band-matrix products on the tensor cores
            (:func:`mta.conv_forward.fold_keys_product_kernel`), else by shifted loads (``fold_keys_kernel``).
        past_by_product: past scores by one product per row tile (``past_scores_product_kernel``) where the band
            fits the tile, else one dot product per row and diagonal (``past_scores_kernel``).
        backward: ``"one_pass"`` (the tiled kernels of :mod:`mta.conv_backward`), ``"two_phase"``
            (:mod:`mta.conv_two_phase`) or ``"chunked"`` (blocks of rows in PyTorch, :mod:`mta.conv_chunked`,
            where no fused tile fits on chip).
        keys_as_rows_tile: one pass: the dK/dV side's tile ``(BLOCK_M, BLOCK_N, warps, stages)`` with keys as the
            score tile's rows; None: the table's tile, queries as rows.
        chunk: two phases: keys per chunk; None: as many as :data:`SCRATCH_BYTES` hold.
        gq_bytes: two phases: most bytes of one block of ``Gq`` rows where GEMMs make dq's far part.
        dq_far_kernel: two phases: dq's far part by :func:`mta.conv_dq_kernels.conv_dq_far_kernel` straight from
            the scratch, else by ``Gq`` GEMMs and :func:`mta.conv_backward.conv_dq_fold_kernel`.
        dk_fold_by_product: two phases: the dK fold on the tensor cores
            (:func:`mta.conv_backward.conv_dk_fold_product_kernel`) where ``U`` is 16-bit, else by pointer loads.
        replay_graphs: a call signature seen before replays a CUDA graph of the fused forward's and backward's
            launches (:mod:`mta.graphed_calls`), else they are launched from Python at every call.
    """

    fold_by_product: bool
    past_by_product: bool
    backward: str
    hold_queries: bool = True
    copy_engine: bool = True
    keys_as_rows_tile: tuple[int, int, int, int] | None = None
    chunk: int | None = None
    gq_bytes: int = GQ_BYTES
    dq_far_kernel: bool = False
    dk_fold_by_product: bool = False
    replay_graphs: bool = False


@functools.lru_cache(maxsize=256)
def plan_conv(dtype: torch.dtype, head_dim: int, kernel_size: tuple[int, int], causal: bool,
              family: str | None = None, graphs: bool = True) -> ConvPlan:
    """The plan for inputs of ``dtype`` and ``head_dim`` under a ``(cq, ck)`` kernel. ``family``: the GPU family
    (:func:`mta.tuning.gpu_family`: ``"hopper"``, ``"other"``, ``"interpreter"``); default this machine's.
    ``graphs``: whether the call may replay CUDA graphs of its own (not where ``torch.compile``'s code calls it).

    The rules, top to bottom:

    * on a GPU, with ``graphs``, repeated call signatures replay CUDA graphs (their launches' Python costs more than
      the GPU's work at the lengths a model trains at: ``docs/decisions.md``);
    * 16-bit inputs on a GPU: folds and past scores by products on the tensor cores (fp32 keeps exact per-element
      sums; the interpreter's 16-bit products are not exact);
    * backward on a GPU where no fused tile fits on chip (:func:`backward_fits`): chunked, in PyTorch;
    * bf16 on Hopper with at least :data:`MIN_QUERY_SHIFTS` query shifts: two phases, dq's far part by the Triton
      kernel at 128-wide head-dim tiles, the dK fold by products;
    * else one pass, with the keys-as-rows dK/dV tile where Hopper has one that fits.
    """
    family = tuning.gpu_family() if family is None else family
    cq, _ = kernel_size
    on_gpu = family != "interpreter"
    by_product = on_gpu and dtype in SIXTEEN_BIT
    block_d = shifted_head_dim_block(head_dim, dtype)
    if on_gpu and not backward_fits(cq, head_dim, dtype):
        backward = "chunked"
    elif dtype == torch.bfloat16 and family == "hopper" and cq >= MIN_QUERY_SHIFTS:
        return ConvPlan(fold_by_product=by_product, past_by_product=by_product, backward="two_phase",
                        dq_far_kernel=block_d == 128, dk_fold_by_product=True, replay_graphs=graphs)
    else:
        backward = "one_pass"
    return ConvPlan(fold_by_product=by_product, past_by_product=by_product, backward=backward,
                    keys_as_rows_tile=keys_as_rows_tile(cq, block_d, dtype, family), replay_graphs=on_gpu and graphs)


def fit_backward_tile(config: dict, owned: str, streamed: str, cq: int, block_d: int, elem_bytes: int) -> dict:
    """``config`` fitted on chip for a backward program whose rows are ``(QA + QB) * block_d`` wide:

    * the fp32 accumulator ``[owned, cols]`` lives in registers: at most :data:`ACC_REGISTERS` per thread. Too
      wide, the program first gets more warps (up to :data:`MAX_WARPS`, two warpgroups), then its owned rows
      ``config[owned]`` halve (down to 16);
    * with one streamed ``[streamed, cols]`` tile beside it, at most :data:`TILE_REGISTERS`: else the streamed
      rows ``config[streamed]`` halve (down to 16);
    * the held 16-bit operand ``[owned, cols]`` and ``num_stages`` streamed ``[streamed, cols]`` tiles in shared
      memory: at most :data:`SHARED_BYTES`. Too large, the streamed rows halve first, then the owned rows, then
      the pipeline loses stages (:func:`backward_fits` says what 16 x 16 x 1 cannot fit).

    The table's tiles are chosen at 6 x 11 (``cq' = 6``); a wider kernel keeps their rows with more warps rather
    than rows too few for the tensor cores.
    """
    config = dict(config)
    cols = sum(query_shift_groups(cq)) * block_d

    def registers():
        return config[owned] * cols / (32 * config["num_warps"])

    while registers() > ACC_REGISTERS:
        if config["num_warps"] < MAX_WARPS:
            config["num_warps"] *= 2
        elif config[owned] > 16:
            config[owned] //= 2
        else:
            break

    def tile_registers():  # the accumulator and one streamed tile (a register holds 4 bytes of it)
        return registers() + config[streamed] * cols * elem_bytes / (4 * 32 * config["num_warps"])

    while tile_registers() > TILE_REGISTERS and config[streamed] > 16:
        config[streamed] //= 2

    def shared():
        return (config[owned] + config[streamed] * max(config["num_stages"], 1)) * cols * elem_bytes

    while shared() > SHARED_BYTES:
        if config[streamed] > 16:
            config[streamed] //= 2
        elif config[owned] > 16:
            config[owned] //= 2
        elif config["num_stages"] > 1:  # tall kernels at d = 128: 16 x 16 rows, one buffer
            config["num_stages"] -= 1
        else:
            break
    return config


def backward_fits(cq: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Whether the fused backward's smallest tile fits on chip: 16 owned and 16 streamed rows,
    ``(QA + QB) * BLOCK_D`` wide (:func:`fit_backward_tile`), within :data:`SHARED_BYTES`. It does not, in
    bf16/fp16, for cq > 12 at d > 128 and cq > 24 at d > 64; in fp32, for cq > 6 at d > 128, cq > 12 at d > 64 and
    cq > 24 at d > 32 (those run :mod:`mta.conv_chunked`)."""
    smallest = 32 * sum(query_shift_groups(cq)) * shifted_head_dim_block(head_dim, dtype) * dtype.itemsize
    return smallest <= SHARED_BYTES


def keys_as_rows_tile(cq: int, block_d: int, dtype: torch.dtype, family: str) -> tuple[int, int, int, int] | None:
    """The dK/dV side's tile when its scores are made keys as rows (:data:`mta.tuning.HOPPER_KEYS_AS_ROWS`: 16-bit
    on Hopper, where the table has one for the head-dim width and it fits whole, its 128 owned keys' accumulator
    included); None: the table's tile, scores with queries as rows."""
    tile = tuning.HOPPER_KEYS_AS_ROWS.get(tuning.width_of(block_d))
    if tile is None or tuning.AUTOTUNE or dtype == torch.float32 or family != "hopper":
        return None
    config = tuning.as_config(tile)
    fitted = fit_backward_tile(config, "BLOCK_N", "BLOCK_M", cq, block_d, dtype.itemsize)
    return tile if fitted == config else None


def post_pass_tile(width: int, max_rows: int, warps: int = 2) -> tuple[int, int]:
    """``(rows, num_warps)`` of a memory-bound backward post-pass over ``[rows, width]`` fp32 tiles: each tile 32
    registers a thread over ``warps`` warps (at least 16 rows, at most ``max_rows``; more warps where 16 rows are
    wider than that), so a few tiles live in registers without spills. The near kernel and the dK fold run
    fastest over 2 warps on Hopper, the dQ fold over 4."""
    if runtime.INTERPRET:  # the interpreter pays per operation, not per element: long tiles
        return 128, 4
    rows = max(16, min(max_rows, 32 * 32 * warps // width))
    return rows, max(warps, rows * width // 1024)
