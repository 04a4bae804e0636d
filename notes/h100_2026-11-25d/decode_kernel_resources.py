"""H100: registers, spills and shared memory of MTA decode's split kernel before and after the band change
(see conv_decode_band_ab.py), at the bench's configurations (bf16, Nq = 1, 6 x 11), B = 8, N = 16k.

    git show 1cc3a2c:mta/decode_kernels.py > mta/_decode_kernels_before.py
    MTA_COMPILE_AHEAD=0 PYTHONPATH=. python notes/h100_2026-11-25d/decode_kernel_resources.py
"""
import importlib.util
import os

import torch

import mta
import mta.decode
from mta import _decode_kernels_before as before

after_kernel = mta.decode.decode_split_kernel
_ab = importlib.util.spec_from_file_location("ab", os.path.join(os.path.dirname(__file__), "conv_decode_band_ab.py"))
ab = importlib.util.module_from_spec(_ab)
_ab.loader.exec_module(ab)
WithoutBandArgs = ab.WithoutBandArgs


def compiled(kernel):
    for cache in kernel.device_caches.values():
        for c in cache[0].values():
            yield c


for hq, hkv, d in [(8, 8, 64), (32, 8, 128)]:
    q = torch.randn(8, hq, 16384, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(8, hkv, 16384, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = 0.2 * torch.randn(hq, 6, 11, device="cuda")
    for name, kern, raw in [("before", WithoutBandArgs(before.decode_split_kernel), before.decode_split_kernel),
                            ("after", after_kernel, after_kernel)]:
        mta.decode.decode_split_kernel = kern
        mta.conv_decode_attention(q, k, v, w)
        mta.decode.decode_split_kernel = after_kernel
        for c in compiled(raw):
            md = c.metadata
            print(f"d={d} {name}: num_warps {md.num_warps} stages {md.num_stages} shared {md.shared} "
                  f"regs {c.n_regs} spills {c.n_spills}", flush=True)
        raw.device_caches.clear()
