"""Plain decode at the B = 8 shapes where SDPA led the committed run by 0.2-1.1%: cache hints on the streamed K and V
loads, and the grid walked heads-first, each beside the shipped kernel and SDPA (as the bench times them; three
interleaved rounds, the smallest median counts). Variants are patched copies of mta/decode_kernels.py.

    PYTHONPATH=. OUT=. python notes/h100_2026-11-24h/decode_load_hints.py
"""
import importlib
import json
import os
from pathlib import Path

import torch

import mta
import mta.decode
from mta.bench.decode import DecodeShape, random_inputs, sdpa
from mta.bench.timing import time_ms

SRC = Path(mta.__file__).parent / "decode_kernels.py"
K_LOAD = "mask=d_ok[:, None] & ((window >= 0) & (window < key_stop))[None, :], other=0.0)"
V_LOAD = "mask=own[:, None] & d_ok[None, :], other=0.0)"
PIDS = ("    split = tl.program_id(0)\n    b = tl.program_id(1) // num_kv_heads\n"
        "    kv_h = tl.program_id(1) % num_kv_heads\n")
HEADS_FIRST = ("    slot = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)\n"
               "    split = slot // tl.num_programs(1)\n    b = slot % tl.num_programs(1) // num_kv_heads\n"
               "    kv_h = slot % tl.num_programs(1) % num_kv_heads\n")


def variant(name, pairs):
    text = SRC.read_text()
    for old, new in pairs:
        assert text.count(old) == 1, (name, old)
        text = text.replace(old, new)
    (SRC.parent / f"_probe_{name}.py").write_text(text)
    return importlib.import_module(f"mta._probe_{name}").decode_split_kernel


hint = lambda load, h: (load, load[:-1] + f", {h})")
KERNELS = {
    "shipped": mta.decode.decode_split_kernel,
    "evict_first": variant("evict_first", [hint(K_LOAD, 'eviction_policy="evict_first"'),
                                           hint(V_LOAD, 'eviction_policy="evict_first"')]),
    "cg": variant("cg", [hint(K_LOAD, 'cache_modifier=".cg"'), hint(V_LOAD, 'cache_modifier=".cg"')]),
    "heads_first": variant("heads_first", [(PIDS, HEADS_FIRST)]),
}
dev = torch.device("cuda")
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for (B, H, Hkv, D, N) in ((8, 8, 8, 64, 65536), (8, 8, 8, 64, 131072), (8, 32, 8, 128, 32768),
                          (8, 32, 8, 128, 131072), (1, 8, 8, 64, 16384), (1, 32, 8, 128, 65536)):
    x = random_inputs(DecodeShape("bfloat16", B, H, Hkv, D, N), dev)
    want = sdpa({k: (t.float() if t.is_floating_point() and k != "weight" else t) for k, t in x.items()})
    fns = {"sdpa": lambda: sdpa(x)}
    for name, kernel in KERNELS.items():
        def run(kernel=kernel):
            mta.decode.decode_split_kernel = kernel
            return mta.decode_attention(x["q"], x["k"], x["v"])
        err = ((run().float() - want).norm() / want.norm()).item()
        assert err < 2e-2, (name, err)
        fns[name] = run
    ms = {}
    for rnd in range(3):
        for name, fn in fns.items():
            t = time_ms(fn, rep=40)
            ms[name] = min(ms.get(name, t), t)
    mta.decode.decode_split_kernel = KERNELS["shipped"]
    print(B, H, Hkv, D, N, {k: round(v * 1e3, 1) for k, v in ms.items()}, flush=True)
    out["rows"].append({"B": B, "H": H, "Hkv": Hkv, "D": D, "N": N, "ms": ms})
    del x
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "decode_load_hints.json"), "w"), indent=1)
