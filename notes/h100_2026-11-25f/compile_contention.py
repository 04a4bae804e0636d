"""Each kernel of a first conv_attention forward + backward (fp16, d = 128, the startup probe's shape) compiled
alone, one after the other, against all of them side by side in compile_ahead's 16-thread pool; empty Triton
cache each time (argv: solo | pool | pool4). Is the dK/dV compile (the first call's critical path) slowed by the
others running beside it?"""
import os, sys, tempfile, threading, time
mode = sys.argv[1]
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
import torch
import triton
from triton import AsyncCompileMode
from triton.compiler import compiler as tc
import triton.compiler as tcp
import triton.runtime.jit as tj
from concurrent.futures import ThreadPoolExecutor
import mta
import mta.launch as ml
import mta.conv as mc

recorded = []
orig_launch = ml.launch


def record(kernel, grid, *args, **meta):
    if ml.in_dry_run():
        recorded.append((kernel, grid, args, meta))
        return None
    return orig_launch(kernel, grid, *args, **meta)


ml.launch = mc.launch = record
times = {}
orig_compile = tc.compile


def compile_(src, *a, **k):
    t, c = time.perf_counter(), time.thread_time()
    try:
        return orig_compile(src, *a, **k)
    finally:
        name = getattr(getattr(src, "fn", None), "__name__", "?")
        times.setdefault(name, []).append((round(time.perf_counter() - t, 2), round(time.thread_time() - c, 2)))


tc.compile = tcp.compile = triton.compile = compile_
if hasattr(tj, "compile"):
    tj.compile = compile_
dev, D, dt = torch.device("cuda"), 128, torch.float16
q = torch.randn(1, 8, 1536, D, device=dev, dtype=dt, requires_grad=True)
k = torch.randn(1, 2, 1536, D, device=dev, dtype=dt, requires_grad=True)
v = torch.randn(1, 2, 1536, D, device=dev, dtype=dt, requires_grad=True)
w = (0.2 * torch.randn(8, 6, 11, device=dev)).requires_grad_()
from triton.runtime.driver import driver
driver.active.utils  # Triton's driver, outside the timing
mc.compile_conv_ahead(q, k, v, w, True, D ** -0.5)
print(mode, "launches recorded:", [r[0].fn.__name__ for r in recorded], flush=True)
ml.launch = mc.launch = orig_launch
token = ml._DRY_RUN.set(True)
t0 = time.perf_counter()
if mode == "solo":
    for kernel, grid, args, meta in recorded:
        kernel.warmup(*args, grid=grid, **meta)
else:
    pool = ThreadPoolExecutor(max_workers=16 if mode == "pool" else 4)
    with AsyncCompileMode(pool) as m:
        for kernel, grid, args, meta in recorded:
            kernel.warmup(*args, grid=grid, **meta)
        futures = list(m.raw_futures)
    for f in futures:
        f.result()
total = time.perf_counter() - t0
ml._DRY_RUN.reset(token)
print(f"RESULT {mode}: all compiles {total:.2f} s wall; per kernel (wall s, this thread's CPU s):")
for name, t in times.items():
    print(f"   {name:26s} {t}")
