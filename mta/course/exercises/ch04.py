"""Checkers for chapter 04's exercises (the MTA forward), and the kernel's tile rule as a NumPy grid.

Each ``check_*`` runs the learner's function on a few small, awkward problems (one token, a length that is not a
multiple of the tile, a sequence shorter than the kernel, a ``1 x 1`` or ``ck = 1`` kernel), prints one line and
returns a :class:`mta.course.exercises.Result`; it never raises.

* :func:`check_diagonal_scores`: the convolved scores on the ``E`` diagonals, from the definition;
* :func:`check_tile_kinds`: a tile's kind (skipped, folded, diagonal) from the definitions, against the rule the
  fused kernel itself runs (:func:`mta.kernel_parts.key_tile_bounds`, through :func:`tile_kinds`);
* :func:`check_fold_keys`: the fold pre-pass, written as a Triton kernel;
* :func:`check_folded_forward`: the non-causal forward's inner loop over key tiles (folded keys, online softmax),
  written as a Triton kernel.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ... import conv, runtime
from ...conv import diagonal_reach
from ...kernel_parts import key_tile_bounds
from . import (CaseFailed, Result, expect_close, expect_equal, finished_attention, own_triton_kernel, refusing,
               run_cases)

__all__ = ["DIAGONAL", "FOLDED", "SKIPPED", "check_diagonal_scores", "check_fold_keys", "check_folded_forward",
           "check_tile_kinds", "convolved_scores", "folded_keys_f64", "tile_kinds"]

F64 = torch.float64

#: Tile kinds of a causal (query tile, key tile) pair.
SKIPPED, FOLDED, DIAGONAL = 0, 1, 2


def convolved_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, scale: float, causal: bool = True):
    """``C`` of one head before the ``-inf`` mask: ``q, k [N, D]``, ``w [cq, ck]``, float64 (``F.conv2d`` on the
    zero-padded, pre-masked scores, as :func:`mta.conv_attention_reference` computes them)."""
    N = q.shape[0]
    cq, ck = w.shape
    pk = (ck - 1) // 2
    s = scale * q @ k.T
    if causal:
        s = s.tril()
    return F.conv2d(F.pad(s, (pk, pk, cq - 1, 0))[None, None], w[None, None])[0, 0][:N, :N]


# --- the fused kernel's own tile rule ------------------------------------------------------------------------------

@triton.jit
def _tile_bounds_probe(OUT, n, REACH, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``OUT[t] = (full_stop, masked_stop)`` of query tile ``t``, from the kernels' :func:`key_tile_bounds`."""
    t = tl.program_id(0)
    full_stop, masked_stop = key_tile_bounds(t * BLOCK_M, n, 0, REACH, CAUSAL, BLOCK_M, BLOCK_N)
    tl.store(OUT + 2 * t, full_stop)
    tl.store(OUT + 2 * t + 1, masked_stop)


