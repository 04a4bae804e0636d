"""Benchmark of the launch order: causal kernels with their tiles numbered heaviest first, or the natural way.

The kernels take their tile from :func:`mta.launch_order.heaviest_first`; the twin is built from the *same* Python
functions with that name bound to :func:`natural_order` (:func:`with_natural_order`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

from mta.launch import NO_SPECIALIZE, Launch
from mta.launch_order import heaviest_first

from .conv import ConvShape, random_inputs
from .harness import Benchmark, Tools
from .plots import plot_launch_order
from .timing import timing_config

SHAPES = [(8, 64), (16, 128)]  # (heads, head dim), B = 1
LENGTHS = [1024, 2048, 4096, 8192, 16384]
QUICK_LENGTHS = [2048, 8192]
KERNEL_SIZE = (6, 11)


@triton.jit
def natural_order(HEAVY_LAST: tl.constexpr):
    """``(tile, pid_bh)`` straight from the grid: every tile of head 0, then head 1, ..."""
    return tl.program_id(0), tl.program_id(1)


def _natural_twin(jit_fn, **jit_options):
    """``jit_fn`` built again from its Python function with ``heaviest_first`` bound to :func:`natural_order`, also
    in the ``@triton.jit`` helpers it calls (rebuilt the same way); ``jit_fn`` itself if it never reaches it."""
    from triton.runtime.interpreter import InterpretedFunction

    fn = jit_fn.fn
    swaps = {}
    for name in fn.__code__.co_names:
        target = fn.__globals__.get(name)
        if target is heaviest_first:
            swaps[name] = natural_order
        elif isinstance(target, (triton.runtime.JITFunction, InterpretedFunction)) and target is not jit_fn:
            twin = _natural_twin(target)
            if twin is not target:
                swaps[name] = twin
    if not swaps:
        return jit_fn
    clone = types.FunctionType(fn.__code__, dict(fn.__globals__, **swaps), fn.__name__, fn.__defaults__,
                               fn.__closure__)
    clone.__qualname__, clone.__module__, clone.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    clone.__annotations__ = dict(fn.__annotations__)  # the tl.constexpr marks live here, not in the code
    clone.__kwdefaults__ = fn.__kwdefaults__
    return triton.jit(clone, **jit_options)


@functools.cache  # a twin is built (and compiled) once per kernel
def with_natural_order(kernel):
    """``kernel`` with its tiles numbered the natural way (:func:`_natural_twin`), the same ``@triton.heuristics``."""
    heuristics = []
    while isinstance(kernel, triton.runtime.Heuristics):
        heuristics.append(kernel.values)
        kernel = kernel.fn
    twin = _natural_twin(kernel, do_not_specialize=NO_SPECIALIZE)
    if twin is kernel:
        raise ValueError(f"{kernel.fn.__name__} never calls heaviest_first: it has no natural-order twin")
    for values in reversed(heuristics):
        twin = triton.heuristics(values)(twin)
    return twin


TILE_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def shipped_tile(made: Launch) -> dict:
    """The tile (``BLOCK_M, BLOCK_N, num_warps, num_stages``) of a launch the package made."""
    return {key: made.meta[key] for key in TILE_KEYS}


def flash_launch(q, k, v) -> tuple[Launch, torch.Tensor]:
    """The causal flash forward's launch for ``q, k, v`` (:func:`mta.flash.flash_forward_launch`) and its output."""
    from mta.flash import flash_forward_launch

    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    return flash_forward_launch(q, k, v, o, lse, True, q.shape[-1] ** -0.5), o


def conv_launch(q, k, v, weight) -> tuple[Launch, torch.Tensor]:
    """The causal MTA forward kernel's launch alone (:func:`mta.conv.conv_forward_launch`), its pre-passes run once
    here, and its output."""
    from mta.conv import conv_forward_launch, conv_prepasses, plan_of

    plan = plan_of(q, weight, True)
    kf, cd = conv_prepasses(q, k, weight, True, plan)
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    return conv_forward_launch(q, v, kf, cd, o, lse, tuple(weight.shape[1:]), True, q.shape[-1] ** -0.5, plan), o


