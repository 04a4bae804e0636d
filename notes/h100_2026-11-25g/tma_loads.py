"""decode_attention's split kernel with K and V read by TMA (descriptors made in the kernel, bounded by the split's
last key, so nothing past it is read) against the shipped pointer loads. bf16, Nq = 1, plain decode only (ck = 1).
Source patch of mta/decode_kernels.py in a temporary module; the package is unchanged."""
import importlib.util
import json
import pathlib
import sys
import tempfile
import torch
import torch.nn.functional as F
import triton
import mta
import mta.decode as dec
from mta.bench.timing import time_ms

SRC = pathlib.Path(mta.__file__).with_name("decode_kernels.py").read_text()
K_OLD = """        kt = tl.load(k_base + window[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                     mask=d_ok[:, None] & ((window >= 0) & (window < key_stop))[None, :], other=0.0)"""
K_NEW = """        kt = tl.trans(k_desc.load([start_n, 0]))"""
V_OLD = """        v = tl.load(v_base + j[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=own[:, None] & d_ok[None, :], other=0.0)"""
V_NEW = """        v = v_desc.load([start_n, 0])"""
LOOP = "    for start_n in range(start, stop, OWN):\n"
DESC = """    BLOCK_D: tl.constexpr = offs_d.shape[0]
    k_desc = tl.make_tensor_descriptor(k_base, shape=[stop, D], strides=[stride_kn, 1], block_shape=[BLOCK_N, BLOCK_D])
    v_desc = tl.make_tensor_descriptor(v_base, shape=[stop, D], strides=[stride_vn, 1], block_shape=[BLOCK_N, BLOCK_D])
"""
for s in (K_OLD, V_OLD, LOOP):
    assert SRC.count(s) == 1, s


def load(name, src):
    src = src.replace("from .kernel_parts import", "from mta.kernel_parts import")
    path = pathlib.Path(tempfile.mkdtemp()) / f"dk_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"dk_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.decode_split_kernel


triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
kernels = {"base": dec.decode_split_kernel,
           "tma": load("tma", SRC.replace(K_OLD, K_NEW).replace(V_OLD, V_NEW).replace(LOOP, DESC + LOOP))}
dev = torch.device("cuda")
orig_tile = dec.decode_tile
rows = []
for B, Hq, Hkv, D, N in ((8, 8, 8, 64, 65536), (8, 8, 8, 64, 131072), (8, 32, 8, 128, 32768), (16, 8, 8, 64, 65536),
                         (1, 8, 8, 64, 16384), (1, 32, 8, 128, 65536)):
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    nb = 2 * k.numel() * 2
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != Hkv)
    base_tile = orig_tile(D, torch.bfloat16)
    tiles = [base_tile, base_tile[:2] + (4,), (base_tile[0] * 2, base_tile[1], 2), (base_tile[0] * 2, 8, 3)]
    for rnd in range(2):
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv), warmup=5, rep=40)
        rows.append(dict(B=B, Hq=Hq, D=D, N=N, impl="sdpa", round=rnd, us=ms * 1e3))
        print(f"B{B} Hq{Hq} d{D} N{N} sdpa r{rnd} {ms * 1e3:.1f} us {nb / ms / 1e9:.3f} TB/s", flush=True)
        for name, kern in kernels.items():
            dec.decode_split_kernel = kern
            for tile in tiles if name == "tma" else tiles[:1]:
                dec.decode_tile = lambda bd, dt, tile=tile: tile
                fn = lambda: mta.decode_attention(q, k, v)
                try:
                    if rnd == 0:
                        err = ((fn().float() - ref).norm() / ref.norm()).item()
                        assert err < 2e-2, err
                    ms = time_ms(fn, warmup=5, rep=40)
                except Exception as e:
                    print(name, tile, type(e).__name__, str(e)[:200], flush=True)
                    continue
                rows.append(dict(B=B, Hq=Hq, D=D, N=N, impl=name, tile=tile, round=rnd, us=ms * 1e3))
                print(f"B{B} Hq{Hq} d{D} N{N} {name} {tile} r{rnd} {ms * 1e3:.1f} us {nb / ms / 1e9:.3f} TB/s",
                      flush=True)
        dec.decode_tile = orig_tile
        dec.decode_split_kernel = kernels["base"]
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)
