"""Checkers for chapter 03's exercises (FlashAttention-2 in Triton).

Each ``check_*`` takes the learner's function, runs it on named cases chosen to catch the usual mistakes (a
length that is not a multiple of the tile, ``Nq < Nk`` and ``Nq > Nk`` with queries that see no key, one token,
query tiles larger or smaller than key tiles, a head dimension that is not a power of two), prints one line and
returns a :class:`~mta.course.exercises.Result`. It never raises.

* :func:`check_forward_kernel` (Triton): the forward kernel, causal or not, in two stages. Besides the output and
  the log-sum-exp, it checks the *loads*: under the causal mask every query tile runs once more on keys and values
  that are NaN from the first key tile right of its diagonal tile on, so a kernel that loads such a tile (even one
  whose scores it masks) gives NaN; and it compares the number of unmasked and masked key tiles each program
  reports;
* :func:`check_key_tiles_visited`, :func:`check_visited_ratio`: counting the key tiles a causal forward visits;
* :func:`check_ds_formula`: ``dS = P * (dP - D)`` with ``D`` from ``O``, against autograd;
* :func:`check_rowsum_do_o` (Triton): the backward's pre-pass ``D_i = dO_i . O_i``;
* :func:`check_dkdv_kernel`, :func:`check_dq_kernel` (Triton): the backward's two kernels, given ``lse`` and ``D``,
  against autograd through :func:`mta.naive_attention` in float64.
"""

from __future__ import annotations

import math
import random
import warnings
from typing import Callable

import torch

from ... import runtime
from ...reference import causal_future, naive_attention
from . import (CaseFailed, Result, expect_close, expect_close_beside_neginf, expect_equal, finished_attention,
               own_triton_kernel, refusing, run_cases)

__all__ = ["BACKWARD_CASES", "FORWARD_CASES", "check_dkdv_kernel", "check_dq_kernel",
           "check_ds_formula", "check_forward_kernel", "check_key_tiles_visited", "check_rowsum_do_o",
           "check_visited_ratio", "poisoned_keys", "stage_counts"]

F64 = torch.float64
#: elementwise tolerances ``(atol, rtol)`` of the outputs, by input dtype
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (6e-3, 6e-3)}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _stage_bounds(m0: int, n_q: int, n_k: int, T_q: int, T_k: int, causal: bool = True) -> tuple[int, int]:
    """``(full_stop, masked_stop)`` of the query tile starting at row ``m0`` (causal: bottom-right alignment;
    not causal: only the key tail past the last whole tile is masked)."""
    if not causal:
        return n_k // T_k * T_k, n_k
    diag = n_k - n_q
    full_stop = min(max(m0 + diag + 1, 0), n_k) // T_k * T_k
    masked_stop = min(max(m0 + T_q + diag, 0), n_k)
    return full_stop, masked_stop


