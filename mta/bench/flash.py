"""Benchmark of ``mta.flash_attention`` against PyTorch SDPA's flash and cuDNN backends.

For every shape, in one run, the forward and forward+backward times of each
implementation are measured on the same fresh random inputs; backward time is
their difference. Before timing, ``mta.flash_attention``'s output and
gradients are checked against SDPA: a fast wrong kernel is worth nothing, so
a mismatch is recorded in the JSON, printed loudly and makes the command
exit with status 1.

The forward is timed with inputs that require grad (the forward of a
training step, which may save extra state for the backward), because the
backward time is derived from it.

Shapes keep the work per token fixed: 16384 tokens in total (batch
``16384 // N``) and model width 2048 (``2048 // d`` heads), as in the
FlashAttention-2 paper's benchmarks.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch
import torch.nn.functional as F

TOTAL_TOKENS = 16384
MODEL_DIM = 2048
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
QUICK_SEQ_LENS = (2048, 8192)
QUICK_DTYPES = ("bfloat16",)

#: The implementation under test; the others are baselines it is compared with.
TESTED_IMPL = "mta"
BASELINES = ("sdpa_flash", "sdpa_cudnn")
#: Ratios are summarized over these sequence lengths (short ones are launch-bound).
SUMMARY_MIN_SEQ_LEN = 2048

#: Largest accepted ``||mta - sdpa|| / ||sdpa||`` per dtype: for the output, and for each of dq, dk, dv.
OUT_TOLERANCE = {"bfloat16": 2e-2, "float16": 1e-2}
GRAD_TOLERANCE = {"bfloat16": 5e-2, "float16": 2e-2}

#: ``impl(q, k, v, causal) -> out``: the form every timed implementation takes.
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


@dataclass(frozen=True)
class FlashShape:
    """One benchmarked problem: ``q, k, v [batch, heads, seq_len, head_dim]``, ``Hq == Hkv``."""

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
    """All benchmarked shapes, grouped by (dtype, head dim, causal), N increasing.

    ``batch = TOTAL_TOKENS // N`` and ``heads = MODEL_DIM // d``: the same
    tokens and model width at every point, so only the attention pattern changes.
    """
    dtypes = QUICK_DTYPES if quick else tuple(DTYPES)
    seq_lens = QUICK_SEQ_LENS if quick else SEQ_LENS
    return [FlashShape(dtype, d, causal, n, batch=TOTAL_TOKENS // n, heads=MODEL_DIM // d)
            for dtype in dtypes for d in HEAD_DIMS for causal in (False, True) for n in seq_lens]


def forward_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool) -> float:
    """``4 B H N^2 D``: two matmuls (``q k^T`` and ``P v``) of ``2 N^2 D`` each; half when causal."""
    flops = 4.0 * batch * heads * seq_len ** 2 * head_dim
    return flops / 2 if causal else flops


def backward_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool) -> float:
    """2.5x the forward: five matmuls (dv, dp, dq, dk, and recomputing s) instead of two."""
    return 2.5 * forward_flops(batch, heads, seq_len, head_dim, causal)


def tflops(flops: float, ms: Optional[float]) -> Optional[float]:
    """Throughput in TFLOP/s, None when there is no (positive) time."""
    if ms is None or not ms > 0:
        return None
    return flops / (ms * 1e-3) / 1e12


# --- implementations -------------------------------------------------------------------------


def mta_flash(q, k, v, causal):
    """``mta.flash_attention``, imported on first use so that this module imports without it."""
    from mta.flash import flash_attention
    return flash_attention(q, k, v, causal=causal)


def sdpa_with(backend_name: str) -> Attention:
    """SDPA restricted to one backend, e.g. ``"FLASH_ATTENTION"`` or ``"CUDNN_ATTENTION"``.

    ``is_causal`` in SDPA masks top-left aligned; here Nq == Nk, where that
    equals the bottom-right alignment of ``mta``.
    """
    def sdpa(q, k, v, causal):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    sdpa.__name__ = sdpa_name(backend_name)
    return sdpa


def sdpa_name(backend_name: str) -> str:
    """``"FLASH_ATTENTION"`` -> ``"sdpa_flash"``, the name used in results."""
    return "sdpa_" + backend_name.lower().removesuffix("_attention")


def default_impls() -> dict[str, Attention]:
    return {
        TESTED_IMPL: mta_flash,
        "sdpa_flash": sdpa_with("FLASH_ATTENTION"),
        "sdpa_cudnn": sdpa_with("CUDNN_ATTENTION"),
    }


#: The reference for the correctness check: the first SDPA backend that runs forward and backward.
REFERENCE_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


# --- measuring -------------------------------------------------------------------------------


def describe_error(exc: BaseException, caught: Iterable[warnings.WarningMessage] = ()) -> str:
    """One line: the exception and the warnings raised with it (SDPA says there why a backend refused)."""
    lines = [f"{type(exc).__name__}: {str(exc).strip()}"] + [str(w.message).strip() for w in caught]
    return " | ".join(" ".join(line.split()) for line in lines)[:600]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref|| / ||ref||`` in fp32 on the tensors' device; inf if x is not finite."""
    x, ref = x.detach().float(), ref.detach().float()
    if not torch.isfinite(x).all():
        return math.inf
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _forward_backward(fn: Attention, q, k, v, dout, causal):
    out = fn(q, k, v, causal)
    return out, torch.autograd.grad(out, (q, k, v), dout)


