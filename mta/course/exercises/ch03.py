"""Checkers for chapter 03's exercises (FlashAttention-2 in Triton).

Each ``check_*`` takes the learner's function, runs it on named cases chosen to catch the usual mistakes (a
length that is not a multiple of the tile, ``Nq < Nk`` and ``Nq > Nk`` with queries that see no key, one token,
query tiles larger or smaller than key tiles), prints one line and returns a :class:`~mta.course.exercises.Result`. It
never raises.

* :func:`check_causal_kernel` (Triton): a causal forward kernel in two stages. Besides the output and the
  log-sum-exp, it checks the *loads*: every query tile runs once more on keys and values that are NaN from the
  first key tile right of its diagonal tile on, so a kernel that loads such a tile (even one whose scores it
  masks) gives NaN; and it compares the number of unmasked and masked key tiles each program reports;
* :func:`check_key_tiles_visited`, :func:`check_visited_ratio`: counting the key tiles a causal forward visits;
* :func:`check_ds_formula`: ``dS = P * (dP - D)`` with ``D`` from ``O``, against autograd;
* :func:`check_rowsum_do_o` (Triton): the backward's pre-pass ``D_i = dO_i . O_i``.
"""

from __future__ import annotations

import math
import random
import warnings
from typing import Callable

import torch

from ... import runtime
from ...reference import causal_future, naive_attention
from . import (CaseFailed, Result, expect_close, expect_equal, finished_attention, own_triton_kernel, refusing,
               run_cases)

__all__ = ["CAUSAL_CASES", "check_causal_kernel", "check_ds_formula", "check_key_tiles_visited",
           "check_rowsum_do_o", "check_visited_ratio", "poisoned_keys", "stage_counts"]

F64 = torch.float64
#: elementwise tolerances ``(atol, rtol)`` of the outputs, by input dtype
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (6e-3, 6e-3)}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _stage_bounds(m0: int, n_q: int, n_k: int, T_q: int, T_k: int) -> tuple[int, int]:
    """``(full_stop, masked_stop)`` of the causal query tile starting at row ``m0`` (bottom-right alignment)."""
    diag = n_k - n_q
    full_stop = min(max(m0 + diag + 1, 0), n_k) // T_k * T_k
    masked_stop = min(max(m0 + T_q + diag, 0), n_k)
    return full_stop, masked_stop