def stage_counts(n_q: int, n_k: int, T_q: int, T_k: int, causal: bool = True) -> torch.Tensor:
    """``[cdiv(n_q, T_q), 2]`` int32: for each query tile, how many key tiles its unmasked stage and its masked
    stage visit (``full_stop / T_k`` and ``cdiv(masked_stop - full_stop, T_k)``)."""
    rows = []
    for m0 in range(0, n_q, T_q):
        full_stop, masked_stop = _stage_bounds(m0, n_q, n_k, T_q, T_k, causal)
        rows.append((full_stop // T_k, _cdiv(max(masked_stop - full_stop, 0), T_k)))
    return torch.tensor(rows, dtype=torch.int32)


def poisoned_keys(n_q: int, n_k: int, T_q: int, T_k: int, tile: int) -> int:
    """The first key that causal query tile ``tile`` never needs to load: the start of the first key tile right of
    its diagonal tile (``n_k`` when there is none)."""
    _, masked_stop = _stage_bounds(tile * T_q, n_q, n_k, T_q, T_k)
    return min(_cdiv(masked_stop, T_k) * T_k, n_k)


# ---------------------------------------------------------------------------------------------------- exercise 1
#: ``(name, (Nq, Nk, D, T_q, T_k, dtype, causal[, low]))``: the problems of :func:`check_forward_kernel`, in order;
#: ``low`` shifts every score by ``-144`` (``q[..., 0] = -24``, ``k[..., 0] = 24``, ``D = 16``): ``exp2`` of a
#: score minus 0 underflows in float32 there, so a running max that starts at 0 instead of ``-inf`` (no guard
#: needed, and right whenever a row's max is above about -104) gives ``o = 0``, ``lse = -inf``.
FORWARD_CASES = (
    ("Nq=Nk=40, tiles 16x16", (40, 40, 32, 16, 16, torch.float32, True)),
    ("Nq=20 < Nk=50, tiles 16x16", (20, 50, 32, 16, 16, torch.float32, True)),
    ("Nq=20 < Nk=37, tiles 16x16 (a diagonal that ends on the first key of a key tile)",
     (20, 37, 32, 16, 16, torch.float32, True)),
    ("Nq=50 > Nk=20 (queries that see no key), tiles 16x16", (50, 20, 32, 16, 16, torch.float32, True)),
    ("Nq=Nk=1", (1, 1, 16, 16, 16, torch.float32, True)),
    ("Nq=Nk=64, tiles 32x16 (two masked key tiles per query tile)", (64, 64, 16, 32, 16, torch.float32, True)),
    ("Nq=40 < Nk=72, tiles 16x32, float16", (40, 72, 32, 16, 32, torch.float16, True)),
    ("Nq=Nk=20, every score near -144 (a running max that starts at 0 underflows)",
     (20, 20, 16, 16, 16, torch.float32, True, True)),
    ("not causal, Nq=37 > Nk=21 (a partial last key tile)", (37, 21, 32, 16, 16, torch.float32, False)),
    ("not causal, Nq=Nk=1", (1, 1, 16, 16, 16, torch.float32, False)),
    ("not causal, Nq=Nk=32 (no partial tile: no masked stage)", (32, 32, 16, 16, 16, torch.float32, False)),
    ("D=40 (a 64-wide feature block, 24 columns masked), Nq=Nk=33", (33, 33, 40, 16, 16, torch.float32, True)),
    ("not causal, D=24, Nq=30 < Nk=50, float16", (30, 50, 24, 16, 16, torch.float16, False)),
    ("D=40, Nq=40 > Nk=24, float16", (40, 24, 40, 16, 16, torch.float16, True)),
)


def _refused():
    return {**finished_attention(), stage_counts: "it calls stage_counts, the checker's own count; make each "
            "program count the key tiles its two stages visit"}


def _forward(fn, q, k, v, T_q, T_k, causal):
    """The learner's call: ``fn(q, k, v, T_q, T_k)`` when causal, with ``causal=False`` added otherwise."""
    dev = runtime.DEVICE
    args = (q.to(dev), k.to(dev), v.to(dev), T_q, T_k)
    with refusing(_refused()):
        return fn(*args) if causal else fn(*args, causal=False)


def _forward_case(fn: Callable, Nq, Nk, D, T_q, T_k, dtype, causal, low=False, *, seed):
    gen = torch.Generator().manual_seed(seed)
    tiles = _cdiv(Nq, T_q)
    H = tiles if causal else 2      # causal: one head per query tile, head t is poisoned for query tile t (below)
    q, k, v = (torch.randn(1, H, n, D, generator=gen, dtype=F64) for n in (Nq, Nk, Nk))
    if low:
        q[..., 0], k[..., 0] = -24.0, 24.0
    q, k, v = (x.to(dtype) for x in (q, k, v))
    ref, ref_lse = naive_attention(q.double(), k.double(), v.double(), causal=causal, return_lse=True)
    atol, rtol = TOL[dtype]
    if low:   # float32 scores near -144 carry an absolute rounding of about 1e-5, and each weight e^(s - m) with it
        atol, rtol = 5 * atol, 5 * rtol

    # 1. The output, the log-sum-exp and the stage counts on clean inputs, from the learner's own kernel.
    out = own_triton_kernel("attention_forward", lambda: _forward(fn, q, k, v, T_q, T_k, causal))
    if not isinstance(out, tuple) or len(out) != 3:
        raise CaseFailed(f"attention_forward must return (o, lse, visits), got {type(out).__name__}")
    o, lse, visits = out
    expect_close("o", o, ref.to(dtype), atol=atol, rtol=rtol)
    expect_close_beside_neginf("lse", lse, ref_lse, atol=10 * atol, rtol=10 * rtol)

    # 2. The loads (causal). Head t's keys and values are NaN from the first key tile right of query tile t's
    # diagonal tile on. The rows of query tiles 0..t of head t never need those keys: a kernel that never loads a
    # tile past the diagonal tile gives them finite, correct outputs; one that loads such a tile (even with its
    # scores masked, since P = 0 times a NaN value is NaN in P @ V) gives NaN.
    if causal:
        k_bad, v_bad = k.clone(), v.clone()
        for t in range(tiles):
            first = poisoned_keys(Nq, Nk, T_q, T_k, t)
            k_bad[:, t, first:] = float("nan")
            v_bad[:, t, first:] = float("nan")
        with warnings.catch_warnings():       # the later query tiles of head t do meet NaN: the interpreter warns
            warnings.simplefilter("ignore", RuntimeWarning)
            o_bad, lse_bad, _ = _forward(fn, q, k_bad, v_bad, T_q, T_k, causal)
        for t in range(tiles):
            rows = min((t + 1) * T_q, Nq)
            first = poisoned_keys(Nq, Nk, T_q, T_k, t)
            what = f"query tile {t}, with keys and values NaN from key {first} on (right of its diagonal tile)"
            expect_close(f"o of {what}", o_bad[0, t, :rows], ref[0, t, :rows].to(dtype), atol=atol, rtol=rtol)
            expect_close_beside_neginf(f"lse of {what}", lse_bad[0, t, :rows], ref_lse[0, t, :rows], atol=10 * atol,
                        rtol=10 * rtol)

    # 3. The stages each program reports: (unmasked key tiles, masked key tiles).
    want = stage_counts(Nq, Nk, T_q, T_k, causal)
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
    o, lse, visits = _forward(fn, q.float(), k.float(), v.float(), T_q, T_k, True)
    expect_close("o", o, ref.float(), atol=atol, rtol=rtol)
    expect_close_beside_neginf("lse", lse, ref_lse, atol=10 * atol, rtol=10 * rtol)
    want = stage_counts(Nq, Nk, T_q, T_k)
    expect_equal("visits shape", tuple(visits.shape), (B * H, _cdiv(Nq, T_q), 2))
    for p in range(B * H):
        expect_equal(f"visits of program (sequence {p // H}, head {p % H})", visits[p].cpu().tolist(), want.tolist())


def check_forward_kernel(fn: Callable) -> Result:
    """``fn(q, k, v, T_q, T_k, causal=True) -> (o, lse, visits)``: attention (causal: bottom-right) from a Triton
    kernel in two stages, for ``q [B, H, Nq, D]``, ``k, v [B, H, Nk, D]`` on :data:`mta.runtime.DEVICE` (any
    ``D``); ``o`` in q's dtype (0 for a query that sees no key), ``lse`` fp32 ``[B, H, Nq]`` (``-inf`` there),
    ``visits`` int32 ``[B * H, cdiv(Nq, T_q), 2]``: the key tiles each program's unmasked and masked stages
    visited. The causal cases call ``fn(q, k, v, T_q, T_k)``, the others add ``causal=False``."""
    cases = [(name, (lambda shape=shape, seed=i: _forward_case(fn, *shape, seed=30 + seed)))
             for i, (name, shape) in enumerate(FORWARD_CASES)]
    cases.append(("B=2, H=2, Nq=Nk=40, tiles 16x16 (the batch's offsets)", lambda: _batched_case(fn, 37)))
    return run_cases("exercise 1 (Triton: the forward kernel in two stages)", cases)


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


# ------------------------------------------------------------------------------------------------ exercises 5, 6
#: ``(name, (B, H, Nq, Nk, D, causal, T_q, T_k, dtype))``: the problems of :func:`check_dkdv_kernel` and
#: :func:`check_dq_kernel`, in order.
BACKWARD_CASES = (
    ("Nq=Nk=1", (1, 1, 1, 1, 16, False, 16, 16, torch.float32)),
    ("not causal, Nq=Nk=37", (1, 2, 37, 37, 16, False, 16, 16, torch.float32)),
    ("causal, Nq=Nk=1", (1, 1, 1, 1, 16, True, 16, 16, torch.float32)),
    ("causal, Nq=Nk=37", (1, 2, 37, 37, 16, True, 16, 16, torch.float32)),
    ("causal, Nq=20 < Nk=37 (a diagonal that ends on the first key of a key tile)",
     (1, 2, 20, 37, 16, True, 16, 16, torch.float32)),
    ("causal, Nq=45 > Nk=20 (queries that see no key: lse = -inf)", (1, 2, 45, 20, 16, True, 16, 16, torch.float32)),
    ("not causal, Nq=45 > Nk=20", (1, 2, 45, 20, 16, False, 16, 16, torch.float32)),
    ("causal, Nq=Nk=40, tiles 32x16", (1, 1, 40, 40, 16, True, 32, 16, torch.float32)),
    ("causal, Nq=24 < Nk=50, tiles 16x32", (1, 1, 24, 50, 16, True, 16, 32, torch.float32)),
    ("causal, D=40 (a 64-wide feature block, 24 columns masked)", (1, 1, 33, 33, 40, True, 16, 16, torch.float32)),
    ("causal, Nq=30 < Nk=50, D=24, float16", (1, 2, 30, 50, 24, True, 16, 16, torch.float16)),
    ("not causal, Nq=Nk=37, float16", (1, 2, 37, 37, 16, False, 16, 16, torch.float16)),
    ("causal, B=2, H=2, Nq=Nk=24 (the batch's offsets)", (2, 2, 24, 24, 16, True, 16, 16, torch.float32)),
)

def _backward_problem(B, H, Nq, Nk, D, causal, dtype, seed):
    """Inputs in ``dtype`` (``q, k, v, do``), the forward's ``lse`` and the pre-pass's ``D`` in fp32 (exact, from
    float64), and autograd's ``{dq, dk, dv}`` through :func:`mta.naive_attention` in float64."""
    gen = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(B, H, Nq, D, generator=gen, dtype=F64).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, H, Nk, D, generator=gen, dtype=F64).to(dtype) for _ in range(2))
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    o, lse = naive_attention(q64, k64, v64, causal=causal, return_lse=True)
    o.backward(do.double())
    delta = (do.double() * o.detach()).sum(-1)
    grads = {"dq": q64.grad, "dk": k64.grad, "dv": v64.grad}
    return (q, k, v, do), lse.detach().float(), delta.float(), grads


