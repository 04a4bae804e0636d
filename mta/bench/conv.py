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

The references only run where they fit in memory (:func:`reference_fit`); a
skip, an out-of-memory error or a ``torch.compile`` failure is recorded and the
run goes on. Before timing, ``mta_conv`` is checked against the reference.
What is measured is :data:`PASSES`: the forward only, as ``mta.conv_attention``
has no backward yet (no input requires grad); a forward+backward pass joins by
one more entry there and in :meth:`ConvBenchmark.calls`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F

from mta import conv_attention, flash_attention
from mta.reference import conv_attention_reference

from . import harness
from .harness import Benchmark, Pass, describe_error, is_oom, ratio, rel_err, release_memory, text_table

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
#: What is measured for every implementation.
PASSES = (Pass("fwd", "fwd_ms", memory_key="peak_extra_bytes"),)

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


def reference_fit(shape: ConvShape, free_bytes: int) -> dict:
    """Whether the materialized reference may run on ``shape`` with ``free_bytes`` of GPU memory free.

    It may if its estimated peak is at most :data:`REFERENCE_MAX_FREE_FRACTION`
    of the free memory. ``heads_that_fit``: how many of its heads would (for the
    check on a slice of heads when all do not).
    """
    estimate = reference_bytes_estimate(shape.batch, shape.heads, shape.seq_len)
    budget = REFERENCE_MAX_FREE_FRACTION * free_bytes
    fits = estimate <= budget
    reason = None if fits else (
        f"not run: the reference needs about {estimate / 2 ** 30:.1f} GiB ({REFERENCE_LIVE_MATRICES} fp32 "
        f"[B, H, N, N] matrices), more than {REFERENCE_MAX_FREE_FRACTION:.0%} of the {free_bytes / 2 ** 30:.1f} "
        "GiB free")
    per_head = reference_bytes_estimate(shape.batch, 1, shape.seq_len)
    return {"estimate_bytes": estimate, "free_bytes": int(free_bytes), "budget_bytes": int(budget), "fits": fits,
            "heads_that_fit": int(min(shape.heads, budget // per_head)), "reason": reason}


def cuda_free_bytes() -> int:
    """Free memory of the current CUDA device, after returning PyTorch's cached blocks to it."""
    release_memory()
    return torch.cuda.mem_get_info()[0]


# --- implementations -------------------------------------------------------------------------


def mta_conv(q, k, v, weight, causal):
    return conv_attention(q, k, v, weight, causal=causal)


def conv_reference(q, k, v, weight, causal):
    return conv_attention_reference(q, k, v, weight, causal=causal)


class CompiledReference:
    """``torch.compile`` of the reference, compiled afresh for every new shape.

    Dynamo's caches are reset when the shape changes, so every shape gets a
    static-shape graph of its own (no silent fallback to eager once dynamo's
    recompile limit is reached). Compilation happens in the timer's warmup.
    """

    __name__ = "conv_reference_compiled"

    def __init__(self):
        self._key = self._fn = None

    def __call__(self, q, k, v, weight, causal):
        key = (tuple(q.shape), tuple(k.shape), tuple(weight.shape), q.dtype, q.device, bool(causal))
        if key != self._key:
            import torch._dynamo
            torch._dynamo.reset()
            self._fn, self._key = torch.compile(conv_attention_reference, dynamic=False), key
        return self._fn(q, k, v, weight, causal=causal)


def mta_flash(q, k, v, weight, causal):
    """Plain attention (no convolution) in Triton."""
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


# --- the check -------------------------------------------------------------------------------


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

    With all heads where the reference fits (``fit["fits"]``); else, or if that
    fails (out of memory, or e.g. a conv2d too large for cuDNN), against a
    float32 reference (inputs cast up) on the leading heads, halving their
    number until it runs.
    """
    check = {"reference": None, "heads_checked": None, "rel_err": None, "tolerance": TOLERANCE[shape.dtype],
             "ok": False, "error": None, "notes": [], "reference_fit": fit}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn(q, k, v, weight, shape.causal)
        except Exception as exc:  # noqa: BLE001  (recorded: a failing kernel is a result)
            check["error"] = f"{TESTED_IMPL} raised {describe_error(exc, caught)}"
            out = None
    wanted = shape.heads if fit["fits"] else fit["heads_that_fit"]
    while out is not None and wanted >= 1 and check["rel_err"] is None:
        hq, hkv = _head_slice(shape.heads, shape.kv_heads, wanted)
        cast = (lambda t: t) if wanted == shape.heads else (lambda t: t.float())
        try:
            ref = reference(cast(q[:, :hq]), cast(k[:, :hkv]), cast(v[:, :hkv]), weight[:hq], causal=shape.causal)
            check.update(rel_err=rel_err(out[:, :hq], ref), heads_checked=hq, reference=(
                f"conv_attention_reference, all heads ({shape.dtype} inputs, fp32 compute)" if hq == shape.heads
                else f"conv_attention_reference on float32 inputs, query heads 0..{hq - 1} of {shape.heads}"))
        except Exception as exc:  # noqa: BLE001  (try fewer heads)
            check["notes"].append(f"reference on {hq} heads ran out of memory" if is_oom(exc)
                                  else f"reference on {hq} heads raised {describe_error(exc)}")
        ref = None
        release_memory()  # outside the except block, so a failed call's tensors can be freed
        wanted = hq // 2
    if out is not None and check["rel_err"] is None:
        check["error"] = ("no reference could run, not even on one head: " + "; ".join(check["notes"])
                          if check["notes"] else "no reference fits in memory, not even on one head")
    check["ok"] = check["rel_err"] is not None and check["rel_err"] <= check["tolerance"]
    return check


def format_check(check: Optional[dict]) -> str:
    if check is None:
        return "not checked"
    if check.get("error"):
        return check["error"]
    return (f"rel err {check['rel_err']:.1e} (tol {check['tolerance']:.0e}) vs {check['reference']}"
            + "".join(f"; {n}" for n in check.get("notes") or []))


# --- the benchmark ---------------------------------------------------------------------------


class ConvBenchmark(Benchmark):
    name, out = "conv", "figures/bench_conv.json"
    help = "mta.conv_attention vs the materialized reference, torch.compile of it, mta.flash_attention, SDPA"
    description = ("Forward time and peak extra memory of mta.conv_attention (MTA), the materialized "
                   "conv_attention_reference (where it fits in memory), torch.compile of it, mta.flash_attention "
                   "and SDPA, causal bf16, after checking mta.conv_attention against the reference. Prints a table "
                   "and the headline ratios at N=8192, kernel 6x11.")
    quick_help = "kernel 6x11, N in {2048, 8192}"
    Shape, tested, passes = ConvShape, TESTED_IMPL, PASSES

    def __init__(self, impls: Optional[dict[str, ConvImpl]] = None, compile_reference: bool = True,
                 free_memory: Callable[[], int] = cuda_free_bytes):
        self._impls = default_impls(compile_reference) if impls is None else impls
        self.compile_reference, self.free_memory = compile_reference, free_memory

    @staticmethod
    def add_args(parser):
        parser.add_argument("--no-compile", dest="compile_reference", action="store_false",
                            help="leave out torch.compile of the reference (it recompiles for every shape)")

    @classmethod
    def from_args(cls, args):
        return cls(compile_reference=args.compile_reference)

    def shapes(self, quick):
        return conv_shapes(quick)

    def impls(self):
        return self._impls

    def inputs(self, shape, device):
        """``(q, k, v, weight, reference_fit)``: the fit from the free memory before the inputs are made."""
        fit = reference_fit(shape, self.free_memory())
        return (*random_inputs(shape, device), fit)

    def check(self, fn, shape, inputs):
        return check_against_reference(fn, *inputs[:4], shape, inputs[4])

    def calls(self, fn, shape, inputs):
        q, k, v, weight, _ = inputs
        return {"fwd": (lambda: fn(q, k, v, weight, shape.causal), None)}

    def skip(self, impl, shape, inputs):
        fit = inputs[4]
        return fit["reason"] if impl in REFERENCE_IMPLS and not fit["fits"] else None

    def summarize(self, results):
        return {"shapes": shape_ratios(results)}

    format_check = staticmethod(format_check)

    def report(self, data):
        return format_table(data["results"]) + "\n\n" + format_headline(data)

    def plot(self, data):
        from .plots import plot_conv
        return plot_conv(data)

    def config(self, quick, warmup, rep):
        return config(quick, warmup, rep, self.compile_reference)


def config(quick: bool, warmup: int, rep: int, compile_reference: bool = True) -> dict:
    shapes = conv_shapes(quick)
    return {
        "benchmark": "conv", "quick": quick, "dtype": DTYPE, "causal": CAUSAL,
        "configurations": [dict(zip(CONFIG_KEYS, c)) for c in dict.fromkeys(
            tuple(getattr(s, k) for k in CONFIG_KEYS) for s in shapes)],
        "kernels": [list(k) for k in dict.fromkeys((s.cq, s.ck) for s in shapes)],
        "seq_lens": sorted({s.seq_len for s in shapes}),
        "impls": [n for n in IMPLS if compile_reference or n != "conv_reference_compiled"],
        "tested_impl": TESTED_IMPL,
        "inputs": f"q, k, v: torch.randn in {DTYPE}; weight [H, cq, ck]: torch.randn * {WEIGHT_STD} in float32, "
                  "a different kernel per head; no input requires grad (forward only)",
        "warmup": warmup, "rep": rep,
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
    }


# --- ratios ----------------------------------------------------------------------------------

SHAPE_KEYS = ("dtype", "batch", "heads", "kv_heads", "head_dim", "cq", "ck", "seq_len", "causal")
CONFIG_KEYS = ("batch", "heads", "kv_heads", "head_dim")

#: name -> (numerator impl, denominator impl, measured key): the ratios reported per shape.
RATIOS = {
    "conv_over_flash_time": ("mta_conv", "mta_flash", "fwd_ms"),
    "conv_over_sdpa_time": ("mta_conv", "sdpa", "fwd_ms"),
    "reference_over_conv_time": ("conv_reference", "mta_conv", "fwd_ms"),
    "reference_compiled_over_conv_time": ("conv_reference_compiled", "mta_conv", "fwd_ms"),
    "conv_over_reference_memory": ("mta_conv", "conv_reference", "peak_extra_bytes"),
    "conv_over_reference_compiled_memory": ("mta_conv", "conv_reference_compiled", "peak_extra_bytes"),
}
#: The ratios :func:`headline_ratios` reports, and how :func:`format_headline` shows them:
#: (label, ratio format, format of the two numbers, their scale, their unit).
HEADLINE = {
    "conv_over_flash_time": ("conv/flash time", "{:.2f}x", "{:.3f}", 1.0, "ms"),
    "reference_over_conv_time": ("reference/conv time", "{:.1f}x", "{:.3f}", 1.0, "ms"),
    "conv_over_reference_memory": ("conv/reference peak memory", "{:.2%}", "{:.1f}", 2.0 ** -20, "MiB"),
}


def by_shape(results: list[dict]) -> dict[tuple, dict[str, dict]]:
    """``{shape key (SHAPE_KEYS): {impl: record}}`` in the order of the results."""
    return harness.by_shape(results, SHAPE_KEYS)


def shape_ratios(results: list[dict]) -> list[dict]:
    """Per shape: its fields, every ratio of :data:`RATIOS` (None where a side is missing), and check_ok."""
    rows = []
    for key, records in by_shape(results).items():
        row = dict(zip(SHAPE_KEYS, key))
        row.update({name: ratio(records, a, b, m) for name, (a, b, m) in RATIOS.items()})
        check = records.get(TESTED_IMPL, {}).get("check")
        row["check_ok"] = None if check is None else bool(check.get("ok"))
        rows.append(row)
    return rows


def headline_ratios(data_or_results: Union[dict, list], seq_len: int = 8192,
                    kernel: tuple[int, int] = (6, 11)) -> list[dict]:
    """Per configuration at ``seq_len`` and ``kernel``: conv/flash time, reference/conv time and conv/reference
    peak memory, each with the two numbers it is made of (``"<impl>_<key>"``, e.g. ``mta_conv_fwd_ms``).

    A ratio is None where a side is missing (skipped, out of memory); ``check_ok``
    says whether mta.conv_attention passed its check there.
    """
    results = data_or_results["results"] if isinstance(data_or_results, dict) else data_or_results
    entries = []
    for key, records in by_shape(results).items():
        shape = dict(zip(SHAPE_KEYS, key))
        if shape["seq_len"] == seq_len and (shape["cq"], shape["ck"]) == tuple(kernel):
            check = records.get(TESTED_IMPL, {}).get("check")
            entry = {k: shape[k] for k in (*CONFIG_KEYS, "cq", "ck", "seq_len")}
            entry["check_ok"] = None if check is None else bool(check.get("ok"))
            for name in HEADLINE:
                a, b, m = RATIOS[name]
                entry.update({name: ratio(records, a, b, m), f"{a}_{m}": records.get(a, {}).get(m),
                              f"{b}_{m}": records.get(b, {}).get(m)})
            entries.append(entry)
    return entries


def format_headline(data_or_results: Union[dict, list], seq_len: int = 8192,
                    kernel: tuple[int, int] = (6, 11)) -> str:
    """:func:`headline_ratios` as lines: each ratio with the two numbers it is made of."""
    lines = [f"at N={seq_len}, kernel {kernel[0]}x{kernel[1]}:"]
    for e in headline_ratios(data_or_results, seq_len, kernel):
        parts = []
        for name, (label, ratio_fmt, number_fmt, scale, unit) in HEADLINE.items():
            a, b, key = RATIOS[name]
            numbers = [e[f"{i}_{key}"] for i in (a, b)]
            numbers = " / ".join("?" if x is None else number_fmt.format(x * scale) for x in numbers)
            parts.append(f"{label} {'n/a' if e[name] is None else ratio_fmt.format(e[name])} ({numbers} {unit})")
        failed = f"; {TESTED_IMPL} FAILED its check" if e["check_ok"] is False else ""
        lines.append(f"  B={e['batch']} H={e['heads']} Hkv={e['kv_heads']} D={e['head_dim']}: "
                     + ", ".join(parts) + failed)
    return "\n".join(lines) if len(lines) > 1 else f"no results at N={seq_len}, kernel {kernel[0]}x{kernel[1]}"


SHORT_NAMES = {"mta_conv": "conv", "mta_flash": "flash", "sdpa": "sdpa", "conv_reference": "ref",
               "conv_reference_compiled": "ref.c"}
#: Ratio columns of the table: (header, ratio, format).
TABLE_RATIOS = (("conv/flash", "conv_over_flash_time", "{:.2f}x"), ("ref/conv", "reference_over_conv_time", "{:.1f}x"),
                ("ref.c/conv", "reference_compiled_over_conv_time", "{:.1f}x"),
                ("mem c/ref", "conv_over_reference_memory", "{:.2%}"))


def _measured(record: Optional[dict], key: str, scale: float = 1.0):
    """A measurement, or why it is missing ("skip", "oom", "err"; None if the implementation did not run)."""
    if record is None or record.get(key) is not None:
        return None if record is None else record[key] * scale
    return {"skipped": "skip", "oom": "oom", "error": "err"}.get(record.get("status"))


def format_table(results: list[dict]) -> str:
    """Times (ms), peak extra memory (MiB), the ratios and the check error, one row per shape."""
    names = [n for n in IMPLS if any(r["impl"] == n for r in results)]
    names += [n for n in dict.fromkeys(r["impl"] for r in results) if n not in names]
    short = [SHORT_NAMES.get(n, n) for n in names]
    columns = [("B", "{}"), ("H", "{}"), ("Hkv", "{}"), ("D", "{}"), ("kernel", "{}"), ("N", "{}")]
    columns += [(f"{s} ms", "{:.3f}") for s in short] + [(f"{s} MiB", "{:.1f}") for s in short]
    columns += [(header, fmt) for header, _, fmt in TABLE_RATIOS] + [("rel err", "{:.1e}"), ("", "")]
    ratios = {tuple(r[k] for k in SHAPE_KEYS): r for r in shape_ratios(results)}
    rows = []
    for key, records in by_shape(results).items():
        s, check = dict(zip(SHAPE_KEYS, key)), records.get(TESTED_IMPL, {}).get("check")
        rows.append([s["batch"], s["heads"], s["kv_heads"], s["head_dim"], f"{s['cq']}x{s['ck']}", s["seq_len"]]
                    + [_measured(records.get(n), "fwd_ms") for n in names]
                    + [_measured(records.get(n), "peak_extra_bytes", 2.0 ** -20) for n in names]
                    + [ratios[key][name] for _, name, _ in TABLE_RATIOS]
                    + [None if check is None else check.get("rel_err"),
                       "!" if check is not None and not check.get("ok") else ""])
    return ("mta.conv_attention (conv) vs mta.flash_attention (flash), SDPA, the materialized reference (ref) and "
            "its torch.compile (ref.c); forward, causal. skip: the reference does not fit; ! = check failed\n"
            + text_table(columns, rows))
