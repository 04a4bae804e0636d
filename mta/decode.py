"""``mta.decode_attention``: split-K decoding of a few new queries against a KV cache.

The kernels are in :mod:`mta.decode_kernels`; this module checks inputs, picks the number of splits and the
tile, and launches them (:func:`launch_decode`, shared with :func:`mta.conv_decode_attention`).
"""

from __future__ import annotations

import functools

import torch

from . import runtime, tuning
from .checks import check_count, is_int_list, resolve_scale
from .decode_kernels import decode_combine_kernel, decode_split_kernel, decode_stream_kernel
from .launch import (INT32_INDEX_LIMIT, batch_chunks, cdiv, check_kernel_inputs, dot_precision, head_dim_block,
                     index_span, launch, next_power_of_2)

#: Most new queries per call (rows of a decode tile: query heads of a group x new queries).
MAX_NEW_QUERIES = 16
#: Stand-in SM count in Triton's interpreter (no GPU to ask), small so that several splits run in the tests.
INTERPRETER_SMS = 4
#: A split count is kept if its wave efficiency is within this fraction of the best one (flash-attn's rule, which
#: keeps 85%). Plain decode keeps 95%: at B = 1 on an H100, 16 splits x 8 kv heads (128 programs, one wave on 132
#: SMs) were 1.1-3.9% faster than the 14-15 that 85% picks, at 16k-128k keys
#: (``notes/h100_remeasure_2026-11-23/decode_fill_splits_6c0f4cb.json``).
SPLIT_EFFICIENCY = 0.95
#: MTA decode keeps flash-attn's 85% (its counts were tuned with it; ``notes/performance.md``), but 95% with
#: :data:`mta.tuning.DECODE_MTA_FAST`'s tiles, where counts that fill four programs an SM ran 1.07-1.6x faster than
#: the others tried (``notes/h100_2026-11-25h/h200_conv_sweep.log``).
MTA_SPLIT_EFFICIENCY = 0.85
MAX_SPLITS = 128
#: MTA decode counts each SM twice when it picks the split count: its key tiles carry ``ck`` products and
#: register shifts besides the loads, so two programs per SM hide each other's latency (on an H100, twice the
#: splits of plain decode were 1.1-1.9x faster at 16k-64k keys; ``notes/performance.md``).
MTA_PROGRAMS_PER_SM = 2  # mta.tuning.MTA_FAST_PROGRAMS_PER_SM with mta.tuning.DECODE_MTA_FAST's tiles
#: MTA decode: while a far split holds at most this many keys, the band's program costs about what a far split's
#: does, and the split count is chosen with it counted as one more program per row tile; longer splits leave it
#: out. On an H100 at B = 8, 4k-8k keys, that took 3 splits instead of 4 and a step 5-21% less time; at 16k-64k
#: keys the band is short beside a split, and counting it cost up to 21% (``notes/performance.md``).
BAND_COUNTS_BELOW = 2048
#: Splits of the merge kernel read per step.
COMBINE_BLOCK_S = 16
#: Plain decode deals its key tiles out evenly over this many programs an SM (:func:`stream_programs`) where the
#: (batch, kv head) units alone fill less than :data:`STREAM_BELOW` of their last wave of SMs, over caches of
#: :data:`STREAM_MIN_KEYS` positions or more. On an H100 (bf16, 8 kv heads, ``notes/h100_2026-11-25h/``), one
#: program a unit took 1.03-1.09x SDPA's time with 136-320 units at 32k keys (the SMs that run a second program
#: end last); the deal took 2-7% off those steps (1, 2 or 3 programs an SM within 1% of each other), 1-4% at 8k keys
#: at three of four batches (1.4% slower at 160 units), and was 4-8% slower at 2k keys, where the merge and the
#: states cost more than the imbalance. On an H200, whose long tiles at 16k keys or more fit one program an SM (so one
#: program a unit ran 136 units in two full waves), the deal took 5-41% off at 16k-32k keys and up to 12% at 8k
#: (0.2% slower at one shape).
STREAM_PROGRAMS_PER_SM = 2
STREAM_BELOW = 0.9
STREAM_MIN_KEYS = 8192
#: Shared memory an SM gives the deal's programs (of about 228 KB on Hopper): a tile whose pipeline buffers pass
#: half of it runs one program an SM, and the deal then counts one. On an H200, dealt to one program an SM rather than
#: two, the long tiles of ``tuning.DECODE_PLAIN_WIDE`` (128 KB of K and V in flight) took 0-2.5% less time and the
#: shorter ones 6-11% more (``notes/h100_2026-11-25h/stream_probe_h200_*.log``).
STREAM_SHARED_BYTES = 200 * 1024

