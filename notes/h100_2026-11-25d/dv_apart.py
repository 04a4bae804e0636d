"""H100: the MTA backward's dK/dV side as two launches, U alone and dV alone (``mta.conv.dv_apart_tile``),
against one launch that makes both (bf16, causal, 6 x 11, N = 8192, B = 1; H = 8 at d = 64, H = 16 at d = 128).
Question: without the [BLOCK_N, d] dV accumulator beside the [BLOCK_N, cq' d] U accumulator, does the U launch
run enough faster to pay for a second launch that recomputes C (cq' product units) to make dV?
Tiles as (BLOCK_M, BLOCK_N, warps, stages); "dv": the dV launch's tile and whether its scores are keys as rows;
"u": the U launch's tile (default the launcher's). Two interleaved rounds, the launcher first and last;
gradients compared with the launcher's; GPU time per dK/dV launch by torch.profiler (mean of 3 calls).

    PYTHONPATH=. python notes/h100_2026-11-25d/dv_apart.py
"""
import json
import os

import torch
from torch.profiler import ProfilerActivity, profile

import mta
import mta.conv
from mta import tuning
from mta.bench.timing import time_ms

VARIANTS = {
    64: [{"dv": ((32, 128, 8, 2), True)}, {"dv": ((64, 128, 8, 2), True)}, {"dv": ((64, 64, 4, 2), True)},
         {"dv": ((32, 64, 4, 2), False)}, {"dv": ((64, 128, 8, 2), True), "u": ((64, 128, 8, 2), True)}],
    128: [{"dv": ((32, 64, 4, 2), True)}, {"dv": ((32, 64, 4, 2), False)}, {"dv": ((16, 64, 4, 3), True)},
          {"dv": ((32, 64, 8, 2), True)}, {"dv": ((32, 64, 4, 2), True), "u": ((32, 64, 8, 2), False)},
          {"dv": ((32, 64, 4, 2), True), "u": ((16, 64, 8, 2), False)}],
}
CONFIGS = {64: 8, 128: 16}  # head dim: heads
launcher_apart, launcher_kr = mta.conv.dv_apart_tile, mta.conv.keys_as_rows_tile
out = {"gpu": torch.cuda.get_device_name(), "rows": []}


def dkdv_ms(step):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    launches = [e for e in prof.events() if e.name.startswith("conv_dkdv_kernel")]
    per = [e.device_time / 1e3 for e in launches]
    n = len(per) // 3
    return [round(sum(per[i::n]) / 3, 4) for i in range(n)]


for D, H in CONFIGS.items():
    torch.manual_seed(0)
    N, cq, ck = 8192, 6, 11
    q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (0.2 * torch.randn(H, cq, ck, device="cuda")).requires_grad_()
    do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)
    flash_ms = time_ms(lambda: torch.autograd.grad(mta.flash_attention(q, k, v, causal=True), (q, k, v), do), rep=30)
    print(f"d={D} H={H}: flash fwd+bwd {flash_ms:.3f} ms", flush=True)
    out["rows"].append({"head_dim": D, "flash_ms": flash_ms})
    ref = None
    for rnd in range(2):
        for variant in [{}] + VARIANTS[D] + [{}]:
            saved = dict(tuning.HOPPER["conv_dkdv"])
            if "dv" in variant:
                tile, kar = variant["dv"]
                mta.conv.dv_apart_tile = lambda *a, t=tile, r=kar: (tuning.as_config(t), r)
            if "u" in variant:
                tile, kar = variant["u"]
                if kar:
                    mta.conv.keys_as_rows_tile = lambda *a, t=tile: tuning.as_config(t)
                else:
                    mta.conv.keys_as_rows_tile = lambda *a: None
                    tuning.HOPPER["conv_dkdv"][(D, True)] = tile

            def step():
                o = mta.conv_attention(q, k, v, w, causal=True)
                return torch.autograd.grad(o, (q, k, v, w), do)
            try:
                grads = step()
                ms = time_ms(step, rep=30)
                kernels = dkdv_ms(step)
            except Exception as error:  # noqa: BLE001 - a tile that does not compile or launch is a result
                print(f"d={D} round {rnd} {variant}: {type(error).__name__}: {str(error)[:200]}", flush=True)
                out["rows"].append({"head_dim": D, "round": rnd, "variant": str(variant), "error": repr(error)[:300]})
                continue
            finally:
                mta.conv.dv_apart_tile, mta.conv.keys_as_rows_tile = launcher_apart, launcher_kr
                tuning.HOPPER["conv_dkdv"].clear()
                tuning.HOPPER["conv_dkdv"].update(saved)
            ref = grads if ref is None else ref
            errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads, ref)]
            print(f"d={D} round {rnd} {variant or 'launcher'}: fwd+bwd {ms:.3f} ms ({ms / flash_ms:.2f}x flash); "
                  f"dK/dV launches {kernels} ms; rel diff " + " ".join(f"{e:.1e}" for e in errs), flush=True)
            out["rows"].append({"head_dim": D, "round": rnd, "variant": str(variant), "ms": ms, "dkdv_ms": kernels,
                                "rel_diff": errs})
    del q, k, v, w, do, ref
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "dv_apart.json"), "w"), indent=1)
