"""Benchmark of the host time per call that a user's loop sees, against SDPA in the same run: :class:`HostBenchmark`.

Each case is one call of a public function (or of :meth:`mta.MultiTokenAttention.step`), bf16, beside the same call
through PyTorch SDPA: ``F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)`` at the same
shapes (forward, or forward and ``.backward`` of a fixed output gradient), for decode the new query against the
whole cache (``enable_gqa=True``, no mask), and for the layer's step the same layer built on SDPA
(:meth:`mta.bench.decoder.SDPAAttention.step`).

* CPU time per call (:func:`host_time_samples_us`): :data:`CALLS` calls back to back with no synchronisation
  between them, ``perf_counter`` around the loop alone (synchronised before it; the synchronisation after it is not
  timed), over :data:`CALLS`; the median of :data:`REPEATS` loops after :data:`WARMUP` untimed calls. mta's and
  SDPA's loops alternate (mta, SDPA, mta, ...), so drift in the host's speed during the run weighs on both sides of
  the ratio alike. Where the GPU takes longer than the host, the host still only queues: this is the host's share,
  not the wall time.
* GPU work per call (:func:`graph_time_us`): the call captured in a CUDA graph (after warm-up calls on a side
  stream), replayed :data:`CALLS` times between two CUDA events; None where the call cannot be captured.
* Launches per call (:func:`launches_per_call`): the kernels, memsets and copies the GPU runs for one call, as the
  profiler sees them: each costs the host a launch, and a loop over chunks shows as a count that grows with N.

Forward+backward calls accumulate into the inputs' ``.grad`` (both sides alike). The layer-step cases reset the
cache's lengths to the prefix before every step (on both sides: one device copy each), so every step attends over
the same prefix plus its new token; the caches hold exactly that many positions, so SDPA's step (which attends over
the whole static cache with a length mask) reads only the valid prefix.

The JSON's ``targets`` hold each case's ratio of mta's CPU time to SDPA's and the most it may be
(:data:`TARGETS`); a missed target is reported there and in the table, never as the exit status.

Duration on an H200 (estimated, not measured): ``--quick`` about 1 minute, the full run about 2, most of it
compiling the kernels in a fresh process.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, fields
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import mta
from mta import MultiTokenAttention

from .decoder import DecoderConfig, SDPAAttention
from .harness import Benchmark, Tools, describe_error, is_oom, measured, release_memory, shape_rows
from .plots import plot_host

CALLS = 20  # calls per timed loop, and graph replays per GPU timing
REPEATS = 7  # timed loops; the median is reported
WARMUP = 10  # untimed calls before the loops (the first compiles the kernels)
GRAPH_WARMUP = 3  # calls on a side stream before a capture
STEP = "MultiTokenAttention.step"
OPS = ("flash_attention", "conv_attention", "decode_attention", "conv_decode_attention", STEP)
IMPLS = ("mta", "sdpa")
#: ``{group: (what, the most mta's CPU time per call may be, as a multiple of SDPA's)}``.
TARGETS = {
    "single_launch": ("single-launch calls (flash_attention forward, decode_attention, conv_decode_attention) "
                      "against SDPA's same call", 2.0),
    "conv_forward": ("conv_attention forward against SDPA's forward", 3.0),
    "flash_forward_backward": ("flash_attention forward + backward against SDPA's forward + backward", 1.5),
    "conv_forward_backward": ("conv_attention forward + backward against SDPA's forward + backward", 3.0),
    "layer_step": ("MultiTokenAttention.step against the step of the same layer built on SDPA", 2.0),
}


@dataclass(frozen=True)
class HostShape:
    """One case: ``op`` (:data:`OPS`), with ``backward`` its forward and backward; ``batch``, ``heads`` query and
    ``kv_heads`` key/value heads, head dim ``head_dim``; ``seq_len`` is N (the decode calls: the cached keys, the
    step: the prefix before its token); ``cq x ck`` the MTA kernel (0 x 0: none)."""

    op: str
    backward: bool
    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    cq: int = 0
    ck: int = 0

    def label(self) -> str:
        kernel = f" {self.cq}x{self.ck}" if self.cq else ""
        heads = f"{self.heads}/{self.kv_heads} heads"
        if self.op == STEP:
            return (f"{self.op}{kernel}, B {self.batch}, dim {self.heads * self.head_dim}, {heads}, "
                    f"prefix {self.seq_len}")
        if self.op.endswith("decode_attention"):
            return f"{self.op}{kernel}, B {self.batch}, {heads}, d {self.head_dim}, {self.seq_len} keys"
        passes = "forward + backward" if self.backward else "forward"
        return f"{self.op}{kernel} {passes}, B {self.batch}, {heads}, N {self.seq_len}, d {self.head_dim}"

    @property
    def target(self) -> str:
        """The group of :data:`TARGETS` this case is held to."""
        if self.op == STEP:
            return "layer_step"
        if self.op == "conv_attention":
            return "conv_forward_backward" if self.backward else "conv_forward"
        if self.op == "flash_attention" and self.backward:
            return "flash_forward_backward"
        return "single_launch"


SHAPE_KEYS = tuple(f.name for f in fields(HostShape))


def cases(quick: bool = False) -> list[HostShape]:
    """The issue's cases; ``quick``: the conv forward+backward at N = 1024 only and one B = 1 decode."""
    flash, conv, decode = "flash_attention", "conv_attention", "decode_attention"
    lengths_64, lengths_128 = ((1024,), (1024,)) if quick else ((1024, 4096, 8192, 16384), (1024, 4096, 8192))
    return [HostShape(flash, False, 1, 16, 4, 2048, 64),
            HostShape(conv, False, 1, 16, 4, 2048, 64, 6, 11),
            HostShape(flash, True, 1, 8, 8, 1024, 64),
            *(HostShape(conv, True, 1, 8, 8, n, 64, 6, 11) for n in lengths_64),
            *(HostShape(conv, True, 1, 16, 16, n, 128, 6, 11) for n in lengths_128),
            HostShape(decode, False, 8, 16, 4, 8192, 64),
            *(HostShape(decode, False, 1, 32, 8, n, 128) for n in ((4096,) if quick else (4096, 16384))),
            HostShape("conv_decode_attention", False, 8, 16, 4, 8192, 64, 6, 11),
            HostShape(STEP, False, 8, 16, 4, 2048, 64, 6, 11),
            HostShape(STEP, False, 8, 16, 4, 2048, 64, 1, 1)]


