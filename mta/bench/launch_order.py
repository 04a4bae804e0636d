"""Benchmark of the launch order: causal kernels with their tiles numbered heaviest first, or the natural way.

The kernels take their tile from :func:`mta.launch_order.heaviest_first`. For
the comparison this module builds a second JIT function from the *same* Python
function with that one name bound to :func:`natural_order` (tile = axis 0, head
= axis 1), so there is no second copy of any kernel. Both run the tile
configuration the autotuner picked for the shipped kernel, on the same inputs,
and their outputs are compared (they must agree to the last bit: only which SM
computes which tile changes).

Measured: the causal forward of :func:`mta.flash_attention` and the kernel of
:func:`mta.conv_attention` (6 x 11, its pre-passes left out, as they do not
depend on the order), bf16, B=1, H=8/D=64 and H=16/D=128, N = 1k to 16k.
"""

from __future__ import annotations

import functools
import json
import types
from pathlib import Path

import torch
import triton
import triton.language as tl

from mta import tuning


@triton.jit
def natural_order(HEAVY_LAST: tl.constexpr):
    """``(tile, pid_bh)`` straight from the grid: every tile of head 0, then head 1, ..."""
    return tl.program_id(0), tl.program_id(1)


def untuned(kernel):
    """What ``@triton.autotune`` wraps: the kernel with its ``@triton.heuristics``, launched with an explicit config."""
    return kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel


def with_natural_order(kernel):
    """:func:`untuned` ``kernel`` built again from its Python function, with ``heaviest_first`` bound to
    :func:`natural_order` (and the same ``@triton.heuristics``)."""
    kernel = untuned(kernel)
    heuristics = []
    while isinstance(kernel, triton.runtime.Heuristics):
        heuristics.append(kernel.values)
        kernel = kernel.fn
    fn = kernel.fn
    clone = types.FunctionType(fn.__code__, dict(fn.__globals__, heaviest_first=natural_order), fn.__name__,
                               fn.__defaults__, fn.__closure__)
    clone.__qualname__, clone.__module__, clone.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    clone.__annotations__ = dict(fn.__annotations__)  # the tl.constexpr marks live here, not in the code
    clone.__kwdefaults__ = fn.__kwdefaults__
    twin = triton.jit(clone, do_not_specialize=tuning.NO_SPECIALIZE)
    for values in reversed(heuristics):
        twin = triton.heuristics(values)(twin)
    return twin


def launch_config(cfg) -> dict:
    """A ``triton.Config`` as launch keywords."""
    return {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def flash_launcher(q, k, v):
    """``launch(kernel, config) -> o``: the causal flash forward of ``q, k, v`` (:func:`mta.flash.flash_forward`)."""
    from mta.flash import flash_forward

    def launch(kernel, cfg):
        return flash_forward(q, k, v, True, q.shape[-1] ** -0.5, kernel=kernel, **launch_config(cfg))[0]
    return launch


def conv_launcher(q, k, v, weight):
    """``launch(kernel, config) -> o``: the causal MTA forward kernel alone, its pre-passes run once here."""
    from mta.conv import conv_prepasses, launch_conv_forward

    kf, cd = conv_prepasses(q, k, weight, causal=True)

    def launch(kernel, cfg):
        return launch_conv_forward(q, v, kf, cd, tuple(weight.shape[1:]), True, q.shape[-1] ** -0.5,
                                   kernel=kernel, **launch_config(cfg))[0]
    return launch


SHAPES = [(8, 64), (16, 128)]  # (heads, head dim), B = 1
LENGTHS = [1024, 2048, 4096, 8192, 16384]


def run(*, out: Path, quick: bool = False, warmup: int = 10, rep: int = 30) -> int:
    """The ``order`` command: time both orders, write ``out`` (JSON) and its PNG. Returns the exit status."""
    import mta
    from mta.conv_forward import conv_forward_kernel
    from mta.flash_forward import flash_forward_kernel

    from .flash import json_safe, save_png
    from .plots import plot_launch_order
    from .provenance import provenance
    from .timing import require_cuda, time_ms

    device = require_cuda("the launch-order benchmark")
    timer = functools.partial(time_ms, warmup=warmup, rep=rep)
    natural = {"flash": with_natural_order(flash_forward_kernel), "conv": with_natural_order(conv_forward_kernel)}
    lengths = [2048, 8192] if quick else LENGTHS
    torch.manual_seed(0)
    results, ok = [], True
    for heads, head_dim in SHAPES:
        for n in lengths:
            q, k, v = (torch.randn(1, heads, n, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
            weight = torch.randn(heads, 6, 11, device=device) * 0.2
            mta.flash_attention(q, k, v, causal=True)  # let the autotuner pick the shipped kernels' configs
            mta.conv_attention(q, k, v, weight, causal=True)
            for name, autotuned, launch in (("flash", flash_forward_kernel, flash_launcher(q, k, v)),
                                            ("conv", conv_forward_kernel, conv_launcher(q, k, v, weight))):
                cfg = autotuned.best_config if len(autotuned.configs) > 1 else autotuned.configs[0]
                heaviest = untuned(autotuned)
                same = torch.equal(launch(heaviest, cfg), launch(natural[name], cfg))
                ok &= same
                rec = {"kernel": name, "heads": heads, "head_dim": head_dim, "seq_len": n,
                       "config": launch_config(cfg),
                       "natural_ms": timer(lambda: launch(natural[name], cfg)),
                       "heaviest_first_ms": timer(lambda: launch(heaviest, cfg)), "same_output": same}
                rec["speedup"] = rec["natural_ms"] / rec["heaviest_first_ms"]
                results.append(rec)
                print(f"{name:5} H={heads:2} D={head_dim:3} N={n:5}: natural {rec['natural_ms']:.3f} ms, heaviest "
                      f"first {rec['heaviest_first_ms']:.3f} ms ({rec['speedup']:.2f}x)"
                      f"{'' if same else '  OUTPUTS DIFFER'}", flush=True)
    data = json_safe({"provenance": provenance(), "config": {"quick": quick, "warmup": warmup, "rep": rep,
                                                             "dtype": "bfloat16", "kernel_size": [6, 11]},
                      "results": results})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    png = save_png(plot_launch_order(data), out.with_suffix(".png"))
    print(f"wrote {out} and {png}")
    return 0 if ok else 1
