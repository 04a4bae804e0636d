"""Not yet run (no device on 2026-11-23 afternoon). Forward+backward time of mta.conv_attention (bf16, causal,
6x11, N=8192) with the dK/dV tile at 1 or 2 pipeline stages: one stage compiles 0.7 s faster (2.1 against 2.8 s offline, sm_90, bf16 d = 64), the critical
path of a first forward+backward call."""
import sys, torch, triton, mta
from mta import tuning
torch.manual_seed(0)
N = 8192
for B, H, HKV, D in [(1, 8, 8, 64), (1, 16, 16, 128)]:
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (0.2 * torch.randn(H, 6, 11, device="cuda")).requires_grad_()
    g = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    base = tuning.HOPPER["conv_dkdv"][(D, True)]
    res = {}
    for stages in (1, 2, 1, 2):
        tuning.HOPPER["conv_dkdv"][(D, True)] = base[:3] + (stages,)
        def step():
            o = mta.conv_attention(q, k, v, w, causal=True)
            o.backward(g)
        step()
        grads = [x.grad.clone() for x in (q, k, v, w)]
        for x in (q, k, v, w): x.grad = None
        ms = triton.testing.do_bench(step, warmup=10, rep=200, return_mode="median")
        res.setdefault(stages, []).append(ms)
        if stages == 1: ref = grads
        else: same = all(torch.equal(a, b) for a, b in zip(ref, grads))
        print(f"D={D} dkdv={base[:3] + (stages,)} fwd+bwd median {ms:.3f} ms", flush=True)
    print(f"D={D} s1 {min(res[1]):.3f} s2 {min(res[2]):.3f} ratio s1/s2 {min(res[1])/min(res[2]):.3f} grads equal {same}")
    tuning.HOPPER["conv_dkdv"][(D, True)] = base
