"""Benchmark of ``mta.conv_attention`` (the fused MTA forward) against what it replaces.

For every shape, in one run and on the same fresh random inputs, the forward
time and the peak extra memory of five implementations are measured:

* ``mta_conv``: :func:`mta.conv_attention`, the implementation under test;
* ``conv_reference``: :func:`mta.conv_attention_reference`, which materializes
  several fp32 ``[B, H, N, N]`` matrices (what MTA costs without a fused kernel);
* ``conv_reference_compiled``: ``torch.compile`` of that reference;
* ``mta_flash``: :func:`mta.flash_attention` (causal), plain attention in Triton;
* ``sdpa``: ``F.scaled_dot_product_attention(is_causal=True)``, default backend
  selection: plain attention, the floor.

The two references only run where they fit in memory (an estimate, see
:func:`reference_fit`); a skip, an out-of-memory error or a ``torch.compile``
failure is recorded in the results and the run goes on.

Before timing, ``mta_conv``'s output is checked once per shape against the
reference (all heads where it fits, else a float32 reference on as many
heads as fit). A mismatch is recorded, printed loudly and makes the command
exit with status 1: a fast wrong kernel is worth nothing.

Everything is forward only (``mta.conv_attention`` has no backward yet): no
input requires grad.
"""

from __future__ import annotations

import functools
import gc
import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from mta.reference import conv_attention_reference

from .flash import _cell, describe_error, json_safe, rel_err, save_png

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPE = "bfloat16"
CAUSAL = True
#: ``(batch, query heads, kv heads, head dim)``.
CONFIGS = ((1, 8, 8, 64), (1, 16, 16, 128))
#: ``(cq, ck)``: query-axis and key-axis sizes of the convolution kernel.
KERNELS = ((6, 11), (11, 11))
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
QUICK_KERNELS = ((6, 11),)
QUICK_SEQ_LENS = (2048, 8192)
#: Standard deviation of the random convolution weights (fp32, one kernel per head).
WEIGHT_STD = 0.2

#: The implementation under test; the others are what it is compared with.
TESTED_IMPL = "mta_conv"
IMPLS = ("mta_conv", "mta_flash", "sdpa", "conv_reference", "conv_reference_compiled")
#: Implementations that materialize ``[B, H, N, N]``: run only where :func:`reference_fit` says they fit.
REFERENCE_IMPLS = ("conv_reference", "conv_reference_compiled")

#: Largest accepted ``||mta - reference|| / ||reference||`` per input dtype.
TOLERANCE = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-4}

#: The reference's peak is bounded by this many fp32 ``[B, H, N, N]`` matrices alive at once
#: (scores, padded scores, convolved scores, masked copy, softmax and its temporaries).
REFERENCE_LIVE_MATRICES = 6
#: ... and it runs only if that bound is at most this fraction of the free GPU memory.
REFERENCE_MAX_FREE_FRACTION = 0.6

#: ``impl(q, k, v, weight, causal) -> out``: the form every timed implementation takes
#: (plain attention ignores ``weight``).
ConvImpl = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


@dataclass(frozen=True)
class Bar:
    """A target from the issue: ``ratio op threshold`` must hold at the bar's shape."""

    name: str
    description: str
    op: str  # "<=" or ">="
    threshold: float

    def holds(self, value: float) -> bool:
        return value <= self.threshold if self.op == "<=" else value >= self.threshold


#: Where the bars are judged: N = 8192, kernel 6x11, every configuration.
BAR_SEQ_LEN = 8192
BAR_KERNEL = (6, 11)
BARS = (
    Bar("conv_over_flash_time", "mta.conv_attention time / mta.flash_attention time", "<=", 4.0),
    Bar("reference_over_conv_time", "reference time / mta.conv_attention time", ">=", 20.0),
    Bar("conv_over_reference_memory", "mta.conv_attention memory / reference memory", "<=", 0.02),
)


