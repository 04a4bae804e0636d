"""H100: MTA forward + backward (bf16, causal, N = 8192, B = 1) with the far dq made by ``conv_dq_kernel`` (a
``[rows, cq' d]`` accumulator, then the fold) or by ``conv_dq_rows_kernel`` (dC through a per-program scratch,
a ``[rows, d]`` accumulator), at the variant's tile. Prints the time, each kernel's GPU time (torch.profiler) and
the relative difference of every gradient from the first variant's (the scratch's reloads must see the stores).

    PYTHONPATH=. VARIANT=0 H=16 D=128 VARIANTS='[(False, None), (True, (64, 32, 4, 2))]' python notes/h100_remeasure_2026-11-24/dq_rows.py
COMPILE_ONLY=1: one call (fills Triton's cache). REF=path: gradients of the reference variant (saved by VARIANT=0).
"""
import json
import os
from collections import defaultdict

import torch

import mta
import mta.conv
import mta.conv_backward as cb
from mta.bench.timing import time_ms

H, D = int(os.environ.get("H", 8)), int(os.environ.get("D", 64))
CQ, CK, N = int(os.environ.get("CQ", 6)), int(os.environ.get("CK", 11)), int(os.environ.get("N", 8192))
rows, tile = eval(os.environ["VARIANTS"])[int(os.environ["VARIANT"])]
cb.DQ_ROWS = rows
if tile:
    mta.conv.DQ_ROWS_TILE = {w: tuple(tile) for w in mta.conv.DQ_ROWS_TILE}
torch.manual_seed(0)
q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
w = (0.2 * torch.randn(H, CQ, CK, device="cuda")).requires_grad_()
do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)


def step():
    o = mta.conv_attention(q, k, v, w, causal=True)
    return torch.autograd.grad(o, (q, k, v, w), do)


tag = f"d{D}_{CQ}x{CK}_v{os.environ['VARIANT']}"
try:
    grads = step()
    torch.cuda.synchronize()
except Exception as error:  # noqa: BLE001 - a tile that does not compile or launch is a result
    print(tag, rows, tile, f"{type(error).__name__}: {str(error)[:300]}", flush=True)
    raise SystemExit(0)
if os.environ.get("COMPILE_ONLY") == "1":
    print(tag, "compiled", flush=True)
    raise SystemExit(0)
ref_path = os.path.join(os.environ.get("OUT", "."), f"dq_rows_d{D}_{CQ}x{CK}_ref.pt")
if os.environ["VARIANT"] == "0":
    torch.save([g.cpu() for g in grads], ref_path)
ref = torch.load(ref_path)
diff = [((g.float().cpu() - r.float()).norm() / r.float().norm()).item() for g, r in zip(grads, ref)]
again = step()
bitwise = all(torch.equal(a, b) for a, b in zip(grads, again))
ms = time_ms(step, rep=20)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
per_kernel = defaultdict(float)
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        per_kernel[e.name[:40]] += e.device_time / 1e3 / 5
top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:6]
print(f"{tag} rows={rows} tile={tile}: fwd+bwd {ms:.3f} ms; " + "; ".join(f"{n} {t:.3f}" for n, t in top)
      + f"; rel diff to v0 " + " ".join(f"{x:.1e}" for x in diff) + f"; bitwise repeat {bitwise}", flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "H": H, "D": D, "kernel": [CQ, CK], "N": N, "variant": [rows, tile],
           "ms": ms, "per_kernel_ms": dict(per_kernel), "rel_diff_to_v0": diff, "bitwise_repeat": bitwise},
          open(os.path.join(os.environ.get("OUT", "."), f"dq_rows_{tag}.json"), "w"), indent=1)
