"""GPU timing with CUDA events (the median of per-call event pairs), wall time per call in a back-to-back loop, and
peak extra memory of a call.

Before each timed call, untimed: a 256 MB write evicts the inputs from L2 (50 MB on an H100), so each call reads
them from HBM as a training step would; then the GPU spins (``torch.cuda._sleep``) for twice the call's host launch
time (at least :data:`LAUNCH_LEAD_CYCLES`) while Python queues the call, so the events time the GPU's work, not the
wrappers' launch overhead. Without CUDA everything here raises RuntimeError (tests take a fake timer).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch

import mta

L2_FLUSH_BYTES = 256 * 1024 * 1024
#: Fewest GPU clock cycles to spin before each timed call (about 1 ms at 1.5-2 GHz): the launch queue's lead.
LAUNCH_LEAD_CYCLES = 2_000_000
#: Un-synchronised calls whose host time sizes the spin; the second longest counts (one stray pause does not).
LAUNCH_PROBES = 6
CALIBRATION_CYCLES = 10_000_000  # spun and timed to convert milliseconds to cycles (about 5 ms)
#: How a benchmark's JSON config describes this timing.
GPU_TIMING = ("median over rep of per-call CUDA event times; 256 MB L2 flush and a GPU spin (launch_lead: so launch "
              "overhead is not timed) before each call")
#: What the ``*_wall_ms`` keys are (runs without them predate it: their configs say :data:`GPU_TIMING` alone).
WALL_TIMING = ("; *_wall_ms: wall time per call of rep calls back to back, no synchronisation between them, launch "
               "overhead included")
TIMING = GPU_TIMING + WALL_TIMING
LAUNCH_LEAD = "max(2e6 cycles, 2 x measured launch time)"

_flush_buffers: dict[torch.device, torch.Tensor] = {}
_cycles_per_ms: dict[torch.device, float] = {}


def timing_config(warmup: int, rep: int, note: Optional[str] = None) -> dict:
    """``warmup``, ``rep``, ``timing`` (with the benchmark's ``note``) and ``launch_lead`` for a JSON config."""
    return {"warmup": warmup, "rep": rep, "timing": TIMING + (f"; {note}" if note else ""),
            "launch_lead": LAUNCH_LEAD}


def require_cuda(what: str = "GPU timing") -> torch.device:
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA GPU, but torch.cuda.is_available() is False")
    return torch.device("cuda", torch.cuda.current_device())


def spin_cycles_per_ms(device: torch.device) -> float:
    """Cycles ``torch.cuda._sleep`` spins per millisecond, cached: from the fastest of three timed spins (the
    fastest gives the longest spins, erring on the safe side)."""
    if device not in _cycles_per_ms:
        times = []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(CALIBRATION_CYCLES)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        _cycles_per_ms[device] = CALIBRATION_CYCLES / min(times)
    return _cycles_per_ms[device]


def launch_lead_cycles(fn: Callable[[], object], device: torch.device,
                       before_each: Optional[Callable[[], None]] = None) -> int:
    """Cycles to spin before each timed call: twice the host time of launching ``fn`` (the second longest of
    :data:`LAUNCH_PROBES` calls, ``before_each`` untimed), at least :data:`LAUNCH_LEAD_CYCLES`."""
    launch_ms = []
    for _ in range(LAUNCH_PROBES):
        if before_each is not None:
            before_each()
        start = time.perf_counter()
        fn()
        launch_ms.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return max(LAUNCH_LEAD_CYCLES, round(2 * sorted(launch_ms)[-2] * spin_cycles_per_ms(device)))


def calls(fn: Callable[[], object], n: int, before_each: Optional[Callable[[], None]] = None) -> None:
    """``n`` calls of ``fn``, each after ``before_each`` (where given)."""
    for _ in range(n):
        if before_each is not None:
            before_each()
        fn()


def warmed_up(fn: Callable[[], object], warmup: int, rep: int,
              before_each: Optional[Callable[[], None]] = None) -> torch.device:
    """The CUDA device, after ``warmup`` untimed calls of ``fn`` have finished (``rep``, ``warmup`` checked)."""
    device = require_cuda()
    if rep < 1 or warmup < 0:
        raise ValueError(f"need rep >= 1 and warmup >= 0, got rep={rep}, warmup={warmup}")
    calls(fn, warmup, before_each)
    torch.cuda.synchronize(device)
    return device


def time_samples_ms(fn: Callable[[], object], *, warmup: int = 10, rep: int = 30,
                    before_each: Optional[Callable[[], None]] = None) -> list[float]:
    """Milliseconds of ``rep`` calls of ``fn`` (which should only launch GPU work) after ``warmup`` untimed ones;
    ``before_each`` runs before every call, untimed (e.g. to drop accumulated gradients)."""
    device = warmed_up(fn, warmup, rep, before_each)
    lead = launch_lead_cycles(fn, device, before_each)
    if device not in _flush_buffers:
        _flush_buffers[device] = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for start, end in zip(starts, ends):
        if before_each is not None:
            before_each()
        _flush_buffers[device].zero_()  # evicts the inputs from L2
        torch.cuda._sleep(lead)  # the GPU waits here while Python queues start, fn, end
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def time_ms(fn: Callable[[], object], *, warmup: int = 10, rep: int = 30,
            before_each: Optional[Callable[[], None]] = None) -> float:
    """Median time of ``fn`` in milliseconds; see :func:`time_samples_ms`."""
    return statistics.median(time_samples_ms(fn, warmup=warmup, rep=rep, before_each=before_each))


def wall_ms(fn: Callable[[], object], *, warmup: int = 10, rep: int = 30,
            before_each: Optional[Callable[[], None]] = None) -> float:
    """Wall time per call of ``fn`` in milliseconds as a user's loop sees it: ``rep`` calls queued back to back
    (``before_each`` included), no synchronisation between them, from the first call's start until the GPU has
    finished the last, over ``rep``. Host work and launch overhead count wherever they exceed the GPU's work."""
    device = warmed_up(fn, warmup, rep, before_each)
    start = time.perf_counter()
    calls(fn, rep, before_each)
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3 / rep


def peak_extra_memory_bytes(fn: Callable[[], object]) -> int:
    """Bytes ``fn`` allocates at its peak above what was allocated before (its result counts while computed).
    The CUDA graphs kept for small MTA calls are dropped first (:func:`mta.release_graphs`): a replay allocates
    only its outputs, its workspace lying in the graph's pool, so ``fn`` runs eagerly and its workspace counts."""
    device = require_cuda("peak memory measurement")
    mta.release_graphs()
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before
