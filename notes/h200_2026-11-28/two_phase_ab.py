# python notes/h200_2026-11-28/two_phase_ab.py OUT.json   (GPU; from the repository root)
"""Issue 12: the two-phase backward (mta.conv_two_phase, forced) against the one-pass kernels, same run, same
inputs: forward + backward time (mta.bench.timing: L2 flushed, median), peak extra memory, and the two paths'
gradients against each other. bf16, causal, B = 1, N = 8192; mta.flash_attention's forward + backward beside."""
import json
import sys

import torch

import mta
from mta import conv_two_phase
from mta.bench.timing import peak_extra_memory_bytes, time_ms

SHAPES = [(8, 64, 6, 11), (16, 128, 6, 11), (8, 64, 11, 11), (16, 128, 11, 11), (4, 256, 6, 11)]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
dev = torch.device("cuda")
rows = []


def fwd_bwd(fn, leaves, do, **kw):
    def run():
        for t in leaves:
            t.grad = None
        fn(*leaves, causal=True, **kw).backward(do)
    return run


for H, D, cq, ck in SHAPES:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (torch.randn(H, cq, ck, device=dev) * 0.2).requires_grad_()
    do = torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16)
    r = dict(H=H, D=D, cq=cq, ck=ck, N=N)
    grads = {}
    for name, force in (("one_pass", False), ("two_phase", True)):
        conv_two_phase.FORCE = force
        run = fwd_bwd(mta.conv_attention, (q, k, v, w), do)
        try:
            run()
            grads[name] = [t.grad.float().clone() for t in (q, k, v, w)]
            r[name + "_ms"] = time_ms(run, warmup=2, rep=7)
            r[name + "_peak_mib"] = peak_extra_memory_bytes(run) / 2 ** 20
        except Exception as e:  # noqa: BLE001
            r[name + "_ms"] = f"{type(e).__name__}: {str(e)[:200]}"
    conv_two_phase.FORCE = None
    if len(grads) == 2:
        r["grad_rel_diff"] = [((a - b).norm() / b.norm()).item() for a, b in zip(grads["two_phase"], grads["one_pass"])]
    flash = fwd_bwd(mta.flash_attention, (q, k, v), do)
    r["flash_ms"] = time_ms(flash, warmup=2, rep=7)
    if isinstance(r.get("two_phase_ms"), float) and isinstance(r.get("one_pass_ms"), float):
        r["two_phase_over_flash"] = r["two_phase_ms"] / r["flash_ms"]
        r["one_pass_over_flash"] = r["one_pass_ms"] / r["flash_ms"]
    rows.append(r)
    print(json.dumps(r), flush=True)
    del q, k, v, w, do, grads
    torch.cuda.empty_cache()
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)
