# python notes/h200_2026-11-28b/tile_sweep.py OUTDIR [TILES]   (GPU; from the repository root)
"""The two-phase backward (forced) at several phase-1 tiles: forward + backward time (mta.bench.timing, L2
flushed, median of 7), bf16, causal, 6 x 11, B = 1, N = 8192, d = 64 (H = 8) and d = 128 (H = 16); then one
profile per head dim at the first tile, with the copies torch makes and what made them."""
import json
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import mta
from mta import conv_two_phase
from mta.bench.timing import peak_extra_memory_bytes, time_ms

out = sys.argv[1]
TILES = [tuple(int(x) for x in t.split(",")) for t in sys.argv[2].split(";")] if len(sys.argv) > 2 else [
    (128, 128, 8, 3), (128, 64, 8, 3), (64, 128, 8, 3), (64, 64, 4, 3)]
N = 8192
dev = torch.device("cuda")
conv_two_phase.FORCE = True
default_tile = conv_two_phase.phase_one_tile
rows = []


def setup(H, D):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (torch.randn(H, 6, 11, device=dev) * 0.2).requires_grad_()
    do = torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16)

    def run():
        for t in (q, k, v, w):
            t.grad = None
        mta.conv_attention(q, k, v, w, causal=True).backward(do)
    return run, (q, k, v, w)


for H, D in ((8, 64), (16, 128)):
    run, leaves = setup(H, D)
    ref = None
    for tile in TILES:
        conv_two_phase.phase_one_tile = lambda *a, t=tile: dict(BLOCK_M=t[0], BLOCK_N=t[1], num_warps=t[2],
                                                                num_stages=t[3])
        r = dict(D=D, H=H, tile=tile)
        try:
            run()
            g = [t.grad.float() for t in leaves]
            if ref is None:
                ref = g
            r["grad_rel_diff_vs_first"] = [((a - b).norm() / b.norm()).item() for a, b in zip(g, ref)]
            r["ms"] = time_ms(run, warmup=2, rep=7)
            r["peak_mib"] = peak_extra_memory_bytes(run) / 2 ** 20
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(r)
        print(json.dumps(r), flush=True)
    conv_two_phase.phase_one_tile = lambda *a, t=TILES[0]: dict(BLOCK_M=t[0], BLOCK_N=t[1], num_warps=t[2],
                                                                num_stages=t[3])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(3):
            run()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:100]] += ev.device_time_total / 1000 / 3
    print(f"== profile d = {D}, tile {TILES[0]}: {sum(per.values()):.3f} ms of kernels per call")
    for name, ms in sorted(per.items(), key=lambda x: -x[1])[:14]:
        print(f"  {ms:8.3f} ms  {name}")
    seen = set()
    for ev in prof.events():
        if ev.name in ("aten::copy_", "aten::clone", "aten::contiguous") and ev.device_type != torch.autograd.DeviceType.CUDA:
            chain, p = [], ev.cpu_parent
            while p is not None and len(chain) < 6:
                chain.append(p.name)
                p = p.cpu_parent
            key = (ev.name, str(ev.input_shapes), tuple(chain))
            if key not in seen:
                seen.add(key)
                print("  copy:", ev.name, ev.input_shapes, "<-", " <- ".join(chain))
    del leaves, run
    torch.cuda.empty_cache()
conv_two_phase.FORCE = None
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(f"{out}/tile_sweep.json", "w"), indent=1)
