"""``mta.flash_attention`` against the float64 reference, forward and backward.

On the CPU the kernels run in Triton's interpreter (fp32, fp16, small shapes);
on a GPU the same tests add bf16 and larger shapes.
"""

from __future__ import annotations

import math

import pytest
import torch

import mta
from conftest import DEVICE, ON_GPU, rand_qkv, record_hopper_tiles

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
# ||out - ref|| <= tol * ||ref|| + ATOL * sqrt(numel); fp32 on a GPU multiplies to fp32 accuracy ("tf32x3").
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
ATOL = 1e-6

SHAPES = [  # B, Hq, Hkv, Nq, Nk, D
    (1, 1, 1, 1, 1, 16),
    (2, 2, 1, 7, 7, 64),
    (1, 4, 2, 100, 100, 96),
    (1, 4, 2, 40, 40, 24),  # a head dim padded inside a 32-wide tile
    (1, 2, 2, 129, 129, 128),
    (1, 2, 1, 37, 100, 64),     # Nq < Nk: decode-like, bottom-right causal
    (1, 3, 1, 100, 29, 16),     # Nq > Nk: the first queries see no key when causal
]
if ON_GPU:
    SHAPES += [(2, 8, 2, 1000, 1000, 128), (1, 4, 4, 2048, 2048, 64), (1, 2, 1, 300, 1111, 256), (2, 4, 1, 513, 513, 80)]


