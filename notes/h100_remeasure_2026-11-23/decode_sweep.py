"""Decode split-count and tile sweep (bf16, Nq=1), timed as `python -m mta.bench decode` times."""
import json, os, sys, statistics
import torch
import mta, mta.decode as dec
from mta.bench.decode import DecodeShape, random_inputs, sdpa
from mta.bench.timing import time_ms

dev = torch.device("cuda")
sms = dec.sm_count(dev)
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
variants64 = [(128, 4, 3), (128, 4, 4), (64, 4, 4), (256, 8, 3), (128, 8, 3)]
variants128 = [(64, 4, 3), (64, 4, 4), (128, 8, 3), (128, 4, 2), (32, 4, 4)]
orig = dict(dec.TILES)
for B in (1, 8):
    for (H, Hkv, D) in ((8, 8, 64), (32, 8, 128)):
        for N in (4096, 16384, 32768, 131072):
            s = DecodeShape("bfloat16", B, H, Hkv, D, N)
            x = random_inputs(s, dev)
            t_sdpa = time_ms(lambda: sdpa(x), rep=50)
            t_read = time_ms(lambda: (x["k"].sum(), x["v"].sum()), rep=50)
            tiles = variants64 if D == 64 else variants128
            rows = {}
            for tile in tiles:
                dec.TILES[D] = tile
                rule = dec.choose_num_splits(B * Hkv, N, tile[0], sms)
                for mult in (1, 2, 4):
                    ns = max(1, rule * mult)
                    t = time_ms(lambda: mta.decode_attention(x["q"], x["k"], x["v"], num_splits=ns), rep=50)
                    rows[f"{tile}x{mult}(s={ns})"] = t
            dec.TILES.clear(); dec.TILES.update(orig)
            t_def = time_ms(lambda: mta.decode_attention(x["q"], x["k"], x["v"]), rep=50)
            best = min(rows, key=rows.get)
            print(f"B={B} H={H}/{Hkv} D={D} N={N}: sdpa {t_sdpa*1e3:.1f} read {t_read*1e3:.1f} default {t_def*1e3:.1f} "
                  f"(sdpa/def {t_sdpa/t_def:.3f}) best {best} {rows[best]*1e3:.1f} (sdpa/best {t_sdpa/rows[best]:.3f})",
                  flush=True)
            out["rows"].append({"B": B, "H": H, "Hkv": Hkv, "D": D, "N": N, "sdpa": t_sdpa, "read": t_read,
                                "default": t_def, "variants": rows})
            del x
            torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_sweep.json"), "w"), indent=1)