def stage_counts(n_q: int, n_k: int, T_q: int, T_k: int) -> torch.Tensor:
    """``[cdiv(n_q, T_q), 2]`` int32: for each query tile, how many key tiles its unmasked stage and its masked
    stage visit (``full_stop / T_k`` and ``cdiv(masked_stop - full_stop, T_k)``)."""
    rows = []
    for m0 in range(0, n_q, T_q):
        full_stop, masked_stop = _stage_bounds(m0, n_q, n_k, T_q, T_k)
        rows.append((full_stop // T_k, _cdiv(max(masked_stop - full_stop, 0), T_k)))
    return torch.tensor(rows, dtype=torch.int32)


def poisoned_keys(n_q: int, n_k: int, T_q: int, T_k: int, tile: int) -> int:
    """The first key that query tile ``tile`` never needs to load: the start of the first key tile right of its
    diagonal tile (``n_k`` when there is none)."""
    _, masked_stop = _stage_bounds(tile * T_q, n_q, n_k, T_q, T_k)
    return min(_cdiv(masked_stop, T_k) * T_k, n_k)


def _expect_lse(what, got, want, *, atol, rtol):
    """``-inf`` in ``want`` (a query that sees no key) must be ``-inf`` in ``got``; the rest close."""
    if not isinstance(got, torch.Tensor):
        raise CaseFailed(f"{what}: expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(want.shape):
        raise CaseFailed(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    neg = torch.isneginf(want)
    if not torch.equal(torch.isneginf(got), neg):
        index = tuple(int(i) for i in torch.nonzero(torch.isneginf(got) != neg)[0])
        raise CaseFailed(f"{what}: at index {index} got {got[index].item():.6g}, expected {want[index].item():.6g}")
    expect_close(what, got.masked_fill(neg, 0.0), want.masked_fill(neg, 0.0), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------------- exercise 1
#: ``(name, (Nq, Nk, D, T_q, T_k, dtype[, low]))``: the problems of :func:`check_causal_kernel`, in order; ``low``
#: shifts every score by ``-144`` (``q[..., 0] = -24``, ``k[..., 0] = 24``, ``D = 16``): ``exp2`` of a score minus 0
#: underflows in float32 there, so a running max that starts at 0 instead of ``-inf`` (no guard needed, and right
#: whenever a row's max is above about -104) gives ``o = 0``, ``lse = -inf``.
CAUSAL_CASES = (
    ("Nq=Nk=40, tiles 16x16", (40, 40, 32, 16, 16, torch.float32)),
    ("Nq=20 < Nk=50, tiles 16x16", (20, 50, 32, 16, 16, torch.float32)),
    ("Nq=20 < Nk=37, tiles 16x16 (a diagonal that ends on the first key of a key tile)",
     (20, 37, 32, 16, 16, torch.float32)),
    ("Nq=50 > Nk=20 (queries that see no key), tiles 16x16", (50, 20, 32, 16, 16, torch.float32)),
    ("Nq=Nk=1", (1, 1, 16, 16, 16, torch.float32)),
    ("Nq=Nk=64, tiles 32x16 (two masked key tiles per query tile)", (64, 64, 16, 32, 16, torch.float32)),
    ("Nq=40 < Nk=72, tiles 16x32, float16", (40, 72, 32, 16, 32, torch.float16)),
    ("Nq=Nk=20, every score near -144 (a running max that starts at 0 underflows)",
     (20, 20, 16, 16, 16, torch.float32, True)),
)


def _refused():
    return {**finished_attention(), stage_counts: "it calls stage_counts, the checker's own count; make each "
            "program count the key tiles its two stages visit"}


def _causal_case(fn: Callable, Nq, Nk, D, T_q, T_k, dtype, low=False, *, seed):
    gen = torch.Generator().manual_seed(seed)
    tiles = _cdiv(Nq, T_q)
    H = tiles                       # one head per query tile: head t is poisoned for query tile t (below)
    q, k, v = (torch.randn(1, H, n, D, generator=gen, dtype=F64) for n in (Nq, Nk, Nk))
    if low:
        q[..., 0], k[..., 0] = -24.0, 24.0
    q, k, v = (x.to(dtype) for x in (q, k, v))
    ref, ref_lse = naive_attention(q.double(), k.double(), v.double(), causal=True, return_lse=True)
    atol, rtol = TOL[dtype]
    if low:   # float32 scores near -144 carry an absolute rounding of about 1e-5, and each weight e^(s - m) with it
        atol, rtol = 5 * atol, 5 * rtol
    dev = runtime.DEVICE

    # 1. The output, the log-sum-exp and the stage counts on clean inputs, from the learner's own kernel.
    with refusing(_refused()):
        out = own_triton_kernel("attention_causal", lambda: fn(q.to(dev), k.to(dev), v.to(dev), T_q, T_k))
    if not isinstance(out, tuple) or len(out) != 3:
        raise CaseFailed(f"attention_causal must return (o, lse, visits), got {type(out).__name__}")
    o, lse, visits = out
    expect_close("o", o, ref.to(dtype), atol=atol, rtol=rtol)
    _expect_lse("lse", lse, ref_lse, atol=10 * atol, rtol=10 * rtol)

    # 2. The loads. Head t's keys and values are NaN from the first key tile right of query tile t's diagonal tile
    # on. The rows of query tiles 0..t of head t never need those keys: a kernel that never loads a tile past the
    # diagonal tile gives them finite, correct outputs; one that loads such a tile (even with its scores masked,
    # since P = 0 times a NaN value is NaN in P @ V) gives NaN.
    k_bad, v_bad = k.clone(), v.clone()
    for t in range(tiles):
        first = poisoned_keys(Nq, Nk, T_q, T_k, t)
        k_bad[:, t, first:] = float("nan")
        v_bad[:, t, first:] = float("nan")
    with warnings.catch_warnings():       # the later query tiles of head t do meet NaN: the interpreter warns
        warnings.simplefilter("ignore", RuntimeWarning)
        with refusing(_refused()):
            o_bad, lse_bad, _ = fn(q.to(dev), k_bad.to(dev), v_bad.to(dev), T_q, T_k)
    for t in range(tiles):
        rows = min((t + 1) * T_q, Nq)
        first = poisoned_keys(Nq, Nk, T_q, T_k, t)
        what = f"query tile {t}, with keys and values NaN from key {first} on (right of its diagonal tile)"
        expect_close(f"o of {what}", o_bad[0, t, :rows], ref[0, t, :rows].to(dtype), atol=atol, rtol=rtol)
        _expect_lse(f"lse of {what}", lse_bad[0, t, :rows], ref_lse[0, t, :rows], atol=10 * atol, rtol=10 * rtol)

    # 3. The stages each program reports: (unmasked key tiles, masked key tiles).
    want = stage_counts(Nq, Nk, T_q, T_k)
    if not isinstance(visits, torch.Tensor):
        raise CaseFailed(f"visits: expected a tensor, got {type(visits).__name__}")
    expect_equal("visits shape", tuple(visits.shape), (H, tiles, 2))
    for t in range(tiles):
        got_t = tuple(int(x) for x in visits[0, t].cpu())
        expect_equal(f"visits of query tile {t} (unmasked, masked key tiles)", got_t, tuple(int(x) for x in want[t]))


def _batched_case(fn: Callable, seed: int):
    """Two sequences of two heads each (every case above has one sequence): the output, the log-sum-exp and every
    program's stage counts."""
    B, H, Nq, Nk, D, T_q, T_k = 2, 2, 40, 40, 32, 16, 16
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=gen, dtype=F64) for n in (Nq, Nk, Nk))
    ref, ref_lse = naive_attention(q, k, v, causal=True, return_lse=True)
    atol, rtol = TOL[torch.float32]
    dev = runtime.DEVICE
    with refusing(_refused()):
        o, lse, visits = fn(*(x.float().to(dev) for x in (q, k, v)), T_q, T_k)
    expect_close("o", o, ref.float(), atol=atol, rtol=rtol)
    _expect_lse("lse", lse, ref_lse, atol=10 * atol, rtol=10 * rtol)
    want = stage_counts(Nq, Nk, T_q, T_k)
    expect_equal("visits shape", tuple(visits.shape), (B * H, _cdiv(Nq, T_q), 2))
    for p in range(B * H):
        expect_equal(f"visits of program (sequence {p // H}, head {p % H})", visits[p].cpu().tolist(), want.tolist())


def check_causal_kernel(fn: Callable) -> Result:
    """``fn(q, k, v, T_q, T_k) -> (o, lse, visits)``: causal (bottom-right) attention from a Triton kernel in two
    stages, for ``q [B, H, Nq, D]``, ``k, v [B, H, Nk, D]`` on :data:`mta.runtime.DEVICE` (``D`` a power of two
    >= 16); ``o`` in q's dtype (0 for a query that sees no key), ``lse`` fp32 ``[B, H, Nq]`` (``-inf`` there),
    ``visits`` int32 ``[B * H, cdiv(Nq, T_q), 2]``: the key tiles each program's unmasked and masked stages
    visited."""
    cases = [(name, (lambda shape=shape, seed=i: _causal_case(fn, *shape, seed=30 + seed)))
             for i, (name, shape) in enumerate(CAUSAL_CASES)]
    cases.append(("B=2, H=2, Nq=Nk=40, tiles 16x16 (the batch's offsets)", lambda: _batched_case(fn, 37)))
    return run_cases("exercise 1 (Triton: a causal kernel in two stages)", cases)


# ---------------------------------------------------------------------------------------------------- exercise 2
def _visited_brute_force(n_q, n_k, T_q, T_k, causal):
    """Key tiles with at least one visible (query, key) pair, counted over the true mask."""
    visible = ~causal_future(n_q, n_k, "cpu") if causal else torch.ones(n_q, n_k, dtype=torch.bool)
    return sum(bool(visible[i:i + T_q, j:j + T_k].any()) for i in range(0, n_q, T_q) for j in range(0, n_k, T_k))


KEY_TILE_CASES = (
    ("Nq=Nk=64, tiles 16x16, causal", (64, 64, 16, 16, True)),
    ("Nq=Nk=64, tiles 16x16, not causal", (64, 64, 16, 16, False)),
    ("Nq=Nk=37, tiles 16x16, causal", (37, 37, 16, 16, True)),
    ("Nq=20 < Nk=50, tiles 16x16, causal", (20, 50, 16, 16, True)),
    ("Nq=50 > Nk=20, tiles 16x16, causal", (50, 20, 16, 16, True)),
    ("Nq=Nk=100, tiles 32x16, causal", (100, 100, 32, 16, True)),
    ("Nq=Nk=100, tiles 16x32, causal", (100, 100, 16, 32, True)),
    ("Nq=Nk=1000, tiles 128x64, causal", (1000, 1000, 128, 64, True)),
)


def check_key_tiles_visited(fn: Callable) -> Result:
    """``fn(n_q, n_k, T_q, T_k, causal) -> int``: key tiles loaded by all the programs of one head together,
    against a brute-force count over the mask; then 40 random shapes x 4 tiles x both masks."""

    def case(shape):
        expect_equal(f"key_tiles_visited{shape}", fn(*shape), _visited_brute_force(*shape))

    def random_shapes():
        rnd = random.Random(5)
        for _ in range(40):
            n_q, n_k = rnd.randint(1, 200), rnd.randint(1, 200)
            for T_q, T_k in ((16, 16), (32, 16), (16, 32), (128, 64)):
                for causal in (False, True):
                    case((n_q, n_k, T_q, T_k, causal))

    cases = [(name, (lambda shape=shape: case(shape))) for name, shape in KEY_TILE_CASES]
    cases.append(("40 random shapes (seed 5), 4 tiles, causal and not", random_shapes))
    return run_cases("exercise 2a (key tiles a forward visits)", cases)


def check_visited_ratio(fn: Callable, T_k: int = 64) -> Result:
    """``fn(N, T_q) -> float``: the closed form of visited(causal) / visited(non-causal) for ``Nq = Nk = N`` a
    multiple of ``T_q``, ``T_q`` a multiple of ``T_k``; compared with the brute-force count's ratio."""

    def case(N, T_q):
        want = _visited_brute_force(N, N, T_q, T_k, True) / _visited_brute_force(N, N, T_q, T_k, False)
        got = fn(N, T_q)
        if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-12):
            raise CaseFailed(f"visited_ratio({N}, {T_q}): got {got!r}, expected {want!r}")

    shapes = [(128, 128), (256, 128), (512, 64), (1024, 128), (1536, 256)]
    return run_cases("exercise 2b (the causal / non-causal ratio in closed form)",
                     [(f"N={N}, T_q={T_q}", (lambda N=N, T_q=T_q: case(N, T_q))) for N, T_q in shapes])


# ---------------------------------------------------------------------------------------------------- exercise 3
def _ds_problem(n_q, n_k, d, masked, seed):
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(n_q, n_k, generator=gen, dtype=F64) * 2
    for i, j in masked:
        s[i, j] = -math.inf
    v = torch.randn(n_k, d, generator=gen, dtype=F64)
    do = torch.randn(n_q, d, generator=gen, dtype=F64)
    return s, v, do


DS_CASES = (
    ("5 queries, 7 keys, one masked score", (5, 7, 4, [(1, 3)])),
    ("one query, one key", (1, 1, 4, [])),
    ("a row with only one visible key", (4, 6, 3, [(2, 0), (2, 1), (2, 2), (2, 4), (2, 5)])),
    ("16 queries, 40 keys, causal-like mask", (16, 40, 8, [(i, j) for i in range(16) for j in range(40)
                                                            if j > i + 24])),
)


def check_ds_formula(fn: Callable) -> Result:
    """``fn(s, v, do) -> dS``: ``P * (dP - D)`` with ``D`` from ``O``, for float64 scores ``s [Nq, Nk]`` (``-inf``
    where masked), ``v [Nk, d]``, ``do [Nq, d]``; against autograd of ``L = sum(do * softmax(s) @ v)``."""

    def case(n_q, n_k, d, masked, seed):
        s, v, do = _ds_problem(n_q, n_k, d, masked, seed)
        s_auto = s.clone().requires_grad_()
        (do * (torch.softmax(s_auto, dim=-1) @ v)).sum().backward()
        got = fn(s.clone(), v.clone(), do.clone())
        expect_close("dS", got, s_auto.grad, atol=1e-12, rtol=1e-10)
        for i, j in masked:
            expect_equal(f"dS[{i}, {j}] (a masked score)", got[i, j].item(), 0.0)

    return run_cases("exercise 3 (dS from the D term)",
                     [(name, (lambda shape=shape, seed=i: case(*shape, seed=40 + seed)))
                      for i, (name, shape) in enumerate(DS_CASES)])


# ---------------------------------------------------------------------------------------------------- exercise 4
#: ``(name, (B, H, N, D, dtype, transposed))``: ``transposed`` passes views of ``[B, N, H, D]`` tensors.
ROWSUM_CASES = (
    ("N=1, D=16", (1, 1, 1, 16, torch.float32, False)),
    ("B=2, H=3, N=37, D=16", (2, 3, 37, 16, torch.float32, False)),
    ("N=50, D=96 (not a power of two)", (1, 2, 50, 96, torch.float32, False)),
    ("N=33, D=40, float16", (1, 2, 33, 40, torch.float16, False)),
    ("B=2, H=3, N=20, D=32, [B, N, H, D] views", (2, 3, 20, 32, torch.float32, True)),
)


def check_rowsum_do_o(fn: Callable) -> Result:
    """``fn(o, do) -> D``: ``D[b, h, i] = sum_d do[b, h, i, d] * o[b, h, i, d]`` in fp32, ``[B, H, N]``, from a
    Triton kernel; ``o, do [B, H, N, D]`` on :data:`mta.runtime.DEVICE`, any ``D``, maybe non-contiguous."""

    def case(B, H, N, D, dtype, transposed, seed):
        gen = torch.Generator().manual_seed(seed)
        shape = (B, N, H, D) if transposed else (B, H, N, D)
        o, do = (torch.randn(*shape, generator=gen, dtype=F64).to(dtype) for _ in range(2))
        if transposed:
            o, do = o.transpose(1, 2), do.transpose(1, 2)
        want = (o.double() * do.double()).sum(-1)
        got = own_triton_kernel("rowsum_do_o", lambda: fn(o.to(runtime.DEVICE), do.to(runtime.DEVICE)))
        if isinstance(got, torch.Tensor) and got.dtype != torch.float32:
            expect_equal("D's dtype", got.dtype, torch.float32)
        expect_close("D", got, want, atol=1e-4, rtol=1e-4)

    return run_cases("exercise 4 (Triton: the backward's pre-pass D = rowsum(dO * O))",
                     [(name, (lambda shape=shape, seed=i: case(*shape, seed=60 + seed)))
                      for i, (name, shape) in enumerate(ROWSUM_CASES)])