def _backward_call(fn, what, inputs, lse, delta, causal, T_q, T_k):
    dev = runtime.DEVICE
    args = [x.to(dev) for x in (*inputs, lse, delta)]
    with refusing(finished_attention()):
        return own_triton_kernel(what, lambda: fn(*args, causal, T_q, T_k))


def _backward_cases(fn, what, names, seed0):
    def case(B, H, Nq, Nk, D, causal, T_q, T_k, dtype, seed):
        inputs, lse, delta, grads = _backward_problem(B, H, Nq, Nk, D, causal, dtype, seed)
        out = _backward_call(fn, what, inputs, lse, delta, causal, T_q, T_k)
        out = out if isinstance(out, tuple) else (out,)
        if len(out) != len(names):
            raise CaseFailed(f"{what} must return {', '.join(names)}: got {len(out)} value(s)")
        atol, rtol = TOL[dtype]
        for name, got in zip(names, out):
            if isinstance(got, torch.Tensor) and got.dtype != dtype:
                expect_equal(f"{name}'s dtype", got.dtype, dtype)
            expect_close(name, got, grads[name], atol=atol, rtol=rtol)

    return [(name, (lambda shape=shape, seed=i: case(*shape, seed=seed0 + seed)))
            for i, (name, shape) in enumerate(BACKWARD_CASES)]


def check_dkdv_kernel(fn: Callable) -> Result:
    """``fn(q, k, v, do, lse, delta, causal, T_q, T_k) -> (dk, dv)`` from a Triton kernel with one program per key
    tile, for ``q, do [B, H, Nq, D]``, ``k, v [B, H, Nk, D]`` on :data:`mta.runtime.DEVICE` (any ``D``), the
    forward's ``lse`` and the pre-pass's ``delta`` fp32 ``[B, H, Nq]`` (``lse = -inf`` for a query that sees no
    key); ``dk, dv`` in k's dtype, against autograd in float64."""
    return run_cases("exercise 5 (Triton: the dK/dV kernel)",
                     _backward_cases(fn, "attention_dkdv", ("dk", "dv"), 80))


def check_dq_kernel(fn: Callable) -> Result:
    """``fn(q, k, v, do, lse, delta, causal, T_q, T_k) -> dq`` from a Triton kernel with one program per query
    tile; arguments as for :func:`check_dkdv_kernel`; ``dq`` in q's dtype, against autograd in float64."""
    return run_cases("exercise 6 (Triton: the dQ kernel)", _backward_cases(fn, "attention_dq", ("dq",), 80))
