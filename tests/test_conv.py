"""``mta.conv_attention`` (the fused MTA forward) against the float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

import mta
from conftest import DEVICE, ON_GPU, planned_conv_attention, rand, rand_qkv

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}

# (2, 3): E = cq - 1 + pk = 2 masked diagonals; (11, 15): E = 17, more than an interpreter key tile.
KERNELS = [(1, 1), (2, 3), (2, 9), (3, 3), (6, 11), (11, 15)]
LENGTHS = [1, 5, 37, 100, 200] + ([1000, 2049] if ON_GPU else [])


def check(out, ref, tol):
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out).all()
    assert (out - ref).norm().item() <= tol * ref.norm().item() + 1e-6 * math.sqrt(ref.numel())


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Buffers the kernel allocates start as NaN: an element it never writes fails the check."""
    empty_like, empty = torch.empty_like, torch.empty
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: empty_like(*a, **k).fill_(float("nan")))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))


#: The lse's absolute tolerance: the folded keys are rounded to the inputs' dtype (fp16 measured up to 6e-4 at
#: |lse| ~ 5, bf16 2.6e-3 on an H100).
LSE_ATOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def run_case(N, cq, ck, causal, dtype, Hq=2, Hkv=1, D=32, B=1, fn=mta.conv_attention):
    q, k, v = rand_qkv(B, Hq, Hkv, N, N, D, dtype=dtype)
    weight = rand(Hq, cq, ck, scale=0.2)  # fp32 weight, as a model keeps it
    out, lse = fn(q, k, v, weight, causal=causal, return_lse=True)
    ref, ref_lse = mta.conv_attention_reference(*(x.cpu().double() for x in (q, k, v, weight)),
                                                causal=causal, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape
    check(out, ref, TOL[dtype])
    assert torch.allclose(lse.cpu().double(), ref_lse, rtol=1e-4, atol=LSE_ATOL[dtype])


@pytest.mark.parametrize("N", LENGTHS)
@pytest.mark.parametrize("cq,ck", KERNELS, ids=lambda x: str(x))
def test_causal_lengths_and_kernels(N, cq, ck, poisoned_outputs):
    run_case(N, cq, ck, True, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("N,cq,ck", [(37, 6, 11), (100, 2, 9), (5, 11, 15)])
def test_dtypes_and_noncausal(N, cq, ck, causal, dtype, poisoned_outputs):
    run_case(N, cq, ck, causal, dtype)


def test_gqa_and_head_dim_96(poisoned_outputs):
    run_case(70, 6, 11, True, torch.float32, Hq=4, Hkv=2, D=96, B=2)


def test_identity_kernel_equals_flash_attention():
    q, k, v = rand_qkv(1, 2, 1, 50, 50, 32)
    weight = torch.zeros(2, 6, 11, device=DEVICE)
    weight[:, 5, 5] = 1.0
    torch.testing.assert_close(mta.conv_attention(q, k, v, weight), mta.flash_attention(q, k, v, causal=True),
                               rtol=1e-5, atol=1e-5)


def test_causality():
    q, k, v = rand_qkv(1, 2, 1, 60, 60, 32)
    weight = rand(2, 6, 11, scale=0.2)
    before = mta.conv_attention(q, k, v, weight)
    t = 29
    q[:, :, t] += 1.0
    k[:, :, t] = 1e4  # huge: any future key leaking into a past row through the folded keys would show
    v[:, :, t] *= 2.0
    after = mta.conv_attention(q, k, v, weight)
    assert torch.equal(after[:, :, :t], before[:, :, :t])
    assert not torch.allclose(after[:, :, t], before[:, :, t])


@pytest.mark.parametrize("dtype,scale,tol,lse_tol", [(torch.float32, 30.0, 1e-4, 1e-6),
                                                     (torch.float16, 16.0, TOL[torch.float16], 4e-4)], ids=str)
def test_large_logits(dtype, scale, tol, lse_tol):
    """q, k scaled (by 30 in fp32, 16 in fp16): logits of order 1e3, saturated softmax rows. Output and lse are
    finite and close to the float64 reference. fp32: the rounding of the logits (about 1e-4 at 1e3) moves the
    output by up to 2e-5 (as much as in fp32 torch); fp16: the folded keys are rounded to fp16, which moves the
    logits, hence the lse, by about 1e-4 relative (measured 9e-5)."""
    q, k, v = rand_qkv(1, 2, 1, 50, 50, 16, dtype=dtype)
    q, k = q * scale, k * scale
    weight = rand(2, 6, 11, scale=0.2)
    out, lse = mta.conv_attention(q, k, v, weight, return_lse=True)
    ref, ref_lse = mta.conv_attention_reference(*(x.cpu().double() for x in (q, k, v, weight)), return_lse=True)
    assert ref_lse.abs().amax() > 500  # the logits are large
    check(out, ref, tol)
    check(lse, ref_lse, lse_tol)


def test_bad_inputs_raise_clear_errors():
    q, k, v = rand_qkv(1, 2, 1, 8, 8, 16)
    with pytest.raises(ValueError, match="must be odd"):
        mta.conv_attention(q, k, v, torch.ones(2, 2, 4, device=DEVICE))
    with pytest.raises(ValueError, match="one kernel per query head"):
        mta.conv_attention(q, k, v, torch.ones(3, 2, 3, device=DEVICE))
    with pytest.raises(ValueError, match="not supported"):
        mta.conv_attention(q, k, v, torch.ones(2, 40, 3, device=DEVICE))
    with pytest.raises(ValueError, match="as many queries as keys"):
        mta.conv_attention(q[:, :, :5], k, v, torch.ones(2, 1, 1, device=DEVICE))
    with pytest.raises(TypeError, match="fp16, bf16 or fp32"):
        mta.conv_attention(q.double(), k.double(), v.double(), torch.ones(2, 1, 1, device=DEVICE))


def fold_by_definition(k: torch.Tensor, w: torch.Tensor, Hq: int) -> torch.Tensor:
    """``Kf[b, h, a, j] = sum_t w[h, a, t] k[b, h // G, j - pk + t]`` in float64, term by term."""
    B, Hkv, N, D = k.shape
    _, cq, ck = w.shape
    kd, wd, pk = k.cpu().double(), w.cpu().double(), (ck - 1) // 2
    want = torch.zeros(B, Hq, cq, N, D, dtype=torch.float64)
    for h in range(Hq):
        for a in range(cq):
            for j in range(N):
                for t in range(ck):
                    if 0 <= j - pk + t < N:
                        want[:, h, a, j] += wd[h, a, t] * kd[:, h // (Hq // Hkv), j - pk + t]
    return want


def test_fold_keys_matches_its_definition():
    B, Hq, Hkv, N, D, cq, ck = 2, 4, 2, 21, 24, 3, 5
    k = rand(B, Hkv, N, D)
    w = rand(Hq, cq, ck, scale=0.3)
    kf = mta.conv.fold_keys(k, w, Hq).cpu().double()
    torch.testing.assert_close(kf, fold_by_definition(k, w, Hq), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("by_product", [False, True], ids=["pointer", "band_product"])
@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if ON_GPU else []), ids=str)
@pytest.mark.parametrize("N,cq,ck,keys_major", [(1, 2, 3, False), (21, 3, 5, True), (150, 6, 11, False),
                                                (70, 16, 15, True), (40, 1, 33, False)], ids=str)
def test_fold_keys_of_16_bit_keys_are_correctly_rounded(N, cq, ck, keys_major, dtype, by_product):
    """Both fold kernels (the band-matrix products, which 16-bit keys take on a GPU, forced either way) keep the
    fp32 weights' digits: each folded value is the float64 fold rounded to the keys' dtype, within half a unit in
    its last place, plus fp32's sums' error and the band kernel's split of the weights into two 16-bit parts
    (``2^-2(m+1)`` of the terms' magnitudes for ``m`` mantissa bits). A fold with the weights rounded to 16 bits
    misses by ``2^-(m+1)``: over a hundred times that."""
    B, Hq, Hkv, D = 1, 4, 2, 24
    k = rand(B, Hkv, N, D).to(dtype)
    w = rand(Hq, cq, ck, scale=0.3)
    kf = mta.conv.fold_keys(k, w, Hq, keys_major=keys_major, by_product=by_product)
    assert kf.shape == (B, Hq, cq, N, D) and kf.dtype == dtype
    want, terms = fold_by_definition(k, w, Hq), fold_by_definition(k.abs(), w.abs(), Hq)
    mantissa_bits = {torch.float16: 10, torch.bfloat16: 7}[dtype]
    smallest = torch.finfo(dtype).smallest_normal * 2.0 ** -mantissa_bits  # the spacing of subnormals
    half_ulp = torch.ldexp(torch.ones_like(want), torch.frexp(want).exponent - 2 - mantissa_bits).clamp(
        min=smallest / 2)
    err = (kf.cpu().double() - want).abs()
    excess = err - half_ulp
    allowed = 1e-6 + 2.0 ** (-2 * (mantissa_bits + 1))
    assert (excess <= allowed * terms).all(), f"{(excess / terms).max():.3g} of the terms' magnitude past half a unit"


@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if ON_GPU else []), ids=str)
@pytest.mark.parametrize("D", [8, 24])
@pytest.mark.parametrize("causal", [True, False])
def test_small_head_dims_padded_in_16_bits(D, causal, dtype, poisoned_outputs):
    """Head dims padded inside a 16- or 32-wide tile, GQA: on an H100 these gave relative errors of 0.3-1.3 in
    16 bits until the MTA kernels took 64-wide tiles for them (``mta.launch.shifted_head_dim_block``)."""
    run_case(40, 5, 3, causal, dtype, Hq=4, Hkv=2, D=D)


