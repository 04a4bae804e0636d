"""``mta.decode_attention``: split-K decoding of a few new queries against a KV cache.

The kernels are in :mod:`mta.decode_kernels`. A call checks its inputs, turns them into a :class:`DecodePlan`
(:func:`plan_decode`: the form, the tiles, the splits, from shapes, dtype and the device's facts only) and runs it
(:func:`run_decode`, shared with :func:`mta.conv_decode_attention`, whose plans :func:`mta.conv_decode.plan_conv_decode`
makes).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from . import runtime, tuning
from .checks import check_count, is_int_list, resolve_scale
from .decode_kernels import decode_combine_kernel, decode_split_kernel, decode_stream_kernel
from .launch import (INT32_INDEX_LIMIT, Launch, LaunchPlan, LaunchPlans, batch_chunks, cdiv, check_kernel_inputs,
                     checked_signature, dot_precision, head_dim_block, index_span, next_power_of_2)

#: Most new queries per call (rows of a decode tile: query heads of a group x new queries).
MAX_NEW_QUERIES = 16
#: Stand-in SM count in Triton's interpreter (no GPU to ask), small so that several splits run in the tests.
INTERPRETER_SMS = 4
#: A split count is kept if its wave efficiency is within this fraction of the best one (flash-attn's rule, which
#: keeps 85%). Plain decode keeps 95%: a count that fills a wave of SMs beats a smaller one that leaves a few idle.
SPLIT_EFFICIENCY = 0.95
#: MTA decode keeps flash-attn's 85% (its counts were tuned with it), but 95% with :data:`mta.tuning.DECODE_MTA_FAST`'s
#: tiles, where counts that fill four programs an SM run faster than the others.
MTA_SPLIT_EFFICIENCY = 0.85
MAX_SPLITS = 128
#: MTA decode counts each SM twice when it picks the split count: its key tiles carry ``ck`` products and register
#: shifts besides the loads, so two programs per SM hide each other's latency.
MTA_PROGRAMS_PER_SM = 2  # mta.tuning.MTA_FAST_PROGRAMS_PER_SM with mta.tuning.DECODE_MTA_FAST's tiles
#: MTA decode: while a far split holds at most this many keys, the band's program costs about what a far split's
#: does, and the split count is chosen with it counted as one more program per row tile; longer splits leave it
#: out (the band is then short beside a split, and counting it would take too few splits).
BAND_COUNTS_BELOW = 2048
#: Splits of the merge kernel read per step.
COMBINE_BLOCK_S = 16
#: Plain decode deals its key tiles out evenly over this many programs an SM (:func:`stream_programs`) where the
#: (batch, kv head) units alone fill less than :data:`STREAM_BELOW` of their last wave of SMs, over caches of
#: :data:`STREAM_MIN_KEYS` positions or more: with one program a unit the SMs that run a second program end last.
#: Below that length the merge and the extra states cost more than the imbalance.
STREAM_PROGRAMS_PER_SM = 2
STREAM_BELOW = 0.9
STREAM_MIN_KEYS = 8192
#: Shared memory an SM gives the deal's programs (of about 228 KB on Hopper): a tile whose pipeline buffers pass
#: half of it runs one program an SM, and the deal then counts one (``tuning.DECODE_PLAIN_WIDE``'s long tiles
#: keep enough bytes in flight alone; two of them would not fit).
STREAM_SHARED_BYTES = 200 * 1024

#: Programs of a decode tile that an SM of Triton's interpreter is taken to run at once (no GPU to ask).
INTERPRETER_RESIDENT = 2
#: Plain decode whose units leave a poor grid (:func:`poor_grid`) runs two splits from this many cache positions
#: (the even deal from :data:`STREAM_MIN_KEYS`); on shorter caches the merge costs more than the imbalance.
POOR_GRID_MIN_KEYS = 2048
#: A last round of resident programs filled below this fraction is thin (:func:`poor_grid`): its programs start on
#: whichever SMs finish first, several to an SM, while the others idle.
THIN_LAST_ROUND = 0.5

#: The tile tables live with the others in :mod:`mta.tuning`.
TILES, TILES_FP32, INTERPRETER_TILE = tuning.DECODE, tuning.DECODE_FP32, tuning.DECODE_INTERPRETER


# --- the device's facts ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    """What the plans read of a device: its SM count, its family (:func:`mta.tuning.gpu_family`: ``"interpreter"``,
    ``"hopper"`` or ``"other"``), its peak memory bandwidth per SM (bytes/s) and its shared memory per SM (bytes;
    0 where the GPU does not say). Tests build one to plan "as on an H100" without a GPU."""
    sms: int
    family: str
    bandwidth_per_sm: float = 0.0
    shared_per_sm: int = 0


#: Triton's interpreter: no GPU to ask.
INTERPRETER = DeviceFacts(sms=INTERPRETER_SMS, family="interpreter")


def device_facts(device: torch.device | None = None) -> DeviceFacts:
    """:class:`DeviceFacts` of ``device`` (default the current GPU; :data:`INTERPRETER` in the interpreter), asked of
    the driver once per GPU."""
    if runtime.INTERPRET:
        return INTERPRETER
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    return _gpu_facts(index)


@functools.cache
def _gpu_facts(index: int) -> DeviceFacts:
    cuda = torch.device("cuda", index)
    props = torch.cuda.get_device_properties(index)
    return DeviceFacts(sms=props.multi_processor_count, family=tuning.gpu_family(cuda),
                       bandwidth_per_sm=tuning.memory_bandwidth_per_sm(cuda),
                       shared_per_sm=getattr(props, "shared_memory_per_multiprocessor", 0))


def sm_count(device: torch.device) -> int:
    """SMs of ``device``'s GPU (:data:`INTERPRETER_SMS` in the interpreter)."""
    return device_facts(device).sms


