"""Follow-up of load_variants.py: (1) kernel times from torch.profiler (no L2 flush between calls) of our split
kernel and cuDNN's at 16 x 8 heads (ours: one split) and 8 x 8 (two and four splits); (2) a variant whose programs
walk their key tiles from a rotated start (tile (r + k) mod n, r from the program id), so that concurrent programs
do not stream at the same offsets of equally spaced regions. bf16, Nq = 1, d = 64, 64k keys."""
import importlib.util
import json
import pathlib
import sys
import tempfile
import torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
import mta
import mta.decode as dec
from mta.bench.timing import time_ms

SRC = pathlib.Path(mta.__file__).with_name("decode_kernels.py").read_text()
LOOP = "    for start_n in range(start, stop, OWN):\n"
ROT = """    n_tiles = tl.maximum(tl.cdiv(stop - start, OWN), 1)
    rot = ((tl.program_id(0) * 5 + tl.program_id(1) * 3) * MULT) % n_tiles
    for step in range(start, stop, OWN):
        kk = (step - start) // OWN + rot
        kk = tl.where(kk >= n_tiles, kk - n_tiles, kk)
        start_n = start + kk * OWN
"""
assert SRC.count(LOOP) == 1


def variant(name, mult):
    src = SRC.replace("from .kernel_parts import", "from mta.kernel_parts import").replace(LOOP, ROT.replace("MULT", str(mult)))
    path = pathlib.Path(tempfile.mkdtemp()) / f"dk_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"dk_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.decode_split_kernel


dev = torch.device("cuda")
base = dec.decode_split_kernel
kernels = {"base": base, "rot1": variant("rot1", 1), "rot7": variant("rot7", 7), "rot31": variant("rot31", 31)}
out = dict(gpu=torch.cuda.get_device_name(), profiler={}, timed=[])


def inputs(B, H, N=65536, D=64):
    return [torch.randn(B, H, n, D, device=dev, dtype=torch.bfloat16) for n in (1, N, N)]


for B, H, splits in ((16, 8, (1,)), (8, 8, (2, 4))):
    q, k, v = inputs(B, H)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    for s in splits:
        for name, kern in kernels.items():
            dec.decode_split_kernel = kern
            o = mta.decode_attention(q, k, v, num_splits=s)
            err = ((o.float() - ref).norm() / ref.norm()).item()
            assert err < 2e-2, (name, err)
            for _ in range(3):
                mta.decode_attention(q, k, v, num_splits=s)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    mta.decode_attention(q, k, v, num_splits=s)
                torch.cuda.synchronize()
            t = {e.key: e.device_time for e in prof.key_averages()}
            out["profiler"][f"{B}x{H} s={s} {name}"] = t
            print(f"profiler {B}x{H} s={s} {name}: " + ", ".join(f"{kk} {vv:.1f} us" for kk, vv in t.items()), flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            F.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
    t = {e.key[:40]: e.device_time for e in prof.key_averages()}
    out["profiler"][f"{B}x{H} sdpa"] = t
    print(f"profiler {B}x{H} sdpa: " + ", ".join(f"{kk} {vv:.1f} us" for kk, vv in t.items()), flush=True)
    nb = 2 * k.numel() * 2
    for rnd in range(3):
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v), warmup=5, rep=40)
        out["timed"].append(dict(B=B, H=H, impl="sdpa", round=rnd, us=ms * 1e3))
        print(f"timed {B}x{H} sdpa r{rnd} {ms * 1e3:.1f} us {nb / ms / 1e9:.3f} TB/s", flush=True)
        for s in splits:
            for name, kern in kernels.items():
                dec.decode_split_kernel = kern
                ms = time_ms(lambda: mta.decode_attention(q, k, v, num_splits=s), warmup=5, rep=40)
                out["timed"].append(dict(B=B, H=H, impl=name, splits=s, round=rnd, us=ms * 1e3))
                print(f"timed {B}x{H} {name} s={s} r{rnd} {ms * 1e3:.1f} us {nb / ms / 1e9:.3f} TB/s", flush=True)
    dec.decode_split_kernel = base
    del q, k, v
json.dump(out, open(sys.argv[1], "w"), indent=1)
