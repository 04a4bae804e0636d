"""Timeline of the first conv_attention forward+backward in a fresh process, empty Triton cache.
argv (optional): dtype d variant, default bf16 64 base (s1: the dK/dV tile with one pipeline stage)."""
import os, sys, tempfile, threading, time, json
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
T0 = time.perf_counter()
import torch
import triton
from triton.compiler import compiler as tc
import mta, mta.launch as ml
from triton.runtime.driver import driver
ev = []
def rec(what, t0):
    ev.append((round(t0 - T0, 3), round(time.perf_counter() - T0, 3), threading.current_thread().name, what))
orig_compile = tc.compile
def compile_(src, *a, **k):
    t = time.perf_counter()
    try:
        return orig_compile(src, *a, **k)
    finally:
        rec("compile " + getattr(getattr(src, "fn", None), "__name__", "?"), t)
tc.compile = compile_
triton.compile = compile_
import triton.compiler as tcp
tcp.compile = compile_
import triton.runtime.jit as tj
if hasattr(tj, "compile"):
    tj.compile = compile_
lc = driver.active.launcher_cls
class Timed(lc):
    def __init__(self, src, md):
        t = time.perf_counter(); super().__init__(src, md); rec("launcher " + str(getattr(src, "name", "")), t)
driver.active.launcher_cls = Timed
orig_ahead = ml.compile_ahead
def ahead(name, *a):
    t = time.perf_counter(); orig_ahead(name, *a); rec("compile_ahead " + name, t)
ml.compile_ahead = ahead
import mta.conv as mc
mc.compile_ahead = ahead
dev = torch.device("cuda")
args = sys.argv[1:] or ['bf16', '64', 'base']
dt = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp32': torch.float32}[args[0]]
D = int(args[1])
if args[2] == 's1':
    from mta import tuning
    for key, t in list(tuning.HOPPER['conv_dkdv'].items()):
        tuning.HOPPER['conv_dkdv'][key] = t[:3] + (1,)
q = torch.randn(1, 8, 1536, D, device=dev, dtype=dt, requires_grad=True)
k = torch.randn(1, 2, 1536, D, device=dev, dtype=dt, requires_grad=True)
v = torch.randn(1, 2, 1536, D, device=dev, dtype=dt, requires_grad=True)
w = (0.2 * torch.randn(8, 6, 11, device=dev)).requires_grad_()
g = torch.randn(1, 8, 1536, D, device=dev, dtype=dt)
(w * 2).backward(torch.ones_like(w)); w.grad = None
torch.cuda.synchronize()
t = time.perf_counter(); T1 = t
o = mta.conv_attention(q, k, v, w, causal=True)
torch.cuda.synchronize(); rec("forward call", t)
t = time.perf_counter()
o.backward(g)
torch.cuda.synchronize(); rec("backward call", t)
print(args, "mode", os.environ.get("MTA_COMPILE_AHEAD", "1"), "first call (fwd+bwd) s", round(time.perf_counter() - T1, 2), "cpus", len(os.sched_getaffinity(0)))
for e in sorted(ev):
    if e[1] >= T1 - T0 - 0.01:
        print(e)
