"""Tile sizes, warps and pipeline depths for the kernels, per machine.

On a GPU, Triton's autotuner times a short list of candidates once per
(problem-size bucket, head dim, causal, dtype) and keeps the fastest. The
lists hold shapes known to suit Hopper (H100/H200) tensor cores; a few are
pruned by head dim, since large tiles at ``D = 256`` exceed shared memory or
spill registers. In Triton's interpreter (no GPU) there is nothing to time:
one small tile keeps the NumPy emulation quick.
"""

from __future__ import annotations

import os

import triton

from .runtime import INTERPRET

INTERPRETER_TILE = 16

#: ``MTA_AUTOTUNE=0`` skips the timing and takes the first candidate left after
#: pruning (tests on a GPU use it: they check results, not speed).
AUTOTUNE = os.environ.get("MTA_AUTOTUNE", "1") != "0"


def _first_unless_autotuning(keep: list) -> list:
    return keep if AUTOTUNE else keep[:1]


def _config(block_m: int, block_n: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps, num_stages=stages)


def forward_configs() -> list[triton.Config]:
    if INTERPRET:
        return [_config(INTERPRETER_TILE, INTERPRETER_TILE, 4, 1)]
    return [_config(bm, bn, w, s)
            for bm, bn in ((128, 64), (128, 128), (64, 64), (128, 32), (64, 32))
            for w in (4, 8) for s in (2, 3, 4)]


def prune_forward(configs, named_args, **kwargs):
    """Drop candidates whose tiles cannot pay off for this head dim."""
    d = named_args["BLOCK_D"] if "BLOCK_D" in named_args else kwargs["BLOCK_D"]
    keep = []
    for c in configs:
        bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        if d <= 64 and (bn < 64 or c.num_stages < 3):
            continue
        if d == 128 and (bn == 32 or (bm == 128 and c.num_warps == 4 and bn == 128)):
            continue
        if d >= 256 and (bm * bn > 64 * 64 or c.num_stages > 2):
            continue
        keep.append(c)
    return _first_unless_autotuning(keep or configs[:1])


def backward_configs() -> list[triton.Config]:
    """For the dK/dV and dQ kernels: ``BLOCK_M`` queries x ``BLOCK_N`` keys per step."""
    if INTERPRET:
        return [_config(INTERPRETER_TILE, INTERPRETER_TILE, 4, 1)]
    return [_config(bm, bn, w, s)
            for bm, bn in ((32, 128), (64, 128), (64, 64), (128, 64), (128, 32), (32, 64))
            for w in (4, 8) for s in (2, 3)]


def prune_backward(configs, named_args, **kwargs):
    d = named_args["BLOCK_D"] if "BLOCK_D" in named_args else kwargs["BLOCK_D"]
    keep = [c for c in configs
            if not (d >= 256 and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] > 64 * 64)
            and not (d >= 256 and c.num_stages > 2)]
    return _first_unless_autotuning(keep or configs[:1])
