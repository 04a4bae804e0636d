"""H100: mta.conv_decode_attention over dtypes, head dims and kernels up to 32 x 33 (n = 1 and 4 new queries): which
launches the split kernel fits. PYTHONPATH=. python notes/h100_remeasure_2026-11-24/conv_decode_grid.py"""
import torch, mta, itertools
torch.manual_seed(0)
for dtype, D, (cq, ck) in itertools.product((torch.float32, torch.bfloat16), (64, 128, 256), ((11, 15), (16, 15), (24, 25), (32, 33), (1, 33), (32, 1))):
    q = torch.randn(2, 4, 80, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(2, 2, 80, D, device="cuda", dtype=dtype) for _ in range(2))
    w = 0.1 * torch.randn(4, cq, ck, device="cuda")
    for n in (1, 4):
        try:
            o = mta.conv_decode_attention(q, k, v, w, num_queries=n, cache_seqlens=torch.tensor([50, 80], dtype=torch.int32))
            torch.cuda.synchronize()
            r = "ok"
        except Exception as e:
            r = f"{type(e).__name__}: {str(e)[:90]}"
        if r != "ok" or n == 1:
            print(dtype, D, cq, ck, n, r, flush=True)
