"""Checkers for chapter 05's exercises (the MTA backward).

Each checker runs the learner's function on a few small, awkward problems (one token, a length that is not a
multiple of the tile, grouped-query attention, causal and not) and compares its answer with float64 values:
autograd's through the same steps as :func:`mta.conv_attention_reference` (exercises 1, 2 and 5), the sums from
their definition (exercises 3 and 4). With one token ``P = 1`` and ``dC = 0``, so every answer there but exercise 5's
``dV`` is zero: that case checks shapes and finite values only. It prints one line and returns a
:class:`mta.course.exercises.Result`; it never raises.

* :func:`check_scores_grad`: ``dS`` from ``dC``, the transposed convolution and the pre-convolution mask;
* :func:`check_kernel_grad`: ``dweight`` as a correlation of ``dC`` with the padded ``S0``;
* :func:`check_dw_partials`: per-tile partials of the far part's ``dweight`` (a Triton kernel);
* :func:`check_dq_far`: the far part of ``dq`` straight from a stored ``dC_far``, as the two-phase backward's
  ``conv_dq_far_kernel`` makes it (a Triton kernel);
* :func:`check_teaching_dv`: section 4's ``dV`` per key tile, ``P`` rebuilt from the convolved scores and the
  log-sum-exp (a Triton kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ...reference import causal_future, conv_attention_reference, expand_kv
from . import Result, expect_close, expect_equal, finished_attention, own_triton_kernel, refusing, run_cases


@dataclass(frozen=True)
class Problem:
    """One MTA problem in float64 and every intermediate of its forward and backward.

    ``S`` the scaled scores, ``S0`` after the pre-convolution zero, ``C`` the convolved scores (before the
    ``-inf`` mask), ``P``, ``O``; ``dC``, ``dS0``, ``dS`` their gradients for the output gradient ``do``; ``grads``:
    autograd's ``(dq, dk, dv, dweight)`` through :func:`mta.conv_attention_reference`.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    weight: torch.Tensor
    do: torch.Tensor
    causal: bool
    scale: float
    S0: torch.Tensor
    dC: torch.Tensor
    dS0: torch.Tensor
    dS: torch.Tensor
    grads: tuple


def make_problem(B: int, Hq: int, Hkv: int, N: int, D: int, cq: int, ck: int, causal: bool, seed: int,
                 round_to: torch.dtype | None = None) -> Problem:
    """A random problem (fixed seed, float64) with its forward and backward intermediates (see :class:`Problem`).
    ``round_to``: ``q, k, v, do`` hold values of that dtype (the problem of a kernel fed with them; the weight stays
    as drawn)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return std * torch.randn(*shape, generator=gen, dtype=torch.float64)

    def rounded(x):
        return x if round_to is None else x.to(round_to).double()

    q, k, v = rounded(randn(B, Hq, N, D)), rounded(randn(B, Hkv, N, D)), rounded(randn(B, Hkv, N, D))
    weight, do = randn(Hq, cq, ck, std=0.3), rounded(randn(B, Hq, N, D))
    scale = D ** -0.5
    pk = (ck - 1) // 2
    future = causal_future(N, N, "cpu")
    S = (scale * q @ expand_kv(k, Hq).transpose(-1, -2)).requires_grad_()
    S0 = S.masked_fill(future, 0.0) if causal else S.clone()
    S0.retain_grad()
    C = F.conv2d(F.pad(S0, (pk, pk, cq - 1, 0)), weight[:, None], groups=Hq)
    C.retain_grad()
    Cm = C.masked_fill(future, float("-inf")) if causal else C
    O = torch.softmax(Cm, dim=-1) @ expand_kv(v, Hq)
    O.backward(do)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, weight)]
    out = conv_attention_reference(*leaves, causal=causal)
    grads = torch.autograd.grad(out, leaves, do)
    return Problem(q, k, v, weight, do, causal, scale, S0.detach(), C.grad, S0.grad, S.grad, grads)


def far_dc(p: Problem) -> torch.Tensor:
    """``dC_far [B, Hq, N, N]`` float64: ``dC`` with the ``E = cq - 1 + pk`` diagonals ``0 <= i - j < E`` zeroed
    when causal (all of ``dC`` when not)."""
    N = p.q.shape[2]
    cq, ck = p.weight.shape[1:]
    E = cq - 1 + (ck - 1) // 2
    i = torch.arange(N)[:, None]
    j = torch.arange(N)[None, :]
    return p.dC.masked_fill((i - j >= 0) & (i - j < E), 0.0) if p.causal else p.dC


def folded_keys(p: Problem) -> torch.Tensor:
    """``kf [B, Hq, cq, N, D]`` float64, ``kf[b, h, a, j] = sum_b' w[h, a, b'] k[b, h // G, j - pk + b']`` (zero
    outside ``[0, N)``): chapter 04's folded keys, per query head."""
    B, Hq, N, D = p.q.shape
    cq, ck = p.weight.shape[1:]
    pk = (ck - 1) // 2
    k_pad = F.pad(expand_kv(p.k, Hq), (0, 0, pk, pk))
    return torch.stack([sum(p.weight[:, a, b, None, None] * k_pad[:, :, b:b + N] for b in range(ck))
                        for a in range(cq)], dim=2)


