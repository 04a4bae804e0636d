"""The MTA pre-passes (fold_keys_kernel, past_scores_kernel, diagonal_scores_kernel) and the dQ fold at other row
tiles and warp counts: GPU time per kernel (torch.profiler, mean of 5 forward + backward calls after 2 warm-ups),
bf16, causal, 6 x 11, N = 8192, B = 1. Each launch's BLOCK_N / BLOCK_R and num_warps are replaced through the
launch call, the grid scaled to match (these kernels' grids are (cdiv(N, rows), B * H)).

    PYTHONPATH=. python notes/h100_2026-11-24h/pre_pass_tiles.py
"""
import torch
from torch.profiler import ProfilerActivity, profile

import mta
import mta.conv
from mta.launch import cdiv

shipped_launch = mta.conv.launch
ROWS = {"fold_keys_kernel": "BLOCK_N", "past_scores_kernel": "BLOCK_R", "diagonal_scores_kernel": "BLOCK_R",
        "conv_dq_fold_kernel": "BLOCK_R"}
OVERRIDE = {}


def launch(kernel, grid, *args, **meta):
    name = getattr(getattr(kernel, "fn", kernel), "__name__", "")
    if name in OVERRIDE and not mta.launch.in_dry_run():
        rows, warps = OVERRIDE[name]
        n = args[[i for i, a in enumerate(kernel.arg_names) if a in ("N", "n")][0]]
        grid = (cdiv(n, rows), *grid[1:])
        meta = {**meta, ROWS[name]: rows, "num_warps": warps}
    return shipped_launch(kernel, grid, *args, **meta)


mta.conv.launch = launch
for H, D in ((8, 64), (16, 128)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, 8192, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    w = (torch.randn(H, 6, 11, device="cuda") * 0.2).requires_grad_()
    do = torch.randn_like(q)

    def step():
        mta.conv_attention(q, k, v, w, causal=True).backward(do)

    def run(override):
        OVERRIDE.clear()
        OVERRIDE.update(override)
        for t in (q, k, v, w):
            t.grad = None
        step()
        grads = [t.grad.clone() for t in (q, k, v, w)]
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        times = {e.key: e.device_time_total / 1e3 / e.count for e in prof.key_averages() if e.count}
        return {name: times.get(name) for name in ROWS}, grads

    base, want = run({})
    print(f"d={D} H={H} shipped (per call, ms):", {n.removesuffix('_kernel'): round(t, 4) for n, t in base.items()},
          flush=True)
    for name in ROWS:
        for rows in (8, 16, 32, 64):
            for warps in (1, 2, 4):
                try:
                    times, grads = run({name: (rows, warps)})
                except Exception as exc:  # noqa: BLE001
                    print(f"  {name} {rows} x {warps}: {type(exc).__name__}", flush=True)
                    continue
                diff = max(((g.float() - x.float()).abs().max() / x.float().abs().max()).item()
                           for g, x in zip(grads, want))
                print(f"  {name.removesuffix('_kernel'):18s} rows {rows:3d} warps {warps}: {times[name]:.4f} ms"
                      f"  (max rel diff {diff:.1e})", flush=True)
