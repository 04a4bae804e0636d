"""H100: MTA forward + backward (bf16, causal, 6 x 11, N = 8192, B = 1) with the backward's tiles given 16 warps
(four warpgroups, 128 registers a thread: the same register file as 8 warps at 255, spread over more warps).
Question: do the wide accumulators ([rows, cq' d] fp32) run faster over four warpgroups than over one or two?
Tiles as (BLOCK_M, BLOCK_N, warps, stages); "dq": the dQ kernel's, "kr": the dK/dV kernel's keys-as-rows tile
(d = 64), "kv": its queries-as-rows tile (d = 128). Two interleaved rounds, the launcher's tiles first and last;
gradients compared with the launcher's. mta.flash_attention forward + backward timed alongside.

    PYTHONPATH=. python notes/h100_2026-11-24g/sixteen_warps.py
"""
import json
import os

import torch

import mta
import mta.conv
from mta import tuning
from mta.bench.timing import time_ms

VARIANTS = {
    64: [{}, {"dq": (128, 32, 16, 2)}, {"dq": (64, 32, 16, 2)}, {"kr": (32, 128, 16, 2)},
         {"dq": (128, 32, 16, 2), "kr": (32, 128, 16, 2)}],
    128: [{}, {"dq": (64, 32, 16, 2)}, {"kv": (32, 64, 16, 1)}, {"kv": (32, 64, 16, 2)},
          {"dq": (64, 32, 16, 2), "kv": (32, 64, 16, 2)}],
}
CONFIGS = {64: 8, 128: 16}  # head dim: heads
launcher_kr = mta.conv.keys_as_rows_tile
out = {"gpu": torch.cuda.get_device_name(), "rows": []}
for D, H in CONFIGS.items():
    torch.manual_seed(0)
    N, cq, ck = 8192, 6, 11
    q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    w = (0.2 * torch.randn(H, cq, ck, device="cuda")).requires_grad_()
    do = torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16)
    flash_ms = time_ms(lambda: torch.autograd.grad(mta.flash_attention(q, k, v, causal=True), (q, k, v), do), rep=30)
    print(f"d={D} H={H}: flash fwd+bwd {flash_ms:.3f} ms", flush=True)
    out["rows"].append({"head_dim": D, "flash_ms": flash_ms})
    ref = None
    for rnd in range(2):
        for variant in VARIANTS[D] + [{}]:
            saved = {key: dict(tuning.HOPPER[key]) for key in ("conv_dq", "conv_dkdv")}
            if "dq" in variant:
                tuning.HOPPER["conv_dq"][(D, True)] = variant["dq"]
            if "kv" in variant:
                tuning.HOPPER["conv_dkdv"][(D, True)] = variant["kv"]
            if "kr" in variant:
                mta.conv.keys_as_rows_tile = lambda *a, t=variant["kr"]: tuning.as_config(t)

            def step():
                o = mta.conv_attention(q, k, v, w, causal=True)
                return torch.autograd.grad(o, (q, k, v, w), do)
            try:
                grads = step()
                ms = time_ms(step, rep=30)
            except Exception as error:  # noqa: BLE001 - a tile that does not compile or launch is a result
                print(f"d={D} round {rnd} {variant}: {type(error).__name__}: {str(error)[:200]}", flush=True)
                out["rows"].append({"head_dim": D, "round": rnd, "variant": variant, "error": repr(error)[:300]})
                continue
            finally:
                mta.conv.keys_as_rows_tile = launcher_kr
                for key, table in saved.items():
                    tuning.HOPPER[key].clear()
                    tuning.HOPPER[key].update(table)
            ref = grads if ref is None else ref
            errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads, ref)]
            print(f"d={D} round {rnd} {variant or 'launcher'}: fwd+bwd {ms:.3f} ms ({ms / flash_ms:.2f}x flash); "
                  "rel diff " + " ".join(f"{e:.1e}" for e in errs), flush=True)
            out["rows"].append({"head_dim": D, "round": rnd, "variant": variant, "ms": ms, "rel_diff": errs})
    del q, k, v, w, do, ref
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "sixteen_warps.json"), "w"), indent=1)