def reference_output(q, k, v, dout, causal):
    """``(backend name, out, (dq, dk, dv))`` from the first SDPA backend that runs."""
    failures = []
    for backend in REFERENCE_BACKENDS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a refusing backend warns before it raises
                out, grads = _forward_backward(sdpa_with(backend), q, k, v, dout, causal)
            return sdpa_name(backend), out, grads
        except Exception as exc:  # noqa: BLE001  (any refusal: try the next backend)
            failures.append(f"{backend}: {describe_error(exc)}")
    raise RuntimeError("no SDPA backend could compute the reference: " + "; ".join(failures))


def check_against_reference(fn: Attention, q, k, v, dout, causal: bool, dtype: str) -> dict:
    """Relative errors of ``fn``'s output and gradients against SDPA, and whether they pass."""
    tolerance = {"out": OUT_TOLERANCE[dtype], "grad": GRAD_TOLERANCE[dtype]}
    check = {"reference": None, "out_rel_err": None, "grad_rel_err": None, "tolerance": tolerance,
             "ok": False, "error": None}
    try:
        check["reference"], ref_out, ref_grads = reference_output(q, k, v, dout, causal)
    except RuntimeError as exc:
        check["error"] = str(exc)
        return check
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn(q, k, v, causal)
            check["out_rel_err"] = rel_err(out, ref_out)
            grads = torch.autograd.grad(out, (q, k, v), dout)
            check["grad_rel_err"] = {name: rel_err(g, ref) for name, g, ref in zip(("dq", "dk", "dv"), grads, ref_grads)}
        except Exception as exc:  # noqa: BLE001  (recorded: a failing kernel is a result)
            check["error"] = describe_error(exc, caught)
            return check
    check["ok"] = (check["out_rel_err"] <= tolerance["out"]
                   and all(e <= tolerance["grad"] for e in check["grad_rel_err"].values()))
    return check


def _free_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure(fn: Attention, q, k, v, dout, causal: bool, timer) -> dict:
    """Forward and forward+backward times of one implementation, or the error that stopped them."""
    timing = {"fwd_ms": None, "fwd_bwd_ms": None, "bwd_ms": None, "error": None, "bwd_error": None}

    def clear_grads():
        q.grad = k.grad = v.grad = None

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            timing["fwd_ms"] = timer(lambda: fn(q, k, v, causal))
        except Exception as exc:  # noqa: BLE001  (an unavailable backend is recorded, not fatal)
            timing["error"] = describe_error(exc, caught)
            _free_cuda_cache()
            return timing
        already_seen = len(caught)  # the forward's warnings say nothing about the backward
        try:
            timing["fwd_bwd_ms"] = timer(lambda: fn(q, k, v, causal).backward(dout), before_each=clear_grads)
        except Exception as exc:  # noqa: BLE001
            timing["bwd_error"] = describe_error(exc, caught[already_seen:])
            _free_cuda_cache()
        finally:
            clear_grads()
    if timing["fwd_bwd_ms"] is not None:
        timing["bwd_ms"] = timing["fwd_bwd_ms"] - timing["fwd_ms"]
    return timing


def random_inputs(shape: FlashShape, device) -> tuple[torch.Tensor, ...]:
    """Fresh standard-normal ``q, k, v`` (requiring grad) and ``dout``."""
    dims = (shape.batch, shape.heads, shape.seq_len, shape.head_dim)
    dtype = DTYPES[shape.dtype]
    q, k, v = (torch.randn(dims, dtype=dtype, device=device).requires_grad_() for _ in range(3))
    return q, k, v, torch.randn(dims, dtype=dtype, device=device)


