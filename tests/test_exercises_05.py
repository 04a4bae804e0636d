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


# --- exercise 5 ------------------------------------------------------------------------------------------------


def test_solution_5_passes(capsys):
    assert ch05.check_teaching_dv(SOLUTIONS.teaching_dv).passed
    assert f"all {len(ch05.DV_CASES)} cases pass" in capsys.readouterr().out


def test_stub_5_is_not_attempted(capsys):
    assert_stubs_not_attempted((ch05.check_teaching_dv,), capsys)


@triton.jit
def _dv_bug(Q, KF, CD, DO, LSE, DV, n, scale, group_size, CQ: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr,
            CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BUG: tl.constexpr):
    # The solution's kernel with one planted bug: BUG = 1 leaves out the -inf mask after the convolution; 2 keeps
    # the folded scores on the E near diagonals (no diagonal scores put in); 3 shifts the queries the transpose's
    # way (r + (cq-1) - a); 4 leaves the scale out of P; 5 takes E_PAD near diagonals instead of E; 6 keeps the
    # loaded dtype (fp16 P and dO products of mixed dtypes); 7 adds only the first query head of each group.
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kv_bh = tl.program_id(1)
    offs_d = tl.arange(0, D)
    key_ok = offs_n < n
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    heads = 1 if BUG == 7 else group_size
    for g in range(heads):
        bh = kv_bh * group_size + g
        for start_m in range(0, n, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < n
            c = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for a in tl.static_range(CQ):
                if BUG == 3:
                    rows = offs_m + (CQ - 1) - a
                else:
                    rows = offs_m - (CQ - 1) + a
                q_a = tl.load(Q + (bh * n + rows[:, None]) * D + offs_d[None, :],
                              mask=((rows >= 0) & (rows < n) & row_ok)[:, None], other=0.0)
                kf_a = tl.load(KF + ((bh * CQ + a) * n + offs_n[:, None]) * D + offs_d[None, :],
                               mask=key_ok[:, None], other=0.0)
                if BUG != 6:
                    q_a = q_a.to(tl.float32)
                    kf_a = kf_a.to(tl.float32)
                c += tl.dot(q_a, tl.trans(kf_a), input_precision="ieee")
            if CAUSAL:
                delta = offs_m[:, None] - offs_n[None, :]
                near = (delta >= 0) & (delta < (E_PAD if BUG == 5 else E))
                cd = tl.load(CD + (bh * n + offs_m[:, None]) * E_PAD + delta, mask=near & row_ok[:, None],
                             other=0.0)
                if BUG != 2:
                    c = tl.where(near, cd, c)
                if BUG != 1:
                    c = tl.where(delta >= 0, c, float("-inf"))
            c = tl.where(key_ok[None, :], c, float("-inf"))
            lse = tl.load(LSE + bh * n + offs_m, mask=row_ok, other=float("inf"))
            if BUG == 4:
                p = tl.exp(c - lse[:, None])
            else:
                p = tl.exp(scale * c - lse[:, None])
            do = tl.load(DO + (bh * n + offs_m[:, None]) * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            if BUG != 6:
                do = do.to(tl.float32)
            dv += tl.dot(tl.trans(p), do, input_precision="ieee")
    tl.store(DV + (kv_bh * n + offs_n[:, None]) * D + offs_d[None, :], dv, mask=key_ok[:, None])


def _dv_with(bug):
    def teaching_dv(q, kf, cd, do, lse, E, num_kv_heads, causal):
        B, Hq, N, D = q.shape
        dv = torch.empty(B, num_kv_heads, N, D, device=q.device)
        _dv_bug[(triton.cdiv(N, 16), B * num_kv_heads)](q, kf, cd, do, lse, dv, N, D ** -0.5, Hq // num_kv_heads,
                                                        CQ=kf.shape[2], E=E, E_PAD=cd.shape[-1], CAUSAL=causal, D=D,
                                                        BLOCK_M=16, BLOCK_N=16, BUG=bug)
        return dv
    return teaching_dv


def test_the_planted_dv_kernel_with_no_bug_passes():
    assert ch05.check_teaching_dv(_dv_with(0)).passed


@pytest.mark.parametrize("bug,case,what", [
    (1, "N=3 < cq=4, 4x3, causal", "dv: max abs error"),        # with one token there is no future
    (2, "N=3 < cq=4, 4x3, causal", "dv: max abs error"),
    (3, "N=7 < ck=9, 2x9, causal", "dv: max abs error"),        # below N = E + 1 every past score is a near one
    (4, "N=1, 3x5, causal (P = 1: dV sums dO over the group)", "dv: max abs error"),
    (5, "N=7 < ck=9, 2x9, causal", "dv: max abs error"),        # diagonals 5 and 6 read cd's zero padding
    (6, "float16, GQA 4:2, N=37, 3x5, causal", "raised"),
    (7, "N=1, 3x5, causal (P = 1: dV sums dO over the group)", "dv: max abs error"),
], ids=["no-mask-after-the-convolution", "no-diagonal-scores", "queries-shifted-the-other-way", "no-scale",
        "E_PAD-diagonals", "fp16-operands-mixed", "one-head-per-group"])
def test_wrong_5_kernel(bug, case, what):
    result = ch05.check_teaching_dv(_dv_with(bug))
    assert result.attempted and not result.passed
    assert f"case '{case}'" in result.message and what in result.message, result.message


def test_wrong_5_a_pytorch_answer():
    # The right numbers from P rebuilt in PyTorch, without a kernel of one's own.
    def in_pytorch(q, kf, cd, do, lse, E, num_kv_heads, causal):
        B, Hq, N, D = q.shape
        cq = kf.shape[2]
        q_pad = F.pad(q.double(), (0, 0, cq - 1, 0))
        c = sum(q_pad[:, :, a:a + N] @ kf[:, :, a].double().transpose(-1, -2) for a in range(cq))
        if causal:
            delta = torch.arange(N, device=q.device)[:, None] - torch.arange(N, device=q.device)[None, :]
            near = (delta >= 0) & (delta < E)
            c = torch.where(near, cd.double().gather(-1, delta.clamp(0, cd.shape[-1] - 1).expand(B, Hq, N, N)), c)
            c = c.masked_fill(delta < 0, float("-inf"))
        p = torch.exp(D ** -0.5 * c - lse.double()[..., None])
        return (p.transpose(-1, -2) @ do.double()).reshape(B, num_kv_heads, -1, N, D).sum(2).float()

    result = ch05.check_teaching_dv(in_pytorch)
    assert "launched no Triton kernel of its own" in result.message, result.message


def test_diagonal_scores_truth_is_the_package_s():
    # The cd the checker hands over is what mta.conv.diagonal_scores makes (fp32, on the runtime's device), on
    # every entry that names a key (i - delta >= 0; a kernel never reads the others).
    from mta.conv import diagonal_scores
    p = ch05.make_problem(*ch05.DV_CASES[4][1], seed=2)
    dev = mta.runtime.DEVICE
    got = diagonal_scores(*(x.float().to(dev) for x in (p.q, p.k, p.weight))).cpu().double()
    want = ch05.diagonal_scores_truth(p)
    N, width = want.shape[-2:]
    a_key = torch.arange(N)[:, None] >= torch.arange(width)[None, :]
    assert got.shape == want.shape
    torch.testing.assert_close(got[..., a_key], want[..., a_key], atol=1e-5, rtol=1e-5)
