"""Benchmark of ``mta.conv_attention`` (the fused MTA forward and backward) against what it replaces:
:class:`ConvBenchmark`; the ratios and tables that chapter 04 prints from its results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from mta import conv_attention
from mta.reference import conv_attention_reference

from . import flash
from .harness import (Benchmark, Pass, cuda_free_bytes, describe_error, is_oom, measured, ratio, recorded_call,
                      rel_err, release_memory, render_tables, shape_rows)
from .plots import MIB, plot_conv
from .timing import timing_config

DTYPE = "bfloat16"
CAUSAL = True
CONFIGS = ((1, 8, 8, 64), (1, 16, 16, 128))  # (batch, query heads, kv heads, head dim)
KERNELS = ((6, 11), (11, 11))  # (cq, ck): query-axis and key-axis sizes of the convolution kernel
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
QUICK_KERNELS = ((6, 11),)
QUICK_SEQ_LENS = (2048, 8192)
WEIGHT_STD = 0.2  # of the random fp32 convolution weights, one kernel per head

TESTED_IMPL = "mta_conv"
IMPLS = ("mta_conv", "mta_flash", "sdpa_flash", "sdpa_cudnn", "conv_reference", "conv_reference_compiled")
#: Implementations that materialize ``[B, H, N, N]``: each pass runs only where :func:`reference_fits` says so.
REFERENCE_IMPLS = ("conv_reference", "conv_reference_compiled")
PASSES = (Pass("fwd", "fwd_ms", memory_key="peak_extra_bytes"),
          Pass("fwd_bwd", "fwd_bwd_ms", memory_key="fwd_bwd_peak_extra_bytes", error_key="bwd_error"))

#: Largest accepted ``||mta - reference|| / ||reference||`` per input dtype, of the output and of each gradient.
TOLERANCE = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-4}
GRAD_TOLERANCE = {"bfloat16": 5e-2, "float16": 2e-2, "float32": 1e-3}
GRAD_NAMES = ("dq", "dk", "dv", "dweight")

#: Bound on the fp32 ``[B, H, N, N]`` matrices the reference's forward holds at once: twice the 3 it holds op by op
#: (3.06 measured on an H100, 3.3 on the CPU at N=256: tests/test_bench_conv.py counts them).
REFERENCE_LIVE_MATRICES = 6
#: ... and its forward+backward: 4 at the softmax and 4 in its backward (4.4 on the CPU, plus conv workspaces).
REFERENCE_LIVE_MATRICES_BACKWARD = 8
#: ... and it runs only if that bound is at most this fraction of the free GPU memory.
REFERENCE_MAX_FREE_FRACTION = 0.6
#: The gradient check's reference runs in float64: twice the bytes of the fp32 forward+backward.
GRAD_CHECK_MATRICES = 2 * REFERENCE_LIVE_MATRICES_BACKWARD

#: ``impl(q, k, v, weight, causal=...) -> out``: every timed implementation (plain attention ignores ``weight``).
ConvImpl = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class ConvShape:
    """``q [B, H, N, D]``, ``k, v [B, Hkv, N, D]``, ``weight [H, cq, ck]``."""

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
    """Grouped by (configuration, kernel), N increasing."""
    return [ConvShape(DTYPE, b, h, hkv, d, cq, ck, n) for (b, h, hkv, d) in CONFIGS
            for (cq, ck) in (QUICK_KERNELS if quick else KERNELS) for n in (QUICK_SEQ_LENS if quick else SEQ_LENS)]


def reference_bytes_estimate(batch: int, heads: int, seq_len: int, matrices: int = REFERENCE_LIVE_MATRICES) -> int:
    """Bound on the reference's peak: ``matrices`` fp32 ``[B, H, N, N]`` matrices (default: its forward's)."""
    return matrices * batch * heads * seq_len * seq_len * 4


def reference_fit(shape, free_bytes: int, matrices: int = REFERENCE_LIVE_MATRICES, what: str = "the reference") -> dict:
    """Whether ``matrices`` fp32 ``[B, H, N, N]`` take at most :data:`REFERENCE_MAX_FREE_FRACTION` of
    ``free_bytes`` (else ``reason``), and ``heads_that_fit``."""
    estimate = reference_bytes_estimate(shape.batch, shape.heads, shape.seq_len, matrices)
    budget = REFERENCE_MAX_FREE_FRACTION * free_bytes
    reason = None if estimate <= budget else (
        f"not run: {what} needs about {estimate / 2 ** 30:.1f} GiB ({matrices} fp32 [B, H, N, N] matrices), "
        f"more than {REFERENCE_MAX_FREE_FRACTION:.0%} of the {free_bytes / 2 ** 30:.1f} GiB free")
    per_head = reference_bytes_estimate(shape.batch, 1, shape.seq_len, matrices)
    return {"estimate_bytes": estimate, "free_bytes": int(free_bytes), "budget_bytes": int(budget),
            "fits": reason is None, "heads_that_fit": int(min(shape.heads, budget // per_head)), "reason": reason}


def reference_fits(shape: ConvShape, free_bytes: int) -> dict[str, dict]:
    """:func:`reference_fit` of each pass (``"fwd"``, ``"fwd_bwd"``) and of the gradient check (``"grad"``)."""
    return {"fwd": reference_fit(shape, free_bytes),
            "fwd_bwd": reference_fit(shape, free_bytes, REFERENCE_LIVE_MATRICES_BACKWARD,
                                     "the reference's forward+backward"),
            "grad": reference_fit(shape, free_bytes, GRAD_CHECK_MATRICES, "the float64 reference's forward+backward")}


class CompiledReference:
    """``torch.compile`` of the reference, compiled afresh (in the timer's warmup) for every new shape, dynamo's
    caches reset: static-shape graphs per shape, never a silent fallback to eager at dynamo's recompile limit."""

    def __init__(self):
        self._key = self._fn = None

    def __call__(self, q, k, v, weight, causal):
        key = (tuple(q.shape), tuple(k.shape), tuple(weight.shape), q.dtype, q.device, bool(causal))
        if key != self._key:
            import torch._dynamo
            torch._dynamo.reset()
            self._fn, self._key = torch.compile(conv_attention_reference, dynamic=False), key
        return self._fn(q, k, v, weight, causal=causal)


def ignoring_weight(attention: flash.Attention) -> ConvImpl:
    """``attention`` as a ConvImpl (plain attention, ``weight`` ignored), under the same name."""
    def impl(q, k, v, weight, causal):
        return attention(q, k, v, causal=causal)
    impl.__name__ = attention.__name__
    return impl


def default_impls(compile_reference: bool = True) -> dict[str, ConvImpl]:
    impls = {"mta_conv": conv_attention, "mta_flash": ignoring_weight(flash.flash_attention),
             "sdpa_flash": ignoring_weight(flash.sdpa_with("FLASH_ATTENTION")),
             "sdpa_cudnn": ignoring_weight(flash.sdpa_with("CUDNN_ATTENTION")),
             "conv_reference": conv_attention_reference}
    if compile_reference:
        impls["conv_reference_compiled"] = CompiledReference()
    return impls


# --- the check -------------------------------------------------------------------------------

def random_inputs(shape: ConvShape, device) -> tuple[torch.Tensor, ...]:
    """Standard-normal ``q, k, v`` in the shape's dtype; fp32 ``weight ~ N(0, WEIGHT_STD^2)``, per head."""
    dtype = getattr(torch, shape.dtype)
    q = torch.randn(shape.batch, shape.heads, shape.seq_len, shape.head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(shape.batch, shape.kv_heads, shape.seq_len, shape.head_dim, dtype=dtype, device=device)
            for _ in range(2))
    weight = torch.randn(shape.heads, shape.cq, shape.ck, dtype=torch.float32, device=device) * WEIGHT_STD
    return q, k, v, weight


def _on_leading_heads(shape: ConvShape, wanted: int, run: Callable[[int, int], None], what: str,
                      notes: list) -> Optional[str]:
    """``run(query heads, kv heads)`` on the leading ``wanted`` query heads, GQA groups kept whole (fewer than a
    group all read kv head 0); the error where no head fits or it raises (noted: OOM, a conv2d too large for
    cuDNN...), else None."""
    if wanted < 1:
        return f"no {what} fits in memory, not even on one head"
    group = shape.heads // shape.kv_heads
    hq = wanted // group * group if wanted >= group else wanted
    error = None
    try:
        run(hq, max(1, hq // group))
    except Exception as exc:  # noqa: BLE001  (recorded: the check fails, the run goes on)
        why = "ran out of memory" if is_oom(exc) else f"raised {describe_error(exc)}"
        notes.append(f"{what} on {hq} heads {why}")
        error = f"no {what} could run: {notes[-1]}"
    release_memory()  # once the attempt's frames are gone, so a failed call's tensors can be freed
    return error


def _grads(fn: Callable, tensors, dout) -> tuple[torch.Tensor, ...]:
    """Gradients of ``fn(*leaves)`` for ``dout``, leaves holding ``tensors`` (zeros where unused)."""
    leaves = [t.detach().requires_grad_() for t in tensors]
    return torch.autograd.grad(fn(*leaves), leaves, dout, allow_unused=True, materialize_grads=True)


def check_against_reference(fn: ConvImpl, q, k, v, weight, dout, shape: ConvShape, fits: dict,
                            reference: Callable = conv_attention_reference) -> dict:
    """Relative errors of ``fn``'s output and gradients against the reference; ``ok``: each within its tolerance.

    The output: against the reference on all heads where it fits (``fits["fwd"]``), else against a float32
    reference (inputs cast up) on the leading heads that fit. dq, dk, dv, dweight: against the reference's autograd
    in float64 on those heads, fewer where that does not fit (``fits["grad"]``); ``fn`` runs on all heads with
    ``dout`` zero beyond the slice, so its dk and dv (sums over a GQA group's query heads) hold the slice's share."""
    check = {"reference": None, "heads_checked": None, "rel_err": None, "tolerance": TOLERANCE[shape.dtype],
             "ok": False, "error": None, "notes": [], "reference_fit": fits["fwd"], "grad_reference": None,
             "grad_heads_checked": None, "grad_rel_err": None, "grad_tolerance": GRAD_TOLERANCE[shape.dtype]}
    out, error = recorded_call(lambda: fn(q, k, v, weight, causal=shape.causal))
    errors = [None if error is None else f"{TESTED_IMPL} raised {error}"]

    def output(hq, hkv):
        cast = (lambda t: t) if hq == shape.heads else (lambda t: t.float())
        ref = reference(cast(q[:, :hq]), cast(k[:, :hkv]), cast(v[:, :hkv]), weight[:hq], causal=shape.causal)
        check.update(rel_err=rel_err(out[:, :hq], ref), heads_checked=hq, reference=(
            f"conv_attention_reference, all heads ({shape.dtype} inputs, fp32 compute)" if hq == shape.heads
            else f"conv_attention_reference on float32 inputs, query heads 0..{hq - 1} of {shape.heads}"))

    def gradients(hq, hkv):
        ref = _grads(lambda *t: reference(*t, causal=shape.causal),
                     [t.double() for t in (q[:, :hq], k[:, :hkv], v[:, :hkv], weight[:hq])], dout[:, :hq].double())
        masked = dout.clone()
        masked[:, hq:] = 0
        grads, failed = recorded_call(lambda: _grads(lambda *t: fn(*t, causal=shape.causal), (q, k, v, weight), masked))
        if failed is not None:  # fn's failure, not the reference's
            errors.append(f"{TESTED_IMPL} forward+backward raised {failed}")
            return
        mine = (grads[0][:, :hq], grads[1][:, :hkv], grads[2][:, :hkv], grads[3][:hq])
        check.update(grad_rel_err=dict(zip(GRAD_NAMES, map(rel_err, mine, ref))), grad_heads_checked=hq,
                     grad_reference=f"conv_attention_reference's autograd in float64, query heads 0..{hq - 1} of "
                                    f"{shape.heads}")

    if error is None:
        wanted = shape.heads if fits["fwd"]["fits"] else fits["fwd"]["heads_that_fit"]
        errors.append(_on_leading_heads(shape, wanted, output, "reference", check["notes"]))
    wanted = min(check["heads_checked"] or shape.heads, fits["grad"]["heads_that_fit"])
    errors.append(_on_leading_heads(shape, wanted, gradients, "float64 reference for the gradients", check["notes"]))
    check["error"] = "; ".join(filter(None, errors)) or None
    check["ok"] = (check["rel_err"] is not None and check["rel_err"] <= check["tolerance"]
                   and check["grad_rel_err"] is not None
                   and all(e <= check["grad_tolerance"] for e in check["grad_rel_err"].values()))
    return check


def format_check(check: dict) -> str:
    if check.get("error"):
        return check["error"]
    text = f"rel err {check['rel_err']:.1e} (tol {check['tolerance']:.0e}) vs {check['reference']}"
    if check.get("grad_rel_err"):
        grads = ", ".join(f"{name} {e:.1e}" for name, e in check["grad_rel_err"].items())
        text += f"; grad rel err {grads} (tol {check['grad_tolerance']:.0e}) vs {check['grad_reference']}"
    return text + "".join(f"; {n}" for n in check.get("notes") or [])


# --- the benchmark ---------------------------------------------------------------------------

class ConvBenchmark(Benchmark):
    """Forward and forward+backward time and peak extra memory of mta.conv_attention (MTA), the materialized
    conv_attention_reference, torch.compile of it, mta.flash_attention and SDPA's flash and cuDNN backends, causal
    bf16, after checking mta.conv_attention's output and gradients against the reference. Both passes run on the
    same fresh inputs: the forward with no input requiring grad, the forward+backward on leaves requiring grad,
    cleared before each call, untimed. The references run each pass only where it fits in memory; a skip, an OOM
    or a refusing backend is recorded and the run goes on. Prints a table per pass and the headline ratios at
    N=8192, kernel 6x11."""

    name, out = "conv", "figures/bench_conv.json"
    help = ("mta.conv_attention forward and forward+backward vs the materialized reference, torch.compile of it, "
            "mta.flash_attention, SDPA flash and cuDNN")
    quick_help = "kernel 6x11, N in {2048, 8192}"
    options = {"--no-compile": dict(dest="compile_reference", action="store_false",
                                    help="leave out torch.compile of the reference (it recompiles for every shape)")}
    Shape, checked, passes = ConvShape, (TESTED_IMPL,), PASSES
    shapes, plot = staticmethod(conv_shapes), staticmethod(plot_conv)
    format_check = staticmethod(format_check)

    def __init__(self, impls: Optional[dict[str, ConvImpl]] = None, compile_reference: bool = True,
                 free_memory: Callable[[], int] = cuda_free_bytes):
        super().__init__(impls)
        self.compile_reference, self.free_memory = compile_reference, free_memory

    def default_impls(self):
        return default_impls(self.compile_reference)

    def inputs(self, shape, device):
        """``(q, k, v, weight, dout, fits)``, :func:`reference_fits` from the free memory before the inputs."""
        fits = reference_fits(shape, self.free_memory())
        q, k, v, weight = random_inputs(shape, device)
        return q, k, v, weight, torch.randn_like(q), fits

    def check(self, name, fn, shape, inputs):
        q, k, v, weight, dout, fits = inputs
        return check_against_reference(fn, q, k, v, weight, dout, shape, fits)

    def calls(self, fn, shape, inputs):
        leaves = [t.detach().requires_grad_() for t in inputs[:4]]  # the inputs' memory, requiring grad
        return flash.forward_and_backward(fn, inputs[:4], leaves, inputs[4], shape.causal)

    def skip(self, impl, shape, inputs):
        """The references' passes that do not fit, each with its reason."""
        fits = inputs[-1]
        return {p.name: fits[p.name]["reason"] for p in PASSES if impl in REFERENCE_IMPLS and not fits[p.name]["fits"]}

    def summarize(self, results):
        return {"shapes": shape_ratios(results)}

    def report(self, data):
        return f"{format_table(data['results'])}\n\n{format_headline(data)}"

    def config(self, quick, warmup, rep):
        fraction, compiled = REFERENCE_MAX_FREE_FRACTION, self.compile_reference
        return {
            "benchmark": "conv", "quick": quick, "dtype": DTYPE, "causal": CAUSAL,
            "configurations": [dict(zip(CONFIG_KEYS, c)) for c in CONFIGS],
            "kernels": [list(k) for k in (QUICK_KERNELS if quick else KERNELS)],
            "seq_lens": list(QUICK_SEQ_LENS if quick else SEQ_LENS),
            "impls": [n for n in IMPLS if compiled or n != "conv_reference_compiled"],
            "tested_impl": TESTED_IMPL,
            "inputs": f"q, k, v: torch.randn in {DTYPE}; weight [H, cq, ck]: torch.randn * {WEIGHT_STD} in float32, "
                      f"a different kernel per head; dout: torch.randn in {DTYPE}",
            "passes": {"fwd": "the forward; no input requires grad",
                       "fwd_bwd": "the forward and .backward(dout); q, k, v and weight are leaves requiring grad "
                                  "(plain attention ignores weight), their grads cleared before each call, untimed"},
            **timing_config(warmup, rep),
            "memory": "peak_extra_bytes (fwd), fwd_bwd_peak_extra_bytes (fwd_bwd): torch.cuda.max_memory_allocated "
                      "during one call minus memory_allocated before it (inputs excluded, output, gradients and "
                      "temporaries included)",
            "reference_fit": {"live_fp32_matrices": {"fwd": REFERENCE_LIVE_MATRICES,
                                                     "fwd_bwd": REFERENCE_LIVE_MATRICES_BACKWARD},
                              "max_fraction_of_free": fraction,
                              "rule": "each pass of conv_reference and conv_reference_compiled runs only if "
                                      f"M * B * H * N * N * 4 bytes <= {fraction} * free GPU memory, with M = "
                                      f"{REFERENCE_LIVE_MATRICES} (fwd) or {REFERENCE_LIVE_MATRICES_BACKWARD} "
                                      "(fwd_bwd)"},
            "compile": "torch.compile(conv_attention_reference, dynamic=False), dynamo reset before each shape"
                       if compiled else None,
            "tolerance": TOLERANCE[DTYPE],
            "grad_tolerance": GRAD_TOLERANCE[DTYPE],
            "grad_check": "dq, dk, dv, dweight of mta.conv_attention against conv_attention_reference's autograd "
                          "in float64, on the heads the output was checked on (fewer where "
                          f"{GRAD_CHECK_MATRICES} fp32-sized [B, 1, N, N] matrices per head do not fit in "
                          f"{fraction} of the free memory)",
        }


# --- ratios and tables -------------------------------------------------------------------------

SHAPE_KEYS = ("dtype", "batch", "heads", "kv_heads", "head_dim", "cq", "ck", "seq_len", "causal")
CONFIG_KEYS = ("batch", "heads", "kv_heads", "head_dim")
#: Each pass's title, and the suffix its ratios' names take (``conv_over_flash_time``, ``..._fwd_bwd_time``).
PASS_NAMES = {"fwd": ("forward", ""), "fwd_bwd": ("forward+backward", "_fwd_bwd")}
#: ``{name: (numerator impl, denominator impl, measured key)}``, each pass's.
RATIOS = {f"{name}{PASS_NAMES[p.name][1]}_{m}": (a, b, p.time_key if m == "time" else p.memory_key)
          for p in PASSES for name, a, b, m in (
              ("conv_over_flash", "mta_conv", "mta_flash", "time"),
              ("conv_over_sdpa_flash", "mta_conv", "sdpa_flash", "time"),
              ("conv_over_sdpa_cudnn", "mta_conv", "sdpa_cudnn", "time"),
              ("reference_over_conv", "conv_reference", "mta_conv", "time"),
              ("reference_compiled_over_conv", "conv_reference_compiled", "mta_conv", "time"),
              ("conv_over_reference", "mta_conv", "conv_reference", "memory"),
              ("conv_over_reference_compiled", "mta_conv", "conv_reference_compiled", "memory"))}
#: Where the headline is taken: N and the kernel (cq, ck).
HEADLINE_AT = (8192, (6, 11))
SHORT_NAMES = {"mta_conv": "conv", "mta_flash": "flash", "sdpa_flash": "sdpa.fa", "sdpa_cudnn": "sdpa.cu",
               "conv_reference": "ref", "conv_reference_compiled": "ref.c"}
SHAPE_COLUMNS = [("B", "{}", "batch"), ("H", "{}", "heads"), ("Hkv", "{}", "kv_heads"), ("D", "{}", "head_dim"),
                 ("kernel", "{}", lambda row: f"{row['cq']}x{row['ck']}"), ("N", "{}", "seq_len")]


def _rows(data_or_results: Union[dict, list], at: Optional[tuple] = None) -> list[dict]:
    """:func:`shape_rows` of a benchmark's JSON or of its results (only those at ``at``, ``(N, (cq, ck))``, if
    given), each with its :data:`RATIOS` (None where a side is missing) and ``check_ok`` (mta_conv's)."""
    results = data_or_results["results"] if isinstance(data_or_results, dict) else data_or_results
    if at is not None:
        results = [r for r in results if (r["seq_len"], (r["cq"], r["ck"])) == (at[0], tuple(at[1]))]
    rows = shape_rows(results, SHAPE_KEYS)
    for row in rows:
        check = row["records"].get(TESTED_IMPL, {}).get("check")
        row.update({name: ratio(row["records"], *spec) for name, spec in RATIOS.items()},
                   check_ok=None if check is None else bool(check.get("ok")))
    return rows


def shape_ratios(results: list[dict]) -> list[dict]:
    """Per shape: its fields, every ratio of :data:`RATIOS` (None where a side is missing), and check_ok."""
    return [{k: v for k, v in row.items() if k != "records"} for row in _rows(results)]


def _ratio_columns(p: Pass, headline: bool = False) -> list:
    """The ratios the tables of pass ``p`` show: (header, format, name); the headline's leave out ref.c/conv."""
    s = PASS_NAMES[p.name][1]
    return [("conv/flash", "{:.2f}x", f"conv_over_flash{s}_time"),
            ("ref/conv", "{:.1f}x", f"reference_over_conv{s}_time"),
            *([] if headline else [("ref.c/conv", "{:.1f}x", f"reference_compiled_over_conv{s}_time")]),
            ("mem c/ref", "{:.2%}", f"conv_over_reference{s}_memory")]


def headline_ratios(data_or_results: Union[dict, list], seq_len: int = HEADLINE_AT[0],
                    kernel: tuple[int, int] = HEADLINE_AT[1]) -> list[dict]:
    """Per configuration at ``seq_len`` and ``kernel``: the headline's ratios, each with the two numbers it is made
    of (``"<impl>_<key>"``, e.g. ``mta_conv_fwd_ms``), None where a side is missing; ``check_ok``: whether
    mta_conv passed there."""
    entries = []
    for row in _rows(data_or_results, (seq_len, kernel)):
        entry = {k: row[k] for k in (*CONFIG_KEYS, "cq", "ck", "seq_len", "check_ok")}
        for *_, name in (c for p in PASSES for c in _ratio_columns(p, headline=True)):
            a, b, key = RATIOS[name]
            entry.update({name: row[name], f"{a}_{key}": row["records"].get(a, {}).get(key),
                          f"{b}_{key}": row["records"].get(b, {}).get(key)})
        entries.append(entry)
    return entries


def _pass_columns(p: Pass, names: list[str], headline: bool = False) -> list:
    """Times (ms) and peak extra memory (MiB) of ``names`` in pass ``p`` (or why one is missing), the ratios and,
    but in the headline, mta_conv's error: of the output (forward), else the largest of the gradients'."""
    def error(row):
        check = row["records"].get(TESTED_IMPL, {}).get("check") or {}
        errors = [check.get("rel_err")] if p.name == "fwd" else list((check.get("grad_rel_err") or {}).values())
        return None if not errors or None in errors else max(errors)
    columns = [(f"{SHORT_NAMES.get(n, n)} ms", "{:.3f}", measured(n, p.time_key, why=True)) for n in names]
    columns += [(f"{SHORT_NAMES.get(n, n)} MiB", "{:.1f}", measured(n, p.memory_key, MIB, why=True)) for n in names]
    columns += _ratio_columns(p, headline)
    return columns if headline else columns + [("rel err" if p.name == "fwd" else "grad err", "{:.1e}", error)]


def format_table(results: list[dict]) -> str:
    """A table per pass: times, peak extra memory, the ratios and the check's error, one row per shape."""
    present = dict.fromkeys(r["impl"] for r in results)
    names = [n for n in IMPLS if n in present] + [n for n in present if n not in IMPLS]
    legend = ("mta.conv_attention (conv) vs mta.flash_attention (flash), SDPA (sdpa.fa, sdpa.cu: its flash and "
              "cuDNN backends), the materialized reference (ref) and its torch.compile (ref.c), causal. skip: the "
              "reference does not fit; ! = check failed")
    titles = (f"forward. {legend}", "forward+backward (grad err: the largest of dq, dk, dv, dweight's)")
    rows = _rows(results)
    return render_tables([(t, SHAPE_COLUMNS + _pass_columns(p, names), rows) for t, p in zip(titles, PASSES)],
                         [TESTED_IMPL])


def format_headline(data_or_results: Union[dict, list]) -> str:
    """The headline ratios of each pass at :data:`HEADLINE_AT`, with the numbers they are made of."""
    seq_len, (cq, ck) = HEADLINE_AT
    rows = _rows(data_or_results, HEADLINE_AT)
    return render_tables([(f"{PASS_NAMES[p.name][0]} at N={seq_len}, kernel {cq}x{ck}", SHAPE_COLUMNS[:4]
                           + _pass_columns(p, ["mta_conv", "mta_flash", "conv_reference"], headline=True), rows)
                          for p in PASSES], [TESTED_IMPL])