def dq_far_truth(dc_far: torch.Tensor, kf: torch.Tensor, scale: float) -> torch.Tensor:
    """``dq[b, h, r] = scale sum_a sum_j dc_far[b, h, r + cq-1-a, j] kf[b, h, a, j]`` (rows past ``N`` read as 0),
    float64 ``[B, Hq, N, D]``."""
    cq, N = kf.shape[2], kf.shape[3]
    out = torch.zeros(*dc_far.shape[:2], N, kf.shape[-1], dtype=torch.float64)
    for a in range(cq):
        gq = dc_far.double() @ kf[:, :, a].double()                 # Gq_a [B, Hq, N, D]
        shift = cq - 1 - a                                          # dq row r reads Gq_a row r + shift
        out[:, :, :N - shift] += gq[:, :, shift:]
    return scale * out


def far_part_u(p: Problem) -> torch.Tensor:
    """``U[b, h, a, j] = sum_i dC_far[i, j] q[i - (cq-1) + a]``, ``[B, Hq, cq, N, D]`` float64: ``dC_far`` is
    ``dC`` with the ``E = cq - 1 + pk`` diagonals ``0 <= i - j < E`` zeroed when causal (all of ``dC`` when not)."""
    N = p.q.shape[2]
    cq = p.weight.shape[1]
    dc_far = far_dc(p)
    q_pad = F.pad(p.q, (0, 0, cq - 1, 0))
    return torch.stack([dc_far.transpose(-1, -2) @ q_pad[:, :, a:a + N] for a in range(cq)], dim=2)


