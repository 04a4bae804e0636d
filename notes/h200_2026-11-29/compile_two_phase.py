"""Offline sm_90 builds (registers, spills, shared memory; no GPU) of the two-phase backward's Triton kernels at the
launcher's tiles: phase 1 (mta.conv_dc_kernels.conv_dc_kernel) and the dQ side (mta.conv_dq_kernels).

    .venv/bin/python notes/h200_2026-11-29/compile_two_phase.py ["BM,BK,w,s;..."]   (dQ tiles to try)
"""
import os
import sys

sys.argv = [sys.argv[0], "conv"] + sys.argv[1:]  # compile_sm90's parser wants its mode first
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
tiles_arg = sys.argv[2] if len(sys.argv) > 2 else None
sys.argv = sys.argv[:2]
import compile_sm90 as c  # noqa: E402
import torch  # noqa: E402

from mta import conv_two_phase  # noqa: E402

conv_two_phase.DQ_FAR_KERNEL = True  # at every head dim, so that its launch is recorded


class Stop(Exception):
    pass


def record(name, D, cq=6, ck=11, causal=True, H=2, N=1024, dq_tile=None):
    kernel = getattr(conv_two_phase, name)
    stand_in = c.RecordedLaunch(kernel)
    saved = kernel, conv_two_phase.launch, conv_two_phase.dq_far_tile

    def launch(k, grid, *args, **kw):
        if k is stand_in:
            stand_in[grid](*args, **kw)
            raise Stop
    setattr(conv_two_phase, name, stand_in)
    conv_two_phase.launch = launch
    if dq_tile is not None:
        conv_two_phase.dq_far_tile = lambda *a: dict(zip(("BLOCK_M", "BLOCK_K", "num_warps", "num_stages"), dq_tile))
    try:
        q, k, v, do = (torch.randn(1, H, N, D, dtype=torch.bfloat16) for _ in range(4))
        w = torch.randn(H, cq, ck)
        kf = torch.empty((1, H, N, cq, D), dtype=torch.bfloat16).permute(0, 1, 3, 2, 4)
        lse, delta = torch.zeros(1, H, N), torch.zeros(1, H, N)
        e = cq - 1 + (ck - 1) // 2
        cd, g = torch.zeros(1, H, N, 16), torch.zeros(1, H, N, 32)
        meta = dict(CAUSAL=causal, CQ=cq, CK=ck, E=e, E_PAD=max(16, 1 << (e - 1).bit_length()), D=D,
                    BLOCK_D=D, PRECISION="tf32")
        try:
            conv_two_phase.two_phase_sides(do, q, k, v, lse, delta, [kf], cd, g, w, causal, D ** -0.5, True,
                                           meta, [])
        except Stop:
            pass
    finally:
        setattr(conv_two_phase, name, saved[0])
        conv_two_phase.launch, conv_two_phase.dq_far_tile = saved[1], saved[2]
    (args, kw), = stand_in.launches
    return kernel, args, c.with_heuristics(kernel, args, kw)


if __name__ == "__main__":
    print(c.HDR)
    dq_tiles = [tuple(int(x) for x in t.split(",")) for t in tiles_arg.split(";")] if tiles_arg else [None]
    for D in (64, 128):
        kernel, args, kw = record("conv_dc_kernel", D)
        c.report("dc", D, True, (kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"], kw["num_stages"]), kernel, args, kw)
        for t in dq_tiles:
            kernel, args, kw = record("conv_dq_far_kernel", D, dq_tile=t)
            c.report("dq_far", D, True, (kw["BLOCK_M"], kw["BLOCK_K"], kw["num_warps"], kw["num_stages"]), kernel,
                     args, kw)
