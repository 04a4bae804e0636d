"""Tile tables: which ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` each kernel launches with.

A kernel's tile is looked up, never timed, by (GPU family, head-dim width,
dtype, causal; a few Hopper entries also by length bucket), as FlagAttention and
flash-attn choose theirs: the first call
costs one compile and nothing else. The Hopper entries are the tiles Triton's
autotuner picked on an H100 for the benchmark shapes (bf16 and fp16, N = 1k to
16k; ``docs/decisions.md``). fp32 runs three TF32 products for each product
(fp32 accuracy), so it gets small tiles that compile in seconds. Other GPUs get tiles that fit
their smaller shared memory. In Triton's interpreter (no GPU) one small tile
keeps the NumPy emulation quick.

``MTA_AUTOTUNE=1`` times the candidates of a kernel instead, once per shape
bucket and machine (:mod:`mta.launch`).
"""

from __future__ import annotations

import functools
import os

import torch

from .runtime import INTERPRET

#: Time the candidates at the first call of each shape bucket (``MTA_AUTOTUNE=1``), instead of the table.
AUTOTUNE = os.environ.get("MTA_AUTOTUNE", "0") == "1"

INTERPRETER_TILE = (16, 16, 4, 1)
#: Head-dim widths (the power-of-two tile of the head dim): 16..64 share 64, 65..128 use 128, up to 256.
WIDTHS = (64, 128, 256)

# (BLOCK_M, BLOCK_N, warps, stages) on Hopper, fp16/bf16, by kernel, head-dim width and causal.
# dK/dV: BLOCK_N keys owned by a program, BLOCK_M queries per step; dQ: BLOCK_M queries owned, BLOCK_N keys per step.
HOPPER = {
    "flash_forward": {(64, False): (128, 64, 8, 3), (64, True): (128, 64, 8, 3),
                      (128, False): (128, 128, 8, 3), (128, True): (128, 64, 8, 3),
                      (256, False): (64, 64, 4, 2), (256, True): (64, 64, 4, 2)},
    "flash_dkdv": {(64, False): (128, 64, 4, 2), (64, True): (128, 64, 4, 2),
                   (128, False): (64, 64, 4, 2), (128, True): (64, 128, 8, 3),
                   (256, False): (32, 64, 4, 2), (256, True): (32, 64, 4, 2)},
    "flash_dq": {(64, False): (128, 64, 8, 3), (64, True): (128, 64, 8, 3),
                 (128, False): (128, 64, 8, 3), (128, True): (128, 64, 8, 3),
                 (256, False): (64, 32, 4, 2), (256, True): (64, 32, 4, 2)},
    # MTA forward: shifted queries held on chip at d <= 64 (6 x 11), streamed in 128 x 128 tiles otherwise
    # (the kernel's rule, mta.conv_forward.holds_queries, decides; the streamed tile is "conv_forward_streamed").
    "conv_forward": {(64, False): (128, 64, 8, 2), (64, True): (128, 64, 8, 2),
                     (128, False): (128, 128, 8, 3), (128, True): (128, 128, 8, 3),
                     (256, False): (64, 32, 4, 2), (256, True): (64, 32, 4, 2)},
    "conv_forward_streamed": {(64, False): (128, 128, 8, 3), (64, True): (128, 128, 8, 3),
                              (128, False): (128, 128, 8, 3), (128, True): (128, 128, 8, 3),
                              (256, False): (64, 32, 4, 2), (256, True): (64, 32, 4, 2)},
    # MTA backward: the dQ side owns BLOCK_M queries (their cq shifted copies held, a [BLOCK_M, cq' * d] fp32
    # accumulator) and streams [cq' * d, BLOCK_N] folded keys; the dK/dV side owns BLOCK_N keys (folded keys and
    # a [BLOCK_N, cq' * d] accumulator held) and streams shifted queries. The fastest tiles on Hopper give each
    # warp whole 16-row slices of the owned rows and fill the accumulator to ~192 registers per thread; for larger
    # kernels the launcher gives them more warps, then fewer rows (mta.conv_plan.fit_backward_tile).
    "conv_dq": {(64, False): (64, 32, 4, 2), (64, True): (64, 32, 4, 2),
                (128, False): (64, 32, 8, 2), (128, True): (64, 32, 8, 2),
                (256, False): (32, 32, 8, 1), (256, True): (32, 32, 8, 1)},
    "conv_dkdv": {(64, False): (32, 64, 4, 2), (64, True): (32, 64, 4, 2),
                  (128, False): (32, 64, 8, 1), (128, True): (32, 64, 8, 1),
                  (256, False): (16, 32, 8, 1), (256, True): (16, 32, 8, 1)},
}
#: Tiles that replace the Hopper table's at some lengths, by (kernel, head-dim width, causal), then by the
#: power-of-two ceiling of the longer sequence (the autotuner's bucket). The flash forward at d = 128, not causal:
#: 128 x 64 is faster than the table's 128 x 128 at N = 2k and 4k only.
HOPPER_BY_LENGTH = {("flash_forward", 128, False): {2048: (128, 64, 8, 3), 4096: (128, 64, 8, 3)}}
#: The MTA dK/dV side with its scores made keys as rows (``mta.conv_backward``, ``KEYS_AS_ROWS``), by head-dim
#: width, on Hopper at 16 bits where the tile fits whole (``mta.conv_plan.keys_as_rows_tile``; else ``conv_dkdv``'s
#: tile, queries as rows): faster at d = 64; at d = 128 (64 owned keys at most) keys as rows is slower at every
#: tile (``docs/decisions.md``).
HOPPER_KEYS_AS_ROWS = {64: (32, 128, 8, 2)}
#: Any other GPU, fp16/bf16: tiles that fit 100 KB of shared memory (consumer Ampere/Ada).
OTHER_GPU = {64: (64, 64, 4, 2), 128: (64, 64, 4, 2), 256: (64, 32, 4, 2)}
#: fp32 on any GPU, by head-dim width: three TF32 products for each, so small tiles, which compile in seconds
#: (the backward's two kernels hold more tiles than the forward: smaller still).
FP32 = {64: (64, 32, 4, 2), 128: (64, 32, 4, 2), 256: (32, 32, 4, 2)}
FP32_BACKWARD = {64: (32, 32, 4, 2), 128: (32, 32, 4, 2), 256: (32, 32, 4, 2)}
#: fp32 in the MTA kernels (forward and backward), by head-dim width: their products are true fp32 (CUDA-core
#: FMAs, fully unrolled over ``cq`` shifted tiles), and ptxas time grows with each thread's share of them.
#: 16 x 16 tiles over 8 warps compile in seconds per kernel at d <= 128 (6 x 11, sm_90), where 64 x 32 over 4
#: warps takes several times longer.
FP32_MTA = {64: (16, 16, 8, 1), 128: (16, 16, 8, 1), 256: (16, 16, 8, 1)}

