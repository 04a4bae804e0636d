"""GPU probe: the three pre-passes of mta.conv_attention (fold_keys, past scores, diagonal scores) at a few
tile sizes, N = 8192, 6 x 11, bf16. ``PYTHONPATH=. python tools/probe_conv_prepasses.py``.
Raw outputs: notes/h200_conv_probe.txt, run 10; the chosen sizes are in mta/conv.py."""
import torch, triton
import mta
from mta.bench.timing import time_ms
from mta.conv import diagonal_reach, past_scores
from mta.conv_forward import fold_keys_kernel, past_scores_kernel, diagonal_scores_kernel
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
    p = torch.empty((1, H, N, 16), device="cuda", dtype=torch.float32)
    for br, warps in ((16, 4), (16, 2), (8, 2), (32, 8)):
        f = lambda: past_scores_kernel[(triton.cdiv(N, br), H)](q, k, p, *q.stride(), *k.stride(), *p.stride()[:3], N, H, 1,
                                                                 EP=ep, EP_PAD=16, D=D, BLOCK_D=head_dim_block(D), BLOCK_R=br, num_warps=warps)
        print(f"H={H} D={D} past br={br} warps={warps}: {time_ms(f):.3f} ms", flush=True)
    p = past_scores(q, k, ep)
    cd = torch.empty((1, H, N, 16), device="cuda", dtype=torch.float32)
    for br, warps in ((64, 4), (32, 4), (128, 4), (64, 2), (16, 1)):
        f = lambda: diagonal_scores_kernel[(triton.cdiv(N, br), H)](p, w, cd, *p.stride()[:3], N, H, CQ=cq, CK=ck, E=e, E_PAD=16,
                                                                     EP_PAD=16, BLOCK_R=br, num_warps=warps)
        print(f"H={H} D={D} diag br={br} warps={warps}: {time_ms(f):.3f} ms", flush=True)
