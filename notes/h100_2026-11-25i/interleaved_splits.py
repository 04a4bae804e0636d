# python notes/h100_2026-11-25i/interleaved_splits.py OUT.json   (GPU; from the repository root)
# python notes/h100_2026-11-25i/interleaved_splits.py --check     (CPU interpreter: exact against float64)
"""Plain decode's splits interleaved: split s of S takes key tiles s, s + S, s + 2S, ... of its sequence instead of
one contiguous range, so the S programs of a (batch, kv head) pair read neighbouring tiles at the same time (one
frontier per pair in memory, not S). Against the shipped contiguous splits and SDPA, bf16, Nq = 1, at the rule's
split count and at twice it; event timing, best of two rounds. Source patch of mta/decode_kernels.py in a temporary
module; the package is unchanged."""
import importlib.util
import json
import pathlib
import sys
import tempfile

import torch
import torch.nn.functional as F

import mta
import mta.decode as dec

SRC = pathlib.Path(mta.__file__).with_name("decode_kernels.py").read_text()
head = SRC.index("@triton.jit\ndef _far_tiles")
tail = SRC.index("\n\n\n@triton.jit", head)
FAR = SRC[head:tail]
FAR_STEP = (FAR.replace("def _far_tiles(", "def _far_tiles_step(")
            .replace("ROWS: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):",
                     "ROWS: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, step):")
            .replace("for start_n in range(start, stop, OWN):", "for start_n in range(start, stop, step):"))
assert FAR_STEP.count("step") >= 3, "patch did not apply"
OLD_RANGE = """    per_split = tl.cdiv(tl.cdiv(n_far, OWN), num_splits) * OWN
    start = split * per_split
    stop = tl.minimum(start + per_split, n_far)"""
NEW_RANGE = """    start = split * OWN  # probe: interleaved tiles
    stop = n_far"""
OLD_CALL = """    acc, m, l = _far_tiles(acc, m, l, q, shift, k_base, v_base, stride_kn, stride_kd, stride_vn,
                           stride_vd, i, offs_d, start, stop, seq_len, qk_scale, CK, E, D, ROWS, BLOCK_N,
                           PRECISION)"""
NEW_CALL = """    acc, m, l = _far_tiles_step(acc, m, l, q, shift, k_base, v_base, stride_kn, stride_kd, stride_vn,
                           stride_vd, i, offs_d, start, stop, seq_len, qk_scale, CK, E, D, ROWS, BLOCK_N,
                           PRECISION, num_splits * OWN)"""
assert SRC.count(OLD_RANGE) == 1 and SRC.count(OLD_CALL) == 1


def interleaved():
    src = SRC[:tail] + "\n\n\n" + FAR_STEP + SRC[tail:]
    src = src.replace("from .kernel_parts import", "from mta.kernel_parts import")
    src = src.replace(OLD_RANGE, NEW_RANGE).replace(OLD_CALL, NEW_CALL)
    path = pathlib.Path(tempfile.mkdtemp()) / "dk_interleaved.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("dk_interleaved", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.decode_split_kernel


KERNELS = {"contiguous": dec.decode_split_kernel, "interleaved": interleaved()}

if "--check" in sys.argv:
    torch.manual_seed(0)
    for B, Hq, Hkv, D, N, lens, splits in ((3, 4, 2, 16, 300, [300, 37, 1], 3), (2, 2, 2, 32, 200, [200, 150], 5),
                                           (4, 8, 2, 16, 130, [1, 64, 129, 130], 2)):
        q = torch.randn(B, Hq, 1, D, dtype=torch.float64)
        k = torch.randn(B, Hkv, N, D, dtype=torch.float64)
        v = torch.randn(B, Hkv, N, D, dtype=torch.float64)
        for b, n in enumerate(lens):
            k[b, :, n:] = float("nan")
            v[b, :, n:] = float("nan")
        refs = []
        for b, n in enumerate(lens):
            kk = k[b:b + 1, :, :n].repeat_interleave(Hq // Hkv, 1)
            vv = v[b:b + 1, :, :n].repeat_interleave(Hq // Hkv, 1)
            refs.append(F.scaled_dot_product_attention(q[b:b + 1], kk, vv))
        ref = torch.cat(refs)
        dec.decode_split_kernel = KERNELS["interleaved"]
        out = mta.decode_attention(q.float(), k.float(), v.float(), cache_seqlens=lens, num_splits=splits)
        dec.decode_split_kernel = KERNELS["contiguous"]
        err = ((out.double() - ref).abs().max()).item()
        print(B, Hq, Hkv, D, N, lens, splits, "max err", err)
        assert err < 1e-5
    sys.exit(0)

from mta.bench.timing import time_ms  # noqa: E402

dev = torch.device("cuda")
rows = []
for B, Hq, Hkv, D, N in ((8, 8, 8, 64, 32768), (8, 8, 8, 64, 65536), (8, 8, 8, 64, 131072), (8, 32, 8, 128, 32768),
                         (8, 32, 8, 128, 65536), (1, 8, 8, 64, 16384), (1, 8, 8, 64, 65536), (1, 32, 8, 128, 65536)):
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    nb = 2 * k.numel() * 2
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != Hkv)
    rule = dec.choose_num_splits(B * Hkv, N, dec.decode_tile(D, k.dtype, plain=True, device=k.device, n_max=N)[0],
                                 dec.sm_count(k.device))
    best = {}
    for rnd in range(2):
        best[("sdpa", None)] = min(best.get(("sdpa", None), 9e9), time_ms(
            lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv), warmup=5, rep=40))
        for name, kern in KERNELS.items():
            dec.decode_split_kernel = kern
            for s in sorted({rule, 2 * rule, 4 * rule if B == 8 else rule}):
                fn = lambda s=s: mta.decode_attention(q, k, v, num_splits=s)
                if rnd == 0:
                    err = ((fn().float() - ref).norm() / ref.norm()).item()
                    assert err < 2e-2, (name, s, err)
                best[(name, s)] = min(best.get((name, s), 9e9), time_ms(fn, warmup=5, rep=40))
        dec.decode_split_kernel = KERNELS["contiguous"]
    sd = best[("sdpa", None)]
    print(f"--- B{B} Hq{Hq} d{D} N{N}: SDPA {sd * 1e3:.1f} us, rule's splits {rule}")
    for (name, s), ms in sorted(best.items(), key=lambda r: r[1]):
        rows.append(dict(B=B, Hq=Hq, Hkv=Hkv, D=D, N=N, impl=name, splits=s, us=ms * 1e3, tbs=nb / ms / 1e9))
        print(f"{name:12s} s={s!s:4s} {ms * 1e3:7.1f} us {nb / ms / 1e9:.3f} TB/s {sd / ms:.4f}x sdpa", flush=True)
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)