@pytest.mark.skipif(not ON_GPU, reason="the GPU build's 16-bit code (the interpreter computed these right)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [16, 32, 64])
def test_short_sequences_gqa_in_16_bits_on_the_gpu(D, dtype, poisoned_outputs):
    """Sequences shorter than, equal to and just past the tiles, GQA, a 5 x 3 kernel. On an H100 a run of such
    cases once hit an illegal address right after the first fp16, d = 32, N = 16 causal call (not reproduced)."""
    for N in (1, 2, 3, 8, 15, 16, 17, 31, 64, 65):
        for causal in (True, False):
            run_case(N, 5, 3, causal, dtype, Hq=4, Hkv=2, D=D)


@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if ON_GPU else []), ids=str)
@pytest.mark.parametrize("D,row", [(16, 24), (32, 40)])
def test_unpadded_head_dims_with_odd_row_strides_in_16_bits(D, row, dtype, poisoned_outputs):
    """Views whose rows are ``row`` elements apart (not a multiple of 16: no vectorised loads), forward and
    backward. The 16-bit padded tiles that were wrong on an H100 also had such strides (padded tiles are now
    64 wide); these are not padded, and are read as they are."""
    B, Hq, Hkv, N = 2, 4, 2, 40
    q, k, v = (rand(B, h, N, row, dtype=dtype)[..., :D] for h in (Hq, Hkv, Hkv))
    weight, do = rand(Hq, 5, 3, scale=0.2), rand(B, Hq, N, D, dtype=dtype)
    xs = [x.detach().requires_grad_() for x in (q, k, v, weight)]
    out = mta.conv_attention(*xs, causal=True)
    out.backward(do)
    ref_xs = [x.detach().cpu().double().requires_grad_() for x in (q, k, v, weight)]
    ref = mta.conv_attention_reference(*ref_xs, causal=True)
    ref.backward(do.cpu().double())
    check(out, ref, TOL[dtype])
    for x, r in zip(xs, ref_xs):
        check(x.grad, r.grad, TOL[dtype])


