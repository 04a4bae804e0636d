"""H100 A/B: MTA decode's split kernel before (``decode_kernels.py`` of 1cc3a2c) and after three changes: the band's
query rows stacked into one load and one product (``ck`` shifts instead of ``cq * ck``), no fold in the band's
program (it has no far keys), the fold's kernel rows unrolled. bf16, Nq = 1, the bench's configurations, the
rule's split counts; conv_decode_attention 6 x 11 and 11 x 11 with each kernel, decode_attention beside them.
Variants (``AB_VARIANTS``): "after" (the working tree's launcher), "after4" (4 pipeline stages at d = 64,
``AB_STAGES``: two programs per SM by shared memory), "after3x" (the split rule counting ``AB_PER_SM`` programs
per SM at d = 64). Three interleaved rounds, the smallest median; outputs compared with "before".

    git show 1cc3a2c:mta/decode_kernels.py > mta/_decode_kernels_before.py
    MTA_COMPILE_AHEAD=0 PYTHONPATH=. python notes/h100_2026-11-25d/conv_decode_band_ab.py
"""
import json
import os

import torch

import mta
import mta.decode
from mta import _decode_kernels_before as before
from mta.bench.timing import time_ms

after_kernel = mta.decode.decode_split_kernel


class WithoutBandArgs:
    """The old kernel behind the new launcher: drops the two constexprs it does not take."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def run(*args, **meta):
            meta.pop("A_GROUP"), meta.pop("BAND_STACK")
            return self.kernel[grid](*args, **meta)
        return run


variants = {"before": WithoutBandArgs(before.decode_split_kernel), "after": after_kernel, "after4": after_kernel,
            "after3x": after_kernel}
variants = {k: v for k, v in variants.items() if k in os.environ.get("AB_VARIANTS", ",".join(variants)).split(",")}
PER_SM = int(os.environ.get("AB_PER_SM", "3"))  # "after3x": the split rule counts this many programs per SM at d = 64
shipped_per_sm = mta.decode.MTA_PROGRAMS_PER_SM
STAGES = int(os.environ.get("AB_STAGES", "4"))  # "after4": this many pipeline stages at d <= 64
shipped_tile = mta.decode.decode_tile


def deeper_at_64(block_d, dtype):
    block_n, warps, stages = shipped_tile(block_d, dtype)
    return (block_n, warps, STAGES) if block_d <= 64 else (block_n, warps, stages)


def main():
    out = {"gpu": torch.cuda.get_device_name(), "rows": []}
    for batch in (1, 8):
        for hq, hkv, d in [(8, 8, 64), (32, 8, 128)]:
            for n in [1024, 2048, 4096, 16384, 65536]:
                torch.manual_seed(0)
                q = torch.randn(batch, hq, n, d, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(batch, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                weights = {f"{cq}x{ck}": 0.2 * torch.randn(hq, cq, ck, device="cuda") for cq, ck in [(6, 11), (11, 11)]}
                best, outs = {}, {}
                for _ in range(3):
                    fn = lambda: mta.decode_attention(q[:, :, -1:], k, v)
                    best["decode"] = min(best.get("decode", 1e9), time_ms(fn, rep=100) * 1e3)
                    for name, kernel in variants.items():
                        mta.decode.decode_split_kernel = kernel
                        mta.decode.decode_tile = deeper_at_64 if name == "after4" else shipped_tile
                        if name == "after3x" and d <= 64:
                            mta.decode.MTA_PROGRAMS_PER_SM = PER_SM
                        try:
                            for wn, w in weights.items():
                                fn = lambda w=w: mta.conv_decode_attention(q, k, v, w)
                                outs[(name, wn)] = fn()
                                key = f"{wn} {name}"
                                best[key] = min(best.get(key, 1e9), time_ms(fn, rep=100) * 1e3)
                        finally:
                            mta.decode.decode_split_kernel = after_kernel
                            mta.decode.decode_tile = shipped_tile
                            mta.decode.MTA_PROGRAMS_PER_SM = shipped_per_sm
                diff = {f"{wn} {name}": (outs[(name, wn)].float() - outs[("before", wn)].float()).abs().max().item()
                        for wn in weights for name in variants if name != "before"}
                row = {"batch": batch, "heads": hq, "kv_heads": hkv, "head_dim": d, "seq_len": n, "us": best,
                       "max_abs_diff": diff}
                out["rows"].append(row)
                print(f"B={batch} Hq={hq} d={d} N={n}: " + " ".join(f"{k} {v:.1f}" for k, v in best.items())
                      + " | 6x11/decode " + " ".join(f"{name} {best['6x11 ' + name] / best['decode']:.3f}"
                                                     for name in variants)
                      + f" | diff {diff}", flush=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "conv_decode_band_ab.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
