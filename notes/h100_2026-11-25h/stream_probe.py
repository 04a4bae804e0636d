"""Plain decode's even deal (`mta.decode_kernels.decode_stream_kernel`) against one program a unit (`num_splits=1`)
and SDPA, where batch x kv heads passes the SMs: batches 17-40 on 8 kv heads. `STREAM_PROGRAMS_PER_SM` 1, 2 and 3.
Checked against SDPA in fp32 first. Event timing (L2 flushed), best of two rounds; bf16, Nq = 1."""
import json
import sys
import torch
import torch.nn.functional as F
import mta
from mta import decode
from mta.bench.timing import time_ms

dev = torch.device("cuda")
rows = []
for Hq, D, N, batches in ((8, 64, 32768, (16, 17, 20, 24, 28, 32, 33, 40)), (8, 64, 8192, (17, 20, 24, 40)),
                          (8, 64, 2048, (20, 24)), (32, 128, 16384, (17, 20, 24, 28, 40)), (8, 128, 32768, (20,))):
    for B in batches:
        q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, 8, N, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, 8, N, D, device=dev, dtype=torch.bfloat16)
        lens = torch.randint(N // 2, N + 1, (B,), device=dev, dtype=torch.int32)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != 8)
        line = {}
        for per_sm in (1, 2, 3):
            decode.STREAM_PROGRAMS_PER_SM = per_sm
            decode.stream_programs.cache_clear()
            fn = lambda: mta.decode_attention(q, k, v)
            err = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
            assert err < 2e-2, (B, err)
            ragged = mta.decode_attention(q, k, v, cache_seqlens=lens)
            want = torch.cat([F.scaled_dot_product_attention(q[b:b+1].float(), k[b:b+1, :, :n].float(),
                              v[b:b+1, :, :n].float(), enable_gqa=Hq != 8) for b, n in enumerate(lens.tolist())])
            rerr = ((ragged.float() - want).abs().max() / want.abs().max()).item()
            assert rerr < 2e-2, (B, rerr)
            assert torch.equal(fn(), fn())
            line[f"deal{per_sm}"] = min(time_ms(fn, warmup=5, rep=30), time_ms(fn, warmup=2, rep=30)) * 1e3
        decode.STREAM_PROGRAMS_PER_SM = 2
        decode.stream_programs.cache_clear()
        for name, fn in (("split1", lambda: mta.decode_attention(q, k, v, num_splits=1)),
                         ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != 8))):
            line[name] = min(time_ms(fn, warmup=5, rep=30), time_ms(fn, warmup=2, rep=30)) * 1e3
        rows.append(dict(B=B, Hq=Hq, Hkv=8, D=D, N=N, us=line, err=err, ragged_err=rerr))
        print(f"B {B:2d} ({B * 8} units) Hq {Hq} d {D} N {N}: " + " ".join(f"{k}:{v:.1f}" for k, v in line.items())
              + f"  deal2/sdpa {line['deal2'] / line['sdpa']:.3f} split1/sdpa {line['split1'] / line['sdpa']:.3f}"
              f" err {err:.1e} {rerr:.1e}", flush=True)
        del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)
