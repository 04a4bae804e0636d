"""GPU probe of conv_forward_kernel: time tile candidates at N = 8192, check each against the reference.

    PROBE_SHAPES='[(H, D, cq, ck, [(BLOCK_M, BLOCK_N, warps, stages), ...], [(variant, causal), ...])]' \
        PYTHONPATH=. python tools/probe_conv.py

``variant`` is "mta" (the package's kernel) or the name of an importable module
holding a modified copy of ``mta/conv_forward.py`` (e.g. one that skips putting the
diagonals in, to see what that costs; its "err" is then meaningless).
Prints flash's causal time, the pre-pass times (fold, diagonal scores), and per candidate the kernel
time, the ratio (kernel + pre-passes) / flash and the error against a float64 reference
(2 heads, N = 2048). Raw outputs of the runs behind tuning.CONV_FORWARD are in
notes/h200_conv_probe.txt.
"""
import importlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import mta
from mta.conv import diagonal_scores, fold_keys, launch_conv_forward
from mta.bench.timing import time_ms

def launch(kernel, q, k, v, w, kf, cd, causal, cfg):
    """The kernel alone (the pre-passes' ``kf`` and ``cd`` are given), heuristics applied, no autotuning;
    TMA descriptors where mta.conv.stream_descriptors makes them, boxes fitted to ``cfg``."""
    bm, bn, warps, stages = cfg
    return launch_conv_forward(q, v, kf, cd, tuple(w.shape[1:]), causal, q.shape[-1] ** -0.5, kernel=kernel.fn,
                               BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)[0]

def main():
    torch.manual_seed(0)
    for (H, D, cq, ck, cfgs, variants) in eval(os.environ["PROBE_SHAPES"]):
        N = 8192
        q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        w = torch.randn(H, cq, ck, device="cuda") * 0.2
        t_flash = time_ms(lambda: mta.flash_attention(q, k, v, causal=True))
        t_fold = time_ms(lambda: fold_keys(k, w, H))
        t_diag = time_ms(lambda: diagonal_scores(q, k, w))
        t_pre = t_fold + t_diag
        kf = fold_keys(k, w, H)
        cd = diagonal_scores(q, k, w)
        n2 = 2048
        qs, ks, vs = (x[:, :2, :n2].contiguous() for x in (q, k, v))
        ws = w[:2].contiguous()
        ref = mta.conv_attention_reference(qs.double(), ks.double(), vs.double(), ws.double(), causal=True)
        kfs = fold_keys(ks, ws, 2)
        cds = diagonal_scores(qs, ks, ws)
        kf_ref = mta.conv.fold_keys(ks.float(), ws, 2)
        print(f"H={H} D={D} {cq}x{ck} N={N}: flash {t_flash:.3f} ms, fold {t_fold:.3f} ms, diagonal scores {t_diag:.3f} ms "
              f"(fold err {((kfs.float()-kf_ref).norm()/kf_ref.norm()).item():.1e})", flush=True)
        for variant, causal in variants:
            kernel = (importlib.import_module(variant) if variant != "mta" else mta.conv_forward).conv_forward_kernel
            for cfg in cfgs:
                try:
                    t0 = time.time()
                    o = launch(kernel, qs, ks, vs, ws, kfs, cds, True, cfg)
                    err = ((o.double() - ref).norm() / ref.norm()).item()
                    comp = time.time() - t0
                    t = time_ms(lambda: launch(kernel, q, k, v, w, kf, cd, causal, cfg), warmup=3, rep=10)
                    print(f"  {variant:20} causal={causal!s:5} cfg {cfg}: {t:.3f} ms (+pre-passes {(t+t_pre)/t_flash:.2f}x flash) "
                          f"err {err:.1e} compile {comp:.1f}s", flush=True)
                except Exception as e:
                    print(f"  {variant:20} cfg {cfg}: FAILED {type(e).__name__}: {str(e)[:100]}", flush=True)

main()