def close(out: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    out, ref = out.double().cpu(), ref.double().cpu()
    return bool(torch.isfinite(out).all()) and \
        (out - ref).norm().item() <= tol * ref.norm().item() + ATOL * math.sqrt(ref.numel())


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every buffer the kernels allocate starts as NaN, so an element they never write fails the check."""
    empty_like, empty = torch.empty_like, torch.empty

    def nan_empty_like(*args, **kwargs):
        return empty_like(*args, **kwargs).fill_(float("nan"))

    def nan_empty(*args, **kwargs):
        x = empty(*args, **kwargs)
        return x.fill_(float("nan")) if x.is_floating_point() else x

    monkeypatch.setattr(torch, "empty_like", nan_empty_like)
    monkeypatch.setattr(torch, "empty", nan_empty)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_backward_match_reference(shape, causal, dtype, poisoned_outputs):
    B, Hq, Hkv, Nq, Nk, D = shape
    q, k, v = (x.requires_grad_() for x in rand_qkv(B, Hq, Hkv, Nq, Nk, D, dtype=dtype))
    out, lse = mta.flash_attention(q, k, v, causal=causal, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == (B, Hq, Nq)
    dout = torch.randn_like(out)
    out.backward(dout)

    q64, k64, v64 = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    ref, ref_lse = mta.naive_attention(q64, k64, v64, causal=causal, return_lse=True)
    ref.backward(dout.cpu().double())

    tol = TOL[dtype]
    assert close(out, ref, tol)
    finite = torch.isfinite(ref_lse)  # -inf marks queries that see no key
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert torch.allclose(lse.cpu().double()[finite], ref_lse[finite], rtol=1e-4, atol=1e-4)
    for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert close(got, want, 2 * tol), name


def test_non_contiguous_inputs():
    # [B, N, H, D] memory viewed as [B, H, N, D], as a model's projections produce it.
    B, H, N, D = 1, 2, 45, 32
    q, k, v = (torch.randn(B, N, H, D, device=DEVICE).transpose(1, 2).requires_grad_() for _ in range(3))
    assert not q.is_contiguous()
    out = mta.flash_attention(q, k, v, causal=True, scale=0.3)
    out.square().sum().backward()
    q64, k64, v64 = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    ref = mta.naive_attention(q64, k64, v64, causal=True, scale=0.3)
    ref.square().sum().backward()
    assert close(out, ref, 2e-5)
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert close(got, want, 4e-5)


def test_gqa_gradients_sum_over_the_group():
    # With one kv head shared by 4 query heads, dk equals the sum of the dk of 4 separate MHA problems.
    q, k, v = (x.requires_grad_() for x in rand_qkv(1, 4, 1, 33, 33, 16))
    mta.flash_attention(q, k, v, causal=True).sum().backward()
    k4, v4 = (x.detach().expand(1, 4, 33, 16).clone().requires_grad_() for x in (k, v))
    mta.flash_attention(q.detach(), k4, v4, causal=True).sum().backward()
    assert torch.allclose(k.grad, k4.grad.sum(1, keepdim=True), rtol=1e-4, atol=1e-5)
    assert torch.allclose(v.grad, v4.grad.sum(1, keepdim=True), rtol=1e-4, atol=1e-5)


def test_causality():
    q, k, v = rand_qkv(1, 2, 1, 50, 50, 32)
    before = mta.flash_attention(q, k, v, causal=True)
    t = 21
    k[:, :, t] += 1.0
    v[:, :, t] -= 1.0
    after = mta.flash_attention(q, k, v, causal=True)
    assert torch.equal(after[:, :, :t], before[:, :, :t])
    assert not torch.allclose(after[:, :, t:], before[:, :, t:])


def grads(q, k, v, do, causal=True):
    """``(o, lse, dq, dk, dv)`` of ``<flash_attention(q, k, v), do>``."""
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o, lse = mta.flash_attention(*xs, causal=causal, return_lse=True)
    o.backward(do)
    return (o.detach(), lse) + tuple(x.grad for x in xs)


def test_gradients_are_exactly_causal():
    """A loss on the outputs before t gives exactly zero dq, dk, dv at t and after, however big the future
    queries, keys and values are (1e3); the rows before t are those of the problem truncated to t."""
    N, t = 50, 21
    q, k, v = rand_qkv(1, 2, 1, N, N, 16)
    for x in (q, k, v):
        x[:, :, t:] = 1e3
    do = torch.randn(1, 2, N, 16, device=DEVICE)
    do[:, :, t:] = 0
    _, _, *full = grads(q, k, v, do)
    _, _, *prefix = grads(q[:, :, :t], k[:, :, :t], v[:, :, :t], do[:, :, :t])
    for name, g, want in zip(("dq", "dk", "dv"), full, prefix):
        assert torch.isfinite(g).all(), name
        assert torch.equal(g[:, :, t:], torch.zeros_like(g[:, :, t:])), f"{name} leaks into rows >= {t}"
        assert g[:, :, :t].abs().amax() > 0, name
        if ON_GPU:  # tiles of other sizes there may sum in another order
            torch.testing.assert_close(g[:, :, :t], want, rtol=1e-6, atol=1e-6, msg=name)
        else:  # bit for bit in the interpreter
            assert torch.equal(g[:, :, :t], want), f"{name} differs from the prefix's"


def test_bitwise_deterministic():
    """Two calls give the same bits: output, lse and the gradients (GQA: dk, dv sum over a group)."""
    q, k, v = rand_qkv(2, 4, 2, 40, 40, 16)
    do = torch.randn(2, 4, 40, 16, device=DEVICE)
    for causal in (True, False):
        first, second = grads(q, k, v, do, causal), grads(q, k, v, do, causal)
        for name, x, y in zip(("o", "lse", "dq", "dk", "dv"), first, second):
            assert torch.equal(x, y), (name, causal)


def test_the_backward_launches_the_dq_kernel_then_the_dkdv_kernel(monkeypatch):
    """Two launches a backward, the dQ kernel first: it stores ``D`` (no pre-pass of its own), which the dK/dV
    kernel reads; at a signature seen before too."""
    from mta import flash, launch
    launched = []
    run = launch.LaunchPlan.__call__
    monkeypatch.setattr(launch.LaunchPlan, "__call__",
                        lambda plan, *t: launched.append(plan.kernel.__name__) or run(plan, *t))
    q, k, v = (x.requires_grad_() for x in rand_qkv(1, 4, 2, 33, 33, 24))
    for _ in range(2):
        o = mta.flash_attention(q, k, v, causal=True)
        launched.clear()
        o.backward(torch.randn_like(o))
        assert launched == ["flash_dq_kernel", "flash_dkdv_kernel"]
    assert len(flash.BACKWARD_PLANS) > 0


def flash_method_in_fp32(q, k, v, do, scale):
    """``(o, lse, dq, dk, dv)``, causal, by the flash method in plain fp32 torch: ``P = exp(S - lse)`` from an
    fp32 ``lse``, ``dS = P (dP - Delta)`` with ``Delta`` from ``O``."""
    q, k, v, do = (x.detach().cpu().float() for x in (q, k, v, do))
    G, n = q.shape[1] // k.shape[1], q.shape[2]
    ke, ve = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = (scale * q @ ke.transpose(-1, -2)).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])
    o = p @ ve
    ds = p * (do @ ve.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    dk, dv = scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ do
    return o, lse, scale * ds @ ke, dk.unflatten(1, (-1, G)).sum(2), dv.unflatten(1, (-1, G)).sum(2)


# Beyond 3x the error of the same method in fp32 torch, relative errors (in norm) allowed at logits of about 1e3,
# for o, lse, dq, dk, dv. The kernels' scores in base 2 (``s * scale * log2 e``, the lse times log2 e) are rounded
# by about eps * 1e3, which moves the recomputed P, hence dv, by about 1e-4 (measured up to 1.2e-4 in fp32); in
# fp16, P is rounded to fp16 before dS = P (dP - Delta), which nearly cancels in a saturated row and is then
# multiplied by keys of size 16 (dq, dk measured up to 5e-3 relative).
LARGE_LOGITS_TOL = {torch.float32: (5e-5, 1e-6, 1e-3, 1e-3, 1e-3), torch.float16: (5e-4, 1e-6, 2e-2, 2e-2, 1e-3)}


@pytest.mark.parametrize("dtype,scale", [(torch.float32, 30.0), (torch.float16, 16.0)], ids=str)
def test_large_logits(dtype, scale):
    """q, k scaled (by 30 in fp32, 16 in fp16): logits of order 1e3, saturated softmax rows (dq, dk then nearly
    vanish: their errors are bounded by those of the same method in fp32 torch). Output, lse and gradients are
    finite and close to the float64 reference."""
    q, k, v = rand_qkv(1, 2, 1, 50, 50, 16, dtype=dtype)
    q, k = q * scale, k * scale
    do = torch.randn(1, 2, 50, 16, device=DEVICE).to(dtype)
    out = grads(q, k, v, do)
    q64, k64, v64 = (x.cpu().double().requires_grad_() for x in (q, k, v))
    ref_o, ref_lse = mta.naive_attention(q64, k64, v64, causal=True, return_lse=True)
    ref_o.backward(do.cpu().double())
    assert ref_lse.abs().amax() > 500  # the logits are large
    fp32 = flash_method_in_fp32(q, k, v, do, 16 ** -0.5)
    for name, x, y, z, tol in zip(("o", "lse", "dq", "dk", "dv"), out, (ref_o, ref_lse, q64.grad, k64.grad, v64.grad),
                                  fp32, LARGE_LOGITS_TOL[dtype]):
        x, y, z = x.double().cpu(), y.detach(), z.double()
        assert torch.isfinite(x).all(), name
        bound = 3 * (z - y).norm() + tol * y.norm() + ATOL * math.sqrt(y.numel())
        assert (x - y).norm() <= bound, f"{name}: error {(x - y).norm():.3g} > {bound:.3g}"


def test_bad_inputs_raise_clear_errors():
    q, k, v = rand_qkv(1, 2, 1, 8, 8, 16)
    with pytest.raises(TypeError, match="fp16, bf16 or fp32"):
        mta.flash_attention(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="at most 256"):
        mta.flash_attention(*rand_qkv(1, 1, 1, 4, 4, 272))
    with pytest.raises(ValueError, match="multiple of kv heads"):
        mta.flash_attention(q, rand_qkv(1, 3, 3, 8, 8, 16)[1], rand_qkv(1, 3, 3, 8, 8, 16)[2])
    with pytest.raises(ValueError, match=r"q must be (on the cpu|a cuda tensor), got meta"):
        mta.flash_attention(q.to("meta"), k.to("meta"), v.to("meta"))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's bf16 limitation")
def test_bf16_in_interpreter_is_refused():
    q, k, v = rand_qkv(1, 1, 1, 8, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bf16 is not supported in Triton's interpreter"):
        mta.flash_attention(q, k, v)


@pytest.mark.parametrize("n_keys,causal,dtype,want_block_n", [
    (1024, False, torch.float16, 128),   # d = 128, not causal: the table's at 1k keys,
    (1025, False, torch.float16, 64),    # 128 x 64 from 1025 (the 2k bucket)
    (4096, False, torch.float16, 64),    # to 4096 keys,
    (4097, False, torch.float16, 128),   # the table's again past them
    (4096, True, torch.float16, 64),     # causal: the table's (128 x 64 at every length)
    (4096, False, torch.float32, 32),    # fp32: its own table
])
def test_forward_tile_on_hopper_follows_the_key_count(n_keys, causal, dtype, want_block_n, monkeypatch):
    import mta.flash
    launched = record_hopper_tiles(monkeypatch, mta.flash)
    q = torch.zeros(1, 1, 8, 128, dtype=dtype, device=DEVICE)
    k = torch.zeros(1, 1, n_keys, 128, dtype=dtype, device=DEVICE)
    mta.flash.flash_forward(q, k, k, causal, 1.0)
    assert [c["BLOCK_N"] for c in launched] == [want_block_n]