def benchmark_shape(shape: FlashShape, impls: dict[str, Attention], timer, device,
                    warn: Callable[[str], None] = print) -> list[dict]:
    """One record per implementation for ``shape``; the tested one carries the correctness check.

    A failed check is passed to ``warn`` at once, before anything is timed.
    """
    q, k, v, dout = random_inputs(shape, device)
    size = (shape.batch, shape.heads, shape.seq_len, shape.head_dim, shape.causal)
    base = {**asdict(shape), "fwd_flops": forward_flops(*size), "bwd_flops": backward_flops(*size)}
    # Checked before anything is timed, so a wrong kernel is reported even if timing then crashes.
    check = (check_against_reference(impls[TESTED_IMPL], q, k, v, dout, shape.causal, shape.dtype)
             if TESTED_IMPL in impls else None)
    if check is not None and not check["ok"]:
        warn(f"!!! {TESTED_IMPL} FAILS ITS CHECK at {shape.label()}: {format_check(check)}")
    records = []
    for name, fn in impls.items():
        record = {"impl": name, **base, **measure(fn, q, k, v, dout, shape.causal, timer)}
        record["fwd_tflops"] = tflops(base["fwd_flops"], record["fwd_ms"])
        record["bwd_tflops"] = tflops(base["bwd_flops"], record["bwd_ms"])
        record["fwd_bwd_tflops"] = tflops(base["fwd_flops"] + base["bwd_flops"], record["fwd_bwd_ms"])
        if name == TESTED_IMPL:
            record["check"] = check
        records.append(record)
    return records


def run_shapes(shapes: list[FlashShape], *, timer, impls: Optional[dict[str, Attention]] = None,
               device="cuda", progress: bool = True) -> list[dict]:
    """Benchmark every shape, with a progress bar; a failed check is printed as soon as it is known."""
    from tqdm.auto import tqdm

    impls = default_impls() if impls is None else impls
    results = []
    bar = tqdm(shapes, desc="flash", unit="shape", disable=not progress)
    for shape in bar:
        bar.set_postfix_str(shape.label())
        results.extend(benchmark_shape(shape, impls, timer, device, warn=tqdm.write))
    return results


# --- reporting -------------------------------------------------------------------------------


def format_check(check: dict) -> str:
    if check["error"]:
        return check["error"]
    grads = ", ".join(f"{k}={v:.1e}" for k, v in (check["grad_rel_err"] or {}).items())
    return (f"out rel err {check['out_rel_err']:.1e} (tol {check['tolerance']['out']:.0e}); "
            f"grad rel err {grads} (tol {check['tolerance']['grad']:.0e}) vs {check['reference']}")


def _by_shape(results: list[dict]) -> dict[tuple, dict[str, dict]]:
    """``{(dtype, head_dim, causal, seq_len): {impl: record}}`` in the order of the results."""
    table: dict[tuple, dict[str, dict]] = {}
    for r in results:
        table.setdefault((r["dtype"], r["head_dim"], r["causal"], r["seq_len"]), {})[r["impl"]] = r
    return table


def _ratio(records: dict[str, dict], other: str, key: str) -> Optional[float]:
    mine, theirs = records.get(TESTED_IMPL, {}).get(key), records.get(other, {}).get(key)
    return mine / theirs if mine and theirs else None


def median_ratios(results: list[dict], min_seq_len: int = SUMMARY_MIN_SEQ_LEN) -> list[dict]:
    """Per (dtype, head dim, causal): the median over N >= ``min_seq_len`` of mta's TFLOPS / a baseline's."""
    groups: dict[tuple, list[dict[str, dict]]] = {}
    for (dtype, d, causal, n), records in _by_shape(results).items():
        if n >= min_seq_len:
            groups.setdefault((dtype, d, causal), []).append(records)
    summary = []
    for (dtype, d, causal), rows in groups.items():
        entry = {"dtype": dtype, "head_dim": d, "causal": causal, "min_seq_len": min_seq_len}
        for other in BASELINES:
            for key in ("fwd", "bwd"):
                ratios = [r for r in (_ratio(row, other, f"{key}_tflops") for row in rows) if r is not None]
                entry[f"{key}_vs_{other}"] = statistics.median(ratios) if ratios else None
        summary.append(entry)
    return summary


def _cell(x: Optional[float], fmt: str) -> str:
    """``x`` formatted, or a dash as wide as ``fmt`` (e.g. ``"7.1f"``) for a missing value."""
    return "-".rjust(int(fmt.split(".")[0])) if x is None else format(x, fmt)


