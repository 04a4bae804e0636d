"""Timeline of the first conv_attention forward + backward in a fresh process with an empty Triton cache, as the
startup probe sees it (Triton's driver is not touched before the call).

argv: dtype d variant.  variant: base (compiles queued in launch order), first (mta.launch.LONGEST_COMPILES
queued first), warm / firstwarm (the same, with Triton's one-time costs started in a thread right after
`import mta`: triton_key() and the driver's cuda_utils module)."""
import os, sys, tempfile, threading, time
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
T0 = time.perf_counter()
import torch
import triton
from triton.compiler import compiler as tc
import triton.backends.nvidia.driver as nd
import mta, mta.launch as ml, mta.conv as mc
dt_name, D, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ml.COMPILE_LONGEST_FIRST = variant in ("first", "firstwarm")
ev = []


def rec(what, t0):
    ev.append((round(t0 - T0, 3), round(time.perf_counter() - T0, 3), threading.current_thread().name, what))


if variant in ("warm", "firstwarm"):
    def warm():
        t = time.perf_counter()
        from triton.compiler.compiler import triton_key
        triton_key()
        rec("warm triton_key", t)
        t = time.perf_counter()
        from triton.runtime.driver import driver
        driver.active.utils
        rec("warm driver", t)
    threading.Thread(target=warm, name="warm", daemon=True).start()
orig_compile = tc.compile


def compile_(src, *a, **k):
    t = time.perf_counter()
    try:
        return orig_compile(src, *a, **k)
    finally:
        rec("compile " + getattr(getattr(src, "fn", None), "__name__", "?"), t)


import triton.compiler as tcp
import triton.runtime.jit as tj
tc.compile = tcp.compile = triton.compile = compile_
if hasattr(tj, "compile"):
    tj.compile = compile_
orig_launcher_init = nd.CudaLauncher.__init__


def launcher_init(self, src, md):
    t = time.perf_counter()
    orig_launcher_init(self, src, md)
    rec("launcher " + str(getattr(getattr(src, "fn", None), "__name__", "")), t)


nd.CudaLauncher.__init__ = launcher_init
orig_driver_init = nd.CudaDriver.__init__


def driver_init(self, *a, **k):
    t = time.perf_counter()
    orig_driver_init(self, *a, **k)
    rec("CudaDriver init", t)


nd.CudaDriver.__init__ = driver_init
dev = torch.device("cuda")
dt = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp32': torch.float32}[dt_name]
q = torch.randn(1, 8, 1536, D, device=dev, dtype=dt, requires_grad=True)
k = torch.randn(1, 2, 1536, D, device=dev, dtype=dt, requires_grad=True)
v = torch.randn(1, 2, 1536, D, device=dev, dtype=dt, requires_grad=True)
w = (0.2 * torch.randn(8, 6, 11, device=dev)).requires_grad_()
g = torch.randn(1, 8, 1536, D, device=dev, dtype=dt)
(w * 2).backward(torch.ones_like(w)); w.grad = None
torch.cuda.synchronize()
T1 = time.perf_counter()
o = mta.conv_attention(q, k, v, w, causal=True)
torch.cuda.synchronize(); rec("forward call", T1)
t = time.perf_counter()
o.backward(g)
torch.cuda.synchronize(); rec("backward call", t)
total = time.perf_counter() - T1
print(f"RESULT {dt_name} d={D} {variant:10s} first fwd+bwd {total:.2f} s (call at {T1 - T0:.2f} s after start)",
      flush=True)
for e in sorted(ev):
    if e[3].startswith(("compile conv_d", "launcher conv_d", "CudaDriver", "warm", "forward", "backward")) or e[0] < T1 - T0 + 0.01:
        print("   ", e)
