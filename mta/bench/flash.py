"""Benchmark of ``mta.flash_attention`` against PyTorch SDPA's flash and cuDNN backends: :class:`FlashBenchmark`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from mta import flash_attention

from .harness import (Benchmark, Pass, describe_error, measured, median_ratios, ratio, recorded_call, rel_err,
                      shape_rows)
from .plots import plot_flash
from .timing import timing_config

TOTAL_TOKENS = 16384
MODEL_DIM = 2048
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
QUICK_SEQ_LENS = (2048, 8192)
QUICK_DTYPES = ("bfloat16",)

TESTED_IMPL = "mta"
BASELINES = ("sdpa_flash", "sdpa_cudnn")
#: The summary: per (dtype, head dim, causal), the median over N >= 2048 (shorter is launch-bound) of mta's
#: TFLOPS over a baseline's (``fwd_vs_sdpa_flash``...).
GROUP_KEYS = ("dtype", "head_dim", "causal")
RATIOS = {f"{p}_vs_{b}": (TESTED_IMPL, b, f"{p}_tflops") for b in BASELINES for p in ("fwd", "bwd")}
SUMMARY_MIN_SEQ_LEN = 2048

#: Largest accepted ``||mta - sdpa|| / ||sdpa||`` per dtype: for the output, and for each of dq, dk, dv.
OUT_TOLERANCE = {"bfloat16": 2e-2, "float16": 1e-2}
GRAD_TOLERANCE = {"bfloat16": 5e-2, "float16": 2e-2}

#: ``impl(q, k, v, causal=...) -> out``: the form every timed implementation takes.
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]
#: The reference for the correctness check: the first SDPA backend that runs forward and backward.
REFERENCE_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


@dataclass(frozen=True)
class FlashShape:
    """``q, k, v [batch, heads, seq_len, head_dim]``."""

    dtype: str
    head_dim: int
    causal: bool
    seq_len: int
    batch: int
    heads: int

    def label(self) -> str:
        return (f"{self.dtype} d={self.head_dim} {'causal' if self.causal else 'full'} "
                f"N={self.seq_len} B={self.batch} H={self.heads}")


def flash_shapes(quick: bool = False) -> list[FlashShape]:
    """Grouped by (dtype, head dim, causal), N increasing; the same tokens and model width at every point."""
    return [FlashShape(dtype, d, causal, n, batch=TOTAL_TOKENS // n, heads=MODEL_DIM // d)
            for dtype in (QUICK_DTYPES if quick else DTYPES) for d in HEAD_DIMS for causal in (False, True)
            for n in (QUICK_SEQ_LENS if quick else SEQ_LENS)]


def forward_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool) -> float:
    """``4 B H N^2 D``: two matmuls (``q k^T`` and ``P v``) of ``2 N^2 D`` each; half when causal."""
    flops = 4.0 * batch * heads * seq_len ** 2 * head_dim
    return flops / 2 if causal else flops


def backward_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool) -> float:
    """2.5x the forward: five matmuls (dv, dp, dq, dk, and recomputing s) instead of two."""
    return 2.5 * forward_flops(batch, heads, seq_len, head_dim, causal)


def tflops(flops: float, ms: Optional[float]) -> Optional[float]:
    """Throughput in TFLOP/s (or TB/s of bytes), None when there is no (positive) time."""
    return flops / (ms * 1e-3) / 1e12 if ms is not None and ms > 0 else None


def sdpa_with(backend_name: str) -> Attention:
    """SDPA restricted to one backend, named like ``"sdpa_flash"`` (GQA where k and v have fewer heads than q); a
    backend that refuses raises. Its ``is_causal`` masks top-left aligned: with Nq == Nk that is mta's mask."""
    def sdpa(q, k, v, causal):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
    sdpa.__name__ = "sdpa_" + backend_name.lower().removesuffix("_attention")
    return sdpa


def default_impls() -> dict[str, Attention]:
    return {TESTED_IMPL: flash_attention, "sdpa_flash": sdpa_with("FLASH_ATTENTION"),
            "sdpa_cudnn": sdpa_with("CUDNN_ATTENTION")}


def check_against_reference(fn: Attention, q, k, v, dout, causal: bool, dtype: str) -> dict:
    """Relative errors of ``fn``'s output and of dq, dk, dv against the first SDPA backend that runs, and whether
    they pass."""
    tolerance = {"out": OUT_TOLERANCE[dtype], "grad": GRAD_TOLERANCE[dtype]}
    check = {"reference": None, "out_rel_err": None, "grad_rel_err": None, "tolerance": tolerance,
             "ok": False, "error": None}
    failures = []
    for backend in REFERENCE_BACKENDS:
        sdpa = sdpa_with(backend)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a refusing backend warns before it raises
                ref_out = sdpa(q, k, v, causal=causal)
                ref_grads = torch.autograd.grad(ref_out, (q, k, v), dout)
            check["reference"] = sdpa.__name__
            break
        except Exception as exc:  # noqa: BLE001  (any refusal: try the next backend)
            failures.append(f"{backend}: {describe_error(exc)}")
    else:
        check["error"] = "no SDPA backend could compute the reference: " + "; ".join(failures)
        return check

    def run():
        out = fn(q, k, v, causal=causal)
        check["out_rel_err"] = rel_err(out, ref_out)
        return torch.autograd.grad(out, (q, k, v), dout)
    grads, check["error"] = recorded_call(run)
    if check["error"] is None:
        check["grad_rel_err"] = {name: rel_err(g, ref) for name, g, ref in zip(("dq", "dk", "dv"), grads, ref_grads)}
        check["ok"] = (check["out_rel_err"] <= tolerance["out"]
                       and all(e <= tolerance["grad"] for e in check["grad_rel_err"].values()))
    return check


