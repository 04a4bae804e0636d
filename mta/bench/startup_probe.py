"""The first call of one public kernel function in this fresh process: what ``python -m mta.bench startup`` runs.

``python mta/bench/startup_probe.py CASE DTYPE HEAD_DIM [--seq-len N ...]`` (a script: ``-m`` would import mta and
torch before the clock starts) times the imports, the first call and a synchronize (compiling, autotuning, loading
kernels: what a user waits for) and a second call (steady state), and prints one JSON line; a failing call raises.
Cases with a backward first run a trivial one (``torch_first_backward_s``): torch's first backward imports sympy,
a cost every training script pays once, not the kernel's. The interpreter skips dtypes it cannot compute exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DTYPES = ("bfloat16", "float16", "float32")
#: The probe's default shape (the benchmark's): ``q [B, Hq, N, D]``, ``k, v [B, Hkv, N, D]``.
BATCH, HEADS, KV_HEADS, SEQ_LEN = 1, 8, 2, 1536
KERNEL_SIZE = (6, 11)


@dataclass(frozen=True)
class Case:
    """``mta.<function>(*inputs named by args, causal=True where causal)``, then with ``grad`` (else under no_grad)
    ``out.backward(dout)``; the outputs (and gradients) are checked finite. ``q_last`` is ``q[:, :, -1:]``."""

    name: str
    label: str
    function: str
    args: tuple[str, ...]
    causal: bool = True
    grad: bool = False

    def call(self, mta, x: dict) -> tuple:
        out = getattr(mta, self.function)(*(x[a] for a in self.args), **({"causal": True} if self.causal else {}))
        if not self.grad:
            return (out,)
        out.backward(x["dout"])
        return (out, *(x[a].grad for a in self.args))


CASES = (
    Case("flash_forward", "flash_attention forward", "flash_attention", ("q", "k", "v")),
    Case("flash_forward_backward", "flash_attention forward+backward", "flash_attention", ("q", "k", "v"),
         grad=True),
    Case("conv_forward", "conv_attention forward (6x11)", "conv_attention", ("q", "k", "v", "weight")),
    Case("conv_forward_backward", "conv_attention forward+backward (6x11)", "conv_attention",
         ("q", "k", "v", "weight"), grad=True),
    Case("decode_forward", "decode_attention (one new query)", "decode_attention", ("q_last", "k", "v"),
         causal=False),
    Case("conv_decode_forward", "conv_decode_attention (6x11, one new query)", "conv_decode_attention",
         ("q", "k", "v", "weight"), causal=False),  # the last position's output from the q and KV caches
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python mta/bench/startup_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=[c.name for c in CASES])
    parser.add_argument("dtype", choices=DTYPES)
    parser.add_argument("head_dim", type=int)
    for flag, default in (("--seq-len", SEQ_LEN), ("--batch", BATCH), ("--heads", HEADS), ("--kv-heads", KV_HEADS)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args(argv)
    case = next(c for c in CASES if c.name == args.case)
    start = time.perf_counter()
    import torch
    imported_torch = time.perf_counter()
    import mta
    from mta import runtime
    result = {"import_torch_s": imported_torch - start, "import_mta_s": time.perf_counter() - imported_torch,
              "device": str(runtime.DEVICE)}
    dtype, device = getattr(torch, args.dtype), runtime.DEVICE
    if dtype not in runtime.SAFE_DTYPES:
        result["skipped"] = f"{args.dtype} is not exact on {runtime.describe()}"
        print(json.dumps(result))
        return 0
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    q_shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    kv_shape = (args.batch, args.kv_heads, args.seq_len, args.head_dim)
    x = {name: torch.randn(q_shape if name in ("q", "dout") else kv_shape, device=device, dtype=dtype)
         for name in ("q", "k", "v", "dout")}
    x["weight"] = 0.2 * torch.randn(args.heads, *KERNEL_SIZE, device=device, dtype=torch.float32)
    x["q_last"] = x["q"][:, :, -1:]  # a view of q's last row
    if case.grad:
        for name in ("q", "k", "v", "weight"):
            x[name].requires_grad_()
        w = torch.ones(2, device=device, requires_grad=True)  # torch's one-time autograd cost, outside the kernel's
        sync()
        begin = time.perf_counter()
        (w * 2).backward(torch.ones_like(w))
        sync()
        result["torch_first_backward_s"] = time.perf_counter() - begin
    finite = True
    for key in ("first_call_s", "second_call_s"):
        for t in x.values():
            t.grad = None
        sync()
        begin = time.perf_counter()
        with torch.set_grad_enabled(case.grad):
            outs = case.call(mta, x)
        sync()
        result[key] = time.perf_counter() - begin
        finite = finite and all(bool(torch.isfinite(t).all()) for t in outs)
    result["finite"] = finite
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parents[2])  # import mta from this checkout, not from mta/bench/
    sys.exit(main())
