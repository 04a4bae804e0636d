"""Conv decode at the package's defaults vs split counts around the rule (6x11, bf16, Nq=1)."""
import json, os
import torch
import mta, mta.decode as dec
from mta.bench.decode import DecodeShape, random_inputs
from mta.bench.timing import time_ms
dev = torch.device("cuda")
sms = dec.sm_count(dev)
rows = []
for B, H, Hkv, D in [(1, 8, 8, 64), (8, 8, 8, 64), (1, 32, 8, 128), (8, 32, 8, 128)]:
    for N in (4096, 16384, 65536, 131072):
        x = random_inputs(DecodeShape("bfloat16", B, H, Hkv, D, N), dev)
        f_dec = lambda: mta.decode_attention(x["q"], x["k"], x["v"])
        t_dec = time_ms(f_dec, rep=50)
        t_read = time_ms(lambda: (x["k"].sum(), x["v"].sum()), rep=50)
        t_sdpa = time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(x["q"], x["k"], x["v"], enable_gqa=H != Hkv), rep=50)
        block_n = max(dec.decode_tile(D, torch.bfloat16)[0], 32)
        rule = dec.choose_num_splits(B * Hkv, N, block_n - 10, sms * dec.MTA_PROGRAMS_PER_SM)
        line = dict(B=B, H=H, Hkv=Hkv, D=D, N=N, decode=t_dec, read=t_read, sdpa=t_sdpa, rule=rule, conv={})
        for ns in sorted({None, max(1, rule // 2), rule * 2, rule * 4}, key=lambda v: -1 if v is None else v):
            f = lambda: mta.conv_decode_attention(x["q_cache"], x["k"], x["v"], x["weight"], num_splits=ns)
            t = time_ms(f, rep=50)
            line["conv"][str(ns)] = t
            print(f"B={B} H={H}/{Hkv} D={D} N={N:6d} splits={str(ns):5s} conv {t*1e3:7.1f} us  /decode {t/t_dec:5.2f}  "
                  f"read/conv {t_read/t:5.2f}", flush=True)
        print(f"B={B} H={H}/{Hkv} D={D} N={N:6d} rule={rule} decode {t_dec*1e3:.1f} us read {t_read*1e3:.1f} sdpa {t_sdpa*1e3:.1f} "
              f"read/decode {t_read/t_dec:.2f} sdpa/decode {t_sdpa/t_dec:.3f}", flush=True)
        rows.append(line)
        del x; torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ["OUT"], "exp13b.json"), "w"), indent=1)