def forward_and_backward(fn: Callable, args: tuple, leaves: tuple, dout, causal: bool) -> dict:
    """The calls of the two passes: ``fn(*args)``, and ``fn(*leaves).backward(dout)`` with the leaves' gradients
    cleared before each call (untimed)."""
    def clear_grads():
        for t in leaves:
            t.grad = None
    return {"fwd": (lambda: fn(*args, causal=causal), None),
            "fwd_bwd": (lambda: fn(*leaves, causal=causal).backward(dout), clear_grads)}


class FlashBenchmark(Benchmark):
    """Forward and backward TFLOPS of mta.flash_attention, SDPA's flash backend and SDPA's cuDNN backend, after
    checking mta's output and gradients against SDPA. Per shape, every implementation runs the forward and the
    forward+backward on the same fresh inputs (the backward's time is their difference, so the forward runs on
    inputs requiring grad, as in training). As in the FlashAttention-2 paper, the work per token is fixed: 16384
    tokens (batch 16384 // N), model width 2048 (2048 // d heads)."""

    name, out = "flash", "figures/bench_flash.json"
    help = "mta.flash_attention vs SDPA flash and cuDNN backends"
    quick_help = "bf16, N in {2048, 8192}"
    Shape, checked = FlashShape, (TESTED_IMPL,)
    passes = (Pass("fwd", "fwd_ms"), Pass("fwd_bwd", "fwd_bwd_ms", error_key="bwd_error"))
    shapes, default_impls = staticmethod(flash_shapes), staticmethod(default_impls)

    def inputs(self, shape, device):
        """Fresh standard-normal ``q, k, v`` (requiring grad) and ``dout``."""
        dims = (shape.batch, shape.heads, shape.seq_len, shape.head_dim)
        dtype = DTYPES[shape.dtype]
        q, k, v = (torch.randn(dims, dtype=dtype, device=device).requires_grad_() for _ in range(3))
        return q, k, v, torch.randn(dims, dtype=dtype, device=device)

    def check(self, name, fn, shape, inputs):
        return check_against_reference(fn, *inputs, shape.causal, shape.dtype)

    def calls(self, fn, shape, inputs):
        return forward_and_backward(fn, inputs[:3], inputs[:3], inputs[3], shape.causal)

    def finish(self, r):
        size = (r["batch"], r["heads"], r["seq_len"], r["head_dim"], r["causal"])
        r["fwd_flops"], r["bwd_flops"] = forward_flops(*size), backward_flops(*size)
        r["bwd_ms"] = r["fwd_bwd_ms"] - r["fwd_ms"] if r["fwd_bwd_ms"] is not None else None
        r["fwd_tflops"] = tflops(r["fwd_flops"], r["fwd_ms"])
        r["bwd_tflops"] = tflops(r["bwd_flops"], r["bwd_ms"])
        r["fwd_bwd_tflops"] = tflops(r["fwd_flops"] + r["bwd_flops"], r["fwd_bwd_ms"])

    @staticmethod
    def format_check(check):
        if check["error"]:
            return check["error"]
        grads = ", ".join(f"{k}={v:.1e}" for k, v in (check["grad_rel_err"] or {}).items())
        return (f"out rel err {check['out_rel_err']:.1e} (tol {check['tolerance']['out']:.0e}); "
                f"grad rel err {grads} (tol {check['tolerance']['grad']:.0e}) vs {check['reference']}")

    def summarize(self, results):
        return {"summary": median_ratios(results, GROUP_KEYS, RATIOS, SUMMARY_MIN_SEQ_LEN)}

    def config(self, quick, warmup, rep):
        return {
            "benchmark": "flash", "quick": quick, "dtypes": sorted(QUICK_DTYPES if quick else DTYPES),
            "head_dims": list(HEAD_DIMS), "causal": [False, True],
            "seq_lens": list(QUICK_SEQ_LENS if quick else SEQ_LENS), "total_tokens": TOTAL_TOKENS,
            "model_dim": MODEL_DIM, "impls": [TESTED_IMPL, *BASELINES],
            **timing_config(warmup, rep, "forward timed with inputs requiring grad; bwd_ms = fwd_bwd_ms - fwd_ms"),
            "flops": "fwd = 4 B H N^2 D, halved when causal; bwd = 2.5 fwd",
            "tolerance": {"out": OUT_TOLERANCE, "grad": GRAD_TOLERANCE},
        }

    def tables(self, data):
        """TFLOPS fwd/bwd per shape and implementation with mta's ratios to the baselines; the summary's medians."""
        groups = [("dtype", "", "dtype"), ("d", "{}", "head_dim"), ("causal", "", "causal")]
        columns = groups + [("N", "{}", "seq_len")]
        columns += [(f"{n} {p}", "{:.1f}", measured(n, f"{p}_tflops")) for n in (TESTED_IMPL, *BASELINES)
                    for p in ("fwd", "bwd")]
        columns += [(f"mta/{b.removeprefix('sdpa_')} {p}", "{:.2f}",
                     lambda row, spec=RATIOS[f"{p}_vs_{b}"]: ratio(row["records"], *spec))
                    for b in BASELINES for p in ("fwd", "bwd")]
        return [("TFLOPS (! = mta failed its correctness check)", columns,
                 shape_rows(data["results"], (*GROUP_KEYS, "seq_len"))),
                (f"median mta/baseline TFLOPS ratio over N >= {SUMMARY_MIN_SEQ_LEN} (> 1: mta is faster)",
                 groups + [(name, "{:.2f}", name) for name in RATIOS], data["summary"])]

    def plot(self, data):
        return plot_flash(data, dtype=data["results"][0]["dtype"])