def test_shifted_head_dim_block():
    block = mta.launch.shifted_head_dim_block
    assert [block(d, torch.float16) for d in (1, 8, 16, 20, 32, 40, 96)] == [64, 64, 16, 64, 32, 64, 128]
    assert [block(d, torch.float32) for d in (8, 24, 32)] == [16, 32, 32]


@pytest.mark.parametrize("cq,groups", [(1, (1, 0)), (2, (2, 0)), (3, (2, 1)), (6, (4, 2)), (7, (4, 4)),
                                       (11, (8, 4)), (16, (16, 0)), (32, (32, 0))])
def test_query_shift_groups_cover_cq(cq, groups):
    qa, qb = mta.conv_forward.query_shift_groups(cq)
    assert (qa, qb) == groups
    assert qa + qb >= cq and qa & (qa - 1) == 0 and qb & (qb - 1) == 0


STREAMED = [(torch.float32, False), (torch.float16, False), (torch.float16, True)]  # (dtype, copy engine)


@pytest.mark.parametrize("dtype,tma", STREAMED, ids=lambda x: str(x))
@pytest.mark.parametrize("D", [16, 32, 96])  # one product per shift (16); two half-width ones, padded (96)
@pytest.mark.parametrize("causal", [True, False])
def test_streamed_queries_path_matches(causal, D, dtype, tma, poisoned_outputs):
    """Planned not to hold the shifted queries, the kernel reloads them per key tile, through pointers or (16-bit
    inputs) the copy engine's descriptors: same result."""
    run_case(45, 3, 5, causal, dtype, D=D, fn=planned_conv_attention(hold_queries=False, copy_engine=tma))


