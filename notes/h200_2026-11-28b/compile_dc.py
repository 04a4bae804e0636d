"""Offline sm_90 builds of the two-phase backward's phase-1 kernel (mta.conv_dc_kernels.conv_dc_kernel) at the
launcher's tile and variants: registers, spills, shared memory. No GPU needed.

    .venv/bin/python notes/h200_2026-11-28b/compile_dc.py [TILES]   (TILES: "BM,BN,w,s;..." overrides)
"""
import os
import sys

sys.argv = [sys.argv[0], "conv"] + sys.argv[1:]  # compile_sm90's parser wants its mode first
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
tiles_arg = sys.argv[2] if len(sys.argv) > 2 else None
sys.argv = sys.argv[:2]
import compile_sm90 as c  # noqa: E402
import torch  # noqa: E402

from mta import conv, conv_two_phase, tuning  # noqa: E402
from mta.conv_dc_kernels import conv_dc_kernel  # noqa: E402


class Stop(Exception):
    pass


def record(D, cq=6, ck=11, causal=True, tile=None, H=2, N=1024, kernel=conv_dc_kernel):
    stand_in = c.RecordedLaunch(kernel)
    saved_kernel, saved_launch, saved_tile = conv_two_phase.conv_dc_kernel, conv_two_phase.launch, conv_two_phase.phase_one_tile

    def launch(kernel, grid, *args, **kw):
        if kernel is stand_in:
            stand_in[grid](*args, **kw)
            raise Stop
    conv_two_phase.conv_dc_kernel, conv_two_phase.launch = stand_in, launch
    if tile is not None:
        conv_two_phase.phase_one_tile = lambda *a: dict(BLOCK_M=tile[0], BLOCK_N=tile[1], num_warps=tile[2], num_stages=tile[3], WIDTH=tile[4] if len(tile) > 4 else min(D, 64))
    try:
        q, k, v, do = (torch.randn(1, H, N, D, dtype=torch.bfloat16) for _ in range(4))
        w = torch.randn(H, cq, ck)
        kf = conv.fold_keys.__wrapped__(k, w, H, True) if hasattr(conv.fold_keys, "__wrapped__") else None
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
        conv_two_phase.conv_dc_kernel, conv_two_phase.launch, conv_two_phase.phase_one_tile = saved_kernel, saved_launch, saved_tile
    (args, kw), = stand_in.launches
    return args, c.with_heuristics(kernel, args, kw)


if __name__ == "__main__":
    print(c.HDR)
    tiles = [tuple(int(x) for x in t.split(",")) for t in tiles_arg.split(";")] if tiles_arg else [None]
    for D in (64, 128):
        for tile in tiles:
            args, kw = record(D, tile=tile)
            cfg = (kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"], kw["num_stages"])
            c.report("dc", D, True, cfg, conv_dc_kernel, args, kw)
