"""H100: mta.decode_attention over dtypes, head dims, new queries (1, 16) and GQA groups (1, 8): does every launch
fit, and does it match the float64 reference rows? PYTHONPATH=. python notes/h100_remeasure_2026-11-24/decode_grid.py"""
import itertools

import torch

import mta

torch.manual_seed(0)
for dtype, D, nq, group in itertools.product((torch.float32, torch.bfloat16, torch.float16), (16, 64, 96, 128, 256),
                                             (1, 16), (1, 8)):
    hkv = 2
    q = torch.randn(2, hkv * group, nq, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(2, hkv, 300, D, device="cuda", dtype=dtype) for _ in range(2))
    lens = torch.tensor([40, 300], dtype=torch.int32)
    try:
        o = mta.decode_attention(q, k, v, cache_seqlens=lens)
        ref = torch.cat([mta.flash_attention(q[b:b + 1].double().float(), k[b:b + 1, :, :L].float(),
                                             v[b:b + 1, :, :L].float(), causal=True) for b, L in enumerate([40, 300])])
        err = ((o.float() - ref).norm() / ref.norm()).item()
        r = f"ok rel err {err:.1e}"
    except Exception as e:  # noqa: BLE001
        r = f"{type(e).__name__}: {str(e)[:100]}"
    print(dtype, D, nq, group, r, flush=True)
