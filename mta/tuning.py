"""Tile sizes, warps and pipeline depths for the kernels, per machine.

On a GPU, Triton's autotuner times a short list of candidates once per
(problem-size bucket, head dim, causal, dtype) and keeps the fastest. The
lists come from a sweep of 12-16 candidates per kernel on an H200 (bf16,
N = 4096, d = 64 and 128; ``dev`` notes in the closing report of issue 3):
the three or four fastest of each are kept, so autotuning stays cheap. In
Triton's interpreter (no GPU) there is nothing to time: one small tile keeps
the NumPy emulation quick. ``MTA_AUTOTUNE=0`` takes the first candidate
without timing (tests use it on a GPU: they check results, not speed).
"""

from __future__ import annotations

import os

import triton

from .runtime import INTERPRET

INTERPRETER_TILE = 16
AUTOTUNE = os.environ.get("MTA_AUTOTUNE", "1") != "0"

# Triton turns an int argument equal to 1 into a constant. With n_q = n_k = 1
# both constant, the causal fp16/bf16 flash forward makes the ptxas bundled
# with Triton 3.6 (CUDA 12.8; 12.9 too, 13.0 not) segfault: seen on an H200,
# reproduced offline. Sequence lengths stay run-time values.
#: Kernel arguments passed to ``triton.jit(do_not_specialize=...)``.
NO_SPECIALIZE = ["n_q", "n_k"]


def _config(block_m: int, block_n: int, warps: int, stages: int, pre_hook=None) -> triton.Config:
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps, num_stages=stages,
                         pre_hook=pre_hook)


# (BLOCK_M queries, BLOCK_N keys, warps, stages), fastest first, by tile width of the head dim.
FORWARD = {
    64: [(128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 4, 3)],
    128: [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
    256: [(64, 64, 4, 2), (64, 32, 4, 2), (128, 32, 8, 2)],
}
DKDV = {  # BLOCK_N keys owned by a program, BLOCK_M queries per step
    64: [(128, 64, 4, 2), (64, 128, 4, 3), (64, 64, 4, 2)],
    128: [(64, 128, 8, 3), (64, 64, 4, 2), (128, 64, 4, 2)],
    256: [(32, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2)],
}
DQ = {  # BLOCK_M queries owned by a program, BLOCK_N keys per step
    64: [(128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 2)],
    128: [(128, 64, 8, 3), (64, 64, 4, 2), (64, 64, 4, 3)],
    256: [(64, 32, 4, 2), (32, 64, 4, 2), (32, 32, 4, 2)],
}
# Head dims in (128, 256] have a 256-wide tile; 16..64 share the 64 list.
_WIDTHS = (64, 128, 256)


def _configs(table: dict) -> list[triton.Config]:
    if INTERPRET:
        return [_config(INTERPRETER_TILE, INTERPRETER_TILE, 4, 1)]
    if not AUTOTUNE:
        return [_config(64, 32, 4, 2)]  # safe for every head dim up to 256
    seen, out = set(), []
    for width in _WIDTHS:
        for c in table[width]:
            if c not in seen:
                seen.add(c)
                out.append(_config(*c))
    return out


def _pruner(table: dict):
    def prune(configs, named_args, **kwargs):
        if len(configs) == 1:
            return configs
        block_d = named_args.get("BLOCK_D", kwargs.get("BLOCK_D"))
        width = next(w for w in _WIDTHS if block_d <= w)
        wanted = set(table[width])
        return [c for c in configs
                if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in wanted]
    return prune


def forward_configs() -> list[triton.Config]:
    return _configs(FORWARD)


def dkdv_configs() -> list[triton.Config]:
    return _configs(DKDV)


def dq_configs() -> list[triton.Config]:
    return _configs(DQ)


prune_forward = _pruner(FORWARD)
prune_dkdv = _pruner(DKDV)
prune_dq = _pruner(DQ)


# MTA forward (chapter 04). Candidates for the tiles of conv_forward_kernel, from
# timings on an H200 (bf16, N = 8192, 6 x 11; tools/probe_conv.py, raw runs in
# notes/h200_conv_probe.txt): 128 x 64 tiles with resident shifted queries lead at
# d = 64, 128 x 128 tiles with 3 stages (queries streamed) at d = 128. The first is the untimed default (MTA_AUTOTUNE=0),
# small enough for every head dim and kernel size. Tiles that do not fit in
# shared memory for a shape are skipped by the autotuner.
CONV_FORWARD = [(64, 32, 4, 2), (128, 64, 8, 2), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3)]

#: Largest ``BLOCK_M x cq x BLOCK_D`` tile of shifted queries held for a whole key walk, in bytes.
#: Beyond it the kernel reloads each shifted query tile for every key tile (slower, any size).
#: Read at every launch, so a test can lower it to exercise that path.
CONV_RESIDENT_BYTES = 96 * 1024


#: Stream the pieces of the reloaded path through the copy engine (TMA tensor descriptors) where it can:
#: a Hopper or newer GPU (or the interpreter, which emulates it), fp16/bf16, 16-byte aligned rows.
#: Read at every launch, so a test can turn it off.
CONV_TMA = True


def conv_forward_configs(pre_hook=None) -> list[triton.Config]:
    """The candidates; ``pre_hook(args)`` runs before each launch of one (it fits the TMA boxes to the tile)."""
    if INTERPRET:
        return [_config(INTERPRETER_TILE, INTERPRETER_TILE, 4, 1, pre_hook)]
    if not AUTOTUNE:
        return [_config(*CONV_FORWARD[0], pre_hook)]
    return [_config(*c, pre_hook) for c in CONV_FORWARD]


def stream_width(block_d: int) -> int:
    """Depth of one streamed product: half the head-dim tile (lighter on registers and shared memory),
    or all of it when that is 16 (``tl.dot`` needs a depth of at least 16)."""
    return block_d if block_d < 32 else block_d // 2


def query_shift_groups(cq: int) -> tuple[int, int]:
    """``(QA, QB)``: ``cq`` query shifts covered by at most two power-of-two groups (``QB = 0``: one).

    ``QA`` is the largest power of two <= cq and ``QB`` the smallest one >= the
    rest; shifts past ``cq`` in the second group are zero padding (6 = 4 + 2,
    11 = 8 + 4 with one padded).
    """
    qa = 1 << (cq.bit_length() - 1)
    rest = cq - qa
    return qa, (1 << (rest - 1).bit_length()) if rest else 0


def _resident(args: dict) -> bool:
    qa, qb = query_shift_groups(args["CQ"])
    return args["BLOCK_M"] * (qa + qb) * args["BLOCK_D"] * args["Q"].element_size() <= CONV_RESIDENT_BYTES


def conv_forward_heuristics() -> dict:
    """Meta-parameters derived at launch from the chosen tile (``triton.heuristics``)."""
    return {"QA": lambda args: query_shift_groups(args["CQ"])[0],
            "QB": lambda args: query_shift_groups(args["CQ"])[1],
            "RESIDENT": _resident,
            "TMA": lambda args: args["QD"] is not None and not _resident(args),
            "WIDTH": lambda args: stream_width(args["BLOCK_D"])}


#: The largest key-axis kernel size ``ck`` (the fold and the future scores unroll a loop over it).
CONV_MAX_CK = 33
