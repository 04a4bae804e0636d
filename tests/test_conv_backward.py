"""The backward of ``mta.conv_attention`` (dq, dk, dv, dweight) against autograd through the float64 reference.

On the CPU the kernels run in Triton's interpreter: small head dims (one case at D = 96) and a few
well-chosen shapes rather than the full cross product, so the file stays quick.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import mta
from conftest import DEVICE, ON_GPU, planned_conv_attention, rand, rand_qkv

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
NAMES = ("dq", "dk", "dv", "dweight")


def check(name, out, ref, tol):
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out).all(), f"{name} is not finite"
    err, bound = (out - ref).norm().item(), tol * ref.norm().item() + 1e-6 * math.sqrt(ref.numel())
    assert err <= bound, f"{name}: error {err:.3g} > {bound:.3g}"


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Buffers the kernels allocate start as NaN: an element they never write fails the check."""
    empty_like, empty = torch.empty_like, torch.empty
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: empty_like(*a, **k).fill_(float("nan")))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))


def grads(fn, q, k, v, weight, do, **kwargs):
    """``(dq, dk, dv, dweight)`` of ``<fn(q, k, v, weight), do>``."""
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v, weight)]
    fn(*xs, **kwargs).backward(do)
    return tuple(x.grad for x in xs)


def reference_grads(q, k, v, weight, do, causal):
    return grads(mta.conv_attention_reference, *(x.cpu().double() for x in (q, k, v, weight, do)), causal=causal)


def run_case(N, cq, ck, causal, dtype, Hq=2, Hkv=1, D=16, B=1, fn=mta.conv_attention):
    q, k, v = rand_qkv(B, Hq, Hkv, N, N, D, dtype=dtype)
    weight = rand(Hq, cq, ck, scale=0.2)  # fp32 weight, as a model keeps it
    do = rand(B, Hq, N, D, dtype=dtype)
    out = grads(fn, q, k, v, weight, do, causal=causal)
    ref = reference_grads(q, k, v, weight, do, causal)
    for name, x, y, like in zip(NAMES, out, ref, (q, k, v, weight)):
        assert x.dtype == like.dtype and x.shape == like.shape, name
        check(name, x, y, TOL[dtype])


# N < cq and N < ck (5 with 11 x 15), cq = 16 > the interpreter's 16-row tile and E = 22 masked diagonals
# spanning two key tiles (16 x 15), 1 x 1 (no near part), N = 1. More kernels and lengths below.
@pytest.mark.parametrize("N,cq,ck", [(1, 6, 11), (5, 11, 15), (24, 16, 15), (100, 1, 1), (100, 6, 11),
                                     (200, 2, 9)], ids=str)
def test_causal_lengths_and_kernels(N, cq, ck, poisoned_outputs):
    run_case(N, cq, ck, True, torch.float32)


@pytest.mark.parametrize("N,cq,ck,causal,dtype", [
    (37, 6, 11, False, torch.float32), (5, 11, 15, False, torch.float32), (100, 3, 3, False, torch.float16),
    (100, 6, 11, True, torch.float16), (37, 3, 3, True, torch.float16),
] + ([(100, 6, 11, True, torch.bfloat16), (100, 2, 9, False, torch.bfloat16)] if ON_GPU else []), ids=str)
def test_dtypes_and_noncausal(N, cq, ck, causal, dtype, poisoned_outputs):
    run_case(N, cq, ck, causal, dtype)


@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if ON_GPU else []), ids=str)
@pytest.mark.parametrize("D,causal", [(8, True), (24, True), (24, False)])
def test_small_head_dims_padded_in_16_bits(D, causal, dtype, poisoned_outputs):
    """Head dims padded inside a 16- or 32-wide tile (64-wide tiles in 16 bits: mta.launch.shifted_head_dim_block),
    GQA and a batch of two for dW's sum."""
    run_case(40, 5, 3, causal, dtype, Hq=4, Hkv=2, D=D, B=2)


