"""Next GPU run (not yet run): does the 16-bit small-head-dim bug follow the padding or the row stride?

The offline probe (`notes/probe_16bit/`) found the broken build (fp16, d = 24 in a 32-wide tile, queries held)
correct in every staged shared-memory tile, mask and wgmma descriptor; it differs from the correct d = 32 build
mainly in its loads: scalar (a row stride of 24 is not a multiple of 16) instead of vectorised copies. Two rules fit
every failure so far: (a) a scalar build with a tile of 16 or 32, (b) a padded head dim in a tile of 16 or 32.
Here d = 24 runs with the 32-wide tile forced (the fix bypassed) on views with rows 32 apart (vectorised build):
right means (a), and the fix should follow the stride; wrong means (b). The same for d = 32 on rows 40 apart.

    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=. python notes/h100_remeasure_2026-11-23/small_head_dims_16bit_stride.py
"""
import torch

import mta
from mta import conv, launch
from mta.reference import conv_attention_reference

conv.shifted_head_dim_block = lambda d, dtype: launch.head_dim_block(d)  # the tile before the fix
conv.vector_rows = lambda x: x  # and no copy of odd layouts
torch.manual_seed(0)
B, H, Hk, N = 1, 4, 2, 40
for dtype in (torch.float16, torch.bfloat16):
    for D, row in ((24, 24), (24, 32), (32, 32), (32, 40)):
        q, k, v = (torch.randn(B, h, N, row, dtype=torch.float64).to(dtype).cuda()[..., :D] for h in (H, Hk, Hk))
        w = 0.2 * torch.randn(H, 5, 3).cuda()
        for causal in (False, True):
            o = mta.conv_attention(q, k, v, w, causal=causal)
            ref = conv_attention_reference(*(x.double().cpu() for x in (q, k, v, w)), causal=causal)
            err = ((o.double().cpu() - ref).norm() / ref.norm()).item()
            print(f"{dtype} D={D} row stride {row} causal={causal}: rel err {err:.1e}", flush=True)