def tile_kinds(N: int, cq: int, ck: int, BM: int, BN: int, causal: bool = True) -> np.ndarray:
    """``kinds[query tile, key tile]`` (:data:`SKIPPED`, :data:`FOLDED`, :data:`DIAGONAL`) as the fused MTA kernel
    decides them: the stage bounds come from running :func:`mta.kernel_parts.key_tile_bounds` (the function
    ``conv_forward_kernel`` calls) with ``REACH = E = cq - 1 + pk``. Key tiles before ``full_stop`` are folded,
    those up to ``masked_stop`` diagonal (causal) and the rest skipped. Not causal: every tile is folded (the
    last one with its key tail masked)."""
    tiles_m, tiles_n = -(-N // BM), -(-N // BN)
    if not causal:
        return np.full((tiles_m, tiles_n), FOLDED)
    out = torch.zeros(2 * tiles_m, dtype=torch.int32, device=runtime.DEVICE)
    _tile_bounds_probe[(tiles_m,)](out, N, diagonal_reach(cq, ck)[0], CAUSAL=True, BLOCK_M=BM, BLOCK_N=BN)
    bounds = out.cpu().view(tiles_m, 2).tolist()
    kinds = np.full((tiles_m, tiles_n), SKIPPED)
    for t, (full_stop, masked_stop) in enumerate(bounds):
        for u in range(tiles_n):
            j0 = u * BN
            kinds[t, u] = FOLDED if j0 < full_stop else DIAGONAL if j0 < masked_stop else SKIPPED
    return kinds


# --- exercise 1 ----------------------------------------------------------------------------------------------------

#: ``(name, (N, D, cq, ck, seed))`` for exercise 1.
DIAGONAL_CASES = (
    ("N=12, 3x5", (12, 8, 3, 5, 1)),
    ("N=20, 6x11 (the paper's kernel)", (20, 8, 6, 11, 2)),
    ("N=9, 2x1 (ck = 1)", (9, 8, 2, 1, 3)),
    ("N=7, 1x1 (E = 0)", (7, 8, 1, 1, 4)),
    ("N=5 < ck=9, 4x9", (5, 8, 4, 9, 5)),
)


def check_diagonal_scores(fn: Callable) -> Result:
    """``fn(q, k, w, scale) -> [N, E]``: ``out[i, delta] = C[i, i - delta]`` for ``0 <= delta < E = cq - 1 + pk``
    (0 where ``i - delta < 0``), the causal convolved scores on the diagonals the pre-convolution mask reaches;
    ``q, k [N, D]``, ``w [cq, ck]``, float64."""

    def case(N, D, cq, ck, seed):
        gen = torch.Generator().manual_seed(40 + seed)
        q, k = (torch.randn(N, D, generator=gen, dtype=F64) for _ in range(2))
        w = torch.randn(cq, ck, generator=gen, dtype=F64)
        scale = 0.35
        E = diagonal_reach(cq, ck)[0]
        C = convolved_scores(q, k, w, scale)
        want = torch.zeros(N, E, dtype=F64)
        for delta in range(E):
            want[delta:, delta] = torch.diagonal(C, -delta)
        with refusing({**finished_attention(),
                       convolved_scores: "it calls convolved_scores, the checker's own answer; read S0 directly",
                       conv.diagonal_scores: "it calls mta.conv.diagonal_scores, the fused kernel's pre-pass; "
                                             "compute the diagonals from the definition",
                       conv.past_scores: "it calls mta.conv.past_scores; read S0 directly"}):
            got = fn(q.clone(), k.clone(), w.clone(), scale)
        expect_close("diagonal scores", got, want, atol=1e-10, rtol=1e-10)

    return run_cases("exercise 1 (the diagonals, from the definition)",
                     [(name, lambda a=args: case(*a)) for name, args in DIAGONAL_CASES])


# --- exercise 2 ----------------------------------------------------------------------------------------------------

#: ``(name, (N, BM, BN, cq, ck))`` for exercise 2: every tile of each grid.
TILE_CASES = (
    ("N=1, tiles 16x16, 6x11", (1, 16, 16, 6, 11)),
    ("N=37, tiles 16x16, 2x9", (37, 16, 16, 2, 9)),
    ("N=100, tiles 16x32, 6x11", (100, 16, 32, 6, 11)),
    ("N=130, tiles 32x16, 11x15", (130, 32, 16, 11, 15)),
    ("N=64, tiles 16x16, 1x1", (64, 16, 16, 1, 1)),
    ("N=33, tiles 16x16, 1x1 (a ragged last tile: decided over the whole rectangle)", (33, 16, 16, 1, 1)),
    ("N=200, tiles 64x64, 6x11", (200, 64, 64, 6, 11)),
)

_KIND_NAMES = {SKIPPED: "SKIPPED", FOLDED: "FOLDED", DIAGONAL: "DIAGONAL"}


def check_tile_kinds(fn: Callable) -> Result:
    """``fn(i0, j0, BM, BN, N, cq, ck) -> SKIPPED | FOLDED | DIAGONAL``: the kind of the causal tile with query rows
    ``[i0, i0 + BM)`` and keys ``[j0, j0 + BN)``, compared on every tile of each grid with the fused kernel's own
    rule (:func:`tile_kinds`)."""

    def case(N, BM, BN, cq, ck):
        kinds = tile_kinds(N, cq, ck, BM, BN)
        for t in range(kinds.shape[0]):
            for u in range(kinds.shape[1]):
                with refusing({tile_kinds: "it calls tile_kinds, the checker's own rule; decide from the "
                                           "definitions"}):
                    got = fn(t * BM, u * BN, BM, BN, N, cq, ck)
                want = int(kinds[t, u])
                if isinstance(got, bool) or not isinstance(got, (int, np.integer)):
                    raise CaseFailed(f"tile (i0={t * BM}, j0={u * BN}): expected an int (SKIPPED, FOLDED or "
                                     f"DIAGONAL), got {type(got).__name__} {got!r}")
                if got != want:
                    raise CaseFailed(f"tile (i0={t * BM}, j0={u * BN}): got {_KIND_NAMES.get(int(got), repr(got))}, "
                                     f"the kernel's rule says {_KIND_NAMES[want]}")

    return run_cases("exercise 2 (which tiles are diagonal tiles?)",
                     [(name, lambda a=args: case(*a)) for name, args in TILE_CASES])


# --- exercise 3 ----------------------------------------------------------------------------------------------------

#: ``(name, (N, D, cq, ck, seed))`` for exercise 3.
FOLD_CASES = (
    ("N=1, D=16, 3x5", (1, 16, 3, 5, 1)),
    ("N=37, D=16, 2x9", (37, 16, 2, 9, 2)),
    ("N=40, D=32, 6x11", (40, 32, 6, 11, 3)),
    ("N=20, D=16, 4x1 (ck = 1)", (20, 16, 4, 1, 4)),
    ("N=9 < ck=15, D=16, 3x15", (9, 16, 3, 15, 5)),
)


def check_fold_keys(fn: Callable) -> Result:
    """``fn(k, w) -> kf [cq, N, D]`` fp32 with ``kf[a, j] = sum_b w[a, b] k[j - pk + b]`` (zero outside ``[0, N)``);
    ``k [N, D]`` and ``w [cq, ck]`` fp32 on :data:`mta.runtime.DEVICE`."""

    def case(N, D, cq, ck, seed):
        gen = torch.Generator().manual_seed(60 + seed)
        k = torch.randn(N, D, generator=gen, dtype=F64)
        w = torch.randn(cq, ck, generator=gen, dtype=F64)
        pk = (ck - 1) // 2
        k_pad = F.pad(k, (0, 0, pk, pk))
        want = torch.stack([sum(w[a, b] * k_pad[b:b + N] for b in range(ck)) for a in range(cq)])
        with refusing({conv.fold_keys: "it calls mta.conv.fold_keys, the package's pre-pass; write the fold "
                                        "kernel yourself"}):
            got = own_triton_kernel("fold_keys", lambda: fn(k.float().to(runtime.DEVICE),
                                                            w.float().to(runtime.DEVICE)))
        if not isinstance(got, torch.Tensor):
            expect_equal("folded keys type", type(got).__name__, "Tensor")
        expect_equal("folded keys shape", tuple(got.shape), (cq, N, D))
        expect_close("folded keys", got.cpu(), want, atol=1e-4, rtol=1e-4)

    return run_cases("exercise 3 (Triton: the fold pre-pass)",
                     [(name, lambda a=args: case(*a)) for name, args in FOLD_CASES])


# --- exercise 4 ----------------------------------------------------------------------------------------------------

#: ``(name, (N, D, cq, ck, scale, seed))`` for exercise 4; ``scale = None``: ``D ** -0.5``.
FORWARD_CASES = (
    ("N=1, D=16, 3x5", (1, 16, 3, 5, None, 1)),
    ("N=37, D=16, 2x9 (a ragged last key tile)", (37, 16, 2, 9, None, 2)),
    ("N=40, D=32, 6x11 (the paper's kernel)", (40, 32, 6, 11, None, 3)),
    ("N=20, D=16, 1x1 (plain attention)", (20, 16, 1, 1, None, 4)),
    ("N=9 < ck=11, D=16, 4x11", (9, 16, 4, 11, None, 5)),
    ("N=48, D=16, 3x5, scale 30 (scores in the hundreds: exp overflows without a running max)",
     (48, 16, 3, 5, 30.0, 6)),
)


def folded_keys_f64(k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``kf [cq, N, D]`` float64 with ``kf[a, j] = sum_b w[a, b] k[j - pk + b]`` (zero outside ``[0, N)``):
    exercise 3's answer, what exercise 4's checker hands the learner's kernel."""
    N = k.shape[0]
    cq, ck = w.shape
    pk = (ck - 1) // 2
    k_pad = F.pad(k.double(), (0, 0, pk, pk))
    return torch.stack([sum(w[a, b].double() * k_pad[b:b + N] for b in range(ck)) for a in range(cq)])


def check_folded_forward(fn: Callable) -> Result:
    """``fn(q, kf, v, scale) -> (o [N, D], lse [N])``: non-causal MTA of one head from the folded keys, by a Triton
    kernel of the learner's; ``q, v [N, D]``, ``kf [cq, N, D]`` (exercise 3's fold of ``k`` with ``w [cq, ck]``) fp32
    on :data:`mta.runtime.DEVICE`, ``D`` a power of two >= 16. ``o`` fp32, ``lse`` fp32 in natural-log units.
    Compared with :func:`mta.conv_attention_reference` (``causal=False``) in float64 on the same ``q, k, v, w``."""
    from ...reference import conv_attention_reference

    def case(N, D, cq, ck, scale, seed):
        gen = torch.Generator().manual_seed(80 + seed)
        q, k, v = (torch.randn(N, D, generator=gen, dtype=F64) for _ in range(3))
        w = 0.3 * torch.randn(cq, ck, generator=gen, dtype=F64)
        scale = D ** -0.5 if scale is None else scale
        kf = folded_keys_f64(k, w)
        want_o, want_lse = conv_attention_reference(q[None, None], k[None, None], v[None, None], w[None],
                                                    causal=False, scale=scale, return_lse=True)
        dev = runtime.DEVICE
        with refusing({**finished_attention(), conv.fold_keys: "it calls mta.conv.fold_keys; the folded keys are "
                                                                "given, use them"}):
            got = own_triton_kernel("the folded forward", lambda: fn(q.float().to(dev), kf.float().to(dev),
                                                                     v.float().to(dev), scale))
        if not isinstance(got, tuple) or len(got) != 2:
            raise CaseFailed(f"expected (o, lse), got {type(got).__name__}")
        o, lse = got
        # fp32 scores of size |C| carry a rounding of about |C| * 1e-7 each, and the weights e^(C - lse) with it
        size = float(want_lse.abs().max())
        expect_close("o", o, want_o[0, 0], atol=2e-5 * max(1.0, size / 50), rtol=2e-5)
        expect_close("lse", lse, want_lse[0, 0], atol=1e-4, rtol=2e-5)

    return run_cases("exercise 4 (Triton: the folded-key forward loop)",
                     [(name, lambda a=args: case(*a)) for name, args in FORWARD_CASES])
