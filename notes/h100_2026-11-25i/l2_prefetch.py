# python notes/h100_2026-11-25i/l2_prefetch.py OUT.json   (GPU; from the repository root)
# python notes/h100_2026-11-25i/l2_prefetch.py --compile   (no GPU: sm_90 offline build of every variant)
"""Does a bulk L2 prefetch ahead of the pipelined loads raise plain decode's bandwidth at B = 8 on Hopper?

Variant `pfA`: decode_attention's split kernel whose key loop, at each tile, issues
`cp.async.bulk.prefetch.L2.global` (one thread, sm_90) for the K and V rows A tiles ahead (bounded by the
split's last key), so DRAM is asked for them before Triton's cp.async pipeline gets there. The loads themselves
are unchanged. Also a plain streaming read with and without the same prefetch, beside x.sum().
Source patches of mta/decode_kernels.py in a temporary module; the package is unchanged."""
import importlib.util
import json
import os
import pathlib
import sys
import tempfile

COMPILE = "--compile" in sys.argv
if COMPILE:
    os.environ["TRITON_INTERPRET"] = "0"
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import mta
import mta.decode as dec

SRC = pathlib.Path(mta.__file__).with_name("decode_kernels.py").read_text()
K_OLD = """        kt = tl.load(k_base + window[None, :] * stride_kn + offs_d[:, None] * stride_kd,"""
PF = """        if AHEAD > 0:  # probe: K and V rows AHEAD tiles on, into L2 (rows contiguous: stride_kd == 1)
            pf = start_n + AHEAD * OWN
            pf_rows = tl.minimum(tl.maximum(key_stop - pf, 0), BLOCK_N)
            nbytes = (pf_rows * D * 2).to(tl.int32)
            l2_prefetch(k_base + pf * stride_kn, nbytes)
            l2_prefetch(v_base + pf * stride_vn, nbytes)
"""
HELPER = '''

@triton.jit
def l2_prefetch(ptr, nbytes):
    """One thread asks L2 for ``nbytes`` (a multiple of 16, may be 0) from ``ptr`` on (sm_90 bulk prefetch)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p, q; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; setp.gt.s32 q, $2, 0; "
        "and.pred p, p, q; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)

'''
assert SRC.count(K_OLD) == 1


def variant(ahead):
    src = SRC.replace("from .kernel_parts import", "from mta.kernel_parts import")
    src = src.replace(K_OLD, PF + K_OLD).replace("\n\n@triton.jit\ndef _far_tiles", HELPER + "\n@triton.jit\ndef _far_tiles", 1)
    src = src.replace("AHEAD", str(ahead)) if ahead else src.replace(PF, "")
    path = pathlib.Path(tempfile.mkdtemp()) / f"dk_pf{ahead}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"dk_pf{ahead}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@triton.jit
