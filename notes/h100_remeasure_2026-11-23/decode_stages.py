"""Decode tiles (BLOCK_N, warps, stages) with the PDL merge, bf16, Nq=1, vs SDPA; two interleaved rounds, min of medians."""
import json, os
import torch
import mta, mta.decode as dec
from mta.bench.decode import DecodeShape, random_inputs, sdpa
from mta.bench.timing import time_ms

dev = torch.device("cuda")
VARS = {64: [(128, 4, 3), (128, 4, 4), (128, 4, 5), (256, 8, 3)], 128: [(64, 4, 3), (64, 4, 4), (64, 4, 5), (128, 8, 3)]}
dec.FUSED_MERGE, dec.PDL_MERGE = False, True
orig = dict(dec.TILES)
out = []
for B in (1, 8):
    for (H, Hkv, D) in ((8, 8, 64), (32, 8, 128)):
        for N in (4096, 16384, 32768, 131072):
            x = random_inputs(DecodeShape("bfloat16", B, H, Hkv, D, N), dev)
            t = {"sdpa": []}
            for rnd in range(2):
                t["sdpa"].append(time_ms(lambda: sdpa(x), rep=40))
                for tile in VARS[D]:
                    dec.TILES[D] = tile
                    t.setdefault(str(tile), []).append(time_ms(lambda: mta.decode_attention(x["q"], x["k"], x["v"]), rep=40))
                    dec.TILES.update(orig)
            med = {k: min(v) * 1e3 for k, v in t.items()}
            print(f"B={B} D={D} N={N}: " + " ".join(f"{k} {v:.1f} ({med['sdpa'] / v:.3f})" for k, v in med.items()), flush=True)
            out.append({"B": B, "H": H, "Hkv": Hkv, "D": D, "N": N, "us": med})
            del x
            torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_stages.json"), "w"), indent=1)
