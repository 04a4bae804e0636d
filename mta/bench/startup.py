"""Benchmark of the wait on the first call of every public kernel function in a fresh process, at a new shape:
:class:`StartupBenchmark`, each call timed by :mod:`mta.bench.startup_probe`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Callable

from . import startup_probe
from .harness import REPO_ROOT, Benchmark, Tools
from .plots import plot_startup
from .startup_probe import BATCH, CASES, DTYPES, HEADS, KV_HEADS, SEQ_LEN

HEAD_DIMS = (64, 128)
QUICK_DTYPES = ("bfloat16", "float32")
QUICK_HEAD_DIMS = (128,)
#: Longest wait for one probe (an empty cache with autotuning compiles many kernels).
PROBE_TIMEOUT_S = 1800
RUNS = ("empty_cache", "warm_cache")


@dataclass(frozen=True)
class StartupShape:
    """``q [batch, heads, seq_len, head_dim]``, ``k, v [batch, kv_heads, seq_len, head_dim]``."""

    case: str
    dtype: str
    head_dim: int
    batch: int = BATCH
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    seq_len: int = SEQ_LEN

    def label(self) -> str:
        return f"{self.case} {self.dtype} d={self.head_dim} N={self.seq_len}"


def startup_shapes(quick: bool = False) -> list[StartupShape]:
    dtypes, head_dims = (QUICK_DTYPES, QUICK_HEAD_DIMS) if quick else (DTYPES, HEAD_DIMS)
    return [StartupShape(case.name, dtype, d) for case in CASES for dtype in dtypes for d in head_dims]


def _tail(text, lines: int = 20) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:])


def run_probe(shape: StartupShape, cache_dir, timeout: float = PROBE_TIMEOUT_S) -> dict:
    """One probe in a fresh Python process with ``TRITON_CACHE_DIR=cache_dir``: its JSON line and the process's
    wall time, or ``error`` and ``stderr_tail`` if it fails."""
    cmd = [sys.executable, startup_probe.__file__, shape.case, shape.dtype, str(shape.head_dim),
           "--seq-len", str(shape.seq_len), "--batch", str(shape.batch), "--heads", str(shape.heads),
           "--kv-heads", str(shape.kv_heads)]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache_dir)}
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timed out after {timeout} s", "stderr_tail": _tail(exc.stderr)}
    result, error = {"process_s": time.perf_counter() - start}, f"the probe exited with status {done.returncode}"
    try:
        if done.returncode == 0:
            return {**result, **json.loads(done.stdout.strip().splitlines()[-1])}
    except (IndexError, ValueError):
        error = "the probe printed no JSON line"
    return {**result, "error": error, "stderr_tail": _tail(done.stderr)}


def startup_check(runs: dict[str, dict]) -> dict:
    """ok: every run returned a result with a finite output; error: what went wrong and the stderr's last lines."""
    problems = []
    for which, r in runs.items():
        if r.get("error"):
            problems.append(f"{which}: {r['error']}: " + " | ".join(_tail(r.get("stderr_tail"), 3).splitlines()))
        elif r.get("finite") is False:
            problems.append(f"{which}: the output is not finite")
    return {"ok": not problems, "error": "; ".join(problems) or None}


class StartupBenchmark(Benchmark):
    """Seconds a user waits on the first call of mta.flash_attention (forward; forward+backward),
    mta.conv_attention (forward; forward+backward), mta.decode_attention and mta.conv_decode_attention (one decode
    step) in a fresh Python process at a new shape (B=1, Hq=8, Hkv=2, N=1536): per (case, dtype, head dim), a
    process with TRITON_CACHE_DIR a new empty directory (every kernel compiles, and autotunes where the package
    does), then one with the same directory (kernels load from disk); the environment is otherwise the user's. A
    failed probe is a result: its stderr tail is recorded and printed."""

    name, out = "startup", "figures/bench_startup.json"
    help = "wall time of the first call of every public kernel function in a fresh process"
    quick_help = "bf16 and fp32, d=128"
    exit_1 = "a probe failed or gave a non-finite output"
    timed = False
    Shape, shapes, plot = StartupShape, staticmethod(startup_shapes), staticmethod(plot_startup)

    def __init__(self, runner: Callable[[StartupShape, str], dict] = run_probe):
        self.runner = runner

    def config(self, quick, warmup, rep):
        return {"benchmark": "startup", "quick": quick, "cases": {c.name: c.label for c in CASES},
                "dtypes": list(QUICK_DTYPES if quick else DTYPES),
                "head_dims": list(QUICK_HEAD_DIMS if quick else HEAD_DIMS),
                "shape": {"batch": BATCH, "heads": HEADS, "kv_heads": KV_HEADS, "seq_len": SEQ_LEN},
                "inputs": "q, k, v, dout: torch.randn; weight [Hq, 6, 11]: 0.2 * torch.randn in float32; causal",
                "runs": "each a fresh `python mta/bench/startup_probe.py`; empty_cache: TRITON_CACHE_DIR a new "
                        "empty directory, warm_cache: the same directory again; the environment otherwise as given",
                "timing": "time.perf_counter around the call and torch.cuda.synchronize; first_call_s is the first "
                          "call in the process, second_call_s the next one; cases with a backward run one trivial "
                          "backward first (torch's one-time autograd imports, torch_first_backward_s), outside "
                          "first_call_s",
                "MTA_AUTOTUNE": os.environ.get("MTA_AUTOTUNE")}

    def measure_shape(self, shape: StartupShape, tools: Tools) -> list[dict]:
        """One record: both runs, empty cache first, in one new temporary cache directory."""
        with tempfile.TemporaryDirectory(prefix="mta-triton-cache-") as cache:
            runs = {which: self.runner(shape, cache) for which in RUNS}
        check = startup_check(runs)
        if not check["ok"]:
            tools.warn(self.failure(None, shape, check))
        return [{**asdict(shape), **runs, "check": check}]

    def tables(self, data):
        """Seconds per (case, dtype, head dim): imports and second call (of the warm run, else the empty one), and
        the first call with an empty and with a warm cache."""
        def imported(r):
            return r["warm_cache"] if "import_mta_s" in r["warm_cache"] else r["empty_cache"]
        columns = [("case", "", "case"), ("dtype", "", "dtype"), ("d", "{}", "head_dim"),
                   ("import", "{:.2f}", lambda r: imported(r)["import_torch_s"] + imported(r)["import_mta_s"]
                    if "import_mta_s" in imported(r) else None),
                   ("first call, empty", "{:.3f}", lambda r: r["empty_cache"].get("first_call_s")),
                   ("first call, warm", "{:.3f}", lambda r: r["warm_cache"].get("first_call_s")),
                   ("second call", "{:.4f}", lambda r: imported(r).get("second_call_s"))]
        return [("seconds (! = a probe failed)", columns, data["results"])]
