"""GPU timing with CUDA events, and peak extra memory of a call.

Each repetition gets its own start/end event pair, so the result is a median
over repetitions (robust to a stray slow launch), not a mean over a batch.
Before every repetition, outside the timed region, a 256 MB buffer is
written: this evicts the inputs from L2 (50 MB on an H100), so every
repetition reads them from HBM as a real training step would. Then the GPU
is told to spin for about a millisecond: while it does, Python launches the
timed kernels, so the events time the GPU's work and not the launch overhead
of the Python wrappers (which exceeds the kernels' own time at small sizes).

Only real GPU numbers are wanted: every function here raises RuntimeError
without CUDA. Code that must run on a CPU (tests) takes a timer argument and
passes a fake one.
"""

from __future__ import annotations

import statistics
from typing import Callable, Optional

import torch

#: A timer as the benchmarks take it: ``timer(fn, before_each=None) -> ms``.
Timer = Callable[..., float]

L2_FLUSH_BYTES = 256 * 1024 * 1024
#: GPU clock cycles to spin before each timed call (about 1 ms at 1.5-2 GHz): the launch queue's lead.
LAUNCH_LEAD_CYCLES = 2_000_000

_flush_buffers: dict[torch.device, torch.Tensor] = {}


def require_cuda(what: str = "GPU timing") -> torch.device:
    """The current CUDA device; RuntimeError with a clear message if there is none."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA GPU, but torch.cuda.is_available() is False")
    return torch.device("cuda", torch.cuda.current_device())


def flush_l2(device: torch.device) -> None:
    """Overwrite L2 with a 256 MB write (the buffer is allocated once per device)."""
    buf = _flush_buffers.get(device)
    if buf is None:
        buf = _flush_buffers[device] = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    buf.zero_()


def time_samples_ms(fn: Callable[[], object], *, warmup: int = 10, rep: int = 30,
                    before_each: Optional[Callable[[], None]] = None, flush: bool = True) -> list[float]:
    """Times of ``rep`` calls of ``fn`` in milliseconds, one CUDA event pair per call.

    Args:
        fn: the work to time; it should only launch GPU work.
        warmup: untimed calls first (compilation, autotuning, allocator warm-up).
        rep: timed calls.
        before_each: run before every call, outside the timed region
            (e.g. drop accumulated gradients).
        flush: write a 256 MB buffer before each timed call to empty L2.
    """
    device = require_cuda()
    if rep < 1 or warmup < 0:
        raise ValueError(f"need rep >= 1 and warmup >= 0, got rep={rep}, warmup={warmup}")
    for _ in range(warmup):
        if before_each is not None:
            before_each()
        fn()
    torch.cuda.synchronize(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for start, end in zip(starts, ends):
        if before_each is not None:
            before_each()
        if flush:
            flush_l2(device)
        torch.cuda._sleep(LAUNCH_LEAD_CYCLES)  # the GPU waits here while Python queues start, fn, end
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def time_ms(fn: Callable[[], object], *, warmup: int = 10, rep: int = 30,
            before_each: Optional[Callable[[], None]] = None, flush: bool = True) -> float:
    """Median time of ``fn`` in milliseconds; see :func:`time_samples_ms`."""
    return statistics.median(time_samples_ms(fn, warmup=warmup, rep=rep, before_each=before_each, flush=flush))


def peak_extra_memory_bytes(fn: Callable[[], object]) -> int:
    """Bytes of GPU memory that ``fn`` allocates at its peak, above what was allocated before.

    The result of ``fn`` is dropped right away, so what it returns counts only
    while it is being computed.
    """
    device = require_cuda("peak memory measurement")
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before