def format_table(results: list[dict]) -> str:
    """TFLOPS fwd/bwd per shape and implementation, and mta's ratios to the baselines."""
    names = [TESTED_IMPL, *BASELINES]
    head = (f"{'dtype':<8} {'d':>3} {'causal':<6} {'N':>5} | "
            + " | ".join(f"{n:>15}" for n in names) + " | "
            + " | ".join(f"{TESTED_IMPL + '/' + b.removeprefix('sdpa_'):>13}" for b in BASELINES))
    sub = (f"{'':<8} {'':>3} {'':<6} {'':>5} | " + " | ".join(f"{'fwd':>7} {'bwd':>7}" for _ in names) + " | "
           + " | ".join(f"{'fwd':>6} {'bwd':>6}" for _ in BASELINES))
    lines = ["TFLOPS (! = mta failed its correctness check)", head, sub, "-" * len(head)]
    for (dtype, d, causal, n), records in _by_shape(results).items():
        cells = []
        for name in names:
            r = records.get(name, {})
            cells.append(f"{_cell(r.get('fwd_tflops'), '7.1f')} {_cell(r.get('bwd_tflops'), '7.1f')}")
        ratios = [f"{_cell(_ratio(records, b, 'fwd_tflops'), '6.2f')} {_cell(_ratio(records, b, 'bwd_tflops'), '6.2f')}"
                  for b in BASELINES]
        failed = "check" in records.get(TESTED_IMPL, {}) and not records[TESTED_IMPL]["check"]["ok"]
        lines.append(f"{dtype:<8} {d:>3} {str(causal):<6} {n:>5} | " + " | ".join(cells) + " | "
                     + " | ".join(ratios) + (" !" if failed else ""))
    return "\n".join(lines)


def format_summary(summary: list[dict]) -> str:
    lines = [f"median mta/baseline TFLOPS ratio over N >= {SUMMARY_MIN_SEQ_LEN} (> 1: mta is faster)",
             f"{'dtype':<8} {'d':>3} {'causal':<6} | " + " | ".join(f"{'vs ' + b:>17}" for b in BASELINES),
             f"{'':<8} {'':>3} {'':<6} | " + " | ".join(f"{'fwd':>8} {'bwd':>8}" for _ in BASELINES)]
    for s in summary:
        lines.append(f"{s['dtype']:<8} {s['head_dim']:>3} {str(s['causal']):<6} | " + " | ".join(
            f"{_cell(s[f'fwd_vs_{b}'], '8.2f')} {_cell(s[f'bwd_vs_{b}'], '8.2f')}" for b in BASELINES))
    return "\n".join(lines)


def json_safe(x):
    """``x`` with non-finite floats replaced by None, so the JSON stays standard."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def config(quick: bool, warmup: int, rep: int) -> dict:
    shapes = flash_shapes(quick)
    return {
        "benchmark": "flash",
        "quick": quick,
        "dtypes": sorted({s.dtype for s in shapes}),
        "head_dims": sorted({s.head_dim for s in shapes}),
        "causal": [False, True],
        "seq_lens": sorted({s.seq_len for s in shapes}),
        "total_tokens": TOTAL_TOKENS,
        "model_dim": MODEL_DIM,
        "impls": [TESTED_IMPL, *BASELINES],
        "warmup": warmup,
        "rep": rep,
        "timing": "median over rep of per-call CUDA event times; 256 MB L2 flush and a ~1 ms GPU spin "
                  "(so launch overhead is not timed) before each call; "
                  "forward timed with inputs requiring grad; bwd_ms = fwd_bwd_ms - fwd_ms",
        "flops": "fwd = 4 B H N^2 D, halved when causal; bwd = 2.5 fwd",
        "tolerance": {"out": OUT_TOLERANCE, "grad": GRAD_TOLERANCE},
    }


def run(*, quick: bool = False, out: Path, warmup: int = 10, rep: int = 30) -> int:
    """The ``flash`` command: benchmark, write ``out`` (JSON) and its PNG, print the tables.

    Returns the exit status: 0, or 1 if mta failed a correctness check.
    """
    from .plots import plot_flash
    from .provenance import provenance
    from .timing import require_cuda, time_ms

    device = require_cuda("the flash benchmark")
    torch.manual_seed(0)
    data = {"provenance": provenance(), "config": config(quick, warmup, rep)}
    timer = functools.partial(time_ms, warmup=warmup, rep=rep)
    data["results"] = run_shapes(flash_shapes(quick), timer=timer, device=device)
    data["summary"] = median_ratios(data["results"])
    data = json_safe(data)

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    png = save_png(plot_flash(data, dtype=data["config"]["dtypes"][0]), out.with_suffix(".png"))

    print(format_table(data["results"]))
    print()
    print(format_summary(data["summary"]))
    print(f"\nwrote {out} and {png}")
    failed = [r for r in data["results"] if "check" in r and not r["check"]["ok"]]
    for r in failed:
        print(f"!!! {TESTED_IMPL} FAILS ITS CHECK at {r['dtype']} d={r['head_dim']} causal={r['causal']} "
              f"N={r['seq_len']}: {format_check(r['check'])}")
    return 1 if failed else 0


def save_png(fig, path: Path) -> Path:
    """Write ``fig`` as mta.figures does (no timestamp metadata, so reruns diff cleanly), then close it."""
    import matplotlib.pyplot as plt

    from mta.figures import FIGURES_DIR, save_figure

    try:
        if path.parent.resolve() == FIGURES_DIR.resolve():
            return save_figure(fig, path.name)
        fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
        return path
    finally:
        plt.close(fig)
