"""Which tiles Triton's autotuner picks for the benchmark shapes: the data behind ``mta/tuning.py``'s tables (GPU only).

    PYTHONPATH=. MTA_AUTOTUNE=1 python3 tools/tune_tables.py [flash|conv]

Runs the public functions (flash: forward + backward, bf16 and fp16; conv: the forward, bf16, 6x11 and
11x11) on the shapes of ``python -m mta.bench flash|conv`` and prints, per shape, the tile each kernel's
autotuner chose among ``tuning.CANDIDATES``. Copy the consistent winners into the table of the GPU family.
"""
import json
import os
import sys

os.environ["MTA_AUTOTUNE"] = "1"

import torch  # noqa: E402

import mta  # noqa: E402
from mta import launch  # noqa: E402


def picks() -> dict:
    """``{kernel name: (BLOCK_M, BLOCK_N, warps, stages)}`` of the autotuners used so far."""
    return {name: (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
            for name, tuner in launch.AUTOTUNED.items() if (c := getattr(tuner, "best_config", None))}


def main(which: str) -> None:
    if which == "flash":
        for dtype in (torch.bfloat16, torch.float16):
            for d in (64, 128):
                for causal in (False, True):
                    for n in (1024, 2048, 4096, 8192, 16384):
                        q, k, v = (torch.randn(16384 // n, 2048 // d, n, d, device="cuda", dtype=dtype,
                                               requires_grad=True) for _ in range(3))
                        mta.flash_attention(q, k, v, causal=causal).backward(torch.randn_like(q))
                        print(json.dumps({"dtype": str(dtype), "d": d, "causal": causal, "n": n, **picks()}))
    else:
        for h, d in ((8, 64), (16, 128)):
            for cq, ck in ((6, 11), (11, 11)):
                for n in (1024, 2048, 4096, 8192, 16384):
                    q, k, v = (torch.randn(1, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    mta.conv_attention(q, k, v, 0.2 * torch.randn(h, cq, ck, device="cuda"))
                    print(json.dumps({"d": d, "kernel": [cq, ck], "n": n, **picks()}))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "flash")