#: Split-K decode (:mod:`mta.decode`), ``(BLOCK_N, num_warps, num_stages)`` by head-dim width, any GPU (plain
#: decode on GPUs with faster memory per SM: :data:`DECODE_PLAIN_WIDE`): decode reads K and V once, so long key
#: tiles and a deep pipeline at 16 bits; fp32 (three TF32 products each) halves the tile. Chosen, not swept; at 16
#: bits they run at the plain read's bandwidth on Hopper (``figures/bench_decode.json``).
DECODE = {64: (128, 4, 3), 128: (64, 4, 3), 256: (32, 4, 2)}
DECODE_FP32 = {64: (64, 4, 2), 128: (32, 4, 2), 256: (16, 4, 2)}
#: Plain decode (``decode_attention``, no MTA fold) at 16 bits where memory feeds each SM fast: key tiles twice as
#: long, 64 KB of K and V per pipeline stage (one program an SM). A streaming program must keep about
#: bandwidth-per-SM x latency bytes in flight (Little's law): ``DECODE``'s 32 KB tiles do on an H100 SXM (3.35 TB/s
#: over 132 SMs, 25 GB/s an SM), not on an H200 (4.8 TB/s, 36 GB/s an SM), where these longer tiles reach SDPA's
#: time at long caches; below 16k keys (fewer key tiles to split) and on the H100 they are slower. d = 256 keeps
#: its tile. MTA decode does not take these: its stacked
#: rows shrink as the window grows (:func:`mta.decode.row_tile`); it has :data:`DECODE_MTA_FAST` instead.
DECODE_PLAIN_WIDE = {64: (256, 4, 3), 128: (128, 4, 3), 256: (32, 4, 2)}
#: Peak memory bandwidth per SM (bytes/s) from which plain decode takes :data:`DECODE_PLAIN_WIDE`, on Hopper.
WIDE_DECODE_SM_BANDWIDTH = 30e9
#: Fewest cache positions (``Nmax``) for :data:`DECODE_PLAIN_WIDE`.
WIDE_DECODE_MIN_KEYS = 16384
#: MTA decode (``conv_decode_attention``) at 16 bits on the same GPUs (memory feeding each SM at
#: :data:`WIDE_DECODE_SM_BANDWIDTH` or more): shorter key windows, of which four programs share an SM
#: (:data:`MTA_FAST_PROGRAMS_PER_SM`, which the split count then counts). Where memory is that fast the fold's work, not
#: the read, sets the pace, and four programs an SM hide each other's latency (``docs/decisions.md``). Other head
#: dims keep ``DECODE``.
DECODE_MTA_FAST = {64: (64, 4, 3)}
MTA_FAST_PROGRAMS_PER_SM = 4
#: Fewest cache positions for :data:`DECODE_MTA_FAST`.
MTA_FAST_MIN_KEYS = 4096
DECODE_INTERPRETER = (32, 4, 1)
#: Head-dim widths at which MTA decode's split kernel takes three measured shortcuts: the band's program stacks its
#: kernel rows' queries into one product (``mta.decode_kernels._band_scores_stacked``; elsewhere one product per
#: kernel row, ``_band_scores_by_row``) and folds no queries (it has no far keys), and the fold's kernel rows are
#: unrolled. They make ``conv_decode_attention`` faster at d = 128 at every benchmarked shape; at d = 64 they cut
#: the split kernel's registers so that three programs share an SM instead of two, which is slower at long caches.
STACKED_BAND = (128,)

