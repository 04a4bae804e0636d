# python notes/h100_2026-11-25i/dq_two_phase.py OUT.json   (GPU; from the repository root)
"""Issue 12, d = 128: would the MTA backward's dQ side be faster in two phases? Phase 1: the shipped
conv_dq_kernel with its Gq products taken out, storing each far dC tile (16-bit) to a scratch instead; phase 2:
Gq = dC Kf for all shifts as one batched GEMM (torch.matmul on the full N x N scratch: no causal skip, so an upper
bound on a fused phase 2's products). Against the shipped kernel's time, bf16, causal, 6 x 11, B = 1, H = 16,
d = 128, N = 8192 (and H = 8, d = 64). Phase 2's Gq is checked against the shipped kernel's. A source patch of
mta/conv_backward.py in a temporary module; the package is unchanged."""
import importlib.util
import json
import pathlib
import sys
import tempfile

import torch

import mta
import mta.launch as ml
from mta.bench.timing import time_ms

SRC = pathlib.Path(mta.__file__).with_name("conv_backward.py").read_text()
REP = [
    ("def _dq_key_tiles(gq_hi, gq_lo, q_hi,", "def _dq_key_tiles(dcs_base, gq_hi, gq_lo, q_hi,"),
    ("""        gq_hi = tl.dot(dc, tl.trans(kf_hi), gq_hi, input_precision=PRECISION)
        if QB > 0:
            gq_lo = tl.dot(dc, tl.trans(kf_lo), gq_lo, input_precision=PRECISION)""",
     """        tl.store(dcs_base + offs_m[:, None].to(tl.int64) * n + offs_k[None, :], dc,
                 mask=(offs_m < n)[:, None] & (offs_k < n)[None, :])"""),
    ("def conv_dq_kernel(Q, KF,", "def conv_dq_kernel(DCS, Q, KF,"),
    ("    cd_base = CD + pid_bh * n * E_PAD\n    gq_hi = tl.zeros",
     "    cd_base = CD + pid_bh * n * E_PAD\n    dcs_base = DCS + pid_bh.to(tl.int64) * n * n\n    gq_hi = tl.zeros"),
    ("""    gq_base = GQ + pid_bh * CQ * n * D
    _store_shifts(gq_base, n * D, D, gq_hi, offs_m, n, 0, QA, CQ, D, BLOCK_D)
    if QB > 0:
        _store_shifts(gq_base, n * D, D, gq_lo, offs_m, n, QA, QB, CQ, D, BLOCK_D)""", ""),
]
src = SRC.replace("from .", "from mta.")
for a, b in REP:
    assert src.count(a) == 1, a[:60]
    src = src.replace(a, b)
assert src.count("_dq_key_tiles(gq_hi, gq_lo, q_hi,") == 2
src = src.replace("_dq_key_tiles(gq_hi, gq_lo, q_hi,", "_dq_key_tiles(dcs_base, gq_hi, gq_lo, q_hi,")
path = pathlib.Path(tempfile.mkdtemp()) / "cb_two_phase.py"
path.write_text(src)
spec = importlib.util.spec_from_file_location("cb_two_phase", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
phase1_kernel = mod.conv_dq_kernel

captured = {}
orig_launch = ml.launch


def capturing_launch(kernel, grid, *args, **meta):
    name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "")
    if name == "conv_dq_kernel" and "dq" not in captured and not ml.in_dry_run():  # not compile_ahead's meta run
        captured["dq"] = (kernel, grid, args, dict(meta))
    return orig_launch(kernel, grid, *args, **meta)


ml.launch = capturing_launch
rows = []
dev = torch.device("cuda")
for H, D in ((16, 128), (8, 64)):
    captured.clear()
    N = 8192
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    w = (torch.randn(H, 6, 11, device=dev) * 0.2).requires_grad_()
    mta.conv_attention(q, k, v, w, causal=True).backward(torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16))
    torch.cuda.synchronize()
    kernel, grid, args, meta = captured["dq"]
    names = kernel.arg_names if hasattr(kernel, "arg_names") else None
    Q, KF, V, DO, LSE, DELTA, CD, GQ = args[:8]
    print(f"H={H} d={D}: grid {grid}, tile", {k_: meta[k_] for k_ in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")},
          "KF", tuple(KF.shape), tuple(KF.stride()), "GQ", tuple(GQ.shape), flush=True)
    # shipped kernel, relaunched with the captured arguments
    gq_ref = GQ.clone()
    t_ship = time_ms(lambda: orig_launch(kernel, grid, *args, **meta), warmup=3, rep=10)
    # phase 1
    dcs = torch.zeros(H, N, N, device=dev, dtype=torch.bfloat16)
    variants = {"table": dict(meta)}
    if D == 128:
        variants["n64_w8_s1"] = {**meta, "BLOCK_N": 64, "num_stages": 1}
        variants["n64_w4_s1"] = {**meta, "BLOCK_N": 64, "num_stages": 1, "num_warps": 4}
        variants["n32_w4"] = {**meta, "num_warps": 4}
    else:
        variants["n64"] = {**meta, "BLOCK_N": 64}
    t1 = {}
    for name, m in variants.items():
        try:
            orig_launch(phase1_kernel, grid, dcs, *args, **m)
            t1[name] = time_ms(lambda m=m: orig_launch(phase1_kernel, grid, dcs, *args, **m), warmup=3, rep=10)
        except Exception as e:  # noqa: BLE001
            print("phase 1", name, type(e).__name__, str(e)[:200], flush=True)
    # phase 2: Gq[h, i, a*D + d] = sum_j dC[h, i, j] Kf[h, a, j, d]
    kf = KF[0]  # [H, CQ, N, D] (a view of the fold's buffer)
    cq = kf.shape[1]
    kf_cols = kf.permute(0, 2, 1, 3).reshape(H, N, cq * D)
    gq2 = torch.matmul(dcs, kf_cols)
    t2 = time_ms(lambda: torch.matmul(dcs, kf_cols), warmup=3, rep=10)
    ref = gq_ref[0].permute(0, 2, 1, 3).reshape(H, N, cq * D).float()  # [H, CQ, N, D] -> [H, N, CQ*D]
    err = ((gq2.float() - ref).norm() / ref.norm()).item()
    r = dict(H=H, D=D, N=N, shipped_ms=t_ship, phase1_ms=t1, phase2_full_gemm_ms=t2, gq_rel_err=err,
             grid=list(grid), tile={k_: meta[k_] for k_ in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")})
    rows.append(r)
    print(json.dumps(r), flush=True)
    del dcs, gq2, q, k, v
    torch.cuda.empty_cache()
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)