def dw_partials_truth(u: torch.Tensor, k: torch.Tensor, ck: int, block_r: int) -> torch.Tensor:
    """``out[t, b, h, a, b'] = sum_{c in tile t} <u[b, h, a, c + pk - b'], k[b, h // G, c]>``, float64."""
    B, Hq, cq, N, D = u.shape
    pk = (ck - 1) // 2
    kx = expand_kv(k.double(), Hq)
    u_pad = F.pad(u.double(), (0, 0, pk, pk))                    # row c + pk - b' of u is row c + 2 pk - b' here
    tiles = -(-N // block_r)
    out = torch.zeros(tiles, B, Hq, cq, ck, dtype=torch.float64)
    for bb in range(ck):
        prod = (u_pad[..., 2 * pk - bb:2 * pk - bb + N, :] * kx[:, :, None]).sum(-1)   # [B, Hq, cq, N]
        prod = F.pad(prod, (0, tiles * block_r - N)).reshape(B, Hq, cq, tiles, block_r).sum(-1)
        out[..., bb] = prod.permute(3, 0, 1, 2)
    return out


#: ``(name, (B, Hq, Hkv, N, D, cq, ck, causal))``: the problems every checker of this chapter runs, in order.
CASES = (
    ("N=1, 3x5, causal (dC = 0: shapes and finite values only)", (1, 2, 1, 1, 8, 3, 5, True)),
    ("N=7 < ck=9, 2x9, causal", (1, 1, 1, 7, 8, 2, 9, True)),
    ("N=21, 3x5, non-causal", (1, 2, 2, 21, 8, 3, 5, False)),
    ("GQA 4:2, B=2, N=37, 4x7, causal", (2, 4, 2, 37, 8, 4, 7, True)),
    ("kernel 1x1, N=19, causal", (1, 2, 1, 19, 8, 1, 1, True)),
)


def _problems(cases=CASES):
    for index, (name, shape) in enumerate(cases):
        yield name, shape, index


def _cases(make_case: Callable, cases=CASES):
    """``(name, case)`` pairs; each case builds its problem only when it runs (stopping early saves work)."""
    return [(name, (lambda shape=shape, seed=seed: make_case(make_problem(*shape, seed=50 + seed))))
            for name, shape, seed in _problems(cases)]


def check_scores_grad(fn: Callable) -> Result:
    """``fn(dC, weight, causal) -> dS``: the gradient of the scores ``S`` (before the pre-convolution zero) from
    ``dC [B, Hq, N, N]`` and ``weight [Hq, cq, ck]``, all float64."""

    def case(p: Problem):
        with refusing(finished_attention()):
            got = fn(p.dC.clone(), p.weight.clone(), p.causal)
        expect_close("dS", got, p.dS, atol=1e-10, rtol=1e-8)

    return run_cases("exercise 1 (dS: the convolution's transpose and the pre-mask)", _cases(case))


def check_kernel_grad(fn: Callable) -> Result:
    """``fn(dC, S0, cq, ck) -> dweight [Hq, cq, ck]``: the kernel's gradient from ``dC`` and the pre-masked
    scores ``S0`` (both ``[B, Hq, N, N]``, float64), summed over the batch."""

    def case(p: Problem):
        cq, ck = p.weight.shape[1:]
        with refusing(finished_attention()):
            got = fn(p.dC.clone(), p.S0.clone(), cq, ck)
        expect_close("dweight", got, p.grads[3], atol=1e-10, rtol=1e-8)

    return run_cases("exercise 2 (dweight: a correlation of dC with S0)", _cases(case))


def check_dw_partials(fn: Callable, block_r: int = 16) -> Result:
    """``fn(u, k, ck, block_r) -> partials [cdiv(N, block_r), B, Hq, cq, ck]`` fp32, with
    ``partials[t, b, h, a, b'] = sum_{c in tile t} <u[b, h, a, c + pk - b'], k[b, h // G, c]>``.

    ``u``: the far part's ``U`` (:func:`far_part_u`), ``[B, Hq, cq, N, D]`` fp32; ``k``: ``[B, Hkv, N, D]`` fp32,
    both on :data:`mta.runtime.DEVICE`. Also checks that ``scale * partials.sum((0, 1))`` is the far part's share
    of ``dweight``, computed directly from ``dC_far`` and ``S0``."""
    from ... import runtime

    def case(p: Problem, block_r=block_r):
        cq, ck = p.weight.shape[1:]
        N = p.q.shape[2]
        u = far_part_u(p)
        with refusing({dw_partials_truth: "it calls dw_partials_truth, the checker's own answer; write the "
                                          "kernel that sums each row tile"}):
            got = own_triton_kernel("dw_partials", lambda: fn(u.float().to(runtime.DEVICE),
                                                              p.k.float().to(runtime.DEVICE), ck, block_r))
        tiles = -(-N // block_r)
        if not isinstance(got, torch.Tensor):
            expect_equal("partials type", type(got).__name__, "Tensor")
        expect_equal("partials shape", tuple(got.shape), (tiles, *p.q.shape[:2], cq, ck))
        want = dw_partials_truth(u, p.k, ck, block_r)
        for t in range(tiles):
            expect_close(f"partials of row tile {t}", got[t].cpu(), want[t], atol=1e-4, rtol=1e-4)
        expect_close("scale * partials.sum((0, 1))", p.scale * got.cpu().double().sum((0, 1)),
                     _far_dweight(p), atol=1e-4, rtol=1e-4)

    # Every case above runs one block_r; the last one runs twice that, so that a launcher that ignores its block_r
    # argument (a tile size written into the kernel) fails.
    name, shape = CASES[3]
    other = 2 * block_r
    return run_cases("exercise 3 (Triton: the far part's dweight partials)", _cases(case) + [
        (f"{name}, block_r = {other}", lambda: case(make_problem(*shape, seed=50 + 3), other))])


#: ``(name, (B, Hq, Hkv, N, D, cq, ck, causal))`` for exercise 4: :data:`CASES` with a head dimension of 16, the
#: smallest that ``tl.dot`` takes.
DQ_CASES = (
    ("N=1, 3x5, causal (dC = 0: shapes and finite values only)", (1, 2, 1, 1, 16, 3, 5, True)),
    ("N=7 < ck=9, 2x9, causal", (1, 1, 1, 7, 16, 2, 9, True)),
    ("N=21, 3x5, non-causal (the far part is all of dq)", (1, 2, 2, 21, 16, 3, 5, False)),
    ("GQA 4:2, B=2, N=37, 4x7, causal", (2, 4, 2, 37, 16, 4, 7, True)),
    ("kernel 1x1, N=19, causal", (1, 2, 1, 19, 16, 1, 1, True)),
)


def check_dq_far(fn: Callable) -> Result:
    """``fn(dc_far, kf, scale) -> dq [B, Hq, N, D]`` fp32: the far part of ``dq``,
    ``dq[r] = scale sum_a sum_j dc_far[r + cq-1-a, j] kf_a[j]``, by a Triton kernel of the learner's.

    ``dc_far``: ``[B, Hq, N, N]`` fp32, ``dC`` with the ``E`` near diagonals zeroed (:func:`far_dc`), as the
    two-phase backward's phase 1 stores it; ``kf``: the folded keys ``[B, Hq, cq, N, D]`` fp32 (:func:`folded_keys`);
    both on :data:`mta.runtime.DEVICE`, ``D`` a power of two >= 16. Compared with :func:`dq_far_truth` in float64;
    not causal there is no near part, and the answer is also compared with autograd's ``dq``."""
    from ... import runtime

    def case(p: Problem):
        dc_far, kf = far_dc(p), folded_keys(p)
        dev = runtime.DEVICE
        with refusing({dq_far_truth: "it calls dq_far_truth, the checker's own answer; write the kernel that "
                                     "reads the shifted rows of dc_far"}):
            got = own_triton_kernel("dq_far", lambda: fn(dc_far.float().to(dev), kf.float().to(dev), p.scale))
        if not isinstance(got, torch.Tensor):
            expect_equal("dq type", type(got).__name__, "Tensor")
        expect_close("far part of dq", got.cpu(), dq_far_truth(dc_far, kf, p.scale), atol=1e-4, rtol=1e-4)
        if not p.causal:
            expect_close("dq (not causal: all of it is far)", got.cpu(), p.grads[0], atol=1e-4, rtol=1e-4)

    return run_cases("exercise 4 (Triton: dq's far part from the stored dC_far)",
                     [(name, (lambda shape=shape, seed=i: case(make_problem(*shape, seed=70 + seed))))
                      for i, (name, shape) in enumerate(DQ_CASES)])


#: ``(name, (B, Hq, Hkv, N, D, cq, ck, causal), dtype)`` for exercise 5 (``D = 16``, the smallest ``tl.dot`` takes).
DV_CASES = (
    ("N=1, 3x5, causal (P = 1: dV sums dO over the group)", (1, 2, 1, 1, 16, 3, 5, True), torch.float32),
    ("N=3 < cq=4, 4x3, causal", (1, 1, 1, 3, 16, 4, 3, True), torch.float32),
    ("N=7 < ck=9, 2x9, causal", (1, 1, 1, 7, 16, 2, 9, True), torch.float32),
    ("N=21, 3x5, non-causal", (1, 2, 2, 21, 16, 3, 5, False), torch.float32),
    ("GQA 4:2, B=2, N=37, 4x7, causal", (2, 4, 2, 37, 16, 4, 7, True), torch.float32),
    ("kernel 1x1, N=19, causal (E = 0: no diagonal scores)", (1, 2, 1, 19, 16, 1, 1, True), torch.float32),
    ("float16, GQA 4:2, N=37, 3x5, causal", (1, 4, 2, 37, 16, 3, 5, True), torch.float16),
)

#: elementwise tolerances ``(atol, rtol)`` of exercise 5's ``dV``, by input dtype: fp16 rounds the folded keys
#: (``C`` moves by about ``1e-3 |C|``), and a kernel may round ``P`` to fp16 for its product with ``dO``.
DV_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2)}


