# PYTHONPATH=/tmp/t36site [DT=f32 D=128] python notes/h100_remeasure_2026-11-23/fork_compile_offline.py  (from the repository root)
"""Offline (no GPU): compile the MTA backward's kernels for sm_90 three ways (one after another, a thread pool,
forked children that fill the on-disk cache and then a cache-hit compile in the parent) and time each."""
import os, sys, time, tempfile, shutil
from concurrent.futures import ThreadPoolExecutor
sys.argv = ["compile_sm90.py", "flash"]
src = open("tools/compile_sm90.py").read().split("def run_conv_backward")[0]
g = {"__name__": "x", "__file__": "tools/compile_sm90.py"}
exec(compile(src, "tools/compile_sm90.py", "exec"), g)
import torch, triton
dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[os.environ.get("DT", "bf16")]
D = int(os.environ.get("D", "64"))
launches = g["conv_backward_launches"](D, True, 6, 11, dtype)
jobs = []
for name, kernel, args, kw in launches:
    jit = g["jit_of"](kernel)
    sig, constexprs, attrs, options = g["specialize"](jit, args, kw)
    jobs.append((name, g["ASTSource"](jit, sig, constexprs, attrs), options.__dict__))

def fresh_cache():
    d = tempfile.mkdtemp(prefix="tc_")
    os.environ["TRITON_CACHE_DIR"] = d
    triton.knobs.cache.dir = d
    return d

def compile_job(job):
    return triton.compile(job[1], target=g["TARGET"], options=job[2])

def forked(job):
    pid = os.fork()
    if pid == 0:
        try:
            compile_job(job)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    t = time.perf_counter(); k = compile_job(job); return time.perf_counter() - t

mode = os.environ.get("MODE", "all")
for m in ("serial", "threads", "fork"):
    if mode not in ("all", m):
        continue
    fresh_cache()
    t = time.perf_counter()
    if m == "serial":
        for j in jobs: compile_job(j)
    elif m == "threads":
        with ThreadPoolExecutor(len(jobs)) as ex: list(ex.map(compile_job, jobs))
    else:
        # children forked up front from the main thread (no compile running in this process), then cache hits
        pids = []
        for j in jobs:
            pid = os.fork()
            if pid == 0:
                try: compile_job(j)
                finally: os._exit(0)
            pids.append(pid)
        for pid in pids: os.waitpid(pid, 0)
        t2 = time.perf_counter()
        for j in jobs: compile_job(j)
        print("  parent's cache-hit compiles", round(time.perf_counter() - t2, 2), "s")
    print(m, dtype, D, len(jobs), "kernels", round(time.perf_counter() - t, 2), "s", flush=True)
