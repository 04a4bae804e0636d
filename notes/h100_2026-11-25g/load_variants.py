"""decode_attention's split kernel with variants of its key and value loads (bf16, Nq = 1), at the shapes where SDPA
led in figures/bench_decode.json: base; `evict` (K and V loads evict-first: streamed once, kept out of L2);
`rowk` (K loaded as [keys, d] rows and transposed in registers, as V); both. Split counts and tiles beside.
The variants are source patches of mta/decode_kernels.py written to a temporary module; the package is unchanged."""
import importlib.util
import json
import pathlib
import sys
import tempfile
import torch
import torch.nn.functional as F
import mta
import mta.decode as dec
from mta.bench.timing import time_ms

SRC = pathlib.Path(mta.__file__).with_name("decode_kernels.py").read_text()
K_OLD = """        kt = tl.load(k_base + window[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                     mask=d_ok[:, None] & ((window >= 0) & (window < key_stop))[None, :], other=0.0)"""
K_ROW = """        kt = tl.trans(tl.load(k_base + window[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                     mask=d_ok[None, :] & ((window >= 0) & (window < key_stop))[:, None], other=0.0EVICT))"""
V_OLD = "mask=own[:, None] & d_ok[None, :], other=0.0)"
assert K_OLD in SRC and SRC.count(V_OLD) == 1


def variant(name):
    src = SRC.replace("from .kernel_parts import", "from mta.kernel_parts import")
    ev = ', eviction_policy="evict_first"' if "evict" in name else ""
    if "rowk" in name:
        src = src.replace(K_OLD, K_ROW.replace("EVICT", ev))
    else:
        src = src.replace(K_OLD, K_OLD.replace("other=0.0)", f"other=0.0{ev})"))
    src = src.replace(V_OLD, V_OLD.replace("other=0.0)", f"other=0.0{ev})"))
    path = pathlib.Path(tempfile.mkdtemp()) / f"dk_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"dk_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.decode_split_kernel


dev = torch.device("cuda")
kernels = {n: variant(n) for n in ("base", "evict", "rowk", "evict_rowk")}
orig_kernel, orig_tile = dec.decode_split_kernel, dec.decode_tile
rows = []
for B, Hq, Hkv, D, N in ((8, 8, 8, 64, 65536), (8, 8, 8, 64, 131072), (8, 32, 8, 128, 32768), (16, 8, 8, 64, 65536)):
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    nb = 2 * k.numel() * 2
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != Hkv)
    res = []
    for rnd in range(2):
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv), warmup=5, rep=40)
        res.append(("sdpa", rnd, None, None, ms))
    for name, kern in kernels.items():
        dec.decode_split_kernel = kern
        for tile in ((128, 4, 3), (128, 4, 4), (256, 4, 2), (128, 8, 3)):
            if D == 128:
                tile = (tile[0] // 2,) + tile[1:]
            dec.decode_tile = lambda bd, dt, tile=tile: tile
            for s in ((1, 2) if B * Hkv >= 128 else (2, 3, 4, 8)):
                fn = lambda s=s: mta.decode_attention(q, k, v, num_splits=s)
                try:
                    err = ((fn().float() - ref).norm() / ref.norm()).item()
                    assert err < 2e-2, err
                    for rnd in range(2):
                        res.append((name, rnd, tile, s, time_ms(fn, warmup=5, rep=40)))
                except Exception as e:
                    print(name, tile, s, type(e).__name__, str(e)[:160], flush=True)
    dec.decode_split_kernel, dec.decode_tile = orig_kernel, orig_tile
    sd = min(r[4] for r in res if r[0] == "sdpa")
    for name, rnd, tile, s, ms in sorted(res, key=lambda r: r[4]):
        rows.append(dict(B=B, Hq=Hq, Hkv=Hkv, D=D, N=N, variant=name, round=rnd, tile=tile, splits=s, us=ms * 1e3,
                         tbs=nb / ms / 1e9))
    print(f"--- B{B} Hq{Hq} Hkv{Hkv} d{D} N{N}: SDPA best {sd * 1e3:.1f} us")
    for name, rnd, tile, s, ms in sorted(res, key=lambda r: r[4])[:14]:
        print(f"{name:11s} r{rnd} {str(tile):15s} s={s} {ms * 1e3:7.1f} us {nb / ms / 1e9:.3f} TB/s {sd / ms:.4f}x sdpa",
              flush=True)
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)