def convolved_scores(p: Problem) -> torch.Tensor:
    """``C [B, Hq, N, N]`` float64: the convolved scores before the ``-inf`` mask (the scale included)."""
    cq, ck = p.weight.shape[1:]
    pk = (ck - 1) // 2
    return F.conv2d(F.pad(p.S0, (pk, pk, cq - 1, 0)), p.weight[:, None], groups=p.weight.shape[0])


def diagonal_scores_truth(p: Problem) -> torch.Tensor:
    """``cd [B, Hq, N, max(16, next_pow2(E))]`` float64, laid out as :func:`mta.conv.diagonal_scores` makes it:
    ``cd[b, h, i, delta] = C[i, i - delta] / scale`` for ``0 <= delta < E`` and ``i - delta >= 0``, 0 elsewhere
    (where ``i - delta < 0`` no key is named, no kernel reads the entry, and the package's holds other values)."""
    B, Hq, N, _ = p.q.shape
    cq, ck = p.weight.shape[1:]
    E = cq - 1 + (ck - 1) // 2
    width = max(16, 1 << max(E - 1, 0).bit_length())
    c = convolved_scores(p) / p.scale
    cd = torch.zeros(B, Hq, N, width, dtype=torch.float64)
    for delta in range(min(E, N)):
        cd[:, :, delta:, delta] = torch.diagonal(c, -delta, dim1=-2, dim2=-1)   # C[i, i - delta], i >= delta
    return cd