#: What ``MTA_AUTOTUNE=1`` times, per kernel (the fastest few of the Hopper sweeps).
CANDIDATES = {
    "flash_forward": [(128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 3), (128, 128, 4, 3), (64, 64, 4, 2),
                      (64, 32, 4, 2), (128, 32, 8, 2)],
    "flash_dkdv": [(128, 64, 4, 2), (64, 128, 4, 3), (64, 64, 4, 2), (64, 128, 8, 3), (128, 64, 4, 2),
                   (32, 64, 4, 2), (32, 32, 4, 2)],
    "flash_dq": [(128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 2), (64, 64, 4, 2), (64, 32, 4, 2),
                 (32, 64, 4, 2), (32, 32, 4, 2)],
    "conv_forward": [(64, 32, 4, 2), (128, 64, 8, 2), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3)],
    "conv_dq": [(64, 32, 4, 2), (64, 64, 4, 2), (64, 32, 8, 2), (32, 64, 8, 2), (32, 32, 8, 2)],
    "conv_dkdv": [(32, 32, 4, 2), (32, 64, 8, 2), (32, 64, 4, 2), (16, 64, 8, 2), (32, 32, 8, 2)],
}


def gpu_family(device: torch.device | None = None) -> str:
    """``"interpreter"``, ``"hopper"`` (compute capability 9.x or newer) or ``"other"``."""
    if INTERPRET:
        return "interpreter"
    return _family_of(torch.cuda.current_device() if device is None else torch.device(device).index)


@functools.cache
def _family_of(index: int) -> str:  # asked at every launch: once per GPU
    major, _ = torch.cuda.get_device_capability(index)
    return "hopper" if major >= 9 else "other"


def memory_bandwidth_per_sm(device: torch.device | None = None) -> float:
    """The GPU's peak memory bandwidth per SM in bytes/s, from the clock and bus width the driver reports (double
    data rate), or 0.0 where torch does not report them (and in the interpreter)."""
    if INTERPRET:
        return 0.0
    return _bandwidth_per_sm(torch.cuda.current_device() if device is None or torch.device(device).index is None
                             else torch.device(device).index)


@functools.cache
def _bandwidth_per_sm(index: int) -> float:
    props = torch.cuda.get_device_properties(index)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    return 2 * clock_khz * 1e3 * bus_bits / 8 / props.multi_processor_count


def width_of(block_d: int) -> int:
    """The table's head-dim width for a head-dim tile ``block_d``."""
    return next(w for w in WIDTHS if block_d <= w)


def config_for(kernel_name: str, block_d: int, dtype: torch.dtype, causal: bool,
               family: str | None = None, n: int | None = None) -> dict:
    """The tile of ``kernel_name`` (a key of :data:`HOPPER`) as launch keywords:
    ``{"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}``; ``n``, the longer sequence, where a kernel's tile
    depends on it (:data:`HOPPER_BY_LENGTH`)."""
    family = gpu_family() if family is None else family
    width = width_of(block_d)
    if family == "interpreter":
        tile = INTERPRETER_TILE
    elif dtype == torch.float32 and kernel_name.startswith("conv_"):
        tile = FP32_MTA[width]
    elif dtype == torch.float32:
        tile = (FP32_BACKWARD if kernel_name in ("flash_dkdv", "flash_dq") else FP32)[width]
    elif family == "hopper":
        by_length = HOPPER_BY_LENGTH.get((kernel_name, width, bool(causal)), {})
        tile = by_length.get(size_bucket(n)) if n is not None else None
        tile = tile or HOPPER[kernel_name][(width, bool(causal))]
    else:
        tile = OTHER_GPU[width]
    return as_config(tile)


def size_bucket(n: int) -> int:
    """A sequence length's bucket (the autotuner's key, the length tables'): its power-of-two ceiling."""
    return 1 << max(n - 1, 0).bit_length()


def as_config(tile: tuple[int, int, int, int]) -> dict:
    block_m, block_n, warps, stages = tile
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}
