"""GPU probe: the two pre-passes of mta.conv_attention (fold_keys, diagonal scores) at a few tile sizes and warp
counts, N = 8192, 6 x 11, bf16. ``PYTHONPATH=. python tools/probe_conv_prepasses.py``.
Raw outputs: notes/h200_conv_probe.txt (runs 10, 18, 20); the chosen sizes are in mta/conv.py."""
import torch
import triton

import mta
from mta.bench.timing import time_ms
from mta.conv import _pad16, diagonal_block, diagonal_reach, diagonal_scores
from mta.conv_forward import diagonal_scores_kernel, fold_keys_kernel
from mta.flash import head_dim_block

N = 8192
for H, D, cq, ck in ((8, 64, 6, 11), (16, 128, 6, 11)):
    q, k = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(H, cq, ck, device="cuda") * 0.2
    e, ep = diagonal_reach(cq, ck)
    kf = torch.empty((1, H, cq, N, D), device="cuda", dtype=k.dtype)
    for bn, warps in ((8, 2), (8, 1), (4, 1), (16, 2), (16, 4)):
        f = lambda: fold_keys_kernel[(triton.cdiv(N, bn), H)](k, w, kf, *k.stride(), *kf.stride(), N, H, 1, CQ=cq, CK=ck,
                                                               D=D, BLOCK_D=head_dim_block(D), BLOCK_N=bn, num_warps=warps)
        print(f"H={H} D={D} fold bn={bn} warps={warps}: {time_ms(f):.3f} ms", flush=True)
    block_r, ep_pad, _ = diagonal_block(cq, ck)
    cd = torch.empty((1, H, N, _pad16(e)), device="cuda", dtype=torch.float32)
    want = diagonal_scores(q, k, w)
    for br, warps in ((block_r, 4), (block_r, 8), (block_r, 2), (2 * block_r, 4), (2 * block_r, 8)):
        kw = triton.next_power_of_2(2 * br + ep_pad)
        f = lambda: diagonal_scores_kernel[(triton.cdiv(N, br), H)](
            q, k, w, cd, *q.stride(), *k.stride(), N, H, 1, CQ=cq, CK=ck, E=e, E_PAD=cd.shape[-1], EP=ep, EP_PAD=ep_pad,
            D=D, BLOCK_D=head_dim_block(D), BLOCK_R=br, KW=kw, PRECISION="tf32", num_warps=warps)
        f()
        print(f"H={H} D={D} diagonal scores br={br} warps={warps}: {time_ms(f):.3f} ms "
              f"(same as the package's: {torch.equal(cd, want)})", flush=True)
    t = time_ms(lambda: mta.conv.conv_prepasses(q, k, w, True))
    print(f"H={H} D={D} conv_prepasses (fold + diagonal scores): {t:.3f} ms", flush=True)