def check_teaching_dv(fn: Callable) -> Result:
    """``fn(q, kf, cd, do, lse, E, num_kv_heads, causal) -> dv [B, Hkv, N, D]`` fp32: section 4's
    ``dV_j = sum_i P_ij dO_i``, ``P = exp(scale C - lse)`` with ``C`` rebuilt as the forward builds it, by a Triton
    kernel of the learner's; for a kv head, the sum over its group's query heads.

    ``q, do [B, Hq, N, D]`` and the folded keys ``kf [B, Hq, cq, N, D]`` (:func:`folded_keys`) fp32 or fp16;
    ``cd [B, Hq, N, E_pad]`` (:func:`diagonal_scores_truth`: ``C / scale`` on the ``E`` near diagonals) and the
    forward's ``lse [B, Hq, N]`` (natural log) fp32; all contiguous on :data:`mta.runtime.DEVICE`; ``D`` a power of
    two >= 16, ``scale = D ** -0.5``. Compared with autograd's ``dv`` through
    :func:`mta.conv_attention_reference` in float64."""
    from ... import runtime

    def make(shape, dtype, seed):
        def case():
            p = make_problem(*shape, seed=seed, round_to=None if dtype == torch.float32 else dtype)
            B, Hq, Hkv, N, D, cq, ck, causal = shape
            E = cq - 1 + (ck - 1) // 2
            _, lse = conv_attention_reference(p.q, p.k, p.v, p.weight, causal=causal, return_lse=True)
            dev = runtime.DEVICE
            args = (p.q.to(dtype), folded_keys(p).to(dtype), diagonal_scores_truth(p).float(), p.do.to(dtype),
                    lse.float())
            with refusing(finished_attention()):
                got = own_triton_kernel("teaching_dv", lambda: fn(*(x.to(dev).contiguous() for x in args), E, Hkv,
                                                                  causal))
            if not isinstance(got, torch.Tensor):
                expect_equal("dv type", type(got).__name__, "Tensor")
            expect_close("dv", got.cpu(), p.grads[2], atol=DV_TOL[dtype][0], rtol=DV_TOL[dtype][1])
        return case

    return run_cases("exercise 5 (Triton: the teaching dV kernel)",
                     [(name, make(shape, dtype, 90 + i)) for i, (name, shape, dtype) in enumerate(DV_CASES)])


def _far_dweight(p: Problem) -> torch.Tensor:
    """The far part's share of ``dweight``: ``dC_far`` correlated with the padded ``S0``, summed over the batch."""
    B, Hq, N, _ = p.q.shape
    cq, ck = p.weight.shape[1:]
    pk = (ck - 1) // 2
    dc_far = far_dc(p)
    s0p = F.pad(p.S0, (pk, pk, cq - 1, 0))
    return torch.stack([torch.stack([(dc_far * s0p[..., a:a + N, b:b + N]).sum((0, 2, 3)) for b in range(ck)], -1)
                        for a in range(cq)], 1)


__all__ = ["CASES", "DQ_CASES", "DV_CASES", "DV_TOL", "Problem", "check_dq_far", "check_dw_partials",
           "check_kernel_grad", "check_scores_grad", "check_teaching_dv", "convolved_scores", "diagonal_scores_truth",
           "dq_far_truth", "dw_partials_truth", "far_dc", "far_part_u", "folded_keys", "make_problem"]