# --- the calls ------------------------------------------------------------------------------------------------

Call = Callable[[], object]


def make_calls(shape: HostShape, device, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> dict[str, Call]:
    """``{"mta": call, "sdpa": call}`` at ``shape`` on ``device``, inputs in ``dtype`` (MTA kernels fp32), each call
    one argument-free closure over inputs made here once."""
    generator = torch.Generator(device).manual_seed(seed)

    def randn(*size, dtype=dtype):
        return torch.randn(*size, device=device, dtype=dtype, generator=generator)

    B, H, Hkv, N, D = shape.batch, shape.heads, shape.kv_heads, shape.seq_len, shape.head_dim
    cq, ck = shape.cq, shape.ck
    if shape.op == STEP:
        return step_calls(shape, device, dtype, randn)
    if shape.op.endswith("decode_attention"):
        q, k, v = randn(B, H, 1, D), randn(B, Hkv, N, D), randn(B, Hkv, N, D)
        lengths = torch.full((B,), N, device=device, dtype=torch.int32)
        if shape.op == "decode_attention":
            ours = lambda: mta.decode_attention(q, k, v, cache_seqlens=lengths)  # noqa: E731
        else:
            q_cache, weight = randn(B, H, N, D), 0.1 * randn(H, cq, ck, dtype=torch.float32)
            ours = lambda: mta.conv_decode_attention(q_cache, k, v, weight, cache_seqlens=lengths)  # noqa: E731
        return {"mta": ours, "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}
    grad = shape.backward
    q, k, v = (randn(B, h, N, D).requires_grad_(grad) for h in (H, Hkv, Hkv))
    if shape.op == "conv_attention":
        weight = (0.1 * randn(H, cq, ck, dtype=torch.float32)).requires_grad_(grad)
        forwards = {"mta": lambda: mta.conv_attention(q, k, v, weight, causal=True)}
    else:
        forwards = {"mta": lambda: mta.flash_attention(q, k, v, causal=True)}
    forwards["sdpa"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if not grad:
        return forwards
    do = randn(B, H, N, D)
    return {name: (lambda forward=forward: forward().backward(do)) for name, forward in forwards.items()}


def step_calls(shape: HostShape, device, dtype: torch.dtype, randn: Callable[..., torch.Tensor]) -> dict[str, Call]:
    """A decode step of :class:`mta.MultiTokenAttention` (kernel ``cq x ck``) and of the same layer on SDPA, each
    over a cache of ``batch`` prompts of ``seq_len`` tokens with one position to spare, reset to the prompt before
    each step."""
    dim, theta = shape.heads * shape.head_dim, DecoderConfig().rope_theta
    ours = MultiTokenAttention(dim, shape.heads, num_kv_heads=shape.kv_heads, kernel_size=(shape.cq, shape.ck),
                               rope_theta=theta).to(device, dtype)
    if ours.conv_weight is not None:  # kept fp32, as the layer keeps it (mta.bench.decoder.build)
        ours.conv_weight.data = ours.conv_weight.data.float()
    sdpa = SDPAAttention(dim, shape.heads, num_kv_heads=shape.kv_heads, rope_theta=theta).to(device, dtype)
    prefix, n_max = shape.seq_len, shape.seq_len + 1
    ours_cache, sdpa_cache = ours.new_cache(shape.batch, n_max), sdpa.new_cache(shape.batch, n_max)
    prompt, x = randn(shape.batch, prefix, dim), randn(shape.batch, 1, dim)
    with torch.no_grad():
        ours.prefill(prompt, ours_cache)
        sdpa.prefill(prompt, sdpa_cache)
    ours_start, sdpa_start = ours_cache.lengths.clone(), sdpa_cache.lengths.clone()

    def ours_step():
        ours_cache.lengths.copy_(ours_start)
        ours_cache.length_bound = prefix  # the host's bound, as after the prefill
        return ours.step(x, ours_cache)

    def sdpa_step():
        sdpa_cache.lengths.copy_(sdpa_start)
        return sdpa.step(x, sdpa_cache)
    return {"mta": ours_step, "sdpa": sdpa_step}


# --- timing ---------------------------------------------------------------------------------------------------

def host_time_samples_us(calls_by_name: dict[str, Call], *, calls: int = CALLS, repeats: int = REPEATS,
                         warmup: int = WARMUP, clock: Callable[[], float] = time.perf_counter,
                         synchronize: Optional[Callable[[], None]] = None) -> dict[str, list[float]]:
    """``{name: samples}``: microseconds of host time per call, one sample per loop of ``calls`` calls back to back.
    First ``warmup`` untimed calls of each call (in the dict's order), then ``repeats`` rounds; in each round, for
    each name in order: synchronize, ``clock`` around that name's loop alone, synchronize (untimed). The loops of
    the names alternate so that a host whose speed drifts during the run slows them alike, and their ratio holds.
    ``synchronize``: default ``torch.cuda.synchronize`` (tests give fakes, and a fake ``clock``)."""
    if calls < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need calls >= 1, repeats >= 1 and warmup >= 0, got calls={calls}, repeats={repeats}, "
                         f"warmup={warmup}")
    synchronize = synchronize or torch.cuda.synchronize
    for call in calls_by_name.values():
        for _ in range(warmup):
            call()
    samples = {name: [] for name in calls_by_name}
    for _ in range(repeats):
        for name, call in calls_by_name.items():
            synchronize()
            start = clock()
            for _ in range(calls):
                call()
            samples[name].append((clock() - start) * 1e6 / calls)
            synchronize()
    return samples


def launches_per_call(call: Call) -> tuple[Optional[int], Optional[str]]:
    """``(n, None)``: the GPU activities (kernels, memsets, copies) of one ``call``, counted by PyTorch's profiler
    between two synchronisations; ``(None, why)`` where it cannot profile (no GPU, for one)."""
    from torch.profiler import ProfilerActivity, profile
    try:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            call()
            torch.cuda.synchronize()
        return sum(event.device_type == torch.autograd.DeviceType.CUDA for event in profiler.events()), None
    except Exception as exc:  # noqa: BLE001  (a call that cannot be profiled is a result)
        return None, describe_error(exc)


def graph_time_us(call: Call, *, replays: int = CALLS, warmup: int = GRAPH_WARMUP) -> tuple[Optional[float],
                                                                                          Optional[str]]:
    """GPU work per call: ``(microseconds, None)`` of ``call`` captured in a CUDA graph (after ``warmup`` calls on a
    side stream, as a capture needs) and replayed ``replays`` times between two CUDA events after one untimed
    replay; ``(None, why)`` where it cannot be captured (a synchronisation inside it, for one)."""
    graph = None
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                call()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / replays, None
    except Exception as exc:  # noqa: BLE001  (a call that cannot be captured is a result)
        return None, describe_error(exc)
    finally:
        del graph  # its memory pool goes with it


# --- targets and tables ---------------------------------------------------------------------------------------

def case_rows(results: list[dict]) -> list[dict]:
    """A row per case (:func:`mta.bench.harness.shape_rows`), with its label ``case`` and target: ``target``,
    ``what``, ``measured`` (mta's CPU time over SDPA's, None where one is missing), ``at_most`` and ``ok`` (None
    where not measured)."""
    rows = shape_rows(results, SHAPE_KEYS)
    for row in rows:
        shape = HostShape(**{k: row[k] for k in SHAPE_KEYS})
        what, at_most = TARGETS[shape.target]
        ours, sdpa = (row["records"].get(impl, {}).get("cpu_us") for impl in IMPLS)
        value = ours / sdpa if ours and sdpa else None
        row.update(case=shape.label(), target=shape.target, what=what, measured=value, at_most=at_most,
                   ok=None if value is None else value <= at_most)
    return rows


def targets(results: list[dict]) -> list[dict]:
    """Each case's target: ``{"target", "what", "case", "measured", "at_most", "ok"}`` (:func:`case_rows`)."""
    return [{k: row[k] for k in ("target", "what", "case", "measured", "at_most", "ok")} for row in case_rows(results)]


def host_tables(data: dict) -> list[tuple]:
    """A row per case: CPU and GPU time per call of mta and SDPA, the ratio of CPU times and its target; for the
    command's output and ``docs/performance.md``."""
    cfg = data["config"]
    result = {True: "pass", False: "MISSED", None: "-"}
    columns = [("call", "", "case"),
               ("mta CPU us", "{:.1f}", measured("mta", "cpu_us", why=True)),
               ("SDPA CPU us", "{:.1f}", measured("sdpa", "cpu_us", why=True)),
               ("CPU mta / SDPA", "{:.2f}", "measured"), ("at most", "{:.1f}", "at_most"),
               ("", "", lambda row: result[row["ok"]]),
               ("mta GPU us", "{:.1f}", measured("mta", "gpu_us")),
               ("SDPA GPU us", "{:.1f}", measured("sdpa", "gpu_us")),
               ("mta launches", "{:.0f}", measured("mta", "launches")),
               ("SDPA launches", "{:.0f}", measured("sdpa", "launches"))]
    return [(f"Host time per call, {cfg['dtype']}, microseconds: CPU is the host's time per call of {cfg['calls']} "
             f"calls back to back with no synchronisation between them (median of {cfg['repeats']} loops, mta's and "
             "SDPA's alternating), GPU the work per call of the call replayed as a CUDA graph (- where it cannot be "
             "captured), launches the kernels, memsets and copies the GPU runs for one call (- where not counted). "
             "SDPA: the same call through F.scaled_dot_product_attention (the step: the same layer built on SDPA). "
             "The target: mta's CPU time at most that multiple of SDPA's:", columns, case_rows(data["results"]))]


# --- the benchmark --------------------------------------------------------------------------------------------

class HostBenchmark(Benchmark):
    """Host (CPU) time per call of mta's public functions and of MultiTokenAttention.step, bf16, as a user's loop
    sees it (20 calls back to back, no synchronisation between them, the median of 7 loops, mta's and SDPA's
    alternating), beside the GPU work per call (CUDA-graph replay), against the same call through PyTorch SDPA (the
    step: the same layer built on SDPA). Records each case's ratio to SDPA and its target (pass or missed) without
    failing on it. About 2 minutes on an H200, most of it compiling."""

    name, out = "host", "figures/bench_host.json"
    help = "host time per call back to back of each public function and the layer's step vs SDPA's same call"
    quick_help = "the conv forward+backward at N = 1024 only, one B = 1 decode"
    exit_1 = "is not used (a missed target is reported in the JSON and the tables)"
    timed = False  # its own loop: --calls and --repeats
    options = {"--calls": dict(dest="calls", type=int, default=CALLS,
                               help=f"calls per timed loop, and graph replays (default {CALLS})"),
               "--repeats": dict(dest="repeats", type=int, default=REPEATS,
                                 help=f"timed loops; the median is reported (default {REPEATS})")}
    Shape, plot = HostShape, staticmethod(plot_host)

    def __init__(self, calls: int = CALLS, repeats: int = REPEATS, *,
                 call_maker: Callable[[HostShape, object], dict[str, Call]] = make_calls,
                 host_timer: Callable[..., dict[str, list[float]]] = host_time_samples_us,
                 graph_timer: Callable[..., tuple] = graph_time_us,
                 launch_counter: Callable[[Call], tuple] = launches_per_call):
        """The defaults are the benchmark; tests replace the calls and the timers."""
        super().__init__()
        if calls < 1 or repeats < 1:
            raise ValueError(f"need calls >= 1 and repeats >= 1, got calls={calls}, repeats={repeats}")
        self.calls, self.repeats = calls, repeats
        self.call_maker, self.host_timer, self.graph_timer = call_maker, host_timer, graph_timer
        self.launch_counter = launch_counter

    def shapes(self, quick):
        return cases(quick)

    def config(self, quick, warmup, rep):
        return {
            "benchmark": "host", "quick": quick, "dtype": "bfloat16", "calls": self.calls, "repeats": self.repeats,
            "warmup": WARMUP,
            "cpu_time": "per call: perf_counter around `calls` calls back to back, no synchronisation between them "
                        "(synchronize before the loop; the one after it untimed), over `calls`; median of `repeats` "
                        "loops after `warmup` untimed calls; the loops of mta and SDPA alternate (mta, sdpa, mta, "
                        "...), so drift in the host's speed weighs on both alike",
            "gpu_work": f"per call: CUDA graph of one call (captured after {GRAPH_WARMUP} calls on a side stream), "
                        "replayed `calls` times between two CUDA events after one untimed replay; None where the "
                        "capture fails",
            "sdpa": "F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) at the same shapes; "
                    "decode: the new query against the whole cache (enable_gqa=True, no mask); the step: "
                    "mta.bench.decoder.SDPAAttention.step (the same layer on SDPA, a static cache with a length mask)",
            "launches": "per call: GPU activities (kernels, memsets, copies) of one call after the timed loops, "
                        "counted by torch.profiler between two synchronisations; None where it cannot profile",
            "backward": "forward, then .backward(a fixed random gradient); gradients accumulate in .grad",
            "step": "the cache holds the prefix plus one position, its lengths reset to the prefix before each step "
                    "(both layers); mta's MTA kernel fp32, the rest bf16",
            "targets": {group: {"what": what, "at_most": at_most} for group, (what, at_most) in TARGETS.items()},
        }

    def summarize(self, results):
        return {"targets": targets(results)}

    def tables(self, data):
        return host_tables(data)

    def measure_shape(self, shape: HostShape, tools: Tools) -> list[dict]:
        """CPU time of both calls (their loops alternating), their launches, then their GPU work, SDPA's first: a
        capture that fails (mta's, if any) comes after every other measurement of the case."""
        records = {impl: {"impl": impl, **asdict(shape), "case": shape.label(), "cpu_us": None,
                          "cpu_us_samples": None, "gpu_us": None, "gpu_error": None, "launches": None,
                          "launches_error": None, "status": "ok", "error": None}
                   for impl in IMPLS}
        try:
            calls = self.call_maker(shape, tools.device)
        except Exception as exc:  # noqa: BLE001  (recorded: an OOM or a failing setup is a result)
            calls = {}
            for record in records.values():
                record.update(status="oom" if is_oom(exc) else "error", error=describe_error(exc))
        try:
            samples = self.host_timer(calls, calls=self.calls, repeats=self.repeats, warmup=WARMUP)
        except Exception as exc:  # noqa: BLE001
            samples = {}
            for impl in calls:
                records[impl].update(status="oom" if is_oom(exc) else "error", error=describe_error(exc))
        for impl, call in calls.items():
            if records[impl]["status"] != "ok":
                continue
            try:
                records[impl].update(cpu_us=statistics.median(samples[impl]), cpu_us_samples=samples[impl])
                records[impl]["launches"], records[impl]["launches_error"] = self.launch_counter(call)
            except Exception as exc:  # noqa: BLE001
                records[impl].update(status="oom" if is_oom(exc) else "error", error=describe_error(exc))
        for impl in sorted(calls, key=lambda name: name != "sdpa"):  # SDPA first: a failed capture comes last
            if records[impl]["status"] == "ok":
                records[impl]["gpu_us"], records[impl]["gpu_error"] = self.graph_timer(calls[impl],
                                                                                       replays=self.calls)
        del calls
        release_memory()
        for record in records.values():
            if record["status"] != "ok":
                tools.warn(f"!!! {record['impl']} at {shape.label()}: {record['error']}")
        return list(records.values())