# --- the plan ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """How one decode call runs: made by :func:`plan_decode` (plain) or :func:`mta.conv_decode.plan_conv_decode`
    (MTA) from hashable facts only (shapes, dtype, the device's facts, ``num_splits``), run by :func:`run_decode`.

    ``form``: ``"split"`` (:func:`decode_split_kernel <mta.decode_kernels.decode_split_kernel>` over ``splits``
    key splits, plus MTA's band program, then the merge where more than one program writes a row), ``"stream"``
    (plain decode's even deal, :func:`decode_stream_kernel <mta.decode_kernels.decode_stream_kernel>`: runs of
    ``tiles_per_program`` key tiles over ``programs`` programs, ``slots`` states per row, then the merge) or
    ``"rows"`` (MTA decode unfused in PyTorch, :func:`mta.conv_decode_rows.conv_decode_rows`; run by
    :func:`mta.conv_decode.run_conv_decode`).

    The problem: ``q [batch, heads, n_new, D]`` (MTA: the query cache ``[batch, heads, n_max, D]``), caches
    ``[batch, kv_heads, n_max, head_dim]``, MTA kernel ``kernel_size = (cq, ck)`` (``(1, 1)``: plain decode).
    The tile: key windows of ``block_n`` keys owning ``own`` (:func:`key_window`), ``num_warps``, ``num_stages``; a
    program's ``rows`` query rows in ``block_m`` slots, MTA's ``stack`` stacked folded rows (:func:`row_tile`).
    ``interleave``: split ``s`` of ``S`` takes key tiles ``s, s + S, ...`` (else one contiguous range).
    ``band``: MTA's band (keys next to the diagonal) as one product of its stacked kernel rows (``"stacked"``,
    :func:`band_stack_rows`), one product per kernel row (``"by_row"``), or ``"none"`` (``E = 0``). ``pdl``: the
    merge is launched as a programmatic dependent of the kernel before it (Hopper on)."""
    form: str
    batch: int
    heads: int
    kv_heads: int
    n_new: int
    n_max: int
    head_dim: int
    kernel_size: tuple[int, int]
    block_n: int
    own: int
    num_warps: int
    num_stages: int
    rows: int
    block_m: int
    stack: int
    splits: int = 1
    interleave: bool = False
    band: str = "none"
    tiles_per_program: int = 0
    programs: int = 0
    slots: int = 0
    pdl: bool = False

    @property
    def block_d(self) -> int:
        return head_dim_block(self.head_dim)

    @property
    def row_tiles(self) -> int:
        """Row tiles of a (batch, kv head) pair's ``G * n_new`` query rows."""
        return row_tiles(self.heads, self.kv_heads, self.n_new, self.rows)

    @property
    def units(self) -> int:
        """(batch, kv head, row tile) units: the programs of one split."""
        return self.batch * self.kv_heads * self.row_tiles

    @property
    def band_keys(self) -> int:
        """``E = cq - 1 + pk``: keys next to each query's diagonal that MTA's band computes (0: no band)."""
        cq, ck = self.kernel_size
        return cq - 1 + (ck - 1) // 2


def row_tiles(heads: int, kv_heads: int, n_new: int, rows: int) -> int:
    """Row tiles of ``rows`` rows for the ``G * n_new`` query rows of a (batch, kv head) pair."""
    return cdiv(heads // kv_heads * n_new, rows) if kv_heads else 0


def plan_tile(batch: int, heads: int, kv_heads: int, n_new: int, n_max: int, head_dim: int, dtype: torch.dtype,
              kernel_size: tuple[int, int], gpu: DeviceFacts, interleave: bool) -> dict:
    """The :class:`DecodePlan` fields every plan of these facts shares, as keywords: the problem, the tile
    (:func:`decode_tile`), key window, row tile, band form and ``pdl``; the plan functions add the form and splits.
    ``interleave``: plain decode's order of a split's key tiles (the splits of a pair then stream one front of
    neighbouring tiles); MTA decode, whose windows overlap by their halos, runs faster with contiguous ranges."""
    cq, ck = kernel_size
    block_d = head_dim_block(head_dim)
    block_n, warps, stages = decode_tile(block_d, dtype, plain=kernel_size == (1, 1), n_max=n_max, gpu=gpu)
    block_n, own = key_window(block_n, ck)
    rows, block_m, stack = row_tile(heads // max(kv_heads, 1) * n_new, block_d, block_n, ck)
    e = cq - 1 + (ck - 1) // 2
    band = "none" if e == 0 else "stacked" if tuning.width_of(block_d) in tuning.STACKED_BAND else "by_row"
    return dict(batch=batch, heads=heads, kv_heads=kv_heads, n_new=n_new, n_max=n_max, head_dim=head_dim,
                kernel_size=kernel_size, block_n=block_n, own=own, num_warps=warps, num_stages=stages, rows=rows,
                block_m=block_m, stack=stack, interleave=interleave, band=band, pdl=gpu.family == "hopper")


def split_plan(tile: dict, num_splits: int) -> DecodePlan:
    """The ``"split"`` plan of ``tile`` (:func:`plan_tile`) for ``num_splits`` asked: at most the key tiles of
    the cache (:func:`splits_run`)."""
    return DecodePlan(form="split", splits=splits_run(num_splits, tile["n_max"], tile["own"]), **tile)


def with_even_deal(plan: DecodePlan, sms: int, per_sm: int) -> DecodePlan:
    """``plan`` (plain decode) as the ``"stream"`` form: its units' key tiles dealt out evenly to about ``per_sm``
    x ``sms`` programs (:func:`deal_tiles`)."""
    per_program, programs, slots = deal_tiles(plan.units, plan.n_max, plan.block_n, per_sm * sms)
    return dataclasses.replace(plan, form="stream", tiles_per_program=per_program, programs=programs, slots=slots)


@functools.lru_cache(maxsize=1024)  # one plan per call signature: a decode step asks at every layer and token
def plan_decode(batch: int, heads: int, kv_heads: int, n_new: int, n_max: int, head_dim: int, dtype: torch.dtype,
                num_splits: int | None = None, gpu: DeviceFacts | None = None) -> DecodePlan:
    """The plan of :func:`decode_attention` for ``q [batch, heads, n_new, head_dim]`` against caches
    ``[batch, kv_heads, n_max, head_dim]`` of ``dtype`` on a device of facts ``gpu`` (default the current one's):

    * ``num_splits`` given: that many splits (at most the key tiles);
    * the units fill the GPU but load its SMs unevenly, over :data:`STREAM_MIN_KEYS` positions or more: the even
      deal (:func:`stream_programs`);
    * the same from :data:`POOR_GRID_MIN_KEYS` positions, where twice the units would not: two splits
      (:func:`two_splits_for_a_poor_grid`);
    * otherwise the wave rule's count (:func:`choose_num_splits`, 1 where the units fill the GPU).
    """
    gpu = gpu or device_facts()
    tile = plan_tile(batch, heads, kv_heads, n_new, n_max, head_dim, dtype, (1, 1), gpu, interleave=True)
    if num_splits is not None:
        return split_plan(tile, num_splits)
    block_n, block_m, stages, block_d = tile["block_n"], tile["block_m"], tile["num_stages"], head_dim_block(head_dim)
    units = batch * kv_heads * row_tiles(heads, kv_heads, n_new, tile["rows"])
    resident = resident_programs(block_n, block_m, block_d, stages, dtype.itemsize, gpu)
    per_sm = stream_programs_per_sm(block_n, block_d, stages, dtype.itemsize)
    if (deal := stream_programs(units, n_max, block_n, gpu.sms, per_sm, resident))[0]:
        return DecodePlan(form="stream", tiles_per_program=deal[0], programs=deal[1], slots=deal[2], **tile)
    if two_splits_for_a_poor_grid(units, n_max, gpu.sms, resident):
        return split_plan(tile, 2)
    return split_plan(tile, choose_num_splits(units, n_max, tile["own"], gpu.sms))


# --- the rules the plans read ------------------------------------------------------------------------------------


def decode_tile(block_d: int, dtype: torch.dtype, *, plain: bool = False, n_max: int = 0,
                gpu: DeviceFacts | None = None) -> tuple[int, int, int]:
    """``(BLOCK_N, num_warps, num_stages)`` for a head-dim tile ``block_d`` on a device of facts ``gpu`` (default
    the current one's), looked up (nothing timed). ``plain``: for ``decode_attention`` (no MTA fold) over a cache
    of ``n_max`` positions, which at 16 bits on a Hopper GPU whose memory feeds each SM at
    :data:`mta.tuning.WIDE_DECODE_SM_BANDWIDTH` or more takes :data:`mta.tuning.DECODE_PLAIN_WIDE`'s longer tiles
    from :data:`mta.tuning.WIDE_DECODE_MIN_KEYS`; MTA decode there takes :data:`mta.tuning.DECODE_MTA_FAST`'s
    shorter ones (:func:`mta_fast_memory`)."""
    gpu = gpu or device_facts()
    if gpu.family == "interpreter":
        return INTERPRETER_TILE
    width = next(w for w in TILES if block_d <= w)
    if dtype == torch.float32:
        return TILES_FP32[width]
    if plain and n_max >= tuning.WIDE_DECODE_MIN_KEYS and fast_memory(gpu):
        return tuning.DECODE_PLAIN_WIDE[width]
    if not plain and mta_fast_memory(block_d, dtype, gpu, n_max):
        return tuning.DECODE_MTA_FAST[width]
    return TILES[width]


def fast_memory(gpu: DeviceFacts) -> bool:
    """A Hopper GPU whose memory feeds each SM at :data:`mta.tuning.WIDE_DECODE_SM_BANDWIDTH` or more (an H200, not
    an H100 SXM)."""
    return gpu.family == "hopper" and gpu.bandwidth_per_sm >= tuning.WIDE_DECODE_SM_BANDWIDTH


def mta_fast_memory(block_d: int, dtype: torch.dtype, gpu: DeviceFacts, n_max: int) -> bool:
    """Whether MTA decode takes :data:`mta.tuning.DECODE_MTA_FAST`'s tile and counts
    :data:`mta.tuning.MTA_FAST_PROGRAMS_PER_SM` programs an SM: 16 bits, a head-dim width in that table, a cache of
    :data:`mta.tuning.MTA_FAST_MIN_KEYS` positions or more, on a GPU with :func:`fast_memory`."""
    if dtype == torch.float32 or n_max < tuning.MTA_FAST_MIN_KEYS:
        return False
    return next(w for w in TILES if block_d <= w) in tuning.DECODE_MTA_FAST and fast_memory(gpu)


def row_block(rows: int, block_d: int) -> int:
    """Rows of a decode tile for ``rows = G * n`` query rows: a power of two >= 16 (``tl.dot``), at most 64
    (32 at head dims over 128: the fp32 accumulator stays in registers); more rows take more row tiles."""
    return max(16, min(next_power_of_2(rows), 32 if block_d > 128 else 64))


def row_tile(rows: int, block_d: int, block_n: int, ck: int) -> tuple[int, int, int]:
    """``(ROWS, BLOCK_M, STACK)``: a program's rows, its slots (>= 16, a product's least height) and, for MTA
    (``ck > 1``), the height of its stacked folded queries.

    Plain decode: :func:`row_block` rows, one per slot. MTA stacks the ``ck`` folded copies of its rows into one
    product (``STACK = CK_PAD * ROWS`` rows, ``CK_PAD`` the next power of two >= ``ck``, raised until
    ``STACK >= 16``), so a program takes fewer rows: at most ``next_pow2(rows)``, and few enough that the
    fp32 product ``[STACK, block_n]`` stays at 8192 values (64 registers a thread over 4 warps).
    """
    if ck == 1:
        block_m = row_block(rows, block_d)
        return block_m, block_m, block_m
    ck_pad = next_power_of_2(ck)
    most = max(1, 8192 // (block_n * ck_pad))
    most = 1 << (most.bit_length() - 1)
    n_rows = min(next_power_of_2(rows), most)
    return n_rows, max(16, n_rows), max(ck_pad, 16 // n_rows) * n_rows


def band_stack_rows(cq: int, rows: int, block_d: int) -> tuple[int, int]:
    """``(A_GROUP, BAND_STACK)`` of the ``"stacked"`` band: its program stacks the query rows of ``A_GROUP`` kernel
    rows (a power of two) for its ``rows`` rows into one product of ``BAND_STACK`` rows (at least 16), at most
    8192 query values (all ``cq`` kernel rows at once wherever that fits: one load, one product, ``ck`` shifts)."""
    a_group = min(next_power_of_2(cq), max(1, max(16, 8192 // block_d) // rows))
    return a_group, max(16, a_group * rows)


def resident_programs(block_n: int, block_m: int, block_d: int, stages: int, itemsize: int,
                      gpu: DeviceFacts) -> int:
    """Programs of plain decode's ``(block_n, stages)`` tile with ``block_m`` row slots that an SM of a device of
    facts ``gpu`` runs at once, estimated from their shared memory (:func:`programs_in_shared_memory`). 1 where the
    GPU does not say; :data:`INTERPRETER_RESIDENT` in the interpreter."""
    if gpu.family == "interpreter":
        return INTERPRETER_RESIDENT
    return programs_in_shared_memory(gpu.shared_per_sm, block_n, block_m, block_d, stages, itemsize)


def programs_in_shared_memory(shared_per_sm: int, block_n: int, block_m: int, block_d: int, stages: int,
                              itemsize: int) -> int:
    """Programs of a tile that an SM of ``shared_per_sm`` bytes holds (at least 1): ``stages - 1`` K and V buffers,
    an fp32 ``[block_m, block_n]`` scratch for layout conversions, and 1 KB the driver keeps per program (73 KB at
    Hopper's d = 64 and d = 128 tiles, which Triton 3.6 compiles to 70 KB: three fit an H100's 228 KB either way)."""
    per_program = max(stages - 1, 1) * 2 * block_n * block_d * itemsize + block_m * block_n * 4 + 1024
    return max(1, shared_per_sm // per_program)


def poor_grid(programs: int, sms: int, resident: int = 1) -> bool:
    """Whether ``programs`` of equal work (about a wave or more) load the ``sms`` SMs unevenly, so that a few end
    last: one program an SM fills its last wave below :data:`STREAM_BELOW` (some SMs run a program more than the
    others), or, where an SM runs ``resident`` programs at once, the programs past the full rounds of
    ``resident * sms`` fill less than :data:`THIN_LAST_ROUND` of a round (they start on whichever SMs finish first,
    several to an SM, while the others idle)."""
    if programs / (sms * cdiv(programs, sms)) < STREAM_BELOW:
        return True
    slots = resident * sms
    return resident > 1 and programs > slots and 0 < programs % slots < THIN_LAST_ROUND * slots


def two_splits_for_a_poor_grid(units: int, n_max: int, sms: int, resident: int) -> bool:
    """Plain decode's ``units`` fill the GPU (the split rule gives one split) but :func:`poor_grid`, over at least
    :data:`POOR_GRID_MIN_KEYS` positions, and twice as many programs would not be: two splits instead."""
    return (units >= 0.8 * sms and n_max >= POOR_GRID_MIN_KEYS and poor_grid(units, sms, resident)
            and not poor_grid(2 * units, sms, resident))


def split_candidates(n_max: int, block_n: int, sms: int, max_splits: int = MAX_SPLITS) -> list[int]:
    """The split counts :func:`choose_num_splits` weighs: ``s = 1 .. min(max_splits, sms, key tiles of n_max)``
    (tiles of ``block_n`` keys) that change the key tiles per split, ``ceil(tiles / s)``; the others only add
    empty splits."""
    tiles = cdiv(max(n_max, 1), block_n)
    return [s for s in range(1, min(max_splits, sms, tiles) + 1) if s == 1 or cdiv(tiles, s) != cdiv(tiles, s - 1)]


def key_window(block_n: int, ck: int = 1) -> tuple[int, int]:
    """``(BLOCK_N, OWN)``: a key window of at least ``block_n`` keys and the ``OWN = BLOCK_N - (ck - 1)`` keys whose
    scores it completes. MTA widens the window until ``OWN`` is at least half of it; plain decode (``ck = 1``)
    owns every key of its tile."""
    block_n = max(block_n, next_power_of_2(2 * (ck - 1)))
    return block_n, block_n - (ck - 1)


def splits_run(num_splits: int, n_max: int, own: int) -> int:
    """The splits a launch runs for ``num_splits`` asked (besides MTA's band): at most the key tiles of ``n_max``
    (``own`` keys each). More would be empty for every sequence: the same result, more states."""
    return min(num_splits, cdiv(n_max, own))


@functools.lru_cache(maxsize=1024)  # a decode step asks the same question at every layer and step
def choose_num_splits(programs: int, n_max: int, block_n: int, sms: int, max_splits: int = MAX_SPLITS,
                      extra: int = 0, efficiency: float = SPLIT_EFFICIENCY) -> int:
    """How many splits the keys of each sequence get, from host numbers only (no device sync).

    ``programs`` (batch x kv heads x row tiles) already fill the GPU at 80% of its ``sms`` (or are none): 1.
    Otherwise, over ``s = 1 .. min(max_splits, sms, key tiles of n_max)``, the wave efficiency of
    ``programs * (s + extra)`` programs (``extra``: programs besides the splits, MTA's band) is ``w / ceil(w)``,
    ``w = programs * (s + extra) / sms``; the answer is the smallest ``s`` within ``efficiency``
    (:data:`SPLIT_EFFICIENCY`, 95%) of the best, among the ``s`` that change the key tiles per split
    (``ceil(tiles / s)``; the others only add empty splits). ``n_max`` is the cache size, not the lengths on
    the device: reading them would synchronise.
    """
    if programs == 0 or programs >= 0.8 * sms:
        return 1
    candidates = split_candidates(n_max, block_n, sms, max_splits)

    def wave_efficiency(s: int) -> float:
        waves = programs * (s + extra) / sms
        return waves / -(-waves // 1)

    best = max(wave_efficiency(s) for s in candidates)
    return next(s for s in candidates if wave_efficiency(s) >= efficiency * best)


def stream_programs_per_sm(block_n: int, block_d: int, stages: int, itemsize: int) -> int:
    """Programs of a ``(block_n, stages)`` decode tile that share an SM in the even deal:
    :data:`STREAM_PROGRAMS_PER_SM`, or fewer where their K and V pipeline buffers (``stages - 1`` tiles of each)
    pass :data:`STREAM_SHARED_BYTES`."""
    buffers = max(stages - 1, 1) * 2 * block_n * block_d * itemsize
    return max(1, min(STREAM_PROGRAMS_PER_SM, STREAM_SHARED_BYTES // buffers))


@functools.lru_cache(maxsize=1024)
def stream_programs(units: int, n_max: int, block_n: int, sms: int, per_sm: int | None = None,
                    resident: int = 1) -> tuple[int, int, int]:
    """``(tiles_per_program, programs, slots)`` for plain decode's even deal (:func:`deal_tiles`), or ``(0, 0, 0)``
    to run one split per unit instead.

    The deal runs where ``units`` (batch x kv heads x row tiles) fill the GPU (:func:`choose_num_splits` gives one
    split), but one program a unit would load the SMs unevenly (:func:`poor_grid`, with ``resident`` programs an SM
    at once), and the cache is long enough (:data:`STREAM_MIN_KEYS`); over about ``per_sm`` x ``sms`` programs
    (default :data:`STREAM_PROGRAMS_PER_SM`; the plan asks :func:`stream_programs_per_sm`). Like the split count,
    this uses host numbers only: ``n_max``, not the lengths."""
    if n_max < STREAM_MIN_KEYS or units < 0.8 * sms or not poor_grid(units, sms, resident):
        return 0, 0, 0
    return deal_tiles(units, n_max, block_n, (per_sm or STREAM_PROGRAMS_PER_SM) * sms)


def deal_tiles(units: int, n_max: int, block_n: int, target: int) -> tuple[int, int, int]:
    """``(tiles_per_program, programs, slots)``: the ``units x tiles`` key tiles of a cache of ``n_max`` positions
    (``block_n`` a tile) dealt out in equal runs of ``W`` tiles to about ``target`` programs, as stream-K splits a
    GEMM's loop and LeanAttention a decode step's keys; a unit's tiles then span at most ``slots`` programs."""
    tiles = cdiv(max(n_max, 1), block_n)
    per_program = max(1, cdiv(units * tiles, target))
    programs = cdiv(units * tiles, per_program)
    return per_program, programs, min(programs, (tiles - 1) // per_program + 2)


# --- input checks ------------------------------------------------------------------------------------------------


def check_new_queries(n: int, n_max: int, what: str) -> None:
    if not 1 <= n <= MAX_NEW_QUERIES:
        raise ValueError(f"{what} must be between 1 and {MAX_NEW_QUERIES}, got {n}")
    if n > n_max:
        raise ValueError(f"{what}={n} is more than the cache holds (Nmax={n_max})")


def check_num_splits(num_splits) -> int | None:
    """None, or a positive int (TypeError for a float or a bool, ValueError below 1)."""
    return None if num_splits is None else check_count("num_splits", num_splits)


def check_seqlens(cache_seqlens, batch: int, n_max: int, n_min: int, device: torch.device,
                  what: str = "Nq") -> torch.Tensor | None:
    """``cache_seqlens`` as an int tensor on ``device`` (None: every sequence is ``n_max`` long).

    A list or a CPU tensor is checked value by value (``n_min <= len <= n_max``, one per sequence) on the host,
    then copied to the device without synchronising; a tensor already on the device is checked for shape and
    dtype only: reading its values would synchronise.
    """
    if cache_seqlens is None:
        return None
    if isinstance(cache_seqlens, (list, tuple)):
        if not is_int_list(cache_seqlens):
            raise TypeError("cache_seqlens must be a list of ints or an int tensor")
        if cache_seqlens:  # values checked before the int32 conversion, which would overflow on a huge one
            _check_length_range(min(cache_seqlens), max(cache_seqlens), n_min, n_max, what)
        cache_seqlens = torch.tensor(cache_seqlens, dtype=torch.int32)
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"cache_seqlens must be an int tensor, a list of ints or None, got "
                        f"{type(cache_seqlens).__name__}")
    if cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cache_seqlens must be int32 or int64, got {cache_seqlens.dtype}")
    if tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(f"cache_seqlens must have shape ({batch},) (one length per sequence), "
                         f"got {tuple(cache_seqlens.shape)}")
    # The kernels read length b at offset b: a strided view (``lengths[::2]``, a column) is made contiguous.
    cache_seqlens = cache_seqlens.contiguous()
    if cache_seqlens.device.type == "cpu":
        if batch:
            _check_length_range(int(cache_seqlens.min()), int(cache_seqlens.max()), n_min, n_max, what)
        # A non-blocking copy from pageable memory is staged at once (the caller may change its tensor right
        # after) and never waits for the device; pinning a buffer at every step costs more host time than the copy.
        return cache_seqlens.to(device, non_blocking=True)
    check_seqlens_device(cache_seqlens, device)
    return cache_seqlens


def check_seqlens_device(cache_seqlens: torch.Tensor, device: torch.device) -> None:
    """A lengths tensor lies on the host or on the caches' ``device``; anywhere else is refused by name (the custom
    ops of :mod:`mta.ops` check it before dispatch: a meta tensor would send them to their fake implementation)."""
    if cache_seqlens.device.type != "cpu" and cache_seqlens.device != device:
        raise ValueError(f"cache_seqlens is on {cache_seqlens.device} but the caches are on {device}")


def _check_length_range(low: int, high: int, n_min: int, n_max: int, what: str) -> None:
    if high > n_max:
        raise ValueError(f"cache_seqlens has a length {high} over the cache size Nmax={n_max}")
    if low < n_min:
        raise ValueError(f"cache_seqlens has a length {low} under {what}={n_min}: each sequence must hold "
                         f"its new tokens")


def check_plan(plan: DecodePlan, q: torch.Tensor, k: torch.Tensor, weight: torch.Tensor | None) -> None:
    """A plan runs only on the shapes it was made for (ValueError otherwise)."""
    B, Hkv, n_max, D = k.shape
    got = dict(batch=B, heads=q.shape[1], kv_heads=Hkv, n_max=n_max, head_dim=D,
               kernel_size=(1, 1) if weight is None else tuple(weight.shape[1:]))
    if weight is None:
        got["n_new"] = q.shape[2]
    wrong = {name: value for name, value in got.items() if getattr(plan, name) != value}
    if wrong:
        raise ValueError(f"the plan is for {', '.join(f'{n}={getattr(plan, n)}' for n in wrong)}, "
                         f"the inputs have {', '.join(f'{n}={v}' for n, v in wrong.items())}")


# --- running a plan ----------------------------------------------------------------------------------------------


def wide_offsets(*tensors: torch.Tensor) -> bool:
    """Whether a sequence's part of one of ``tensors`` (all but the batch axis, which the kernels address in
    int64) reaches 2**31 elements: its indices times strides would wrap around in int32 (one sequence of 4M keys
    with 5 kv heads of 128, a query cache of 512k positions with 32 heads of 128)."""
    return any(index_span(t, 1) >= INT32_INDEX_LIMIT for t in tensors)


def split_state(slots: int, rows: int, D: int, device) -> torch.Tensor:
    """The fp32 states of ``slots`` splits of ``rows`` rows in one buffer, ``m [slots, rows]``, then
    ``l [slots, rows]``, then ``acc [slots, rows, D]`` (:func:`mta.decode_kernels.state_parts`): one allocation
    per step, not three (a decode step's host time is most of its time at short caches)."""
    return torch.empty(slots * rows * (2 + D), device=device, dtype=torch.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class DecodeLaunches:
    """A ``"split"`` or ``"stream"`` plan's launches for one call signature (:data:`LAUNCHES`): the kernel over the
    keys (``form``'s), the merge of its ``slots`` states (None where one program writes each row), and the output's
    shape ``[B, Hq, n_new, D]``. Calling it allocates the output and the states and launches."""
    form: str
    keys: LaunchPlan
    merge: LaunchPlan | None
    out_shape: tuple
    slots: int

    def __call__(self, q, k, v, lens, weight=None) -> torch.Tensor:
        B, Hq, n_new, D = self.out_shape
        o = torch.empty(self.out_shape, device=k.device, dtype=q.dtype)
        state = None if self.merge is None else split_state(self.slots, B * Hq * n_new, D, k.device)
        if self.form == "stream":
            self.keys(q, k, v, lens, state)
        else:
            self.keys(q, weight, k, v, lens, o, state)
        if self.merge is not None:
            self.merge(state, o)
        return o


def decode_launches(plan: DecodePlan, q, k, v, lens, scale: float, weight=None) -> DecodeLaunches | None:
    """The :class:`DecodeLaunches` of a ``"split"`` or ``"stream"`` ``plan`` on inputs of these shapes, strides and
    dtypes (those of :func:`run_decode`; ValueError for shapes the plan was not made for, or another form); None
    where nothing launches (no sequence or no head)."""
    check_plan(plan, q, k, weight)
    if not (plan.form == "split" or (plan.form == "stream" and weight is None)):
        raise ValueError(f"run_decode runs a plan of form 'split', or 'stream' without a weight, not {plan.form!r}"
                         f"{'' if weight is None else ' with a weight'}")
    if plan.batch * plan.heads * plan.n_new * plan.head_dim == 0:
        return None
    signature = (plan, q.stride(), k.stride(), v.stride(), q.dtype, k.device, scale, weight is None,
                 None if lens is None else lens.dtype)
    return LAUNCHES.get(signature, lambda: (_split_launches if plan.form == "split" else _stream_launches)(
        plan, q, k, v, lens, scale, weight))


def run_decode(plan: DecodePlan, q, k, v, lens, scale: float, weight=None) -> torch.Tensor:
    """``o [B, Hq, n_new, D]`` in q's dtype: the ``"split"`` or ``"stream"`` ``plan`` run on these inputs (made for
    their shapes: ValueError otherwise).

    Plain attention: ``q [B, Hq, n_new, D]``, the new queries. MTA (``weight [Hq, cq, ck]`` fp32 contiguous): ``q``
    is the query cache ``[B, Hq, Nmax, D]``. ``k, v [B, Hkv, Nmax, D]``; ``lens [B]`` int on the caches' device or
    None (every sequence ``Nmax`` long); ``scale``: the scores' factor.
    """
    launches = decode_launches(plan, q, k, v, lens, scale, weight)
    if launches is None:  # no sequence or no head: nothing to launch
        return torch.empty((plan.batch, plan.heads, plan.n_new, plan.head_dim), device=k.device, dtype=q.dtype)
    return launches(q, k, v, lens, weight)


def _split_launches(plan: DecodePlan, q, k, v, lens, scale: float, weight) -> DecodeLaunches:
    """The ``"split"`` plan's launches: the split kernel, and the merge where more than one program writes a row."""
    cq, ck = plan.kernel_size
    e = plan.band_keys
    programs = plan.splits + (e > 0)
    one = programs == 1
    pdl = plan.pdl and not one
    block_e = max(16, next_power_of_2(plan.n_new + e - 1))
    a_group, band_stack = band_stack_rows(cq, plan.rows, plan.block_d) if plan.band == "stacked" else (1, 0)
    o, state = _example_outputs(plan, q, k, programs)
    split = Launch(decode_split_kernel, (programs, plan.batch * plan.kv_heads, plan.row_tiles),
                   (q, weight, k, v, lens, o, None if one else state, *q.stride(), *k.stride(), *v.stride(),
                    *o.stride()),
                   dict(n_max=plan.n_max, n_new=plan.n_new, num_heads=plan.heads, num_kv_heads=plan.kv_heads,
                        num_splits=plan.splits, scale=scale,
                        HAS_LENS=lens is not None, ONE_SPLIT=one, FOLD=weight is not None, CQ=cq, CK=ck, E=e,
                        D=plan.head_dim, BLOCK_D=plan.block_d, ROWS=plan.rows, BLOCK_M=plan.block_m,
                        STACK=plan.stack, BLOCK_N=plan.block_n, BLOCK_E=block_e,
                        BLOCK_W=next_power_of_2(block_e + ck - 1), A_GROUP=a_group, BAND_STACK=band_stack, PDL=pdl,
                        PRECISION=dot_precision(k.dtype), INTERLEAVE=plan.interleave, WIDE=wide_offsets(q, k, v),
                        num_warps=plan.num_warps, num_stages=plan.num_stages)).plan(7)
    merge = None if one else _merge_launch(state, o, plan, programs, pdl)
    return DecodeLaunches("split", split, merge, tuple(o.shape), programs)


def _stream_launches(plan: DecodePlan, q, k, v, lens, scale: float, weight=None) -> DecodeLaunches:
    """The ``"stream"`` plan's launches: the even deal of key tiles, then the merge."""
    tiles = cdiv(plan.n_max, plan.block_n)
    o, state = _example_outputs(plan, q, k, plan.slots)
    stream = Launch(decode_stream_kernel, (plan.programs,),
                    (q, k, v, lens, state, *q.stride(), *k.stride(), *v.stride()),
                    dict(n_max=plan.n_max, n_new=plan.n_new, num_heads=plan.heads, num_kv_heads=plan.kv_heads,
                         row_tiles=plan.row_tiles, tiles_per_pair=tiles, tiles_per_program=plan.tiles_per_program,
                         total_tiles=plan.units * tiles, num_slots=plan.slots, scale=scale,
                         HAS_LENS=lens is not None, D=plan.head_dim, BLOCK_D=plan.block_d, ROWS=plan.rows,
                         BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, PDL=plan.pdl, PRECISION=dot_precision(k.dtype),
                         WIDE=wide_offsets(q, k, v), num_warps=plan.num_warps, num_stages=plan.num_stages)).plan(5)
    return DecodeLaunches("stream", stream, _merge_launch(state, o, plan, plan.slots, plan.pdl), tuple(o.shape),
                          plan.slots)


def _example_outputs(plan: DecodePlan, q, k, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An output and a state buffer of ``slots`` splits as a call allocates them: the launches take their strides."""
    o = torch.empty((plan.batch, plan.heads, plan.n_new, plan.head_dim), device=k.device, dtype=q.dtype)
    return o, split_state(slots, plan.batch * plan.heads * plan.n_new, plan.head_dim, k.device)


def _merge_launch(state, o, plan: DecodePlan, slots: int, pdl: bool):
    """:func:`decode_combine_kernel <mta.decode_kernels.decode_combine_kernel>` over the ``slots`` states in
    ``state`` (:func:`split_state`) of every row of ``o [B, Hq, n_new, D]``, as a :class:`mta.launch.LaunchPlan`
    on ``(state, o)``; ``pdl``: as a programmatic dependent of the kernel before."""
    return Launch(decode_combine_kernel, (plan.batch * plan.heads * plan.n_new,), (state, o, *o.stride()),
                  dict(n_new=plan.n_new, num_heads=plan.heads, num_splits=slots, D=plan.head_dim,
                       BLOCK_D=plan.block_d, BLOCK_S=COMBINE_BLOCK_S, PDL=pdl,
                       num_warps=1 if plan.block_d <= 64 else 2,
                       **({"launch_pdl": True} if pdl else {}))).plan(2)


#: The decode kernels' launches per call signature: the plan, the inputs' strides and dtype, the device, the
#: scale and which optional inputs are given (everything but the tensors' addresses).
LAUNCHES = LaunchPlans()


def in_batch_chunks(run, kv_heads: int, q, k, v, lens) -> torch.Tensor:
    """``run(q, k, v, lens)``, or, where ``batch x kv_heads`` programs pass a grid axis
    (:func:`mta.launch.batch_chunks`), its outputs for chunks of sequences concatenated (each chunk planned on its
    own)."""
    chunks = batch_chunks(k.shape[0], kv_heads)
    if chunks is None:
        return run(q, k, v, lens)
    return torch.cat([run(q[a:b], k[a:b], v[a:b], None if lens is None else lens[a:b]) for a, b in chunks])


def decode_attention(q, k_cache, v_cache, *, cache_seqlens=None, scale: float | None = None,
                     num_splits: int | None = None) -> torch.Tensor:
    """Attention of ``Nq`` new queries per sequence against its KV cache, split over the keys (split-K).

    Per sequence ``b`` of length ``L = cache_seqlens[b]``, the result equals
    ``mta.flash_attention(q[b:b+1], k_cache[b:b+1, :, :L], v_cache[b:b+1, :, :L], causal=True)``: the queries are
    positions ``L - Nq .. L - 1`` and query ``t`` sees keys ``0 .. L - Nq + t`` (bottom-right alignment).
    Nothing past ``L`` is read.

    Args:
        q: ``[B, Hq, Nq, D]``, ``1 <= Nq <= 16``; fp16, bf16 or fp32; any strides.
        k_cache, v_cache: ``[B, Hkv, Nmax, D]``, ``Hq % Hkv == 0``, holding the new tokens' keys and values.
        cache_seqlens: ``[B]`` int32 (or int64) valid keys per sequence, the new ones included; None: all
            ``Nmax``. A list or a CPU tensor is checked (``Nq <= L <= Nmax``); on the GPU the values are the
            caller's responsibility (checking them would synchronise): the kernel clamps them to
            ``[0, Nmax]`` and a query before position 0 outputs 0.
        scale: default ``D ** -0.5``.
        num_splits: key splits per sequence; default :func:`plan_decode`'s choice (from the SM count, ``B * Hkv``
            and ``Nmax``). Each split keeps an fp32 ``(m, l, acc)`` state; a second kernel merges them. By
            default, where ``B * Hkv`` passes the SM count unevenly, the key tiles of all sequences are instead
            dealt out evenly to the programs (:func:`stream_programs`).

    Returns:
        ``[B, Hq, Nq, D]`` in q's dtype. Head dims 1 to 256; on the CPU (Triton's interpreter) fp16 and fp32.
        For inference: the result carries no gradient, even where an input requires one (eager or compiled).
    """
    signature = call_signature(q, k_cache, v_cache, cache_seqlens, scale, num_splits)
    if (launches := CHECKED_CALLS.find(signature)) is not None:
        return launches(q, k_cache, v_cache, cache_seqlens)
    B, Hq, Hkv, Nq, n_max, D = check_kernel_inputs(q, k_cache, v_cache, per_kv_head=True,
                                                   names=("q", "k_cache", "v_cache"))
    check_new_queries(Nq, n_max, "Nq (new queries)")
    if torch.compiler.is_compiling():  # traced: the custom op (mta.ops) checks the lengths when it runs
        return torch.ops.mta.decode_attention(q, k_cache, v_cache, seqlens_argument(cache_seqlens, q.device),
                                              resolve_scale(scale, D), check_num_splits(num_splits))
    check_no_transforms("decode_attention")
    lens = check_seqlens(cache_seqlens, B, n_max, Nq, q.device)
    scale = resolve_scale(scale, D)
    num_splits = check_num_splits(num_splits)
    gpu = device_facts(q.device)

    def plan(batch: int) -> DecodePlan:
        return plan_decode(batch, Hq, Hkv, Nq, n_max, D, q.dtype, num_splits=num_splits, gpu=gpu)

    if signature is not None and checked_once(cache_seqlens, lens, B, Hkv):
        launches = decode_launches(plan(B), q, k_cache, v_cache, lens, scale)
        if launches is not None:
            CHECKED_CALLS.keep(signature, launches)
            return launches(q, k_cache, v_cache, lens)
    return in_batch_chunks(lambda q, k, v, lens: run_decode(plan(k.shape[0]), q, k, v, lens, scale), Hkv, q,
                           k_cache, v_cache, lens)


#: The launches of public decode calls whose inputs passed the checks, by :func:`call_signature`: a call with the
#: same signature passes them again, and runs at once.
CHECKED_CALLS = LaunchPlans()


def call_signature(q, k_cache, v_cache, cache_seqlens, *arguments):
    """What the checks and the plan of a decode call depend on (:func:`mta.launch.checked_signature` of its
    arguments; ``arguments`` may hold more than the tensors and the lengths). None where
    :func:`~mta.launch.checked_signature` gives none, or where the lengths are not a tensor or None (a list is
    checked at every call)."""
    if not (cache_seqlens is None or isinstance(cache_seqlens, torch.Tensor)):
        return None
    return checked_signature(q, k_cache, v_cache, cache_seqlens, *arguments)


def check_no_transforms(name: str) -> None:
    """A decode call runs on plain tensors: under ``torch.func``'s transforms (vmap, grad, jvp), whose wrapped
    tensors Triton cannot read, it is refused by name."""
    if torch._C._are_functorch_transforms_active():
        raise NotImplementedError(f"{name} does not run under torch.func transforms (vmap, grad, jvp): call it on "
                                  f"the whole batch (decoding computes no gradient)")


def checked_once(cache_seqlens, lens, batch: int, kv_heads: int) -> bool:
    """Whether a call that passed the checks may be run again at once by its signature: its lengths (checked as
    ``lens``) are none, or the caller's own tensor on the GPU (lengths on the host are checked value by value at
    every call), and its sequences' programs fit on one grid (:func:`mta.launch.batch_chunks`)."""
    on_gpu = cache_seqlens is None or (lens is cache_seqlens and lens.device.type != "cpu")
    return on_gpu and batch_chunks(batch, kv_heads) is None


def seqlens_argument(cache_seqlens, device: torch.device) -> torch.Tensor | None:
    """``cache_seqlens`` as the decode ops take it: a tensor (its device checked), or None."""
    # A custom op takes tensors, not lists: a list becomes a CPU int64 tensor, checked on the host inside the op
    # (int64, so that a huge length is named there rather than overflowing an int32 conversion here). A tensor's
    # device is checked here, before the dispatcher picks the op's implementation from its inputs' devices.
    if isinstance(cache_seqlens, (list, tuple)):
        if not is_int_list(cache_seqlens):
            raise TypeError("cache_seqlens must be a list of ints or an int tensor")
        return torch.tensor(cache_seqlens, dtype=torch.int64)
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"cache_seqlens must be an int tensor, a list of ints or None, got "
                        f"{type(cache_seqlens).__name__}")
    if cache_seqlens is not None:
        check_seqlens_device(cache_seqlens, device)
    return cache_seqlens
