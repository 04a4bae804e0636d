"""Decode: separate merge kernel vs fused (last program merges) vs fused + evict_first; vs SDPA (bf16, Nq=1)."""
import json, os
import torch
import mta, mta.decode as dec
from mta.bench.decode import DecodeShape, random_inputs, sdpa, last_rows_reference
from mta.bench.timing import time_ms

dev = torch.device("cuda")
VARIANTS = {"sep": (False, False), "pdl": (False, True), "fused": (True, False)}

def setv(name):
    dec.FUSED_MERGE, dec.PDL_MERGE = VARIANTS[name]

# CUDA graphs: each variant captured, replayed, against eager
x = random_inputs(DecodeShape("bfloat16", 2, 32, 8, 128, 5000), dev)
for name in VARIANTS:
    setv(name)
    eager = mta.decode_attention(x["q"], x["k"], x["v"], cache_seqlens=torch.tensor([5000, 3001], dtype=torch.int32))
    ceager = mta.conv_decode_attention(x["q_cache"], x["k"], x["v"], x["weight"], cache_seqlens=torch.tensor([5000, 3001], dtype=torch.int32))
    lens = torch.tensor([5000, 3001], dtype=torch.int32, device=dev)
    g = torch.cuda.CUDAGraph()
    s_ = torch.cuda.Stream()
    s_.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s_):
        for _ in range(2):
            mta.decode_attention(x["q"], x["k"], x["v"], cache_seqlens=lens)
    torch.cuda.current_stream().wait_stream(s_)
    with torch.cuda.graph(g):
        o = mta.decode_attention(x["q"], x["k"], x["v"], cache_seqlens=lens)
        oc = mta.conv_decode_attention(x["q_cache"], x["k"], x["v"], x["weight"], cache_seqlens=lens)
    ok = []
    for _ in range(3):
        g.replay(); torch.cuda.synchronize()
        ok.append(bool(torch.equal(o, eager)) and bool(torch.equal(oc, ceager)))
        ok.append(bool(torch.equal(mta.decode_attention(x["q"], x["k"], x["v"], cache_seqlens=lens), eager)))
    print("graph", name, ok, flush=True)
del x
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for B in (1, 8):
    for (H, Hkv, D) in ((8, 8, 64), (32, 8, 128)):
        for N in (4096, 8192, 16384, 32768, 65536, 131072):
            s = DecodeShape("bfloat16", B, H, Hkv, D, N)
            x = random_inputs(s, dev)
            ref = torch.nn.functional.scaled_dot_product_attention(
                x["q"].float(), x["k"].float(), x["v"].float(), enable_gqa=True)
            times = {"sdpa": [], **{k: [] for k in VARIANTS}, **{"conv_" + k: [] for k in VARIANTS}}
            errs = {}
            for rnd in range(2):
                times["sdpa"].append(time_ms(lambda: sdpa(x), rep=40))
                for name in VARIANTS:
                    setv(name)
                    f = lambda: mta.decode_attention(x["q"], x["k"], x["v"])
                    if rnd == 0:
                        a, b = f(), f()
                        errs[name] = ((a.float() - ref).norm() / ref.norm()).item()
                        errs[name + "_bitwise_repeat"] = bool(torch.equal(a, b))
                    times[name].append(time_ms(f, rep=40))
                for name in VARIANTS:
                    setv(name)
                    f = lambda: mta.conv_decode_attention(x["q_cache"], x["k"], x["v"], x["weight"])
                    if rnd == 0:
                        errs["conv_" + name] = f()
                    times["conv_" + name].append(time_ms(f, rep=40))
            for name in ("pdl", "fused"):
                errs[f"conv_{name}_vs_sep"] = ((errs.pop("conv_" + name).float() - errs["conv_sep"].float()).norm()
                                               / errs["conv_sep"].float().norm()).item()
            errs.pop("conv_sep")
            med = {k: min(v) * 1e3 for k, v in times.items()}
            print(f"B={B} H={H}/{Hkv} D={D} N={N}: " + " ".join(f"{k} {v:.1f}" for k, v in med.items())
                  + f" | sdpa/sep {med['sdpa']/med['sep']:.3f} sdpa/pdl {med['sdpa']/med['pdl']:.3f} sdpa/fused {med['sdpa']/med['fused']:.3f}"
                  f" conv sep/pdl {med['conv_sep']/med['conv_pdl']:.3f} conv sep/fused {med['conv_sep']/med['conv_fused']:.3f}"
                  f" | max err {max(v for k, v in errs.items() if not k.endswith('repeat') and 'conv' not in k):.4f}"
                  f" conv vs sep {max(v for k, v in errs.items() if 'conv' in k):.1e}"
                  f" repeat-bitwise {all(v for k, v in errs.items() if k.endswith('repeat'))}", flush=True)
            out["rows"].append({"B": B, "H": H, "Hkv": Hkv, "D": D, "N": N, "times_us": times, "errs": errs})
            del x
            torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "fused_merge.json"), "w"), indent=1)
