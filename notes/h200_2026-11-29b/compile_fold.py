"""Offline sm_90 builds (registers, spills, shared memory; no GPU) of the band-matrix fold
(mta.conv_forward.fold_keys_product_kernel) at the tiles given, 6 x 11, bf16.

    .venv/bin/python notes/h200_2026-11-29b/compile_fold.py ["keys,warps;..."]
"""
import os
import sys

tiles_arg = sys.argv[1] if len(sys.argv) > 1 else "64,4"
sys.argv = [sys.argv[0], "conv"]  # compile_sm90's parser wants its mode first
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import compile_sm90 as c  # noqa: E402
import torch  # noqa: E402

from mta import conv  # noqa: E402

print(c.HDR)
for tile in tiles_arg.split(";"):
    keys, warps = (int(x) for x in tile.split(","))
    for D in (32, 64, 128, 256):
        stand_in = c.RecordedLaunch(conv.fold_keys_product_kernel)
        saved = conv.fold_keys_product_kernel, conv.uses_fold_product, conv.FOLD_PRODUCT_TILE
        conv.fold_keys_product_kernel, conv.uses_fold_product = stand_in, lambda *a: True
        conv.FOLD_PRODUCT_TILE = (keys, warps)
        conv.check_kernel_device = lambda **kw: None  # CPU tensors: only the launch is recorded
        try:
            conv.fold_keys(torch.randn(1, 2, 1024, D, dtype=torch.bfloat16), torch.randn(2, 6, 11), 2)
        finally:
            conv.fold_keys_product_kernel, conv.uses_fold_product, conv.FOLD_PRODUCT_TILE = saved
        (args, kw), = stand_in.launches
        c.report("fold", D, False, (keys, kw["WINDOW"], warps, kw.get("num_stages", 0)), saved[0], args, kw)