def read_kernel(X, OUT, per_program, BLOCK: tl.constexpr, AHEAD: tl.constexpr):
    """Program p sums X[p * per_program : (p + 1) * per_program] (bf16, per_program a multiple of BLOCK)."""
    p = tl.program_id(0)
    base = X + p.to(tl.int64) * per_program
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, per_program, BLOCK):
        if AHEAD > 0:
            nb = tl.minimum(tl.maximum(per_program - (s + AHEAD * BLOCK), 0), BLOCK) * 2
            tl.inline_asm_elementwise(
                "{ .reg .pred p, q; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; setp.gt.s32 q, $2, 0; "
                "and.pred p, p, q; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r", [base + s + AHEAD * BLOCK, nb.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
        acc += tl.load(base + s + offs).to(tl.float32)
    tl.store(OUT + p, tl.sum(acc))


AHEADS = (0, 2, 4, 8)

if COMPILE:  # offline: does ptxas take the asm?
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    tgt = GPUTarget("cuda", 90, 32)
    src = ASTSource(read_kernel, {"X": "*bf16", "OUT": "*fp32", "per_program": "i32", "BLOCK": "constexpr",
                                  "AHEAD": "constexpr"}, {(3,): 8192, (4,): 4})
    ck = triton.compile(src, target=tgt)
    print("read_kernel ok", "cp.async.bulk.prefetch" in ck.asm["ptx"], ck.metadata.shared)
    for a in AHEADS:
        variant(a)
    print("variants import ok")
    sys.exit(0)

from mta.bench.timing import time_ms  # noqa: E402

dev = torch.device("cuda")
mods = {a: variant(a) for a in AHEADS}
orig_kernel, orig_tile = dec.decode_split_kernel, dec.decode_tile
rows = []

# 1. the plain read: 1 GiB of bf16
x = torch.randn(1 << 29, device=dev, dtype=torch.bfloat16)
nbytes = x.numel() * 2
for rnd in range(2):
    ms = time_ms(lambda: x.sum(), warmup=5, rep=30)
    rows.append(dict(kind="read", impl="x.sum", round=rnd, us=ms * 1e3, tbs=nbytes / ms / 1e9))
    for programs in (132, 264):
        per = x.numel() // programs // 8192 * 8192
        out = torch.empty(programs, device=dev)
        for a in AHEADS:
            for block in (4096, 8192):
                f = lambda: read_kernel[(programs,)](x, out, per, BLOCK=block, AHEAD=a // (block // 4096), num_warps=4,
                                                     num_stages=3)
                ms = time_ms(f, warmup=5, rep=30)
                nb = programs * per * 2
                rows.append(dict(kind="read", impl=f"triton p{programs} b{block} pf{a}", round=rnd, us=ms * 1e3,
                                 tbs=nb / ms / 1e9))
for r in rows:
    print(f"{r['impl']:28s} r{r['round']} {r['us']:8.1f} us {r['tbs']:.3f} TB/s", flush=True)
del x

# 2. decode
for B, Hq, Hkv, D, N in ((8, 8, 8, 64, 32768), (8, 8, 8, 64, 65536), (8, 8, 8, 64, 131072), (8, 32, 8, 128, 32768),
                         (1, 8, 8, 64, 16384), (1, 32, 8, 128, 65536)):
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    nb = 2 * k.numel() * 2
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=Hq != Hkv)
    base_tile = orig_tile(64 if D == 64 else 128, k.dtype, plain=True, device=k.device, n_max=N)
    res = []
    for rnd in range(2):
        res.append(("sdpa", rnd, None, time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv),
                                               warmup=5, rep=40)))
        for a, mod in mods.items():
            dec.decode_split_kernel = mod.decode_split_kernel
            for tile in {base_tile, (base_tile[0], base_tile[1], 2)}:
                if a == 0 and tile[2] == 2:
                    continue
                dec.decode_tile = lambda *args, tile=tile, **kw: tile
                fn = lambda: mta.decode_attention(q, k, v)
                try:
                    if rnd == 0:
                        err = ((fn().float() - ref).norm() / ref.norm()).item()
                        assert err < 2e-2, (a, tile, err)
                    res.append((f"pf{a}", rnd, tile, time_ms(fn, warmup=5, rep=40)))
                except Exception as e:  # noqa: BLE001
                    print("FAILED", a, tile, type(e).__name__, str(e)[:300], flush=True)
        dec.decode_split_kernel, dec.decode_tile = orig_kernel, orig_tile
    sd = min(r[3] for r in res if r[0] == "sdpa")
    print(f"--- B{B} Hq{Hq} Hkv{Hkv} d{D} N{N}: SDPA best {sd * 1e3:.1f} us")
    for name, rnd, tile, ms in sorted(res, key=lambda r: r[3]):
        rows.append(dict(kind="decode", B=B, Hq=Hq, Hkv=Hkv, D=D, N=N, impl=name, round=rnd, tile=tile, us=ms * 1e3,
                         tbs=nb / ms / 1e9))
        print(f"{name:6s} r{rnd} {str(tile):14s} {ms * 1e3:7.1f} us {nb / ms / 1e9:.3f} TB/s {sd / ms:.4f}x sdpa",
              flush=True)
    del q, k, v
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)