@dataclass(frozen=True)
class ConvShape:
    """One benchmarked problem: ``q [B, H, N, D]``, ``k, v [B, Hkv, N, D]``, ``weight [H, cq, ck]``."""

    dtype: str
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    cq: int
    ck: int
    seq_len: int
    causal: bool = CAUSAL

    def label(self) -> str:
        kv = f" Hkv={self.kv_heads}" if self.kv_heads != self.heads else ""
        return (f"{self.dtype} B={self.batch} H={self.heads}{kv} D={self.head_dim} "
                f"{self.cq}x{self.ck} N={self.seq_len}")


def conv_shapes(quick: bool = False) -> list[ConvShape]:
    """All benchmarked shapes, grouped by (configuration, kernel), N increasing."""
    kernels = QUICK_KERNELS if quick else KERNELS
    seq_lens = QUICK_SEQ_LENS if quick else SEQ_LENS
    return [ConvShape(DTYPE, b, h, hkv, d, cq, ck, n)
            for (b, h, hkv, d) in CONFIGS for (cq, ck) in kernels for n in seq_lens]


# --- memory fit of the reference -------------------------------------------------------------


def reference_bytes_estimate(batch: int, heads: int, seq_len: int) -> int:
    """Bound on the reference's peak: :data:`REFERENCE_LIVE_MATRICES` fp32 ``[B, H, N, N]`` matrices."""
    return REFERENCE_LIVE_MATRICES * batch * heads * seq_len * seq_len * 4


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.1f} GiB"


