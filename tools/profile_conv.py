"""One launch each of the MTA forward kernel and the flash forward, at one explicit tile, for Nsight Compute.

    ncu --clock-control none -k regex:"conv_forward_kernel|flash_forward_kernel" --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats python tools/profile_conv.py

H=16, N=8192, d=128 (the issue's d = 128 bar shape), 6 x 11, bf16, causal; the pre-passes run before and are not
matched by the filter. Each kernel runs twice: ``--launch-skip 2`` profiles the second (compiled, warm) pair.
PROFILE_TILE='(BLOCK_M, BLOCK_N, warps, stages)' picks the tile (default 128 x 128, 8 warps, 3 stages).
Run 15 in notes/h200_conv_probe.txt is its output for the pointer-load kernel.
"""
import os

import torch

from mta.conv import conv_prepasses, launch_conv_forward
from mta.flash import flash_forward

bm, bn, warps, stages = eval(os.environ.get("PROFILE_TILE", "(128, 128, 8, 3)"))
tile = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
torch.manual_seed(0)
H, N, D = 16, 8192, 128
q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
w = torch.randn(H, 6, 11, device="cuda") * 0.2
kf, cd = conv_prepasses(q, k, w, causal=True)
for _ in range(2):
    launch_conv_forward(q, v, kf, cd, (6, 11), True, D ** -0.5, **tile)
    flash_forward(q, k, v, True, D ** -0.5, **tile)
torch.cuda.synchronize()
print("profiled tile", tile)
