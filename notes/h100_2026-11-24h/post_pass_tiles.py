"""The MTA backward's row-tile post-passes (conv_near_kernel, conv_dq_fold_kernel, conv_dk_fold_kernel) at other
row tiles and warp counts: GPU time per kernel (torch.profiler, mean of 5 backward calls after 2 warm-ups), bf16,
causal, 6 x 11, N = 8192, B = 1. The launcher's choice is block_r = max(16, min(64, 4096 // block_d)), 4 warps.
Variants run a patched copy of mta/conv.py (one block_r for the three kernels; warps per kernel through the
launch call); gradients are compared with the shipped launcher's.

    PYTHONPATH=. python notes/h100_2026-11-24h/post_pass_tiles.py
"""
import importlib
import itertools
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import mta
import mta.conv

SRC = Path(mta.conv.__file__)
LINE = "block_r = 128 if runtime.INTERPRET else max(16, min(64, 4096 // block_d))"
text = SRC.read_text()
assert text.count(LINE) == 1
(SRC.parent / "_probe_conv.py").write_text(text.replace(LINE, "block_r = PROBE_R").replace(
    "\ndef _fused_backward(", "\nPROBE_R = 64\nPROBE_WARPS = {}\n\n\ndef _fused_backward("))
probe = importlib.import_module("mta._probe_conv")
shipped_launch = probe.launch


def launch(kernel, grid, *args, **meta):
    name = getattr(kernel, "__name__", getattr(getattr(kernel, "fn", None), "__name__", ""))
    if name in probe.PROBE_WARPS:
        meta["num_warps"] = probe.PROBE_WARPS[name]
    return shipped_launch(kernel, grid, *args, **meta)


probe.launch = launch
KERNELS = ("conv_near_kernel", "conv_dq_fold_kernel", "conv_dk_fold_kernel")


def kernel_ms(fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    times = {e.key: e.device_time_total / 5 / 1e3 for e in prof.key_averages()}
    return {k: times.get(k) for k in KERNELS}, sum(v for v in times.values() if v)


for H, D in ((8, 64), (16, 128)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, 8192, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    w = torch.randn(H, 6, 11, device="cuda") * 0.2
    do = torch.randn_like(q)
    scale = D ** -0.5
    o, lse = mta.conv.conv_attention_forward(q, k, v, w, True, scale)
    want = mta.conv._fused_backward(do, q, k, v, o, lse, w, True, scale)
    base, total = kernel_ms(lambda: mta.conv._fused_backward(do, q, k, v, o, lse, w, True, scale))
    print(f"d={D} H={H} shipped: backward {total:.3f} ms;",
          ", ".join(f"{k.removeprefix('conv_').removesuffix('_kernel')} {t:.4f}" for k, t in base.items()), flush=True)
    for block_r, warps in itertools.product((16, 32, 64, 128), (2, 4, 8)):
        probe.PROBE_R, probe.PROBE_WARPS = block_r, dict.fromkeys(KERNELS, warps)
        try:
            got = probe._fused_backward(do, q, k, v, o, lse, w, True, scale)
            diff = max(((g.float() - x.float()).abs().max() / x.float().abs().max()).item() for g, x in zip(got, want))
            times, total = kernel_ms(lambda: probe._fused_backward(do, q, k, v, o, lse, w, True, scale))
        except Exception as exc:  # noqa: BLE001  (a tile that does not fit: noted)
            print(f"  block_r={block_r} warps={warps}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        print(f"  block_r={block_r:3d} warps={warps}: backward {total:.3f} ms;",
              ", ".join(f"{k.removeprefix('conv_').removesuffix('_kernel')} {t:.4f}" for k, t in times.items()),
              f"; max rel diff {diff:.1e}", flush=True)
