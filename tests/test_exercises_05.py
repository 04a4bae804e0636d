"""Chapter 05's exercises: every reference solution passes its checker, and a plausible wrong answer fails it
with a message that names the failing case."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import mta  # noqa: F401  (sets the runtime before any kernel below is defined)
from conftest import assert_stubs_not_attempted, load_solutions
from mta.course.exercises import ch05
from mta.reference import expand_kv

SOLUTIONS = load_solutions("ch05")


def test_solution_1_passes(capsys):
    result = ch05.check_scores_grad(SOLUTIONS.scores_grad)
    assert result.passed and result.attempted
    assert "all 5 cases pass" in capsys.readouterr().out


def test_solution_2_passes():
    assert ch05.check_kernel_grad(SOLUTIONS.kernel_grad).passed


def test_solution_3_passes():
    assert ch05.check_dw_partials(SOLUTIONS.dw_partials).passed


def test_solution_4_passes(capsys):
    assert ch05.check_dq_far(SOLUTIONS.dq_far).passed
    assert f"all {len(ch05.DQ_CASES)} cases pass" in capsys.readouterr().out


def test_stubs_are_not_attempted(capsys):
    assert_stubs_not_attempted((ch05.check_scores_grad, ch05.check_kernel_grad, ch05.check_dw_partials,
                                ch05.check_dq_far), capsys)


def test_wrong_1_forgets_the_pre_mask():
    # The transposed convolution alone: right for one token and for the non-causal case, wrong as soon as a
    # causal problem has a future (the pre-convolution zero replaced those scores by a constant).
    def no_pre_mask(dC, weight, causal):
        return SOLUTIONS.scores_grad(dC, weight, causal=False)

    result = ch05.check_scores_grad(no_pre_mask)
    assert result.attempted and not result.passed
    assert "case 'N=7 < ck=9, 2x9, causal' fails: dS: max abs error" in result.message


def test_wrong_1_convolves_instead_of_transposing():
    # The forward's convolution (padding on top, kernel not flipped) applied to dC. With one token dC is exactly 0
    # (P = 1, so dP - D = 0) and anything linear passes; the first real case fails.
    def forward_conv(dC, weight, causal):
        cq, ck = weight.shape[1:]
        pk = (ck - 1) // 2
        return F.conv2d(F.pad(dC, (pk, pk, cq - 1, 0)), weight[:, None], groups=weight.shape[0])

    result = ch05.check_scores_grad(forward_conv)
    assert "case 'N=7 < ck=9, 2x9, causal' fails: dS: max abs error" in result.message


def test_wrong_2_pads_the_bottom():
    # S0 padded below instead of above: the kernel's rows are paired with the wrong queries.
    def pads_bottom(dC, S0, cq, ck):
        N = dC.shape[-1]
        pk = (ck - 1) // 2
        s0p = F.pad(S0, (pk, pk, 0, cq - 1))
        return torch.stack([torch.stack([(dC * s0p[..., a:a + N, b:b + N]).sum((0, 2, 3)) for b in range(ck)], -1)
                            for a in range(cq)], 1)

    result = ch05.check_kernel_grad(pads_bottom)
    assert not result.passed
    assert "case 'N=7 < ck=9, 2x9, causal' fails: dweight: max abs error" in result.message


def test_wrong_2_keeps_the_batch():
    # Forgets that the kernel is shared by the batch: one gradient per batch element.
    def per_batch(dC, S0, cq, ck):
        return torch.stack([SOLUTIONS.kernel_grad(dC[b:b + 1], S0[b:b + 1], cq, ck) for b in range(dC.shape[0])])

    result = ch05.check_kernel_grad(per_batch)
    assert ("case 'N=1, 3x5, causal (dC = 0: shapes and finite values only)' fails: dweight: shape (1, 2, 3, 5), "
            "expected (2, 3, 5)") in result.message


@triton.jit
def _wrong_direction_kernel(U, K, OUT, n, num_heads, group_size,
                            CQ: tl.constexpr, CK: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr):
    # As the solution, but the kernel column runs the wrong way along u (row c - pk + t instead of c + pk - t).
    PK: tl.constexpr = (CK - 1) // 2
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_heads
    kv_bh = b * (num_heads // group_size) + (bh % num_heads) // group_size
    offs_c = tile * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, D)
    k = tl.load(K + kv_bh * n * D + offs_c[:, None] * D + offs_d[None, :], mask=(offs_c < n)[:, None], other=0.0)
    out = OUT + (tile * tl.num_programs(1) + bh) * CQ * CK
    for a in tl.static_range(CQ):
        for t in tl.static_range(CK):
            rows = offs_c - PK + t
            u = tl.load(U + ((bh * CQ + a) * n + rows[:, None]) * D + offs_d[None, :],
                        mask=((rows >= 0) & (rows < n))[:, None], other=0.0)
            tl.store(out + a * CK + t, tl.sum(tl.sum(u * k, 1), 0))


def test_wrong_3_shifts_the_wrong_way():
    # With one token only the centre column pairs anything, so N = 1 passes; N = 7 does not.
    def wrong_direction(u, k, ck, block_r):
        B, Hq, cq, N, D = u.shape
        tiles = triton.cdiv(N, block_r)
        out = torch.empty(tiles, B, Hq, cq, ck, device=u.device, dtype=torch.float32)
        _wrong_direction_kernel[(tiles, B * Hq)](u.contiguous(), k.contiguous(), out, N, Hq, Hq // k.shape[1],
                                                 CQ=cq, CK=ck, D=D, BLOCK_R=block_r)
        return out

    result = ch05.check_dw_partials(wrong_direction)
    assert result.attempted and not result.passed
    assert "case 'N=7 < ck=9, 2x9, causal' fails: partials of row tile 0: max abs error" in result.message


def test_wrong_3_tiles_the_heads_instead_of_grouping():
    # The classic GQA slip: query head h reads kv head h % Hkv (k.repeat) instead of h // G (repeat_interleave).
    # Right whenever there is one kv head or one query head per kv head; wrong in the GQA case.
    def tiles_heads(u, k, ck, block_r):
        G = u.shape[1] // k.shape[1]
        return SOLUTIONS.dw_partials(u, k.repeat(1, G, 1, 1).contiguous(), ck, block_r)

    result = ch05.check_dw_partials(tiles_heads)
    assert "case 'GQA 4:2, B=2, N=37, 4x7, causal' fails: partials of row tile 0" in result.message


def test_wrong_3_ignores_block_r():
    # A launcher that ignores its block_r argument (16 written in): right for every case at the default block_r.
    result = ch05.check_dw_partials(lambda u, k, ck, block_r: SOLUTIONS.dw_partials(u, k, ck, 16))
    assert result.attempted and not result.passed
    assert "case 'GQA 4:2, B=2, N=37, 4x7, causal, block_r = 32' fails: partials shape: got (3, 2, 4, 4, 7), " \
        "expected (2, 2, 4, 4, 7)" in result.message, result.message


@triton.jit
def _dq_far_bug(DC, KF, DQ, n, scale, CQ: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BUG: tl.constexpr):
    # The solution's kernel with one planted bug: BUG = 1 shifts the rows the forward's way (r - (cq-1) + a, the
    # query shift instead of its transpose); 2 leaves out the scale; 3 reads row r of dc_far for every shift.
    bh = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    DC += bh * n * n
    KF += bh * CQ * n * D
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(0, n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n
        for a in tl.static_range(CQ):
            if BUG == 1:
                rows = offs_m - (CQ - 1) + a
            elif BUG == 3:
                rows = offs_m
            else:
                rows = offs_m + (CQ - 1) - a
            dc = tl.load(DC + rows[:, None] * n + offs_n[None, :],
                         mask=((rows >= 0) & (rows < n))[:, None] & key_ok[None, :], other=0.0)
            kf = tl.load(KF + (a * n + offs_n[:, None]) * D + offs_d[None, :], mask=key_ok[:, None], other=0.0)
            acc = tl.dot(dc, kf, acc, input_precision="ieee")
    if BUG != 2:
        acc = acc * scale
    tl.store(DQ + bh * n * D + offs_m[:, None] * D + offs_d[None, :], acc, mask=(offs_m < n)[:, None])


def _dq_far_with(bug):
    def dq_far(dc_far, kf, scale, block=16):
        B, Hq, cq, N, D = kf.shape
        dq = torch.empty(B, Hq, N, D, device=kf.device)
        _dq_far_bug[(triton.cdiv(N, block), B * Hq)](dc_far, kf, dq, N, scale, CQ=cq, D=D, BLOCK_M=block,
                                                     BLOCK_N=block, BUG=bug)
        return dq
    return dq_far


def test_wrong_4_shifts_the_forward_way():
    # With one token dC = 0 and every answer is zero: the first real case fails.
    result = ch05.check_dq_far(_dq_far_with(1))
    assert result.attempted and not result.passed
    assert "case 'N=7 < ck=9, 2x9, causal' fails: far part of dq: max abs error" in result.message, result.message


def test_wrong_4_forgets_the_scale():
    result = ch05.check_dq_far(_dq_far_with(2))
    assert "case 'N=7 < ck=9, 2x9, causal' fails: far part of dq: max abs error" in result.message, result.message


def test_wrong_4_forgets_the_shifts():
    # The rows of dc_far unshifted for every a: the fold of the query shift left out.
    result = ch05.check_dq_far(_dq_far_with(3))
    assert "case 'N=7 < ck=9, 2x9, causal' fails: far part of dq: max abs error" in result.message, result.message


def test_wrong_4_a_pytorch_answer():
    # The right numbers without a kernel of one's own.
    def in_pytorch(dc_far, kf, scale):
        cq = kf.shape[2]
        return scale * sum(F.pad(dc_far @ kf[:, :, a], (0, 0, 0, cq - 1 - a))[:, :, cq - 1 - a:] for a in range(cq))

    result = ch05.check_dq_far(in_pytorch)
    assert "launched no Triton kernel of its own" in result.message, result.message


def test_dq_far_truth_is_dq_through_the_far_part_of_dc():
    # The fold form of the checker's truth equals the direct route for dC_far: its transposed convolution (which
    # puts nothing on future scores), then dq = scale dS K.
    p = ch05.make_problem(*ch05.DQ_CASES[3][1], seed=3)
    far = ch05.dq_far_truth(ch05.far_dc(p), ch05.folded_keys(p), p.scale)
    dS_far = SOLUTIONS.scores_grad(ch05.far_dc(p), p.weight, p.causal)
    torch.testing.assert_close(far, p.scale * dS_far @ expand_kv(p.k, p.q.shape[1]))


@pytest.mark.parametrize("name,shape", ch05.CASES)
def test_problem_matches_the_reference(name, shape):
    # The checkers' float64 pipeline is the reference's: its weight gradient is autograd's through
    # mta.conv_attention_reference, and dS0 is what the transposed convolution gives.
    p = ch05.make_problem(*shape, seed=1)
    torch.testing.assert_close(SOLUTIONS.kernel_grad(p.dC, p.S0, *p.weight.shape[1:]), p.grads[3])
    torch.testing.assert_close(SOLUTIONS.scores_grad(p.dC, p.weight, p.causal), p.dS)
    if p.causal:
        assert bool((p.dC.triu(1) == 0).all())                           # P = 0 in the future, so dC too