@pytest.mark.parametrize("N", [1, 70])
def test_streamed_through_descriptors_gqa_and_strided_inputs(N, poisoned_outputs):
    """The descriptors read GQA values and q, k, v laid out ``[B, N, H, D]`` (transposed views, not copies)."""
    B, Hq, Hkv, D, dtype = 2, 4, 2, 32, torch.float16
    q = rand(B, N, Hq, D, dtype=dtype).transpose(1, 2)
    k, v = (rand(B, N, Hkv, D, dtype=dtype).transpose(1, 2) for _ in range(2))
    weight = rand(Hq, 6, 11, scale=0.2)
    assert mta.conv.stream_descriptors(q, v, mta.conv.fold_keys(k, weight, Hq))[0] is not None or \
        torch.cuda.get_device_capability()[0] < 9
    ref, ref_lse = mta.conv_attention_reference(*(x.cpu().double() for x in (q, k, v, weight)), return_lse=True)
    out, lse = planned_conv_attention(hold_queries=False)(q, k, v, weight, return_lse=True)
    check(out, ref, TOL[dtype])
    # At N = 1 the output is v[0] whatever the score: the lse checks the score itself.
    assert torch.allclose(lse.cpu().double(), ref_lse, rtol=1e-4, atol=2e-3)


def test_stream_descriptors_only_where_the_copy_engine_can_read():
    """fp32, rows that are not a multiple of 16 bytes, an unaligned start, or a plan without the copy engine:
    pointer loads."""
    if ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("no copy engine before Hopper")
    q, k, v = rand_qkv(1, 2, 1, 9, 9, 24, dtype=torch.float16)
    w = rand(2, 3, 5)

    def descriptors(q, k, v):
        return mta.conv.stream_descriptors(q, v, mta.conv.fold_keys(k, w, 2))

    assert all(d is not None for d in descriptors(q, k, v))
    assert descriptors(q.float(), k.float(), v.float()) == (None, None, None)
    q20, k20, v20 = rand_qkv(1, 2, 1, 9, 9, 20, dtype=torch.float16)  # 40-byte rows
    assert descriptors(q20, k20, v20) == (None, None, None)
    # 48-byte rows (every stride a multiple of 16 bytes) starting 2 bytes in: only the start is refused.
    q_off = rand(432 + 8, dtype=torch.float16)[1:433].view(1, 2, 9, 24)
    assert q_off.data_ptr() % 16 == 2 and all(s * 2 % 16 == 0 for s in q_off.stride()[:-1])
    assert all(d is not None for d in descriptors(q_off.clone(), k, v))  # the same strides, aligned
    assert descriptors(q_off, k, v) == (None, None, None)
    assert mta.conv.stream_descriptors(q, v, mta.conv.fold_keys(k, w, 2), copy_engine=False) == (None, None, None)