def reference_fit(shape: ConvShape, free_bytes: int) -> dict:
    """Whether the materialized reference may run on ``shape`` with ``free_bytes`` of GPU memory free.

    It may if its estimated peak is at most :data:`REFERENCE_MAX_FREE_FRACTION`
    of the free memory. ``heads_that_fit`` is how many heads of it would fit
    (for the correctness check on a slice of heads when all do not).
    """
    estimate = reference_bytes_estimate(shape.batch, shape.heads, shape.seq_len)
    budget = REFERENCE_MAX_FREE_FRACTION * free_bytes
    per_head = reference_bytes_estimate(shape.batch, 1, shape.seq_len)
    fits = estimate <= budget
    reason = None if fits else (
        f"not run: the reference needs about {_gib(estimate)} ({REFERENCE_LIVE_MATRICES} fp32 [B, H, N, N] "
        f"matrices), more than {REFERENCE_MAX_FREE_FRACTION:.0%} of the {_gib(free_bytes)} free")
    return {"estimate_bytes": estimate, "free_bytes": int(free_bytes), "budget_bytes": int(budget), "fits": fits,
            "heads_that_fit": int(min(shape.heads, budget // per_head)), "reason": reason}


def cuda_free_bytes() -> int:
    """Free memory of the current CUDA device, after returning PyTorch's cached blocks to it."""
    release_memory()
    return torch.cuda.mem_get_info()[0]


def release_memory() -> None:
    """Drop unreachable tensors (an exception's frames hold some) and return cached blocks to the GPU."""
    if torch.cuda.is_available():  # nothing to return on the CPU (the tests), and gc.collect is slow
        gc.collect()
        torch.cuda.empty_cache()


def is_oom(exc: BaseException) -> bool:
    """True for a CUDA out-of-memory error, also when torch.compile wraps it in its own exception."""
    while exc is not None:
        if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# --- implementations -------------------------------------------------------------------------


def mta_conv(q, k, v, weight, causal):
    """``mta.conv_attention``, imported on first use."""
    from mta.conv import conv_attention
    return conv_attention(q, k, v, weight, causal=causal)


def conv_reference(q, k, v, weight, causal):
    return conv_attention_reference(q, k, v, weight, causal=causal)


class CompiledReference:
    """``torch.compile`` of the reference, compiled afresh for every new shape.

    Dynamo's caches are reset when the shape changes, so every shape gets a
    static-shape graph of its own: no dynamic-shape graph, and no silent
    fallback to eager once dynamo's recompile limit is reached. Compilation
    happens in the first call, i.e. in the timer's warmup.
    """

    __name__ = "conv_reference_compiled"

    def __init__(self):
        self._key = None
        self._fn = None

    def __call__(self, q, k, v, weight, causal):
        key = (tuple(q.shape), tuple(k.shape), tuple(weight.shape), q.dtype, q.device, bool(causal))
        if key != self._key:
            import torch._dynamo
            torch._dynamo.reset()
            self._fn = torch.compile(conv_attention_reference, dynamic=False)
            self._key = key
        return self._fn(q, k, v, weight, causal=causal)


def mta_flash(q, k, v, weight, causal):
    """``mta.flash_attention``: plain attention (no convolution), for the time bar."""
    from mta.flash import flash_attention
    return flash_attention(q, k, v, causal=causal)


def sdpa(q, k, v, weight, causal):
    """SDPA with PyTorch's default backend selection: plain attention, the floor."""
    if q.shape[1] != k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def default_impls(compile_reference: bool = True) -> dict[str, ConvImpl]:
    impls = {"mta_conv": mta_conv, "mta_flash": mta_flash, "sdpa": sdpa, "conv_reference": conv_reference}
    if compile_reference:
        impls["conv_reference_compiled"] = CompiledReference()
    return impls


# --- measuring -------------------------------------------------------------------------------


def random_inputs(shape: ConvShape, device) -> tuple[torch.Tensor, ...]:
    """Standard-normal ``q, k, v`` in the shape's dtype; fp32 ``weight ~ N(0, WEIGHT_STD^2)``, per head."""
    dtype = DTYPES[shape.dtype]
    q = torch.randn(shape.batch, shape.heads, shape.seq_len, shape.head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(shape.batch, shape.kv_heads, shape.seq_len, shape.head_dim, dtype=dtype, device=device)
            for _ in range(2))
    weight = torch.randn(shape.heads, shape.cq, shape.ck, dtype=torch.float32, device=device) * WEIGHT_STD
    return q, k, v, weight


def _head_slice(heads: int, kv_heads: int, wanted: int) -> tuple[int, int]:
    """``(query heads, kv heads)`` of a leading slice of at most ``wanted`` query heads that keeps GQA groups whole."""
    group = heads // kv_heads
    if wanted >= group:
        q_heads = (wanted // group) * group
        return q_heads, q_heads // group
    return wanted, 1  # part of the first group: every one of these query heads reads kv head 0


def check_against_reference(fn: ConvImpl, q, k, v, weight, shape: ConvShape, fit: dict,
                            reference: Callable = conv_attention_reference) -> dict:
    """Relative error of ``fn``'s output against the reference, and whether it passes.

    With all heads where the reference fits (``fit["fits"]``); else, or if
    that runs out of memory, against a float32 reference (inputs cast up) on
    the leading heads, halving their number until it runs.
    """
    tolerance = TOLERANCE[shape.dtype]
    check = {"reference": None, "heads_checked": None, "rel_err": None, "tolerance": tolerance, "ok": False,
             "error": None, "notes": [], "reference_fit": fit}
    failure = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn(q, k, v, weight, shape.causal)
        except Exception as exc:  # noqa: BLE001  (recorded: a failing kernel is a result)
            failure = f"{TESTED_IMPL} raised {describe_error(exc, caught)}"
    if failure is not None:
        check["error"] = failure
        release_memory()
        return check

    wanted = shape.heads if fit["fits"] else fit["heads_that_fit"]
    full = fit["fits"]
    while wanted >= 1 and check["rel_err"] is None:
        hq, hkv = _head_slice(shape.heads, shape.kv_heads, wanted)
        failure = None
        try:
            if full:
                ref = reference(q, k, v, weight, causal=shape.causal)
                check["reference"] = f"conv_attention_reference, all heads ({shape.dtype} inputs, fp32 compute)"
                mine = out
            else:
                ref = reference(q[:, :hq].float(), k[:, :hkv].float(), v[:, :hkv].float(), weight[:hq],
                                causal=shape.causal)
                check["reference"] = (f"conv_attention_reference on float32 inputs, query heads 0..{hq - 1} "
                                      f"of {shape.heads}")
                mine = out[:, :hq]
            check["heads_checked"] = hq
            check["rel_err"] = rel_err(mine, ref)
            del ref, mine
        except Exception as exc:  # noqa: BLE001  (OOM, or e.g. a conv2d too large for cuDNN: try fewer heads)
            failure = (f"reference on {hq} heads ran out of memory" if is_oom(exc)
                       else f"reference on {hq} heads raised {describe_error(exc)}")
        if failure is not None:  # outside the except block, so the failed call's tensors can be freed
            check["notes"].append(failure)
            release_memory()
            wanted, full = hq // 2, False
    del out
    if check["rel_err"] is None:
        if check["notes"]:
            check["error"] = "no reference could run, not even on one head: " + "; ".join(check["notes"])
        else:
            check["error"] = "no reference fits in memory, not even on one head"
    check["ok"] = check["rel_err"] is not None and check["rel_err"] <= tolerance
    release_memory()
    return check


def measure(fn: ConvImpl, q, k, v, weight, causal: bool, timer, memory) -> dict:
    """Forward time and peak extra memory of one implementation, or why they are missing."""
    m = {"fwd_ms": None, "peak_extra_bytes": None, "status": "ok", "error": None}
    failed = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            m["fwd_ms"] = timer(lambda: fn(q, k, v, weight, causal))
            m["peak_extra_bytes"] = int(memory(lambda: fn(q, k, v, weight, causal)))
        except Exception as exc:  # noqa: BLE001  (OOM, compile failure...: recorded, not fatal)
            m["status"] = "oom" if is_oom(exc) else "error"
            m["error"] = describe_error(exc, caught)
            failed = True
    if failed:  # outside the except block, so the exception's frames (and their tensors) are gone
        release_memory()
    return m


def benchmark_shape(shape: ConvShape, impls: dict[str, ConvImpl], *, timer, memory, free_bytes: int, device,
                    warn: Callable[[str], None] = print) -> list[dict]:
    """One record per implementation for ``shape``; the tested one carries the correctness check.

    A failed check is passed to ``warn`` at once, before anything is timed.
    """
    q, k, v, weight = random_inputs(shape, device)
    fit = reference_fit(shape, free_bytes)
    check = None
    if TESTED_IMPL in impls:
        check = check_against_reference(impls[TESTED_IMPL], q, k, v, weight, shape, fit)
        if not check["ok"]:
            warn(f"!!! {TESTED_IMPL} FAILS ITS CHECK at {shape.label()}: {format_check(check)}")
    records = []
    for name, fn in impls.items():
        record = {"impl": name, **asdict(shape)}
        if name in REFERENCE_IMPLS and not fit["fits"]:
            record.update(fwd_ms=None, peak_extra_bytes=None, status="skipped", error=fit["reason"])
        else:
            record.update(measure(fn, q, k, v, weight, shape.causal, timer, memory))
        if name == TESTED_IMPL:
            record["check"] = check
        records.append(record)
    del q, k, v, weight
    release_memory()
    return records


def run_shapes(shapes: list[ConvShape], *, timer, memory, free_memory: Callable[[], int],
               impls: Optional[dict[str, ConvImpl]] = None, device="cuda", progress: bool = True,
               done: Optional[list[dict]] = None,
               after_each: Optional[Callable[[list[dict]], None]] = None) -> list[dict]:
    """Benchmark every shape, with a progress bar; a failed check is printed as soon as it is known.

    ``free_memory()`` is asked before each shape, with nothing of the benchmark allocated.
    ``done``: results of an interrupted run; their shapes are not measured again.
    ``after_each(results so far)`` is called after every shape (to save them).
    """
    from tqdm.auto import tqdm

    impls = default_impls() if impls is None else impls
    results = list(done or [])
    measured = set(by_shape(results))
    todo = [s for s in shapes if tuple(getattr(s, k) for k in SHAPE_KEYS) not in measured]
    bar = tqdm(todo, desc="conv", unit="shape", disable=not progress)
    for shape in bar:
        bar.set_postfix_str(shape.label())
        results.extend(benchmark_shape(shape, impls, timer=timer, memory=memory, free_bytes=free_memory(),
                                       device=device, warn=tqdm.write))
        if after_each is not None:
            after_each(results)
    return results


# --- ratios and bars -------------------------------------------------------------------------

SHAPE_KEYS = ("dtype", "batch", "heads", "kv_heads", "head_dim", "cq", "ck", "seq_len", "causal")
CONFIG_KEYS = ("batch", "heads", "kv_heads", "head_dim")


def by_shape(results: list[dict]) -> dict[tuple, dict[str, dict]]:
    """``{shape key (SHAPE_KEYS): {impl: record}}`` in the order of the results."""
    table: dict[tuple, dict[str, dict]] = {}
    for r in results:
        table.setdefault(tuple(r[k] for k in SHAPE_KEYS), {})[r["impl"]] = r
    return table


def _over(records: dict[str, dict], a: str, b: str, key: str) -> Optional[float]:
    """``records[a][key] / records[b][key]``, None where either is missing or not positive."""
    x, y = records.get(a, {}).get(key), records.get(b, {}).get(key)
    return x / y if x is not None and y and x > 0 and y > 0 else None


#: name -> (numerator impl, denominator impl, measured key): the ratios reported per shape.
RATIOS = {
    "conv_over_flash_time": ("mta_conv", "mta_flash", "fwd_ms"),
    "conv_over_sdpa_time": ("mta_conv", "sdpa", "fwd_ms"),
    "reference_over_conv_time": ("conv_reference", "mta_conv", "fwd_ms"),
    "reference_compiled_over_conv_time": ("conv_reference_compiled", "mta_conv", "fwd_ms"),
    "conv_over_reference_memory": ("mta_conv", "conv_reference", "peak_extra_bytes"),
    "conv_over_reference_compiled_memory": ("mta_conv", "conv_reference_compiled", "peak_extra_bytes"),
}


def shape_ratios(results: list[dict]) -> list[dict]:
    """Per shape: its fields, every ratio of :data:`RATIOS` (None where a side is missing), and check_ok."""
    rows = []
    for key, records in by_shape(results).items():
        row = dict(zip(SHAPE_KEYS, key))
        row.update({name: _over(records, a, b, m) for name, (a, b, m) in RATIOS.items()})
        check = records.get(TESTED_IMPL, {}).get("check")
        row["check_ok"] = None if check is None else bool(check.get("ok"))
        rows.append(row)
    return rows


def evaluate_bars(results: list[dict], seq_len: int = BAR_SEQ_LEN, kernel: tuple[int, int] = BAR_KERNEL) -> list[dict]:
    """Every bar of :data:`BARS` for every configuration in ``results``, at ``seq_len`` and ``kernel``.

    ``result`` is "PASS", "FAIL" or "MISSING" (the shape or a measurement is
    absent). A bar at a shape where mta failed its correctness check FAILs,
    whatever its numbers: a wrong kernel's speed means nothing.
    """
    ratios = shape_ratios(results)
    records = by_shape(results)
    configs = list(dict.fromkeys(tuple(r[k] for k in CONFIG_KEYS) for r in results))
    entries = []
    for config in configs:
        where = dict(zip(CONFIG_KEYS, config))
        row = next((r for r in ratios if all(r[k] == v for k, v in where.items())
                    and r["seq_len"] == seq_len and (r["cq"], r["ck"]) == tuple(kernel)), None)
        for bar in BARS:
            value = None if row is None else row[bar.name]
            entry = {**where, "cq": kernel[0], "ck": kernel[1], "seq_len": seq_len, "bar": bar.name,
                     "description": bar.description, "op": bar.op, "threshold": bar.threshold, "value": value,
                     "result": None, "note": None}
            if row is None:
                entry["result"], entry["note"] = "MISSING", "shape not benchmarked"
            elif row["check_ok"] is False:
                entry["result"], entry["note"] = "FAIL", f"{TESTED_IMPL} failed its correctness check"
            elif value is None:
                shape_records = records[tuple(row[k] for k in SHAPE_KEYS)]
                entry["result"], entry["note"] = "MISSING", _missing(shape_records, RATIOS[bar.name])
            else:
                entry["result"] = "PASS" if bar.holds(value) else "FAIL"
            entries.append(entry)
    return entries


def _missing(records: dict[str, dict], ratio: tuple[str, str, str]) -> str:
    """Why a ratio has no value: which side is missing and its status (skipped, oom, error)."""
    reasons = []
    for impl in ratio[:2]:
        r = records.get(impl)
        if r is None:
            reasons.append(f"{impl} not run")
        elif r.get(ratio[2]) is None:
            reasons.append(f"{impl} {r.get('status') or 'missing'}")
    return ", ".join(reasons) or "a measurement is not positive"


# --- reporting -------------------------------------------------------------------------------

SHORT_NAMES = {"mta_conv": "conv", "mta_flash": "flash", "sdpa": "sdpa", "conv_reference": "ref",
               "conv_reference_compiled": "ref.c"}
_STATUS_CELLS = {"skipped": "skip", "oom": "oom", "error": "err"}


def format_check(check: Optional[dict]) -> str:
    if check is None:
        return "not checked"
    if check.get("error"):
        return check["error"]
    return (f"rel err {check['rel_err']:.1e} (tol {check['tolerance']:.0e}) vs {check['reference']}"
            + ("".join(f"; {n}" for n in check.get("notes") or [])))


def _status_cell(record: Optional[dict], key: str, fmt: str, scale: float = 1.0) -> str:
    """A measurement, or why it is missing (skip / oom / err), or a dash, as wide as ``fmt``."""
    width = int(fmt.split(".")[0])
    if record is None:
        return "-".rjust(width)
    if record.get(key) is not None:
        return format(record[key] * scale, fmt)
    return _STATUS_CELLS.get(record.get("status"), "-").rjust(width)


def _ratio_cell(x: Optional[float], width: int, precision: int, percent: bool = False) -> str:
    """``x`` as ``1.23x`` (or ``1.23%``), right-aligned in ``width`` characters; a dash if missing."""
    if x is None:
        return "-".rjust(width)
    return (f"{100 * x:.{precision}f}%" if percent else f"{x:.{precision}f}x").rjust(width)


def format_table(results: list[dict]) -> str:
    """Times (ms), peak extra memory (MiB), the ratios and the check error, one row per shape."""
    names = [n for n in IMPLS if any(r["impl"] == n for r in results)]
    names += [n for n in dict.fromkeys(r["impl"] for r in results) if n not in names]
    short = [SHORT_NAMES.get(n, n)[:8] for n in names]
    cols = " ".join(f"{s:>8}" for s in short)
    width = len(cols)
    ratio_head = f"{'conv/flash':>10} {'ref/conv':>9} {'ref.c/conv':>10} {'mem c/ref':>9}"
    groups = (f"{'':<26} | {'forward time (ms)':<{width}} | {'peak extra memory (MiB)':<{width}} | "
              f"{'ratios':<{len(ratio_head)}} | check")
    head = f"{'B   H Hkv   D':<13} {'kernel':>6} {'N':>5} | {cols} | {cols} | {ratio_head} | {'rel err':>7}"
    lines = [f"mta.conv_attention (conv) vs mta.flash_attention (flash), SDPA, the materialized reference (ref) and "
             "its torch.compile (ref.c); forward, causal. skip: the reference does not fit; ! = check failed",
             groups, head, "-" * len(head)]
    ratios = {tuple(r[k] for k in SHAPE_KEYS): r for r in shape_ratios(results)}
    for key, records in by_shape(results).items():
        shape = dict(zip(SHAPE_KEYS, key))
        times = " ".join(_status_cell(records.get(n), "fwd_ms", "8.3f") for n in names)
        mems = " ".join(_status_cell(records.get(n), "peak_extra_bytes", "8.1f", 2.0 ** -20) for n in names)
        row = ratios[key]
        check = records.get(TESTED_IMPL, {}).get("check")
        err = _cell(None if check is None else check.get("rel_err"), "7.1e")
        failed = check is not None and not check.get("ok")
        config = f"{shape['batch']:<2} {shape['heads']:>2} {shape['kv_heads']:>3} {shape['head_dim']:>3}"
        lines.append(
            f"{config:<13} {str(shape['cq']) + 'x' + str(shape['ck']):>6} {shape['seq_len']:>5} | {times} | "
            f"{mems} | {_ratio_cell(row['conv_over_flash_time'], 10, 2)} "
            f"{_ratio_cell(row['reference_over_conv_time'], 9, 1)} "
            f"{_ratio_cell(row['reference_compiled_over_conv_time'], 10, 1)} "
            f"{_ratio_cell(row['conv_over_reference_memory'], 9, 2, percent=True)} | {err}"
            + (" !" if failed else ""))
    return "\n".join(lines)


def _bar_value(entry: dict) -> str:
    if entry["value"] is None:
        return "n/a"
    if entry["bar"].endswith("_memory"):
        return f"{100 * entry['value']:.2f}%"
    return f"{entry['value']:.2f}x"


def _bar_threshold(entry: dict) -> str:
    return f"{100 * entry['threshold']:g}%" if entry["bar"].endswith("_memory") else f"{entry['threshold']:g}x"


def format_bars(bars: list[dict]) -> str:
    """The bars, one line each: configuration, what is compared, value, op, threshold, PASS/FAIL/MISSING."""
    if not bars:
        return "bars: no results"
    first = bars[0]
    lines = [f"bars at N={first['seq_len']}, kernel {first['cq']}x{first['ck']}:"]
    for e in bars:
        config = f"B={e['batch']} H={e['heads']} Hkv={e['kv_heads']} D={e['head_dim']}"
        lines.append(f"  {config:<26} {e['description']:<52} {_bar_value(e):>8} {e['op']} "
                     f"{_bar_threshold(e):<5} {e['result']}" + (f" ({e['note']})" if e["note"] else ""))
    passed = sum(e["result"] == "PASS" for e in bars)
    lines.append(f"  {passed}/{len(bars)} bars pass")
    return "\n".join(lines)


def config(quick: bool, warmup: int, rep: int, compile_reference: bool = True) -> dict:
    shapes = conv_shapes(quick)
    return {
        "benchmark": "conv",
        "quick": quick,
        "dtype": DTYPE,
        "causal": CAUSAL,
        "configurations": [dict(zip(CONFIG_KEYS, c)) for c in dict.fromkeys(
            tuple(getattr(s, k) for k in CONFIG_KEYS) for s in shapes)],
        "kernels": [list(k) for k in dict.fromkeys((s.cq, s.ck) for s in shapes)],
        "seq_lens": sorted({s.seq_len for s in shapes}),
        "impls": [n for n in IMPLS if compile_reference or n != "conv_reference_compiled"],
        "tested_impl": TESTED_IMPL,
        "inputs": f"q, k, v: torch.randn in {DTYPE}; weight [H, cq, ck]: torch.randn * {WEIGHT_STD} in float32, "
                  "a different kernel per head; no input requires grad (forward only)",
        "warmup": warmup,
        "rep": rep,
        "timing": "forward only; median over rep of per-call CUDA event times; 256 MB L2 flush and a ~1 ms GPU spin "
                  "(so launch overhead is not timed) before each call",
        "memory": "peak_extra_bytes: torch.cuda.max_memory_allocated during one call minus memory_allocated "
                  "before it (inputs excluded, output and temporaries included)",
        "reference_fit": {"live_fp32_matrices": REFERENCE_LIVE_MATRICES,
                          "max_fraction_of_free": REFERENCE_MAX_FREE_FRACTION,
                          "rule": "conv_reference and conv_reference_compiled run only if "
                                  f"{REFERENCE_LIVE_MATRICES} * B * H * N * N * 4 bytes <= "
                                  f"{REFERENCE_MAX_FREE_FRACTION} * free GPU memory"},
        "compile": "torch.compile(conv_attention_reference, dynamic=False), dynamo reset before each shape"
                   if compile_reference else None,
        "tolerance": TOLERANCE[DTYPE],
        "bars": {"seq_len": BAR_SEQ_LEN, "kernel": list(BAR_KERNEL),
                 "bars": [asdict(b) for b in BARS]},
    }


#: Provenance fields that must match for a run to go on from another's partial results.
RESUME_KEYS = ("gpu", "torch", "triton", "git_commit", "mta_source_sha256")


def resumable_results(path: Path, prov: dict, cfg: dict) -> list[dict]:
    """The results saved in ``path`` by an interrupted run of the same benchmark, code and machine.

    Raises ValueError naming the difference if the saved run is not the same
    one (another configuration, GPU, library version or code).
    """
    saved = json.loads(path.read_text())
    if saved.get("config") != json_safe(cfg):
        raise ValueError(f"cannot resume from {path}: it was run with another configuration")
    diff = [k for k in RESUME_KEYS if saved.get("provenance", {}).get(k) != prov.get(k)]
    if diff:
        raise ValueError(f"cannot resume from {path}: {', '.join(diff)} differ from this run's")
    return saved.get("results", [])


def write_results(out: Path, prov: dict, cfg: dict, results: list[dict], complete: bool) -> dict:
    """Write the JSON (``complete``: False while shapes are still to run) and return what was written."""
    data = json_safe({"provenance": prov, "config": cfg, "complete": complete, "results": results,
                      "shapes": shape_ratios(results), "bars": evaluate_bars(results)})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    return data


def run(*, quick: bool = False, out: Path, warmup: int = 10, rep: int = 30, compile_reference: bool = True,
        resume: bool = False) -> int:
    """The ``conv`` command: benchmark, write ``out`` (JSON) and its PNG, print the table and the bars.

    The JSON is rewritten after every shape; ``resume`` goes on from the shapes
    it already holds (same code, machine and configuration), so a long run can
    be split into several calls.
    Returns the exit status: 0, or 1 if mta.conv_attention failed a correctness check.
    """
    from .plots import plot_conv
    from .provenance import provenance
    from .timing import peak_extra_memory_bytes, require_cuda, time_ms

    device = require_cuda("the conv benchmark")
    torch.manual_seed(0)
    prov, cfg = provenance(), config(quick, warmup, rep, compile_reference)
    done = resumable_results(out, prov, cfg) if resume and out.exists() else []
    if done:
        print(f"resuming from {out}: {len(by_shape(done))} shapes already measured")
    timer = functools.partial(time_ms, warmup=warmup, rep=rep)
    results = run_shapes(conv_shapes(quick), timer=timer, memory=peak_extra_memory_bytes,
                         free_memory=cuda_free_bytes, impls=default_impls(compile_reference), device=device,
                         done=done, after_each=lambda r: write_results(out, prov, cfg, r, complete=False))
    data = write_results(out, prov, cfg, results, complete=True)
    try:
        png = save_png(plot_conv(data), out.with_suffix(".png"))
        wrote = f"wrote {out} and {png}"
    except Exception as exc:  # noqa: BLE001  (the numbers are safe in the JSON; the figure can be redrawn)
        wrote = f"wrote {out}; the figure failed ({describe_error(exc)}), redraw it with mta.bench.plots.plot_conv"

    print(format_table(data["results"]))
    print()
    print(format_bars(data["bars"]))
    print(f"\n{wrote}")
    failed = [r for r in data["results"] if r["impl"] == TESTED_IMPL and not (r.get("check") or {}).get("ok")]
    for r in failed:
        shape = ConvShape(**{k: r[k] for k in SHAPE_KEYS})
        print(f"!!! {TESTED_IMPL} FAILS ITS CHECK at {shape.label()}: {format_check(r.get('check'))}")
    return 1 if failed else 0