#: Programs of a decode tile that an SM of Triton's interpreter is taken to run at once (no GPU to ask).
INTERPRETER_RESIDENT = 2
#: Plain decode whose units leave a poor grid (:func:`poor_grid`) runs two splits from this many cache positions
#: (the even deal from :data:`STREAM_MIN_KEYS`). On an H100 (bf16, 8 kv heads, ``notes/h100_2026-11-25i/``) at
#: 192-512 units and 2k-4k keys, two splits took 0.3-4.6% off a step at 11 of 12 shapes (1.7% more at one), and at 1k
#: keys added up to 6% at 5 of 6.
POOR_GRID_MIN_KEYS = 2048
#: A last round of resident programs filled below this fraction is thin (:func:`poor_grid`). On an H100 (three plain
#: decode programs an SM, 396 at once), 512-528 units of one program each (116-132 past a full round, 29-33%) took
#: 1.05-1.15x SDPA's time at 2k-16k keys; 640 units (244 past, 62%) 0.99-1.02x (``notes/h100_2026-11-25i/``).
THIN_LAST_ROUND = 0.5

#: Plain decode's split ``s`` of ``S`` takes key tiles ``s, s + S, ...`` (the pair's splits read neighbouring tiles
#: at the same time) rather than one contiguous range. On an H100 (bf16, Nq = 1, the decode benchmark's 24 shapes
#: from 4k keys, same run, ``notes/h100_2026-11-25i/interleave_ab.log``) that order took 0.2-6% off at 18 shapes and
#: added 0.5-2.3% at 6 (all four at 8k keys among them); for MTA decode it added 2.2-4.6% at B = 8, d = 128 from 32k
#: keys (and up to 4.6% elsewhere at 12 of the 24), so MTA decode keeps the ranges.
INTERLEAVED_SPLITS = True

#: The tile tables live with the others in :mod:`mta.tuning`.
TILES, TILES_FP32, INTERPRETER_TILE = tuning.DECODE, tuning.DECODE_FP32, tuning.DECODE_INTERPRETER


def decode_tile(block_d: int, dtype: torch.dtype, plain: bool = False, device: torch.device | None = None,
                n_max: int = 0) -> tuple[int, int, int]:
    """``(BLOCK_N, num_warps, num_stages)`` for a head-dim tile ``block_d``, looked up (nothing timed). ``plain``:
    for ``decode_attention`` (no MTA fold) over a cache of ``n_max`` positions, which at 16 bits on a Hopper GPU
    (``device``'s, default the current one) whose memory feeds each SM at :data:`mta.tuning.WIDE_DECODE_SM_BANDWIDTH`
    or more takes :data:`mta.tuning.DECODE_PLAIN_WIDE`'s longer tiles from :data:`mta.tuning.WIDE_DECODE_MIN_KEYS`;
    MTA decode there takes :data:`mta.tuning.DECODE_MTA_FAST`'s shorter ones (:func:`mta_fast_memory`)."""
    if runtime.INTERPRET:
        return INTERPRETER_TILE
    width = next(w for w in TILES if block_d <= w)
    if dtype == torch.float32:
        return TILES_FP32[width]
    if plain and n_max >= tuning.WIDE_DECODE_MIN_KEYS and fast_memory(device):
        return tuning.DECODE_PLAIN_WIDE[width]
    if not plain and mta_fast_memory(block_d, dtype, device, n_max):
        return tuning.DECODE_MTA_FAST[width]
    return TILES[width]


def fast_memory(device: torch.device | None) -> bool:
    """A Hopper GPU whose memory feeds each SM at :data:`mta.tuning.WIDE_DECODE_SM_BANDWIDTH` or more (an H200, not
    an H100 SXM)."""
    return (tuning.gpu_family(device) == "hopper"
            and tuning.memory_bandwidth_per_sm(device) >= tuning.WIDE_DECODE_SM_BANDWIDTH)


