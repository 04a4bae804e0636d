"""Benchmark of ``mta.conv_attention`` (the fused MTA forward and backward) against what it replaces.

For every shape, on the same fresh random inputs, two passes of six implementations, each with its time and peak
extra memory: the forward (no input requires grad) and the forward+backward (``q, k, v`` and the fp32 weight are
leaves requiring grad, cleared before each call outside the timed region; ``.backward(dout)``, ``dout`` fixed).

* ``mta_conv``: :func:`mta.conv_attention`, the implementation under test;
* ``conv_reference``: :func:`mta.conv_attention_reference`, which materializes several fp32 ``[B, H, N, N]``
  matrices (what MTA costs without a fused kernel), differentiated by autograd, and
  ``conv_reference_compiled``, its ``torch.compile``;
* ``mta_flash``, ``sdpa_flash``, ``sdpa_cudnn``: plain causal attention (:func:`mta.flash_attention`, SDPA
  restricted to its flash or its cuDNN backend), the floor.

The references run per pass only where they fit in memory (:func:`reference_fits`). A skipped pass, an
out-of-memory error, a backend that refuses or a ``torch.compile`` failure is recorded and the run goes on.
Before timing, ``mta_conv``'s output and gradients (dq, dk, dv, dweight) are checked against the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from mta import conv_attention
from mta.reference import conv_attention_reference

from . import flash, harness
from .harness import (Benchmark, Pass, cuda_free_bytes, describe_error, is_oom, ratio, recorded_call, rel_err,
                      release_memory, text_table)
from .plots import plot_conv
from .timing import timing_config

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
IMPLS = ("mta_conv", "mta_flash", "sdpa_flash", "sdpa_cudnn", "conv_reference", "conv_reference_compiled")
#: Implementations that materialize ``[B, H, N, N]``: run only where :func:`reference_fit` says they fit.
REFERENCE_IMPLS = ("conv_reference", "conv_reference_compiled")
#: What is measured for every implementation: the forward, and the forward+backward.
PASSES = (Pass("fwd", "fwd_ms", memory_key="peak_extra_bytes"),
          Pass("fwd_bwd", "fwd_bwd_ms", memory_key="fwd_bwd_peak_extra_bytes", error_key="bwd_error"))

#: Largest accepted ``||mta - reference|| / ||reference||`` per input dtype: of the output ...
TOLERANCE = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-4}
#: ... and of each gradient (against the reference in float64).
GRAD_TOLERANCE = {"bfloat16": 5e-2, "float16": 2e-2, "float32": 1e-3}
GRAD_NAMES = ("dq", "dk", "dv", "dweight")

#: The reference's forward peak is bounded by this many fp32 ``[B, H, N, N]`` matrices alive at once, twice what
#: it holds op by op (scores, padded scores, convolved scores; then scores, masked convolved scores, softmax):
#: 3.06 measured on an H100, 3.3 on the CPU at N=256 (tests/test_bench_conv.py counts them).
REFERENCE_LIVE_MATRICES = 6
#: ... and its forward+backward by this many, twice again: autograd keeps the padded scores (for the weight's
#: gradient) and the softmax, so the forward holds 4 at its softmax, and the softmax's backward 4 again (padded
#: scores, softmax, dP = dO v^T, dC); 4.4 on the CPU at N=256, before the convolution's backward workspace.
REFERENCE_LIVE_MATRICES_BACKWARD = 8
#: ... and it runs only if that bound is at most this fraction of the free GPU memory.
REFERENCE_MAX_FREE_FRACTION = 0.6
#: The gradient check's reference runs in float64: twice the bytes of the fp32 forward+backward.
GRAD_CHECK_MATRICES = 2 * REFERENCE_LIVE_MATRICES_BACKWARD

#: ``impl(q, k, v, weight, causal) -> out``: every timed implementation (plain attention ignores ``weight``).
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


def reference_bytes_estimate(batch: int, heads: int, seq_len: int, matrices: int = REFERENCE_LIVE_MATRICES) -> int:
    """Bound on the reference's peak: ``matrices`` fp32 ``[B, H, N, N]`` matrices (default: its forward's)."""
    return matrices * batch * heads * seq_len * seq_len * 4


def reference_fit(shape: ConvShape, free_bytes: int, matrices: int = REFERENCE_LIVE_MATRICES,
                  what: str = "the reference") -> dict:
    """Whether the materialized reference may run on ``shape`` with ``free_bytes`` of GPU memory free: if its
    estimated peak (``matrices`` fp32 ``[B, H, N, N]`` matrices) is at most :data:`REFERENCE_MAX_FREE_FRACTION`
    of it. ``heads_that_fit``: how many of its heads would (to check a slice of heads where all do not fit)."""
    estimate = reference_bytes_estimate(shape.batch, shape.heads, shape.seq_len, matrices)
    budget = REFERENCE_MAX_FREE_FRACTION * free_bytes
    fits = estimate <= budget
    reason = None if fits else (
        f"not run: {what} needs about {estimate / 2 ** 30:.1f} GiB ({matrices} fp32 [B, H, N, N] matrices), "
        f"more than {REFERENCE_MAX_FREE_FRACTION:.0%} of the {free_bytes / 2 ** 30:.1f} GiB free")
    per_head = reference_bytes_estimate(shape.batch, 1, shape.seq_len, matrices)
    return {"estimate_bytes": estimate, "free_bytes": int(free_bytes), "budget_bytes": int(budget), "fits": fits,
            "heads_that_fit": int(min(shape.heads, budget // per_head)), "reason": reason}


def reference_fits(shape: ConvShape, free_bytes: int) -> dict[str, dict]:
    """:func:`reference_fit` of each pass (``"fwd"``, ``"fwd_bwd"``) and of the gradient check (``"grad"``)."""
    return {"fwd": reference_fit(shape, free_bytes),
            "fwd_bwd": reference_fit(shape, free_bytes, REFERENCE_LIVE_MATRICES_BACKWARD,
                                     "the reference's forward+backward"),
            "grad": reference_fit(shape, free_bytes, GRAD_CHECK_MATRICES, "the float64 reference's forward+backward")}


def mta_conv(q, k, v, weight, causal):
    return conv_attention(q, k, v, weight, causal=causal)


def conv_reference(q, k, v, weight, causal):
    return conv_attention_reference(q, k, v, weight, causal=causal)


class CompiledReference:
    """``torch.compile`` of the reference, compiled afresh (in the timer's warmup) for every new shape: dynamo's
    caches are reset, so each shape gets static-shape graphs of its own, for the forward and for inputs requiring
    grad (no silent fallback to eager once dynamo's recompile limit is reached)."""

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


def ignoring_weight(attention: flash.Attention) -> ConvImpl:
    """Plain attention ``attention(q, k, v, causal)`` (:mod:`mta.bench.flash`) as a ConvImpl: no convolution."""
    def impl(q, k, v, weight, causal):
        return attention(q, k, v, causal)
    impl.__name__ = attention.__name__
    return impl


def sdpa_with(backend_name: str) -> ConvImpl:
    """SDPA restricted to one backend (``"FLASH_ATTENTION"``, ``"CUDNN_ATTENTION"``): plain attention, the floor."""
    return ignoring_weight(flash.sdpa_with(backend_name))


def default_impls(compile_reference: bool = True) -> dict[str, ConvImpl]:
    impls = {"mta_conv": mta_conv, "mta_flash": ignoring_weight(flash.mta_flash),
             "sdpa_flash": sdpa_with("FLASH_ATTENTION"), "sdpa_cudnn": sdpa_with("CUDNN_ATTENTION"),
             "conv_reference": conv_reference}
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


def _on_head_slices(shape: ConvShape, wanted: int, attempt: Callable[[int, int], bool]) -> bool:
    """``attempt(query heads, kv heads)`` on a leading slice of ``wanted`` query heads (:func:`_head_slice`),
    then of half as many, ... until it returns True or no head is left; whether any slice was tried."""
    tried = wanted >= 1
    while wanted >= 1:
        hq, hkv = _head_slice(shape.heads, shape.kv_heads, wanted)
        done = attempt(hq, hkv)
        release_memory()  # once the attempt's frames are gone, so a failed call's tensors can be freed
        if done:
            break
        wanted = hq // 2
    return tried


def _failure(exc: BaseException) -> str:
    return "ran out of memory" if is_oom(exc) else f"raised {describe_error(exc)}"


def check_against_reference(fn: ConvImpl, q, k, v, weight, shape: ConvShape, fit: dict,
                            reference: Callable = conv_attention_reference) -> dict:
    """Relative error of ``fn``'s output against the reference, and whether it passes: with all heads where the
    reference fits (``fit["fits"]``); else, or if that fails (out of memory, or e.g. a conv2d too large for
    cuDNN), against a float32 reference (inputs cast up) on the leading heads, halving them until it runs."""
    check = {"reference": None, "heads_checked": None, "rel_err": None, "tolerance": TOLERANCE[shape.dtype],
             "ok": False, "error": None, "notes": [], "reference_fit": fit}
    out, error = recorded_call(fn, q, k, v, weight, shape.causal)
    if error is not None:
        check["error"] = f"{TESTED_IMPL} raised {error}"
        return check

    def attempt(hq, hkv):
        cast = (lambda t: t) if hq == shape.heads else (lambda t: t.float())
        try:
            ref = reference(cast(q[:, :hq]), cast(k[:, :hkv]), cast(v[:, :hkv]), weight[:hq], causal=shape.causal)
            check.update(rel_err=rel_err(out[:, :hq], ref), heads_checked=hq, reference=(
                f"conv_attention_reference, all heads ({shape.dtype} inputs, fp32 compute)" if hq == shape.heads
                else f"conv_attention_reference on float32 inputs, query heads 0..{hq - 1} of {shape.heads}"))
            return True
        except Exception as exc:  # noqa: BLE001  (try fewer heads)
            check["notes"].append(f"reference on {hq} heads {_failure(exc)}")
            return False

    _on_head_slices(shape, shape.heads if fit["fits"] else fit["heads_that_fit"], attempt)
    if check["rel_err"] is None:
        check["error"] = ("no reference could run, not even on one head: " + "; ".join(check["notes"])
                          if check["notes"] else "no reference fits in memory, not even on one head")
    check["ok"] = check["rel_err"] is not None and check["rel_err"] <= check["tolerance"]
    return check


def _grads(fn: Callable, tensors, dout) -> tuple[torch.Tensor, ...]:
    """Gradients of ``fn(*leaves)`` with respect to leaves holding ``tensors``, for ``dout`` (zeros for a leaf
    the output does not depend on)."""
    leaves = [t.detach().requires_grad_() for t in tensors]
    return torch.autograd.grad(fn(*leaves), leaves, dout, allow_unused=True, materialize_grads=True)


def check_gradients(fn: ConvImpl, q, k, v, weight, dout, shape: ConvShape, fit: dict, check: dict,
                    reference: Callable = conv_attention_reference) -> dict:
    """``check`` (the output's, :func:`check_against_reference`) with ``fn``'s gradients checked too.

    ``grad_rel_err``: the relative errors of dq, dk, dv and dweight against the reference's autograd in float64,
    on the heads the output was checked on, or fewer where the float64 forward+backward does not fit (``fit``) or
    fails, halving as the output's check does. ``fn`` runs on all heads with ``dout`` zero beyond the slice, so
    its dk and dv (sums over a GQA group's query heads) hold exactly the slice's share. ``ok``: the output and
    every gradient within their tolerances.
    """
    check = {**check, "grad_reference": None, "grad_heads_checked": None, "grad_rel_err": None,
             "grad_tolerance": GRAD_TOLERANCE[shape.dtype], "notes": list(check["notes"])}
    error = None

    def attempt(hq, hkv):
        nonlocal error
        try:
            ref = _grads(lambda *t: reference(*t, causal=shape.causal),
                         [t.double() for t in (q[:, :hq], k[:, :hkv], v[:, :hkv], weight[:hq])], dout[:, :hq].double())
        except Exception as exc:  # noqa: BLE001  (try fewer heads)
            check["notes"].append(f"float64 reference's gradients on {hq} heads {_failure(exc)}")
            return False
        masked = dout.clone()
        masked[:, hq:] = 0

        def compare():
            dq, dk, dv, dw = _grads(lambda *t: fn(*t, shape.causal), (q, k, v, weight), masked)
            mine = (dq[:, :hq], dk[:, :hkv], dv[:, :hkv], dw[:hq])
            check.update(grad_rel_err=dict(zip(GRAD_NAMES, map(rel_err, mine, ref))), grad_heads_checked=hq,
                         grad_reference=f"conv_attention_reference's autograd in float64, query heads "
                                        f"0..{hq - 1} of {shape.heads}")
        failed = recorded_call(compare)[1]
        if failed is not None:
            error = f"{TESTED_IMPL} forward+backward raised {failed}"
        return True

    tried = _on_head_slices(shape, min(check["heads_checked"] or shape.heads, fit["heads_that_fit"]), attempt)
    if error is None and check["grad_rel_err"] is None:
        error = (f"no float64 reference for the gradients {'could run' if tried else 'fits in memory'}, "
                 "not even on one head")
    if error is not None:
        check["error"] = "; ".join(filter(None, (check["error"], error)))
    check["ok"] = bool(check["ok"] and check["grad_rel_err"] is not None
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
    name, out = "conv", "figures/bench_conv.json"
    help = ("mta.conv_attention forward and forward+backward vs the materialized reference, torch.compile of it, "
            "mta.flash_attention, SDPA flash and cuDNN")
    description = ("Forward and forward+backward time and peak extra memory of mta.conv_attention (MTA), the "
                   "materialized conv_attention_reference (each pass where it fits in memory), torch.compile of it, "
                   "mta.flash_attention and SDPA's flash and cuDNN backends, causal bf16, after checking "
                   "mta.conv_attention's output and gradients against the reference. Prints a table per pass and "
                   "the headline ratios at N=8192, kernel 6x11.")
    quick_help = "kernel 6x11, N in {2048, 8192}"
    Shape, tested, passes = ConvShape, TESTED_IMPL, PASSES
    shapes, plot = staticmethod(conv_shapes), staticmethod(plot_conv)

    def __init__(self, impls: Optional[dict[str, ConvImpl]] = None, compile_reference: bool = True,
                 free_memory: Callable[[], int] = cuda_free_bytes):
        super().__init__(impls)
        self.compile_reference, self.free_memory = compile_reference, free_memory

    @staticmethod
    def add_args(parser):
        parser.add_argument("--no-compile", dest="compile_reference", action="store_false",
                            help="leave out torch.compile of the reference (it recompiles for every shape)")

    @classmethod
    def from_args(cls, args):
        return cls(compile_reference=args.compile_reference)

    def default_impls(self):
        return default_impls(self.compile_reference)

    def inputs(self, shape, device):
        """``(q, k, v, weight, dout, fits)``: ``dout`` random in the inputs' dtype, :func:`reference_fits` from the
        free memory before the inputs are made."""
        fits = reference_fits(shape, self.free_memory())
        q, k, v, weight = random_inputs(shape, device)
        return q, k, v, weight, torch.randn_like(q), fits

    def check(self, name, fn, shape, inputs):
        q, k, v, weight, dout, fits = inputs
        check = check_against_reference(fn, q, k, v, weight, shape, fits["fwd"])
        return check_gradients(fn, q, k, v, weight, dout, shape, fits["grad"], check)

    def calls(self, fn, shape, inputs):
        q, k, v, weight, dout, _ = inputs
        leaves = [t.detach().requires_grad_() for t in (q, k, v, weight)]  # the inputs' memory, requiring grad

        def clear_grads():
            for t in leaves:
                t.grad = None
        return {"fwd": (lambda: fn(q, k, v, weight, shape.causal), None),
                "fwd_bwd": (lambda: fn(*leaves, shape.causal).backward(dout), clear_grads)}

    def skip(self, impl, shape, inputs):
        """The references' passes that do not fit (each with its reason), or None."""
        if impl not in REFERENCE_IMPLS:
            return None
        fits = inputs[-1]
        return {p.name: fits[p.name]["reason"] for p in PASSES if not fits[p.name]["fits"]} or None

    def summarize(self, results):
        return {"shapes": shape_ratios(results)}

    format_check = staticmethod(format_check)

    def report(self, data):
        return format_table(data["results"]) + "\n\n" + format_headline(data)

    def config(self, quick, warmup, rep):
        return config(quick, warmup, rep, self.compile_reference)


def config(quick: bool, warmup: int, rep: int, compile_reference: bool = True) -> dict:
    shapes = conv_shapes(quick)
    fraction = REFERENCE_MAX_FREE_FRACTION
    return {
        "benchmark": "conv", "quick": quick, "dtype": DTYPE, "causal": CAUSAL,
        "configurations": [dict(zip(CONFIG_KEYS, c)) for c in dict.fromkeys(
            tuple(getattr(s, k) for k in CONFIG_KEYS) for s in shapes)],
        "kernels": [list(k) for k in dict.fromkeys((s.cq, s.ck) for s in shapes)],
        "seq_lens": sorted({s.seq_len for s in shapes}),
        "impls": [n for n in IMPLS if compile_reference or n != "conv_reference_compiled"],
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
                                  f"{REFERENCE_LIVE_MATRICES} (fwd) or {REFERENCE_LIVE_MATRICES_BACKWARD} (fwd_bwd)"},
        "compile": "torch.compile(conv_attention_reference, dynamic=False), dynamo reset before each shape"
                   if compile_reference else None,
        "tolerance": TOLERANCE[DTYPE],
        "grad_tolerance": GRAD_TOLERANCE[DTYPE],
        "grad_check": "dq, dk, dv, dweight of mta.conv_attention against conv_attention_reference's autograd in "
                      "float64, on the heads the output was checked on (fewer where "
                      f"{GRAD_CHECK_MATRICES} fp32-sized [B, 1, N, N] matrices per head do not fit in "
                      f"{fraction} of the free memory)",
    }


# --- ratios and tables -------------------------------------------------------------------------

SHAPE_KEYS = ("dtype", "batch", "heads", "kv_heads", "head_dim", "cq", "ck", "seq_len", "causal")
CONFIG_KEYS = ("batch", "heads", "kv_heads", "head_dim")
#: Each pass's label, and the suffix its ratios' names take (``conv_over_flash_time``, ``..._fwd_bwd_time``).
PASS_NAMES = {"fwd": ("forward", ""), "fwd_bwd": ("forward+backward", "_fwd_bwd")}
#: The ratios of a pass, named with ``{}`` for its suffix: (numerator impl, denominator impl, "time" or "memory").
PASS_RATIOS = {
    "conv_over_flash{}_time": ("mta_conv", "mta_flash", "time"),
    "conv_over_sdpa_flash{}_time": ("mta_conv", "sdpa_flash", "time"),
    "conv_over_sdpa_cudnn{}_time": ("mta_conv", "sdpa_cudnn", "time"),
    "reference_over_conv{}_time": ("conv_reference", "mta_conv", "time"),
    "reference_compiled_over_conv{}_time": ("conv_reference_compiled", "mta_conv", "time"),
    "conv_over_reference{}_memory": ("mta_conv", "conv_reference", "memory"),
    "conv_over_reference_compiled{}_memory": ("mta_conv", "conv_reference_compiled", "memory"),
}
#: name -> (numerator impl, denominator impl, measured key): the ratios reported per shape, for the forward
#: (``conv_over_flash_time``...) and the forward+backward (``conv_over_flash_fwd_bwd_time``...).
RATIOS = {name.format(PASS_NAMES[p.name][1]): (a, b, p.time_key if m == "time" else p.memory_key)
          for p in PASSES for name, (a, b, m) in PASS_RATIOS.items()}
#: The ratios :func:`headline_ratios` reports for each pass, and how :func:`format_headline` shows them:
#: (label, ratio format, format of the two numbers, their scale, their unit).
HEADLINE = {"conv_over_flash{}_time": ("conv/flash time", "{:.2f}x", "{:.3f}", 1.0, "ms"),
            "reference_over_conv{}_time": ("reference/conv time", "{:.1f}x", "{:.3f}", 1.0, "ms"),
            "conv_over_reference{}_memory": ("conv/reference peak memory", "{:.2%}", "{:.1f}", 2.0 ** -20, "MiB")}


def by_shape(results: list[dict]) -> dict[tuple, dict[str, dict]]:
    """``{shape key (SHAPE_KEYS): {impl: record}}`` in the order of the results."""
    return harness.by_shape(results, SHAPE_KEYS)


def _check_ok(records: dict[str, dict]) -> Optional[bool]:
    check = records.get(TESTED_IMPL, {}).get("check")
    return None if check is None else bool(check.get("ok"))


def shape_ratios(results: list[dict]) -> list[dict]:
    """Per shape: its fields, every ratio of :data:`RATIOS` (None where a side is missing), and check_ok."""
    return [{**dict(zip(SHAPE_KEYS, key)), **{name: ratio(records, a, b, m) for name, (a, b, m) in RATIOS.items()},
             "check_ok": _check_ok(records)} for key, records in by_shape(results).items()]


def headline_ratios(data_or_results: Union[dict, list], seq_len: int = 8192,
                    kernel: tuple[int, int] = (6, 11)) -> list[dict]:
    """Per configuration at ``seq_len`` and ``kernel``: the :data:`HEADLINE` ratios of the forward
    (``conv_over_flash_time``...) and of the forward+backward (``conv_over_flash_fwd_bwd_time``...), each with the
    two numbers it is made of (``"<impl>_<key>"``, e.g. ``mta_conv_fwd_ms``). A ratio is None where a side is
    missing (skipped, out of memory, not measured by an older run); ``check_ok``: whether mta_conv passed there."""
    results = data_or_results["results"] if isinstance(data_or_results, dict) else data_or_results
    entries = []
    for key, records in by_shape(results).items():
        shape = dict(zip(SHAPE_KEYS, key))
        if shape["seq_len"] == seq_len and (shape["cq"], shape["ck"]) == tuple(kernel):
            entry = {k: shape[k] for k in (*CONFIG_KEYS, "cq", "ck", "seq_len")}
            entry["check_ok"] = _check_ok(records)
            for name in (name.format(suffix) for _, suffix in PASS_NAMES.values() for name in HEADLINE):
                a, b, m = RATIOS[name]
                entry.update({name: ratio(records, a, b, m), f"{a}_{m}": records.get(a, {}).get(m),
                              f"{b}_{m}": records.get(b, {}).get(m)})
            entries.append(entry)
    return entries


def format_headline(data_or_results: Union[dict, list], seq_len: int = 8192,
                    kernel: tuple[int, int] = (6, 11)) -> str:
    """:func:`headline_ratios` as lines, one per configuration and pass (a pass an older run did not measure
    is left out): each ratio with the two numbers it is made of."""
    lines = [f"at N={seq_len}, kernel {kernel[0]}x{kernel[1]}:"]
    for e in headline_ratios(data_or_results, seq_len, kernel):
        failed = f"; {TESTED_IMPL} FAILED its check" if e["check_ok"] is False else ""
        for pass_label, suffix in PASS_NAMES.values():
            parts, numbers_seen = [], False
            for template, (label, ratio_fmt, number_fmt, scale, unit) in HEADLINE.items():
                name = template.format(suffix)
                a, b, key = RATIOS[name]
                numbers = [e[f"{i}_{key}"] for i in (a, b)]
                numbers_seen = numbers_seen or any(x is not None for x in numbers)
                numbers = " / ".join("?" if x is None else number_fmt.format(x * scale) for x in numbers)
                parts.append(f"{label} {'n/a' if e[name] is None else ratio_fmt.format(e[name])} ({numbers} {unit})")
            if numbers_seen:
                lines.append(f"  B={e['batch']} H={e['heads']} Hkv={e['kv_heads']} D={e['head_dim']}, {pass_label}: "
                             + ", ".join(parts) + failed)
    return "\n".join(lines) if len(lines) > 1 else f"no results at N={seq_len}, kernel {kernel[0]}x{kernel[1]}"


#: Column names in the table, in its order; ``sdpa`` (SDPA's default backend) is in older runs.
SHORT_NAMES = {"mta_conv": "conv", "mta_flash": "flash", "sdpa": "sdpa", "sdpa_flash": "sdpa.fa",
               "sdpa_cudnn": "sdpa.cu", "conv_reference": "ref", "conv_reference_compiled": "ref.c"}
#: Ratio columns of a pass's table: (header, ratio of :data:`PASS_RATIOS`, format).
TABLE_RATIOS = (("conv/flash", "conv_over_flash{}_time", "{:.2f}x"),
                ("ref/conv", "reference_over_conv{}_time", "{:.1f}x"),
                ("ref.c/conv", "reference_compiled_over_conv{}_time", "{:.1f}x"),
                ("mem c/ref", "conv_over_reference{}_memory", "{:.2%}"))


def _max_grad_err(check: dict) -> Optional[float]:
    errors = list((check.get("grad_rel_err") or {}).values())
    return None if not errors or None in errors else max(errors)


#: The check's column in each pass's table: (header, the error shown).
CHECK_COLUMNS = {"fwd": ("rel err", lambda c: c.get("rel_err")), "fwd_bwd": ("grad err", _max_grad_err)}


def _measured(record: Optional[dict], key: str, scale: float = 1.0):
    """A measurement, or why it is missing ("skip", "oom", "err"; None if the implementation did not run)."""
    if record is None or record.get(key) is not None:
        return None if record is None else record[key] * scale
    return {"skipped": "skip", "oom": "oom", "error": "err"}.get(record.get("status"))


def _pass_table(results: list[dict], names: list[str], p: Pass) -> str:
    """One pass's times (ms), peak extra memory (MiB), ratios and the check's error, one row per shape."""
    short = [SHORT_NAMES.get(n, n) for n in names]
    (err_header, err_of), suffix = CHECK_COLUMNS[p.name], PASS_NAMES[p.name][1]
    columns = [("B", "{}"), ("H", "{}"), ("Hkv", "{}"), ("D", "{}"), ("kernel", "{}"), ("N", "{}")]
    columns += [(f"{s} ms", "{:.3f}") for s in short] + [(f"{s} MiB", "{:.1f}") for s in short]
    columns += [(header, fmt) for header, _, fmt in TABLE_RATIOS] + [(err_header, "{:.1e}"), ("", "")]
    ratios = {tuple(r[k] for k in SHAPE_KEYS): r for r in shape_ratios(results)}
    rows = []
    for key, records in by_shape(results).items():
        s, check = dict(zip(SHAPE_KEYS, key)), records.get(TESTED_IMPL, {}).get("check")
        rows.append([s["batch"], s["heads"], s["kv_heads"], s["head_dim"], f"{s['cq']}x{s['ck']}", s["seq_len"]]
                    + [_measured(records.get(n), p.time_key) for n in names]
                    + [_measured(records.get(n), p.memory_key, 2.0 ** -20) for n in names]
                    + [ratios[key][name.format(suffix)] for _, name, _ in TABLE_RATIOS]
                    + [None if check is None else err_of(check),
                       "!" if check is not None and not check.get("ok") else ""])
    return text_table(columns, rows)


def format_table(results: list[dict]) -> str:
    """A table of the forward, and one of the forward+backward where it was measured (not in older runs):
    times (ms), peak extra memory (MiB), the ratios and the check's error, one row per shape."""
    names = [n for n in SHORT_NAMES if any(r["impl"] == n for r in results)]
    names += [n for n in dict.fromkeys(r["impl"] for r in results) if n not in names]
    legend = ("mta.conv_attention (conv) vs mta.flash_attention (flash), SDPA (sdpa.fa, sdpa.cu: its flash and "
              "cuDNN backends), the materialized reference (ref) and its torch.compile (ref.c), causal. skip: the "
              "reference does not fit; ! = check failed")
    text = f"forward. {legend}\n" + _pass_table(results, names, PASSES[0])
    if any(PASSES[1].time_key in r for r in results):
        text += ("\n\nforward+backward (grad err: the largest of dq, dk, dv, dweight's)\n"
                 + _pass_table(results, names, PASSES[1]))
    return text
