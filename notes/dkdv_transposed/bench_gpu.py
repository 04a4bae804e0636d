"""H100: MTA forward + backward (bf16, causal, 6 x 11, N = 8192, the bench's two configurations) with the shipped
dK/dV kernel and with the transposed one (dkdv_t.py) at a few tiles; gradients compared with the shipped ones.

    PYTHONPATH=.:notes/dkdv_transposed python notes/dkdv_transposed/bench_gpu.py
"""
import json, os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
import mta, mta.conv
from mta import tuning
from mta.bench.timing import time_ms
from dkdv_t import conv_dkdv_kernel_t

shipped = mta.conv.conv_dkdv_kernel
table = dict(tuning.HOPPER["conv_dkdv"])
dq_table = dict(tuning.HOPPER["conv_dq"])
#: (kernel, tile) per head dim: "s" the shipped kernel, "t" the transposed one; tile None: the table's.
VARIANTS = {64: [("s", None), ("s", (32, 128, 8, 2)), ("t", (32, 128, 8, 2)), ("s", (16, 128, 8, 2)),
                 ("t", (16, 128, 8, 2)), ("s", (64, 128, 8, 2)), ("t", (64, 128, 8, 2)), ("t", (32, 128, 8, 3)),
                 ("t", (32, 128, 8, 2), (128, 32, 8, 2)), ("t", (32, 128, 8, 2), (128, 64, 8, 2)),
                 ("t", (32, 128, 8, 2), (64, 64, 8, 2))]}  # the last three: dQ tiles too
if len(sys.argv) > 1:  # run 1 (dkdv_transposed_run1.json): the transposed kernel at its tiles, both configurations
    VARIANTS = {64: [("s", None), ("t", (32, 64, 4, 2)), ("t", (64, 64, 4, 2)), ("t", (32, 64, 8, 2)),
                     ("t", (32, 128, 8, 2))],
                128: [("s", None), ("t", (32, 64, 8, 1)), ("t", (32, 64, 8, 2)), ("t", (64, 64, 8, 1))]}
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for H, D in ((8, 64), (16, 128)):
    if D not in VARIANTS:
        continue
    torch.manual_seed(0)
    N, cq, ck = 8192, 6, 11
    q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (0.2 * torch.randn(H, cq, ck, device="cuda")).requires_grad_()
    do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)
    ref = None
    for kind, tile, *dq_tile in VARIANTS[D]:
        tuning.HOPPER["conv_dq"] = {key: dq_tile[0] for key in dq_table} if dq_tile else dq_table
        mta.conv.conv_dkdv_kernel = shipped if kind == "s" else conv_dkdv_kernel_t
        tuning.HOPPER["conv_dkdv"] = table if tile is None else {key: tile for key in table}
        def step():
            o = mta.conv_attention(q, k, v, w, causal=True)
            return torch.autograd.grad(o, (q, k, v, w), do)
        try:
            grads = step()
            ms = time_ms(step, rep=20)
        except Exception as exc:  # noqa: BLE001
            print(H, D, tile, "failed:", str(exc)[:300], flush=True)
            continue
        if ref is None:
            ref = grads
        errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads, ref)]
        print(f"H={H} D={D} {'shipped' if kind == 's' else 'transposed'} {tile or 'table'} dQ {dq_tile[0] if dq_tile else 'table'}: fwd+bwd {ms:.3f} ms; rel diff to shipped "
              + " ".join(f"{e:.1e}" for e in errs), flush=True)
        out["rows"].append({"H": H, "D": D, "kernel": kind, "tile": tile, "dq_tile": dq_tile[0] if dq_tile else None, "ms": ms, "rel_diff": errs})
    mta.conv.conv_dkdv_kernel = shipped
    tuning.HOPPER["conv_dkdv"] = table
    tuning.HOPPER["conv_dq"] = dq_table
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "dkdv_transposed.json"), "w"), indent=1)