@pytest.mark.parametrize("N,cq,ck,causal,dtype,Hq,Hkv", [
    (1, 6, 11, True, torch.float32, 2, 1), (37, 6, 11, True, torch.float32, 4, 2), (100, 2, 9, True, torch.float16, 2, 2),
    (37, 3, 3, False, torch.float32, 2, 1), (24, 16, 15, True, torch.float16, 2, 1), (40, 1, 1, False, torch.float16, 3, 1),
], ids=str)
def test_dkdv_with_keys_as_rows(N, cq, ck, causal, dtype, Hq, Hkv, poisoned_outputs):
    """The dK/dV side's other form (scores made keys as rows, which a GPU takes at 128 owned keys) at the
    interpreter's tile: the same gradients."""
    from mta import tuning
    fn = planned_conv_attention(backward="one_pass", keys_as_rows_tile=tuning.INTERPRETER_TILE)
    run_case(N, cq, ck, causal, dtype, Hq=Hq, Hkv=Hkv, fn=fn)


@pytest.mark.skipif(not ON_GPU, reason="the GPU build's 16-bit code")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_short_sequences_gqa_in_16_bits_on_the_gpu(dtype, poisoned_outputs):
    for N in (1, 8, 16, 17, 65):
        run_case(N, 5, 3, True, dtype, Hq=4, Hkv=2, D=32, B=2)


@pytest.mark.skipif(not ON_GPU, reason="the GPU's tiles: held or streamed queries, fitted to its shared memory")
@pytest.mark.parametrize("D", [64, 96, 128, 256])
@pytest.mark.parametrize("cq,ck", [(1, 1), (2, 9), (3, 3), (6, 11), (16, 15)], ids=str)
def test_every_head_dim_width_and_kernel_in_16_bits(D, cq, ck, poisoned_outputs):
    """Small kernels hold their shifted queries (d = 128 with cq = 2 once asked for 352 KB of shared memory),
    larger ones stream them; forward and backward, bf16, each head-dim width. 16 x 15 at d = 256 is too big for
    the fused backward: on a GPU it runs in row chunks (:mod:`mta.conv_chunked`)."""
    run_case(70, cq, ck, True, torch.bfloat16, Hq=2, Hkv=1, D=D)


@pytest.mark.skipif(not ON_GPU, reason="the tiles at stake are the GPU's (the interpreter's are 16 x 16)")
@pytest.mark.parametrize("N,cq,ck,D,dtype", [(130, 29, 3, 16, torch.float16), (200, 11, 11, 64, torch.bfloat16),
                                             (150, 11, 15, 128, torch.float16)], ids=str)
def test_gqa_with_the_queries_as_rows_dkdv_tile(N, cq, ck, D, dtype):
    """GQA (4 query heads a group, B = 2) where the dK/dV side takes queries as rows: with two pipeline stages
    around the group's loop, Triton 3.6 gave dK and dweight 10% off at the first of these on an H100."""
    run_case(N, cq, ck, True, dtype, Hq=8, Hkv=2, D=D, B=2)