def mta_fast_memory(block_d: int, dtype: torch.dtype, device: torch.device | None, n_max: int) -> bool:
    """Whether MTA decode takes :data:`mta.tuning.DECODE_MTA_FAST`'s tile and counts
    :data:`mta.tuning.MTA_FAST_PROGRAMS_PER_SM` programs an SM: 16 bits, a head-dim width in that table, a cache of
    :data:`mta.tuning.MTA_FAST_MIN_KEYS` positions or more, on a GPU with :func:`fast_memory`."""
    if runtime.INTERPRET or dtype == torch.float32 or n_max < tuning.MTA_FAST_MIN_KEYS:
        return False
    return next(w for w in TILES if block_d <= w) in tuning.DECODE_MTA_FAST and fast_memory(device)


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
    """``(A_GROUP, BAND_STACK)``: the band's program stacks the query rows of ``A_GROUP`` kernel rows (a power of
    two) for its ``rows`` rows into one product of ``BAND_STACK`` rows (at least 16), at most 8192 query values
    (all ``cq`` kernel rows at once wherever that fits: one load, one product, ``ck`` shifts). ``(1, 0)``: one
    product per kernel row instead, at head-dim widths not in :data:`mta.tuning.STACKED_BAND`."""
    if tuning.width_of(block_d) not in tuning.STACKED_BAND:
        return 1, 0
    a_group = min(next_power_of_2(cq), max(1, max(16, 8192 // block_d) // rows))
    return a_group, max(16, a_group * rows)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def dependent_launch(device: torch.device) -> bool:
    """Launch the merge kernel with programmatic dependent launch: on Hopper and later GPUs (never in the
    interpreter). Its programs are then scheduled while the split kernel runs and wait for its end on the GPU,
    so the gap between the two kernels is not paid (on an H100, 2-9% of a step at B = 1 and 4k-64k keys;
    ``notes/performance.md``)."""
    return device.type == "cuda" and tuning.gpu_family(device) == "hopper"


@functools.cache
def _shared_memory_per_sm(index: int) -> int:
    return getattr(torch.cuda.get_device_properties(index), "shared_memory_per_multiprocessor", 0)


def resident_programs(block_n: int, block_m: int, block_d: int, stages: int, itemsize: int,
                      device: torch.device) -> int:
    """Programs of plain decode's ``(block_n, stages)`` tile with ``block_m`` row slots that an SM of ``device``
    runs at once, estimated from their shared memory: ``stages - 1`` K and V buffers, an fp32 ``[block_m, block_n]``
    scratch for layout conversions, and 1 KB the driver keeps per program (73 KB at Hopper's d = 64 and d = 128 tiles,
    which Triton 3.6 compiles to 70 KB: three fit an H100's 228 KB either way). 1 where the GPU does not say;
    :data:`INTERPRETER_RESIDENT` in the interpreter."""
    if runtime.INTERPRET:
        return INTERPRETER_RESIDENT
    index = device.index if device.index is not None else torch.cuda.current_device() if device.type == "cuda" else 0
    return programs_in_shared_memory(_shared_memory_per_sm(index), block_n, block_m, block_d, stages, itemsize)


def programs_in_shared_memory(shared_per_sm: int, block_n: int, block_m: int, block_d: int, stages: int,
                              itemsize: int) -> int:
    """:func:`resident_programs` for an SM of ``shared_per_sm`` bytes (at least 1)."""
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


def sm_count(device: torch.device) -> int:
    """SMs of ``device``'s GPU (:data:`INTERPRETER_SMS` in the interpreter)."""
    if runtime.INTERPRET:
        return INTERPRETER_SMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


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

    ``programs`` (batch x kv heads x row tiles) already fill the GPU at 80% of its ``sms``: 1. Otherwise,
    over ``s = 1 .. min(max_splits, sms, key tiles of n_max)``, the wave efficiency of ``programs * (s + extra)``
    programs (``extra``: programs besides the splits, MTA's band) is ``w / ceil(w)``,
    ``w = programs * (s + extra) / sms``; the answer is the smallest ``s`` within
    ``efficiency`` (:data:`SPLIT_EFFICIENCY`, 95%) of the best, among the ``s`` that change the key tiles per split
    (``ceil(tiles / s)``; the others only add empty splits). ``n_max`` is the cache size, not the lengths on
    the device: reading them would synchronise.
    """
    if programs >= 0.8 * sms:
        return 1
    candidates = split_candidates(n_max, block_n, sms, max_splits)

    def wave_efficiency(s: int) -> float:
        waves = programs * (s + extra) / sms
        return waves / -(-waves // 1)

    best = max(wave_efficiency(s) for s in candidates)
    return next(s for s in candidates if wave_efficiency(s) >= efficiency * best)


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
        # after) and never waits for the device; pinning a buffer at every step cost more host time than the copy.
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


def wide_offsets(*tensors: torch.Tensor) -> bool:
    """Whether a sequence's part of one of ``tensors`` (all but the batch axis, which the kernels address in
    int64) reaches 2**31 elements: its indices times strides would wrap around in int32 (one sequence of 4M keys
    with 5 kv heads of 128, a query cache of 512k positions with 32 heads of 128)."""
    return any(index_span(t, 1) >= INT32_INDEX_LIMIT for t in tensors)


def split_states(splits: int, rows: int, D: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(m, l, acc)``: ``[splits, rows]``, ``[splits, rows]``, ``[splits, rows, D]`` fp32, views of one buffer (one
    allocation per step, not three: a decode step's host time is most of its time at short caches)."""
    buffer = torch.empty(splits * rows * (2 + D), device=device, dtype=torch.float32)
    m, l, acc = buffer.split([splits * rows, splits * rows, splits * rows * D])
    return m.view(splits, rows), l.view(splits, rows), acc.view(splits, rows, D)


def stream_programs_per_sm(block_n: int, block_d: int, stages: int, itemsize: int) -> int:
    """Programs of a ``(block_n, stages)`` decode tile that share an SM: :data:`STREAM_PROGRAMS_PER_SM`, or fewer
    where their K and V pipeline buffers (``stages - 1`` tiles of each) pass :data:`STREAM_SHARED_BYTES`."""
    buffers = max(stages - 1, 1) * 2 * block_n * block_d * itemsize
    return max(1, min(STREAM_PROGRAMS_PER_SM, STREAM_SHARED_BYTES // buffers))


@functools.lru_cache(maxsize=1024)
def stream_programs(units: int, n_max: int, block_n: int, sms: int, per_sm: int | None = None,
                    resident: int = 1) -> tuple[int, int, int]:
    """``(tiles_per_program, programs, slots)`` for plain decode's even deal (:func:`decode_stream_kernel
    <mta.decode_kernels.decode_stream_kernel>`), or ``(0, 0, 0)`` to run one split per unit instead.

    ``units`` (batch x kv heads x row tiles) fill the GPU (:func:`choose_num_splits` gives one split), but one
    program a unit would load the SMs unevenly (:func:`poor_grid`, with ``resident`` programs an SM at once), and the
    cache is long enough (:data:`STREAM_MIN_KEYS`). Then the ``units x tiles`` key tiles of the cache (``n_max``
    positions, ``block_n`` a tile) are dealt out in equal runs of ``W`` tiles to about ``per_sm`` x ``sms`` programs
    (default :data:`STREAM_PROGRAMS_PER_SM`; the launcher asks :func:`stream_programs_per_sm`), as stream-K splits a
    GEMM's loop and LeanAttention a decode step's keys; a unit's tiles then span at most ``slots`` programs. Like the
    split count, this uses host numbers only: ``n_max``, not the lengths."""
    tiles = cdiv(max(n_max, 1), block_n)
    if n_max < STREAM_MIN_KEYS or units < 0.8 * sms or not poor_grid(units, sms, resident):
        return 0, 0, 0
    total = units * tiles
    per_program = cdiv(total, (per_sm or STREAM_PROGRAMS_PER_SM) * sms)
    programs = cdiv(total, per_program)
    return per_program, programs, min(programs, (tiles - 1) // per_program + 2)


def launch_merge(parts, o, n_new: int, slots: int, block_d: int, pdl: bool) -> None:
    """:func:`decode_combine_kernel <mta.decode_kernels.decode_combine_kernel>` over the ``slots`` states
    ``parts`` of every row of ``o [B, Hq, n_new, D]``; ``pdl``: as a programmatic dependent of the kernel before."""
    launch(decode_combine_kernel, (o.shape[0] * o.shape[1] * n_new,), *parts, o, *o.stride(), n_new, o.shape[1],
           slots, D=o.shape[3], BLOCK_D=block_d, BLOCK_S=COMBINE_BLOCK_S, PDL=pdl,
           num_warps=1 if block_d <= 64 else 2, **({"launch_pdl": True} if pdl else {}))


def launch_stream(q, k, v, lens, o, n_new: int, scale: float, tile: tuple[int, int, int], rows_tile: tuple[int, int],
                  row_tiles: int, deal: tuple[int, int, int]) -> torch.Tensor:
    """Plain decode's even deal (:func:`stream_programs`) over ``B * Hkv * row_tiles`` units, then the merge of
    each row's slots."""
    B, Hkv, n_max, D = k.shape
    Hq = q.shape[1]
    block_n, warps, stages = tile
    tile_rows, block_m = rows_tile
    per_program, programs, slots = deal
    block_d = head_dim_block(D)
    tiles = cdiv(n_max, block_n)
    parts = split_states(slots, B * Hq * n_new, D, k.device)
    pdl = dependent_launch(k.device)
    launch(decode_stream_kernel, (programs,), q, k, v, lens, *parts, *q.stride(), *k.stride(), *v.stride(),
           n_max, n_new, Hq, Hkv, row_tiles, tiles, per_program, B * Hkv * row_tiles * tiles, slots, scale,
           HAS_LENS=lens is not None, D=D, BLOCK_D=block_d,
           ROWS=tile_rows, BLOCK_M=block_m, BLOCK_N=block_n, PDL=pdl, PRECISION=dot_precision(k.dtype),
           WIDE=wide_offsets(q, k, v), num_warps=warps, num_stages=stages)
    launch_merge(parts, o, n_new, slots, block_d, pdl)
    return o


def launch_decode(q, k, v, lens, n_new: int, scale: float, num_splits: int | None, *, weight=None,
                  kernel_size: tuple[int, int] = (1, 1), out_dtype=None) -> torch.Tensor:
    """Split kernel, then (with more than one split) the merge: ``o [B, Hq, n_new, D]``.

    Plain attention: ``q [B, Hq, n, D]``, the new queries. MTA (``weight [Hq, cq, ck]`` fp32 given): ``q`` is
    the query cache ``[B, Hq, Nmax, D]``; the kernel folds the new queries and adds the band (one more split,
    when ``E = cq - 1 + pk > 0``).
    """
    B, Hkv, n_max, D = k.shape
    if (chunks := batch_chunks(B, Hkv)) is not None:  # more programs than a grid axis takes
        return torch.cat([launch_decode(q[a:b], k[a:b], v[a:b], None if lens is None else lens[a:b], n_new, scale,
                                        num_splits, weight=weight, kernel_size=kernel_size, out_dtype=out_dtype)
                          for a, b in chunks])
    Hq = q.shape[1]
    cq, ck = kernel_size
    o = torch.empty((B, Hq, n_new, D), device=k.device, dtype=out_dtype or q.dtype)
    if o.numel() == 0:  # no sequence or no head: nothing to launch
        return o
    e = cq - 1 + (ck - 1) // 2
    block_d = head_dim_block(D)
    block_n, warps, stages = decode_tile(block_d, k.dtype, plain=(cq, ck) == (1, 1), device=k.device, n_max=n_max)
    block_n, own = key_window(block_n, ck)  # own: keys whose scores one key window completes
    tile_rows, block_m, stack = row_tile((Hq // Hkv) * n_new, block_d, block_n, ck)
    row_tiles = cdiv((Hq // Hkv) * n_new, tile_rows)
    if num_splits is None and (cq, ck) == (1, 1):
        units, sms = B * Hkv * row_tiles, sm_count(k.device)
        resident = resident_programs(block_n, block_m, block_d, stages, k.element_size(), k.device)
        deal = stream_programs(units, n_max, block_n, sms, stream_programs_per_sm(block_n, block_d, stages,
                                                                                  k.element_size()), resident)
        if deal[0]:
            return launch_stream(q, k, v, lens, o, n_new, scale, (block_n, warps, stages), (tile_rows, block_m),
                                 row_tiles, deal)
        if two_splits_for_a_poor_grid(units, n_max, sms, resident):
            num_splits = 2
    if num_splits is None:
        mta_fast = (cq, ck) != (1, 1) and mta_fast_memory(block_d, k.dtype, k.device, n_max)  # decode_tile's choice
        per_sm = tuning.MTA_FAST_PROGRAMS_PER_SM if mta_fast else MTA_PROGRAMS_PER_SM if ck > 1 else 1
        rule = functools.partial(choose_num_splits, B * Hkv * row_tiles, n_max, own, sm_count(k.device) * per_sm,
                                 efficiency=SPLIT_EFFICIENCY if (cq, ck) == (1, 1) or mta_fast
                                 else MTA_SPLIT_EFFICIENCY)
        num_splits = rule()
        if e > 0 and n_max <= BAND_COUNTS_BELOW * num_splits and not mta_fast:
            num_splits = rule(extra=1)
    num_splits = splits_run(num_splits, n_max, own)
    programs = num_splits + (e > 0)
    block_e = max(16, next_power_of_2(n_new + e - 1))
    a_group, band_stack = band_stack_rows(cq, tile_rows, block_d) if e > 0 else (1, 0)  # no band: no variant
    one = programs == 1
    rows = B * Hq * n_new
    parts = (None, None, None) if one else split_states(programs, rows, D, k.device)
    pdl = not one and dependent_launch(k.device)
    launch(decode_split_kernel, (programs, B * Hkv, row_tiles),
        q, weight, k, v, lens, o, *parts, *q.stride(), *k.stride(), *v.stride(),
        *o.stride(), n_max, n_new, Hq, Hkv, num_splits, scale,
        HAS_LENS=lens is not None, ONE_SPLIT=one, FOLD=weight is not None, CQ=cq, CK=ck, E=e, D=D,
        BLOCK_D=block_d, ROWS=tile_rows, BLOCK_M=block_m, STACK=stack, BLOCK_N=block_n, BLOCK_E=block_e,
        BLOCK_W=next_power_of_2(block_e + ck - 1), A_GROUP=a_group, BAND_STACK=band_stack, PDL=pdl,
        PRECISION=dot_precision(k.dtype), INTERLEAVE=INTERLEAVED_SPLITS and weight is None,
        WIDE=wide_offsets(q, k, v), num_warps=warps, num_stages=stages)
    if not one:
        launch_merge(parts, o, n_new, programs, block_d, pdl)
    return o


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
        num_splits: key splits per sequence; default :func:`choose_num_splits` (from the SM count, ``B * Hkv``
            and ``Nmax``). Each split keeps an fp32 ``(m, l, acc)`` state; a second kernel merges them. By
            default, where ``B * Hkv`` passes the SM count unevenly, the key tiles of all sequences are instead
            dealt out evenly to the programs (:func:`stream_programs`).

    Returns:
        ``[B, Hq, Nq, D]`` in q's dtype. Head dims 1 to 256; on the CPU (Triton's interpreter) fp16 and fp32.
        For inference: the result carries no gradient, even where an input requires one (eager or compiled).
    """
    B, Hq, Hkv, Nq, n_max, D = check_kernel_inputs(q, k_cache, v_cache, per_kv_head=True,
                                                   names=("q", "k_cache", "v_cache"))
    check_new_queries(Nq, n_max, "Nq (new queries)")
    if torch.compiler.is_compiling():  # traced: the custom op (mta.ops) checks the lengths when it runs
        from . import ops
        return ops.decode_attention(q, k_cache, v_cache, cache_seqlens=cache_seqlens, scale=scale,
                                    num_splits=num_splits)
    lens = check_seqlens(cache_seqlens, B, n_max, Nq, q.device)
    scale = resolve_scale(scale, D)
    return launch_decode(q, k_cache, v_cache, lens, Nq, scale, check_num_splits(num_splits))
