"""Benchmark of ``mta.conv_attention`` (the fused MTA forward and backward) against what it replaces:
:class:`ConvBenchmark`; the ratios and tables that chapter 04 prints from its results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from mta import conv_attention
from mta.reference import conv_attention_reference

from . import flash
from .harness import (Benchmark, Pass, cuda_free_bytes, describe_error, is_oom, measured, ratio, ratio_of,
                      recorded_call, rel_err, release_memory, render_tables, shape_rows)
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
    def impl(q, k, v, weight, causal):
        return attention(q, k, v, causal=causal)
    impl.__name__ = attention.__name__
    return impl


def sdpa_with(backend_name: str) -> ConvImpl:
    """SDPA restricted to one backend (``"FLASH_ATTENTION"``, ``"CUDNN_ATTENTION"``) as a ConvImpl, no conv."""
    return ignoring_weight(flash.sdpa_with(backend_name))


def default_impls(compile_reference: bool = True) -> dict[str, ConvImpl]:
    impls = {"mta_conv": conv_attention, "mta_flash": ignoring_weight(flash.flash_attention),
             "sdpa_flash": sdpa_with("FLASH_ATTENTION"), "sdpa_cudnn": sdpa_with("CUDNN_ATTENTION"),
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


def _head_slice(heads: int, kv_heads: int, wanted: int) -> tuple[int, int]:
    """``(query heads, kv heads)`` of a leading slice of at most ``wanted`` query heads, GQA groups kept whole."""
    group = heads // kv_heads
    if wanted >= group:
        q_heads = (wanted // group) * group
        return q_heads, q_heads // group
    return wanted, 1  # part of the first group: every one of these query heads reads kv head 0


def _on_head_slices(shape: ConvShape, wanted: int, attempt: Callable[[int, int], None], notes: list, what: str):
    """``attempt(query heads, kv heads)`` on a leading slice of ``wanted`` heads; where it raises (noted as
    ``what``'s failure), on half as many..., until it runs or no head is left."""
    while wanted >= 1:
        hq, hkv = _head_slice(shape.heads, shape.kv_heads, wanted)
        try:
            attempt(hq, hkv)
            wanted = 0  # it ran: done
        except Exception as exc:  # noqa: BLE001  (try fewer heads)
            why = "ran out of memory" if is_oom(exc) else f"raised {describe_error(exc)}"
            notes.append(f"{what} on {hq} heads {why}")
            wanted = hq // 2
        release_memory()  # once the attempt's frames are gone, so a failed call's tensors can be freed


def check_against_reference(fn: ConvImpl, q, k, v, weight, shape: ConvShape, fit: dict,
                            reference: Callable = conv_attention_reference) -> dict:
    """Relative error of ``fn``'s output against the reference, and whether it passes: all heads where it fits
    (``fit``); else, or if that fails (OOM, a conv2d too large for cuDNN), a float32 reference (inputs cast up)
    on the leading heads, halving them until it runs."""
    check = {"reference": None, "heads_checked": None, "rel_err": None, "tolerance": TOLERANCE[shape.dtype],
             "ok": False, "error": None, "notes": [], "reference_fit": fit}
    out, error = recorded_call(lambda: fn(q, k, v, weight, causal=shape.causal))
    if error is not None:
        check["error"] = f"{TESTED_IMPL} raised {error}"
        return check

    def attempt(hq, hkv):
        cast = (lambda t: t) if hq == shape.heads else (lambda t: t.float())
        ref = reference(cast(q[:, :hq]), cast(k[:, :hkv]), cast(v[:, :hkv]), weight[:hq], causal=shape.causal)
        check.update(rel_err=rel_err(out[:, :hq], ref), heads_checked=hq, reference=(
            f"conv_attention_reference, all heads ({shape.dtype} inputs, fp32 compute)" if hq == shape.heads
            else f"conv_attention_reference on float32 inputs, query heads 0..{hq - 1} of {shape.heads}"))

    _on_head_slices(shape, shape.heads if fit["fits"] else fit["heads_that_fit"], attempt, check["notes"],
                    "reference")
    if check["rel_err"] is None:
        check["error"] = ("no reference could run, not even on one head: " + "; ".join(check["notes"])
                          if check["notes"] else "no reference fits in memory, not even on one head")
    check["ok"] = check["rel_err"] is not None and check["rel_err"] <= check["tolerance"]
    return check


def _grads(fn: Callable, tensors, dout) -> tuple[torch.Tensor, ...]:
    """Gradients of ``fn(*leaves)`` for ``dout``, leaves holding ``tensors`` (zeros where unused)."""
    leaves = [t.detach().requires_grad_() for t in tensors]
    return torch.autograd.grad(fn(*leaves), leaves, dout, allow_unused=True, materialize_grads=True)


def check_gradients(fn: ConvImpl, q, k, v, weight, dout, shape: ConvShape, fit: dict, check: dict,
                    reference: Callable = conv_attention_reference) -> dict:
    """``check`` (the output's) with ``grad_rel_err``: dq, dk, dv, dweight against the reference's autograd in
    float64, on the heads the output was checked on, halved while the float64 run does not fit (``fit``) or fails.
    ``fn`` runs on all heads with ``dout`` zero beyond the slice, so its dk and dv (sums over a GQA group's query
    heads) hold exactly the slice's share. ``ok``: the output and every gradient within tolerance."""
    check = {**check, "grad_reference": None, "grad_heads_checked": None, "grad_rel_err": None,
             "grad_tolerance": GRAD_TOLERANCE[shape.dtype], "notes": list(check["notes"])}
    error = None

    def attempt(hq, hkv):
        nonlocal error
        ref = _grads(lambda *t: reference(*t, causal=shape.causal),
                     [t.double() for t in (q[:, :hq], k[:, :hkv], v[:, :hkv], weight[:hq])], dout[:, :hq].double())
        masked = dout.clone()
        masked[:, hq:] = 0

        def compare():
            dq, dk, dv, dw = _grads(lambda *t: fn(*t, causal=shape.causal), (q, k, v, weight), masked)
            mine = (dq[:, :hq], dk[:, :hkv], dv[:, :hkv], dw[:hq])
            check.update(grad_rel_err=dict(zip(GRAD_NAMES, map(rel_err, mine, ref))), grad_heads_checked=hq,
                         grad_reference=f"conv_attention_reference's autograd in float64, query heads "
                                        f"0..{hq - 1} of {shape.heads}")
        failed = recorded_call(compare)[1]  # a failure of fn is the check's error, not a reason to try fewer heads
        if failed is not None:
            error = f"{TESTED_IMPL} forward+backward raised {failed}"

    wanted = min(check["heads_checked"] or shape.heads, fit["heads_that_fit"])
    _on_head_slices(shape, wanted, attempt, check["notes"], "float64 reference's gradients")
    if error is None and check["grad_rel_err"] is None:
        error = (f"no float64 reference for the gradients {'could run' if wanted >= 1 else 'fits in memory'}, "
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
        check = check_against_reference(fn, q, k, v, weight, shape, fits["fwd"])
        return check_gradients(fn, q, k, v, weight, dout, shape, fits["grad"], check)

    def calls(self, fn, shape, inputs):
        leaves = [t.detach().requires_grad_() for t in inputs[:4]]  # the inputs' memory, requiring grad
        return flash.forward_and_backward(fn, inputs[:4], leaves, inputs[4], shape.causal)

    def skip(self, impl, shape, inputs):
        """The references' passes that do not fit, each with its reason."""
        fits = inputs[-1]
        if impl not in REFERENCE_IMPLS:
            return {}
        return {p.name: fits[p.name]["reason"] for p in PASSES if not fits[p.name]["fits"]}

    def summarize(self, results):
        return {"shapes": shape_ratios(results)}

    def tables(self, data):
        return pass_tables(data["results"]) + headline_tables(data)

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
#: Each pass's label, and the suffix its ratios' names take (``conv_over_flash_time``, ``..._fwd_bwd_time``).
PASS_NAMES = {"fwd": ("forward", ""), "fwd_bwd": ("forward+backward", "_fwd_bwd")}
#: The ratios of a pass, ``{}`` for its suffix: numerator impl, denominator impl, "time" or "memory", and where a
#: pass's table shows it, its column (header, format).
PASS_RATIOS = {
    "conv_over_flash{}_time": ("mta_conv", "mta_flash", "time", ("conv/flash", "{:.2f}x")),
    "conv_over_sdpa_flash{}_time": ("mta_conv", "sdpa_flash", "time", None),
    "conv_over_sdpa_cudnn{}_time": ("mta_conv", "sdpa_cudnn", "time", None),
    "reference_over_conv{}_time": ("conv_reference", "mta_conv", "time", ("ref/conv", "{:.1f}x")),
    "reference_compiled_over_conv{}_time": ("conv_reference_compiled", "mta_conv", "time", ("ref.c/conv", "{:.1f}x")),
    "conv_over_reference{}_memory": ("mta_conv", "conv_reference", "memory", ("mem c/ref", "{:.2%}")),
    "conv_over_reference_compiled{}_memory": ("mta_conv", "conv_reference_compiled", "memory", None),
}
#: name -> (numerator impl, denominator impl, measured key), for both passes.
RATIOS = {name.format(PASS_NAMES[p.name][1]): (a, b, p.time_key if m == "time" else p.memory_key)
          for p in PASSES for name, (a, b, m, _) in PASS_RATIOS.items()}
#: The ratios the headline reports, of both passes.
HEADLINE = [name.format(suffix) for _, suffix in PASS_NAMES.values()
            for name in ("conv_over_flash{}_time", "reference_over_conv{}_time", "conv_over_reference{}_memory")]
#: Where the headline is taken: N and the kernel (cq, ck).
HEADLINE_AT = (8192, (6, 11))


def _check_ok(records: dict[str, dict]) -> Optional[bool]:
    check = records.get(TESTED_IMPL, {}).get("check")
    return None if check is None else bool(check.get("ok"))


def _at(data_or_results: Union[dict, list], seq_len: int, kernel: tuple[int, int]) -> list[dict]:
    """The records at ``seq_len`` and ``kernel``, of a benchmark's JSON or of its results."""
    results = data_or_results["results"] if isinstance(data_or_results, dict) else data_or_results
    return [r for r in results if r["seq_len"] == seq_len and (r["cq"], r["ck"]) == tuple(kernel)]


def shape_ratios(results: list[dict]) -> list[dict]:
    """Per shape: its fields, every ratio of :data:`RATIOS` (None where a side is missing), and check_ok."""
    return [{**{k: row[k] for k in SHAPE_KEYS}, **{name: ratio(row["records"], a, b, m) for name, (a, b, m) in
             RATIOS.items()}, "check_ok": _check_ok(row["records"])} for row in shape_rows(results, SHAPE_KEYS)]


def headline_ratios(data_or_results: Union[dict, list], seq_len: int = HEADLINE_AT[0],
                    kernel: tuple[int, int] = HEADLINE_AT[1]) -> list[dict]:
    """Per configuration at ``seq_len`` and ``kernel``: the :data:`HEADLINE` ratios, each with the two numbers it
    is made of (``"<impl>_<key>"``, e.g. ``mta_conv_fwd_ms``), None where a side is missing; ``check_ok``: whether
    mta_conv passed there."""
    entries = []
    for row in shape_rows(_at(data_or_results, seq_len, kernel), SHAPE_KEYS):
        records = row["records"]
        entry = {**{k: row[k] for k in (*CONFIG_KEYS, "cq", "ck", "seq_len")}, "check_ok": _check_ok(records)}
        for name in HEADLINE:
            a, b, m = RATIOS[name]
            entry.update({name: ratio(records, a, b, m), f"{a}_{m}": records.get(a, {}).get(m),
                          f"{b}_{m}": records.get(b, {}).get(m)})
        entries.append(entry)
    return entries


SHORT_NAMES = {"mta_conv": "conv", "mta_flash": "flash", "sdpa_flash": "sdpa.fa", "sdpa_cudnn": "sdpa.cu",
               "conv_reference": "ref", "conv_reference_compiled": "ref.c"}
SHAPE_COLUMNS = [("B", "{}", "batch"), ("H", "{}", "heads"), ("Hkv", "{}", "kv_heads"), ("D", "{}", "head_dim"),
                 ("kernel", "{}", lambda row: f"{row['cq']}x{row['ck']}"), ("N", "{}", "seq_len")]


def _pass_columns(p: Pass, names: list[str], headline: bool = False) -> list:
    """Times (ms) and peak extra memory (MiB) of ``names`` in pass ``p`` (or why one is missing), the ratios the
    tables show (of :data:`HEADLINE` only for the headline) and, but in the headline, the check's error."""
    suffix = PASS_NAMES[p.name][1]
    columns = [(f"{SHORT_NAMES.get(n, n)} ms", "{:.3f}", measured(n, p.time_key, why=True)) for n in names]
    columns += [(f"{SHORT_NAMES.get(n, n)} MiB", "{:.1f}", measured(n, p.memory_key, MIB, why=True)) for n in names]
    columns += [(*column, ratio_of(*RATIOS[name.format(suffix)])) for name, (*_, column) in PASS_RATIOS.items()
                if column and (not headline or name.format(suffix) in HEADLINE)]
    if not headline:
        columns.append(("rel err" if p.name == "fwd" else "grad err", "{:.1e}", lambda row: _check_error(row, p)))
    return columns


def _check_error(row: dict, p: Pass) -> Optional[float]:
    """mta_conv's error at the row's shape: of the output (forward), else the largest of the gradients'."""
    check = row["records"].get(TESTED_IMPL, {}).get("check") or {}
    if p.name == "fwd":
        return check.get("rel_err")
    errors = list((check.get("grad_rel_err") or {}).values())
    return None if not errors or None in errors else max(errors)


def pass_tables(results: list[dict]) -> list[tuple]:
    """A table per pass: times, peak extra memory, the ratios and the check's error, one row per shape."""
    present = dict.fromkeys(r["impl"] for r in results)
    names = [n for n in IMPLS if n in present] + [n for n in present if n not in IMPLS]
    legend = ("mta.conv_attention (conv) vs mta.flash_attention (flash), SDPA (sdpa.fa, sdpa.cu: its flash and "
              "cuDNN backends), the materialized reference (ref) and its torch.compile (ref.c), causal. skip: the "
              "reference does not fit; ! = check failed")
    rows = shape_rows(results, SHAPE_KEYS)
    return [(f"forward. {legend}", SHAPE_COLUMNS + _pass_columns(PASSES[0], names), rows),
            ("forward+backward (grad err: the largest of dq, dk, dv, dweight's)",
             SHAPE_COLUMNS + _pass_columns(PASSES[1], names), rows)]


def headline_tables(data_or_results: Union[dict, list]) -> list[tuple]:
    """The headline ratios of each pass at :data:`HEADLINE_AT`, with the numbers they are made of."""
    seq_len, (cq, ck) = HEADLINE_AT
    rows = shape_rows(_at(data_or_results, *HEADLINE_AT), SHAPE_KEYS)
    return [(f"{PASS_NAMES[p.name][0]} at N={seq_len}, kernel {cq}x{ck}",
             SHAPE_COLUMNS[:4] + _pass_columns(p, ["mta_conv", "mta_flash", "conv_reference"], headline=True), rows)
            for p in PASSES]


def format_table(results: list[dict]) -> str:
    """:func:`pass_tables` as text."""
    return render_tables(pass_tables(results), [TESTED_IMPL])


def format_headline(data_or_results: Union[dict, list]) -> str:
    """:func:`headline_tables` as text."""
    return render_tables(headline_tables(data_or_results), [TESTED_IMPL])