@pytest.mark.parametrize("N,causal", [(26, True), (20, False)])
def test_gqa_head_dim_96_and_batch(N, causal, poisoned_outputs):
    """Hq = 4 query heads on Hkv = 2 kv heads (dk, dv sum over a group), D = 96 (padded to 128),
    B = 2 (dweight sums over the batch)."""
    run_case(N, 6, 11, causal, torch.float32, Hq=4, Hkv=2, D=96, B=2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_are_exactly_causal(dtype):
    """A loss on the outputs before t gives exactly zero gradient to q, k, v at t and after, however big the
    future keys, queries and values are: nothing of the future leaks through the folded keys."""
    N, t = 40, 21
    q, k, v = rand_qkv(1, 2, 1, N, N, 16, dtype=dtype)
    weight = rand(2, 6, 11, scale=0.2)
    for x in (q, k, v):
        x[:, :, t:] = 1e3 if dtype == torch.float32 else 40.0
    do = rand(1, 2, N, 16, dtype=dtype)
    do[:, :, t:] = 0
    full = grads(mta.conv_attention, q, k, v, weight, do)
    for name, g in zip(NAMES, full[:3]):
        assert torch.isfinite(g).all(), name
        assert torch.equal(g[:, :, t:], torch.zeros_like(g[:, :, t:])), f"{name} leaks into rows >= {t}"
        assert g[:, :, :t].abs().amax() > 0, name
    # The rows before t, and dweight, are those of the problem truncated to its first t positions, bit for bit.
    prefix = grads(mta.conv_attention, *(x[:, :, :t] for x in (q, k, v)), weight, do[:, :, :t])
    for name, g, want in zip(NAMES, full, prefix):
        assert torch.equal(g if name == "dweight" else g[:, :, :t], want), f"{name} differs from the prefix's"


def test_bitwise_deterministic():
    q, k, v = rand_qkv(2, 4, 2, 24, 24, 16)
    weight, do = rand(4, 3, 5, scale=0.2), rand(2, 4, 24, 16)
    first = grads(mta.conv_attention, q, k, v, weight, do)
    second = grads(mta.conv_attention, q, k, v, weight, do)
    for name, x, y in zip(NAMES, first, second):
        assert torch.equal(x, y), name


def test_large_logits_give_finite_gradients():
    """q, k scaled by 30: logits of order 1e3, saturated softmax rows. The gradients stay finite and as close
    to the fp64 reference as the same method in fp32 torch (:func:`split_backward`) gets: ``dC = P (dP - Delta)``
    with ``Delta`` taken from ``O``, as flash attention does, cancels to about ``eps * |dO| |v|`` per score,
    and the fp32 rounding of the logits moves ``P`` by about ``eps * 1e3``."""
    q, k, v = rand_qkv(1, 2, 1, 50, 50, 16)
    q, k = q * 30, k * 30
    weight, do = rand(2, 6, 11, scale=0.2), rand(1, 2, 50, 16)
    out = grads(mta.conv_attention, q, k, v, weight, do)
    ref = reference_grads(q, k, v, weight, do, True)
    fp32 = split_backward(*(x.cpu() for x in (q, k, v, weight, do)), True, 16 ** -0.5)
    for name, x, y, z in zip(NAMES, out, ref, fp32):
        assert torch.isfinite(x).all(), name
        x, z = x.double().cpu(), z.double()
        bound = 3 * (z - y).norm() + 1e-4 * y.norm() + 1e-6 * math.sqrt(y.numel())
        assert (x - y).norm() <= bound, name


def test_identity_kernel_gradients_equal_flash_attention():
    q, k, v = rand_qkv(1, 2, 1, 40, 40, 32)
    weight = torch.zeros(2, 6, 11, device=DEVICE)
    weight[:, 5, 5] = 1.0
    do = rand(1, 2, 40, 32)
    mine = grads(mta.conv_attention, q, k, v, weight, do)
    flash = grads(lambda q, k, v, w: mta.flash_attention(q, k, v, causal=True), q, k, v, weight, do)
    for name, x, y in zip(NAMES[:3], mine, flash):
        check(name, x, y, TOL[torch.float32])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cq,ck", [(1, 1), (3, 5)], ids=str)
def test_one_hot_kernels_equal_flash_attention(cq, ck, causal):
    """A kernel that is 1 at ``[cq - 1, pk]`` and 0 elsewhere convolves the scores into themselves, causal or
    not: output, lse and dq, dk, dv are flash attention's."""
    q, k, v = rand_qkv(1, 2, 1, 30, 30, 16)
    weight = torch.zeros(2, cq, ck, device=DEVICE)
    weight[:, cq - 1, (ck - 1) // 2] = 1.0
    do = rand(1, 2, 30, 16)
    mine = mta.conv_attention(q, k, v, weight, causal=causal, return_lse=True)
    flash = mta.flash_attention(q, k, v, causal=causal, return_lse=True)
    for name, x, y in zip(("o", "lse"), mine, flash):
        check(name, x, y, TOL[torch.float32])
    mine = grads(lambda *x: mta.conv_attention(*x, causal=causal), q, k, v, weight, do)
    flash = grads(lambda q, k, v, w: mta.flash_attention(q, k, v, causal=causal), q, k, v, weight, do)
    for name, x, y in zip(NAMES[:3], mine, flash):
        check(name, x, y, TOL[torch.float32])


@pytest.mark.parametrize("cq,ck", [(1, 1), (3, 3), (16, 15)], ids=str)
def test_noncausal_gqa_head_dim_96(cq, ck, poisoned_outputs):
    """Not causal, GQA, D = 96 (padded to 128), forward (o, lse) and backward against the float64 reference.
    N = 40: three 16-row tiles each way, the 16 x 15 kernel's padding across two of them (at N = 200 the
    16 x 15 case alone takes 2-4 minutes in the interpreter)."""
    N = 40
    q, k, v = rand_qkv(1, 2, 1, N, N, 96)
    weight, do = rand(2, cq, ck, scale=0.2), rand(1, 2, N, 96)
    o, lse = mta.conv_attention(q, k, v, weight, causal=False, return_lse=True)
    ref_o, ref_lse = mta.conv_attention_reference(*(x.cpu().double() for x in (q, k, v, weight)), causal=False,
                                                  return_lse=True)
    check("o", o, ref_o, TOL[torch.float32])
    check("lse", lse, ref_lse, TOL[torch.float32])
    out = grads(lambda *x: mta.conv_attention(*x, causal=False), q, k, v, weight, do)
    for name, x, y in zip(NAMES, out, reference_grads(q, k, v, weight, do, False)):
        check(name, x, y, TOL[torch.float32])


def test_weight_dtype_kept_with_half_activations():
    """fp16 q, k, v with an fp32 kernel (and an fp16 one): each gradient in its input's dtype."""
    q, k, v = rand_qkv(1, 2, 1, 20, 20, 16, dtype=torch.float16)
    do = rand(1, 2, 20, 16, dtype=torch.float16)
    for wdtype in (torch.float32, torch.float16):
        weight = rand(2, 3, 5, scale=0.2, dtype=wdtype)
        dq, dk, dv, dw = grads(mta.conv_attention, q, k, v, weight, do)
        assert (dq.dtype, dk.dtype, dv.dtype, dw.dtype) == (torch.float16,) * 3 + (wdtype,)
        check("dweight", dw, reference_grads(q, k, v, weight, do, True)[3], TOL[torch.float16])


@pytest.mark.parametrize("wanted", [("q",), ("k", "v"), ("weight",)], ids="+".join)
def test_only_some_inputs_need_gradients(wanted):
    """The inputs that ask for a gradient get the reference's; the others get none."""
    q, k, v = rand_qkv(1, 2, 1, 20, 20, 16)
    weight, do = rand(2, 3, 5, scale=0.2), rand(1, 2, 20, 16)
    xs = dict(zip(("q", "k", "v", "weight"), (q, k, v, weight)))
    for name in wanted:
        xs[name].requires_grad_()
    mta.conv_attention(*xs.values()).backward(do)
    ref = dict(zip(xs, reference_grads(q, k, v, weight, do, True)))
    for name, x in xs.items():
        if name in wanted:
            assert x.grad is not None and x.grad.dtype == x.dtype, name
            check("d" + name, x.grad, ref[name], TOL[torch.float32])
        else:
            assert x.grad is None, name


def shift(x, s):
    """``y[:, :, r] = x[:, :, r + s]``, zero where ``r + s`` falls outside the rows."""
    n, y = x.shape[2], torch.zeros_like(x)
    if 0 <= s < n:
        y[:, :, :n - s] = x[:, :, s:]
    elif -n < s < 0:
        y[:, :, -s:] = x[:, :, :n + s]
    return y


# The split the kernels implement, in plain float64 torch: far part through folded keys, near diagonals
# through the past scores. Checked against autograd so that the kernels' math is pinned down on its own.
def split_backward(q, k, v, w, do, causal, scale):
    B, Hq, N, D = q.shape
    G = Hq // k.shape[1]
    cq, ck = w.shape[1:]
    pk = (ck - 1) // 2
    e_near, e_past = (cq - 1 + pk, ck + cq - 3) if causal else (0, 0)
    ke, ve = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    s = scale * q @ ke.transpose(-1, -2)
    c = F.conv2d(F.pad(s.masked_fill(j > i, 0) if causal else s, (pk, pk, cq - 1, 0)), w[:, None], groups=Hq)
    p = torch.softmax(c.masked_fill(j > i, float("-inf")) if causal else c, -1)
    dc = p * (do @ ve.transpose(-1, -2) - (do * (p @ ve)).sum(-1, keepdim=True))
    dv = (p.transpose(-1, -2) @ do).unflatten(1, (-1, G)).sum(2)
    dc_far = dc * (i - j >= e_near) if causal else dc
    kp = F.pad(ke, (0, 0, pk, pk))
    kf = torch.stack([sum(w[:, a, b, None, None] * kp[:, :, b:b + N] for b in range(ck)) for a in range(cq)], 2)
    qs = torch.stack([F.pad(q, (0, 0, cq - 1, 0))[:, :, a:a + N] for a in range(cq)], 2)  # q[i - (cq-1) + a]
    gq = F.pad(dc_far[:, :, None] @ kf, (0, 0, 0, cq - 1))  # Gq_a[i], zero past N
    dq = scale * sum(gq[:, :, a, cq - 1 - a:cq - 1 - a + N] for a in range(cq))
    u = F.pad(dc_far.transpose(-1, -2)[:, :, None] @ qs, (0, 0, pk, pk))  # U_a[x - pk]
    dk = scale * sum(w[:, a, b, None, None] * u[:, :, a, 2 * pk - b:2 * pk - b + N] for a in range(cq) for b in range(ck))
    dw = scale * torch.stack([torch.stack([(u[:, :, a, 2 * pk - b:2 * pk - b + N] * ke).sum((0, 2, 3))
                                           for b in range(ck)], -1) for a in range(cq)], 1)
    if e_near:
        dcd = torch.stack([(dc * (i - j == d)).sum(-1) for d in range(e_near)], -1)  # DC[i, d] = dC[i, i - d]
        past = torch.stack([(q * shift(ke, -e)).sum(-1) for e in range(e_past + 1)], -1)  # q_r . k_{r-e}
        g = torch.zeros(B, Hq, N, e_past + 1, dtype=q.dtype)
        for a in range(cq):
            for d in range(e_near):
                for e in range(e_past + 1):
                    b = a - e + d + pk - (cq - 1)
                    if 0 <= b < ck:
                        g[..., e] += shift(dcd[..., d], cq - 1 - a) * w[:, a, b, None]
                        # the score S[r, r - e] of row r = i - (cq-1) + a (rows before 0: padding)
                        dw[:, a, b] += scale * (dcd[..., d] * shift(past[..., e], -(cq - 1 - a))).sum((0, 2))
        for e in range(e_past + 1):
            dq += scale * g[..., e, None] * shift(ke, -e)
            dk += scale * shift(g[..., e, None] * q, e)
    return dq, dk.unflatten(1, (-1, G)).sum(2), dv, dw


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("N,cq,ck", [(7, 1, 1), (7, 11, 15), (23, 2, 9), (23, 3, 3), (40, 6, 11)], ids=str)
def test_split_backward_in_float64(N, cq, ck, causal):
    q, k, v = (rand(2, h, N, 8, dtype=torch.float64, device="cpu") for h in (4, 2, 2))
    w, do = rand(4, cq, ck, scale=0.3, dtype=torch.float64, device="cpu"), rand(2, 4, N, 8, dtype=torch.float64,
                                                                                 device="cpu")
    ref = reference_grads(q, k, v, w, do, causal)
    for name, x, y in zip(NAMES, split_backward(q, k, v, w, do, causal, 8 ** -0.5), ref):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12, msg=name)
