"""H100: isolating a wrong dk/dweight the random-shape probe found (fp16, d = 16, 29 x 3, N = 274, Hq = 8, Hkv = 2,
B = 2, causal): the same case with one thing changed at a time, errors of dq dk dv dw relative to the float64
reference, and the backward tiles launched.

    PYTHONPATH=. python -m pytest -q -s -p no:cacheprovider notes/h100_remeasure_2026-11-24/dk_isolate.py -n 14
"""
import os

import pytest
import torch

import mta
import mta.conv

BASE = dict(dtype=torch.float16, D=16, cq=29, ck=3, N=274, Hq=8, Hkv=2, B=2, causal=True)
VARIANTS = [{}, {"Hq": 8, "Hkv": 8, "B": 2}, {"Hq": 8, "Hkv": 2, "B": 1}, {"Hq": 2, "Hkv": 1, "B": 1},
            {"stages": 1}, {"stages": 1, "Hq": 8, "Hkv": 8, "B": 2}, {"dkdv": (32, 64, 8, 2), "D": 64, "cq": 6},
            {"dkdv": (16, 64, 8, 2)}, {"dkdv": (32, 32, 8, 2)}, {"N": 60}, {"N": 130}, {"Hq": 2, "Hkv": 2, "B": 1}, {"cq": 16}, {"cq": 17}, {"cq": 24}, {"cq": 12},
            {"D": 64}, {"dtype": torch.float32}, {"dtype": torch.bfloat16}, {"ck": 1}, {"causal": False},
            {"cq": 29, "ck": 3, "D": 64, "N": 130}]


@pytest.mark.parametrize("change", VARIANTS, ids=str)
def test_variant(change):
    c = {**BASE, **change}
    if "stages" in change or "dkdv" in change:  # the dK/dV side's tile, queries as rows, as the launcher fits it
        tile = change.get("dkdv", (32, 64, 4, change.get("stages", 2)))
        mta.tuning.HOPPER["conv_dkdv"] = {key: tile for key in mta.tuning.HOPPER["conv_dkdv"]}
        mta.tuning.HOPPER_KEYS_AS_ROWS.clear()
    launched = []
    fit = mta.conv._fit_backward_tile
    mta.conv._fit_backward_tile = lambda config, owned, *a: launched.append((owned, fit(config, owned, *a))) or launched[-1][1]
    torch.manual_seed(0)
    c.pop("stages", None), c.pop("dkdv", None)
    q = torch.randn(c["B"], c["Hq"], c["N"], c["D"], device="cuda", dtype=c["dtype"])
    k, v = (torch.randn(c["B"], c["Hkv"], c["N"], c["D"], device="cuda", dtype=c["dtype"]) for _ in range(2))
    w = 0.2 * torch.randn(c["Hq"], c["cq"], c["ck"], device="cuda")
    do = torch.randn(c["B"], c["Hq"], c["N"], c["D"], device="cuda", dtype=c["dtype"])
    xs = [x.clone().requires_grad_() for x in (q, k, v, w)]
    mta.conv_attention(*xs, causal=c["causal"]).backward(do)
    refs = [x.double().requires_grad_() for x in (q, k, v, w)]
    mta.conv_attention_reference(*refs, causal=c["causal"]).backward(do.double())
    errs = [((x.grad.double() - r.grad).norm() / r.grad.norm()).item() for x, r in zip(xs, refs)]
    line = (f"{change}: rel err dq dk dv dw " + " ".join(f"{e:.1e}" for e in errs)
            + f"; tiles {[(o, tuple(t.values())) for o, t in launched]}")
    with open(os.path.join(os.environ.get("OUT", "."), "dk_isolate.txt"), "a") as f:
        f.write(line + "\n")
