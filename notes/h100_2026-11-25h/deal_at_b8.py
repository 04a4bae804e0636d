"""The even deal forced at the benchmark's B = 8 shapes (64 units: the split rule's two splits otherwise), one and
two programs an SM, against the shipped path and SDPA. Event timing, best of two rounds; bf16, Nq = 1."""
import json
import sys
import torch
import torch.nn.functional as F
import mta
from mta import decode
from mta.launch import cdiv
from mta.bench.timing import time_ms

dev = torch.device("cuda")
shipped = decode.stream_programs


def forced(units, n_max, block_n, sms, per_sm=None):
    total = units * cdiv(n_max, block_n)
    w = cdiv(total, (per_sm or 2) * sms)
    programs = cdiv(total, w)
    return w, programs, min(programs, (cdiv(n_max, block_n) - 1) // w + 2)


rows = []
for Hq, D, N in ((8, 64, 32768), (8, 64, 65536), (8, 64, 131072), (32, 128, 32768), (32, 128, 65536)):
    q = torch.randn(8, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(8, 8, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(8, 8, N, D, device=dev, dtype=torch.bfloat16)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != 8)
    line = {}
    for name, per_sm in (("shipped", None), ("deal1", 1), ("deal2", 2), ("shipped_again", None)):
        decode.stream_programs = shipped if per_sm is None else (lambda *a, _p=per_sm: forced(*a[:4], _p))
        fn = lambda: mta.decode_attention(q, k, v)
        err = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
        assert err < 2e-2, err
        line[name] = min(time_ms(fn, warmup=5, rep=30), time_ms(fn, warmup=2, rep=30)) * 1e3
    decode.stream_programs = shipped
    sd = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != 8)
    line["sdpa"] = min(time_ms(sd, warmup=5, rep=30), time_ms(sd, warmup=2, rep=30)) * 1e3
    rows.append(dict(B=8, Hq=Hq, D=D, N=N, us=line))
    print(f"B 8 Hq {Hq} d {D} N {N}: " + " ".join(f"{k}:{v:.1f}" for k, v in line.items()), flush=True)
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)
