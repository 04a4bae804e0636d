"""H100: MTA forward + backward (bf16, causal, N = 8192, B = 1) with the backward's tiled kernels made in one launch
(every query shift accumulated) or in one launch per shift group (``mta.conv_backward.SPLIT_COLUMNS = 0``), and
tiles of the table replaced by the variant's. Prints the tiles launched, the time of a forward + backward and the
GPU time of each kernel (torch.profiler).

    PYTHONPATH=. VARIANT=0 H=16 D=128 python notes/h100_remeasure_2026-11-24/shift_groups.py
VARIANTS (a Python list) of (split, dq tile or None, dK/dV tile or None, keys-as-rows tile or None or "off").
COMPILE_ONLY=1: one call (fills Triton's cache), nothing timed.
"""
import json
import os
from collections import defaultdict

import torch

import mta
import mta.conv
import mta.conv_backward as cb
from mta import tuning
from mta.bench.timing import time_ms

H, D = int(os.environ.get("H", 8)), int(os.environ.get("D", 64))
CQ, CK, N = int(os.environ.get("CQ", 6)), int(os.environ.get("CK", 11)), int(os.environ.get("N", 8192))
split, dq_tile, dkdv_tile, kar = eval(os.environ["VARIANTS"])[int(os.environ["VARIANT"])]
cb.SPLIT_COLUMNS = 0 if split else 1 << 30
for name, tile in (("conv_dq", dq_tile), ("conv_dkdv", dkdv_tile)):
    if tile:
        tuning.HOPPER[name] = {key: tuple(tile) for key in tuning.HOPPER[name]}
if kar == "off":
    tuning.HOPPER_KEYS_AS_ROWS.clear()
elif kar:
    tuning.HOPPER_KEYS_AS_ROWS[64] = tuple(kar)
launched = []
fit = mta.conv._fit_backward_tile
mta.conv._fit_backward_tile = lambda config, owned, *a: launched.append((owned, a[-1], fit(config, owned, *a))) or launched[-1][2]
kart = mta.conv.keys_as_rows_tile
mta.conv.keys_as_rows_tile = lambda *a, **k: (lambda t: launched.append(("keys_as_rows", k.get("acc_shifts"), t)) or t)(kart(*a, **k))

torch.manual_seed(0)
q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
w = (0.2 * torch.randn(H, CQ, CK, device="cuda")).requires_grad_()
do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)


def step():
    o = mta.conv_attention(q, k, v, w, causal=True)
    return torch.autograd.grad(o, (q, k, v, w), do)


grads = step()
torch.cuda.synchronize()
tag = f"d{D}_{CQ}x{CK}_v{os.environ['VARIANT']}"
if os.environ.get("COMPILE_ONLY") == "1":
    print(tag, "compiled", flush=True)
    raise SystemExit(0)
tiles = [(o, s, tuple(c.values()) if c else None) for o, s, c in launched]
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
sums = [g.float().sum().item() for g in grads]
print(f"{tag} split={split} dq={dq_tile} dkdv={dkdv_tile} kar={kar} -> {tiles}\n   fwd+bwd {ms:.3f} ms; "
      + "; ".join(f"{n} {t:.3f}" for n, t in top) + f"; grad sums {sums}", flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "H": H, "D": D, "kernel": [CQ, CK], "N": N,
           "variant": [split, dq_tile, dkdv_tile, kar], "launched": tiles, "ms": ms, "per_kernel_ms": dict(per_kernel),
           "grad_sums": sums}, open(os.path.join(os.environ.get("OUT", "."), f"shift_groups_{tag}.json"), "w"), indent=1)