def writing(made: Launch, kernel, out: torch.Tensor):
    """A call that runs ``made`` with ``kernel`` in its place and returns its output ``out``."""
    swapped = dataclasses.replace(made, kernel=kernel)
    return lambda: (swapped(), out)[1]


def run_as(made: Launch, kernel, out: torch.Tensor) -> torch.Tensor:
    """``made`` launched with ``kernel`` in its place: a copy of its output."""
    dataclasses.replace(made, kernel=kernel)()
    return out.clone()


@dataclass(frozen=True)
class OrderShape:
    """``q, k, v [1, heads, seq_len, head_dim]``, ``kernel`` "flash" or "conv"."""

    kernel: str
    heads: int
    head_dim: int
    seq_len: int

    def label(self) -> str:
        return f"{self.kernel} H={self.heads} D={self.head_dim} N={self.seq_len}"


class LaunchOrderBenchmark(Benchmark):
    """Times the causal forward of mta.flash_attention and the kernel of mta.conv_attention (6x11, without its
    pre-passes) with their tiles numbered heaviest first (as shipped) and in the natural order, the shipped tile
    config, the same inputs (bf16, B=1, N = 1k to 16k), after checking both give the same output to the last bit."""

    name, out = "order", "figures/bench_launch_order.json"
    help = "causal kernels with tiles launched heaviest first vs in the natural order"
    quick_help = "N in {2048, 8192}"
    exit_1 = "the outputs of the two orders differ"
    Shape, plot = OrderShape, staticmethod(plot_launch_order)

    def __init__(self, dtype: str = "bfloat16"):
        self.dtype = dtype

    def shapes(self, quick):
        return [OrderShape(kernel, h, d, n) for h, d in SHAPES for n in (QUICK_LENGTHS if quick else LENGTHS)
                for kernel in ("flash", "conv")]

    def config(self, quick, warmup, rep):
        return {"quick": quick, **timing_config(warmup, rep), "dtype": self.dtype, "kernel_size": list(KERNEL_SIZE)}

    def measure_shape(self, shape: OrderShape, tools: Tools) -> list[dict]:
        """One record: the tile config, both times, the speedup and whether both orders agree (checked first)."""
        import mta
        from mta.conv_forward import conv_forward_kernel
        from mta.flash_forward import flash_forward_kernel

        q, k, v, weight = random_inputs(ConvShape(self.dtype, 1, shape.heads, shape.heads, shape.head_dim,
                                                  *KERNEL_SIZE, shape.seq_len), tools.device)
        if shape.kernel == "flash":
            mta.flash_attention(q, k, v, causal=True)  # warm up
            heaviest, (made, out) = flash_forward_kernel, flash_launch(q, k, v)
        else:
            mta.conv_attention(q, k, v, weight, causal=True)
            heaviest, (made, out) = conv_forward_kernel, conv_launch(q, k, v, weight)
        natural = with_natural_order(heaviest)
        same = torch.equal(run_as(made, heaviest, out), run_as(made, natural, out))
        check = {"ok": same, "error": None if same else "the two launch orders give different outputs"}
        if not same:
            tools.warn(self.failure(None, shape, check))
        rec = {**asdict(shape), "config": shipped_tile(made), "natural_ms": tools.timer(writing(made, natural, out)),
               "heaviest_first_ms": tools.timer(writing(made, heaviest, out)), "same_output": same, "check": check}
        rec["speedup"] = rec["natural_ms"] / rec["heaviest_first_ms"]
        return [rec]

    def tables(self, data):
        columns = [("kernel", "", "kernel"), ("H", "{}", "heads"), ("D", "{}", "head_dim"), ("N", "{}", "seq_len"),
                   ("natural ms", "{:.3f}", "natural_ms"), ("heaviest first ms", "{:.3f}", "heaviest_first_ms"),
                   ("speedup", "{:.2f}x", "speedup")]
        return [("launch orders (! = their outputs differ)", columns, data["results"])]
