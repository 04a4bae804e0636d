"""CPU (interpreter) check: the transposed dK/dV kernel gives the shipped kernel's gradients."""
import sys, os
sys.path.insert(0, os.path.dirname(__file__))
import torch
import mta, mta.conv
from dkdv_t import conv_dkdv_kernel_t

torch.manual_seed(0)
shipped = mta.conv.conv_dkdv_kernel
for (B, H, Hk, N, D, cq, ck, causal) in [(1, 2, 1, 37, 24, 3, 5, True), (2, 2, 2, 40, 16, 6, 11, False),
                                          (1, 2, 2, 33, 32, 2, 3, True), (1, 1, 1, 5, 16, 6, 11, True)]:
    q, k, v = (torch.randn(B, h, N, D, dtype=torch.float32) for h in (H, Hk, Hk))
    w = 0.3 * torch.randn(H, cq, ck)
    do = torch.randn(B, H, N, D)
    grads = []
    for kern in (shipped, conv_dkdv_kernel_t):
        mta.conv.conv_dkdv_kernel = kern
        x = [t.clone().requires_grad_() for t in (q, k, v, w)]
        o = mta.conv_attention(*x, causal=causal)
        grads.append(torch.autograd.grad(o, x, do))
    mta.conv.conv_dkdv_kernel = shipped
    errs = [((a - b).norm() / b.norm()).item() for a, b in zip(*grads)]
    print(B, H, Hk, N, D, cq, ck, causal, ["%.1e" % e for e in errs])
    assert max(errs) < 1e-5, errs