@pytest.mark.parametrize("N", [1, 23, 70])
@pytest.mark.parametrize("cq,ck", [(16, 15), (1, 33), (5, 1)], ids=str)
def test_masked_diagonals_across_key_tiles(N, cq, ck, poisoned_outputs):
    """E = cq - 1 + pk masked diagonals: 22 and 16 span two or three key tiles, 4 with ck = 1 (pk = 0)."""
    run_case(N, cq, ck, True, torch.float32)


@pytest.mark.parametrize("by_product", [False, True], ids=["dots", "product"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("N,reach", [(1, 7), (19, 7), (70, 15), (150, 20)], ids=str)
def test_past_scores_match_their_definition(N, reach, dtype, by_product):
    """Both kernels (per-row dot products; one product per row tile, which 16-bit inputs take on a GPU), forced
    either way, against float64: zero before key 0 and past ``reach``, GQA, a head dim that is no power of 2."""
    if dtype == torch.bfloat16 and not ON_GPU:
        pytest.skip("the interpreter's bf16 products are not exact")
    if by_product and dtype == torch.float32:
        pytest.skip("fp32 keeps the per-row dot products")
    B, Hq, Hkv, D = 2, 4, 2, 24
    q, k = rand(B, Hq, N, D).to(dtype), rand(B, Hkv, N, D).to(dtype)
    p = mta.conv.past_scores(q, k, reach, by_product=by_product).cpu().double()
    width = max(16, 1 << reach.bit_length())
    assert p.shape == (B, Hq, N, width)
    qd, kd = q.cpu().double(), k.cpu().double()
    want = torch.zeros(B, Hq, N, width, dtype=torch.float64)
    for h in range(Hq):
        for r in range(N):
            for e in range(reach + 1):
                if r - e >= 0:
                    want[:, h, r, e] = (qd[:, h, r] * kd[:, h // (Hq // Hkv), r - e]).sum(-1)
    torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cq,ck", [(6, 11), (2, 9), (16, 15), (3, 1)], ids=str)
def test_diagonal_scores_are_the_causal_convolved_scores(cq, ck):
    """CD[i, delta] * scale = C[i, i - delta] of the reference convolution (pre-mask included), delta < E."""
    B, Hq, Hkv, N, D = 1, 2, 1, 41, 24
    q, k = rand(B, Hq, N, D), rand(B, Hkv, N, D)
    w = rand(Hq, cq, ck, scale=0.3)
    cd = mta.conv.diagonal_scores(q, k, w).cpu().double()
    e, _ = mta.conv.diagonal_reach(cq, ck)
    pk = (ck - 1) // 2
    qd, kd, wd = q.cpu().double(), k.cpu().double().expand(B, Hq, N, D), w.cpu().double()
    s0 = (qd @ kd.transpose(-1, -2)).tril()  # the future zeroed before the convolution
    c = torch.nn.functional.conv2d(torch.nn.functional.pad(s0, (pk, pk, cq - 1, 0)), wd[:, None], groups=Hq)
    for delta in range(cd.shape[-1]):
        rows = torch.arange(delta, N)
        want = c[:, :, rows, rows - delta] if delta < e else torch.zeros(B, Hq, N - delta, dtype=torch.float64)
        torch.testing.assert_close(cd[:, :, delta:, delta], want, rtol=1e-5, atol=1e-5)


def test_wrong_device_is_named():
    """The launchers and pre-passes name the tensor that is not where Triton runs (meta stands in on the CPU)."""
    wrong = "meta" if mta.runtime.INTERPRET else "cpu"
    q, k, v = rand_qkv(1, 1, 1, 8, 8, 16)
    w = torch.ones(1, 2, 3, device=DEVICE)
    with pytest.raises(ValueError, match="q must be"):
        mta.conv_attention(*(x.to(wrong) for x in (q, k, v)), w.to(wrong))
    with pytest.raises(ValueError, match="k must be"):
        mta.conv.fold_keys(k.to(wrong), w, 1)
    with pytest.raises(ValueError, match="weight must be"):
        mta.conv.diagonal_scores(q, k, w.to(wrong))
    with pytest.raises(ValueError, match="q must be"):
        mta.conv.past_scores(q.to(wrong), k, 4)
