"""Chapter 04's exercises: every reference solution passes its checker, and a plausible wrong answer fails it
with a message that names the failing case."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import mta  # noqa: F401  (sets the runtime before any kernel below is defined)
from conftest import assert_stubs_not_attempted, load_solutions
from mta.course.exercises import ch04

SOLUTIONS = load_solutions("ch04")


def test_solution_1_passes(capsys):
    result = ch04.check_diagonal_scores(SOLUTIONS.diagonal_scores)
    assert result.passed and result.attempted
    assert f"all {len(ch04.DIAGONAL_CASES)} cases pass" in capsys.readouterr().out


def test_solution_2_passes():
    assert ch04.check_tile_kinds(SOLUTIONS.classify_by_definition).passed


def test_solution_3_passes():
    assert ch04.check_fold_keys(SOLUTIONS.fold_keys).passed


def test_solution_4_passes():
    assert ch04.check_folded_forward(SOLUTIONS.folded_forward).passed


def test_stubs_are_not_attempted(capsys):
    assert_stubs_not_attempted((ch04.check_diagonal_scores, ch04.check_tile_kinds, ch04.check_fold_keys,
                                ch04.check_folded_forward), capsys)


def test_wrong_1_forgets_the_pre_mask():
    # The convolution of the raw scores S: the right half of the kernel then reads future scores.
    def no_pre_mask(q, k, w, scale):
        N = q.shape[0]
        cq, ck = w.shape
        pk = (ck - 1) // 2
        S_pad = F.pad(scale * q @ k.T, (pk, pk, cq - 1, 0))
        out = torch.zeros(N, cq - 1 + pk, dtype=q.dtype)
        for i in range(N):
            for delta in range(min(cq - 1 + pk, i + 1)):
                out[i, delta] = (w * S_pad[i:i + cq, i - delta:i - delta + ck]).sum()
        return out

    result = ch04.check_diagonal_scores(no_pre_mask)
    assert result.attempted and not result.passed
    assert "case 'N=12, 3x5' fails: diagonal scores: max abs error" in result.message


def test_wrong_1_flips_the_kernel():
    # A true convolution (kernel flipped on both axes) instead of the cross-correlation F.conv2d computes.
    def flipped(q, k, w, scale):
        return SOLUTIONS.diagonal_scores(q, k, w.flip(0, 1), scale)

    result = ch04.check_diagonal_scores(flipped)
    assert "case 'N=12, 3x5' fails: diagonal scores: max abs error" in result.message


def _tile_rule(reach, folded_on_real_entries=False):
    """A tile-kinds answer: SKIPPED if every real entry is in the future, FOLDED if every entry (or only every
    real one) is at least ``reach(cq, ck)`` diagonals below, else DIAGONAL."""
    def kind(i0, j0, BM, BN, N, cq, ck):
        i = np.arange(i0, i0 + BM)[:, None]
        j = np.arange(j0, j0 + BN)[None, :]
        real = (i < N) & (j < N)
        if (j > i)[real].all():
            return ch04.SKIPPED
        far = i - j >= reach(cq, ck)
        return ch04.FOLDED if (far[real] if folded_on_real_entries else far).all() else ch04.DIAGONAL
    return kind


def test_wrong_2_forgets_the_reach():
    # Plain flash attention's rule: a tile is unmasked once it lies on or below the diagonal (E taken as 0).
    result = ch04.check_tile_kinds(_tile_rule(lambda cq, ck: 0))
    assert result.attempted and not result.passed
    assert "case 'N=37, tiles 16x16, 2x9' fails: tile (i0=16, j0=0): got FOLDED, the kernel's rule says DIAGONAL" \
        in result.message


def test_wrong_2_folded_judged_on_the_real_entries_only():
    # FOLDED is decided over the whole B_M x B_N rectangle (the kernel does not know which rows are real): with a
    # 1 x 1 kernel (E = 0) the ragged last tile of N = 33 differs.
    result = ch04.check_tile_kinds(_tile_rule(lambda cq, ck: cq - 1 + (ck - 1) // 2, folded_on_real_entries=True))
    assert "case 'N=33, tiles 16x16, 1x1 (a ragged last tile: decided over the whole rectangle)' fails:" \
        in result.message, result.message
    assert ch04.check_tile_kinds(_tile_rule(lambda cq, ck: cq - 1 + (ck - 1) // 2)).passed  # the whole rectangle


def test_wrong_2_reach_off_by_one():
    # E = cq + pk: one diagonal too many. Only a tile whose nearest entry is exactly E below the diagonal tells.
    def off_by_one(i0, j0, BM, BN, N, cq, ck):
        return SOLUTIONS.classify_by_definition(i0, j0, BM, BN, N, cq + 1, ck)

    result = ch04.check_tile_kinds(off_by_one)
    assert "case 'N=130, tiles 32x16, 11x15' fails:" in result.message
    assert "got DIAGONAL, the kernel's rule says FOLDED" in result.message


@triton.jit
def _fold_wrong_way(K, W, KF, n, CQ: tl.constexpr, CK: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    # As the solution, but kernel column b reads key j + pk - b (the shift runs the wrong way).
    PK: tl.constexpr = (CK - 1) // 2
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    for a in tl.static_range(CQ):
        acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        for b in tl.static_range(CK):
            rows = offs_n + PK - b
            k = tl.load(K + rows[:, None] * D + offs_d[None, :], mask=((rows >= 0) & (rows < n))[:, None], other=0.0)
            acc += tl.load(W + a * CK + b) * k
        tl.store(KF + (a * n + offs_n[:, None]) * D + offs_d[None, :], acc, mask=(offs_n < n)[:, None])


@triton.jit
def _fold_clamped(K, W, KF, n, CQ: tl.constexpr, CK: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    # As the solution, but rows outside [0, n) are clamped to the nearest key instead of reading 0.
    PK: tl.constexpr = (CK - 1) // 2
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    for a in tl.static_range(CQ):
        acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        for b in tl.static_range(CK):
            rows = tl.minimum(tl.maximum(offs_n - PK + b, 0), n - 1)
            k = tl.load(K + rows[:, None] * D + offs_d[None, :])
            acc += tl.load(W + a * CK + b) * k
        tl.store(KF + (a * n + offs_n[:, None]) * D + offs_d[None, :], acc, mask=(offs_n < n)[:, None])


def _fold_with(kernel):
    def fold(k, w, block_n=16):
        N, D = k.shape
        cq, ck = w.shape
        kf = torch.empty(cq, N, D, device=k.device, dtype=torch.float32)
        kernel[(triton.cdiv(N, block_n),)](k.contiguous(), w.contiguous(), kf, N, CQ=cq, CK=ck, D=D, BLOCK_N=block_n)
        return kf
    return fold


def test_wrong_3_shifts_the_wrong_way():
    # With one token only the centre column reads a key, so N = 1 passes; N = 37 does not.
    result = ch04.check_fold_keys(_fold_with(_fold_wrong_way))
    assert result.attempted and not result.passed
    assert "case 'N=37, D=16, 2x9' fails: folded keys: max abs error" in result.message


def test_wrong_3_clamps_the_padding():
    # Replicate padding instead of zero padding: wrong at both ends, already with one token.
    result = ch04.check_fold_keys(_fold_with(_fold_clamped))
    assert "case 'N=1, D=16, 3x5' fails: folded keys: max abs error" in result.message


@triton.jit
def _forward_bug(Q, KF, V, O, LSE, n, qk_scale, CQ: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BUG: tl.constexpr):
    # The solution's kernel with one planted bug: BUG = 1 scores the keys past the end 0 instead of -inf; 2 shifts
    # the queries the wrong way (row i + (cq-1) - a); 3 keeps no running max (2^c summed as it is); 4 writes the
    # log-sum-exp in base-2 units.
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if BUG == 3:
        m = tl.zeros([BLOCK_M], dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(0, n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n
        c = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for a in tl.static_range(CQ):
            if BUG == 2:
                rows = offs_m + (CQ - 1) - a
            else:
                rows = offs_m - (CQ - 1) + a
            q_a = tl.load(Q + rows[:, None] * D + offs_d[None, :], mask=((rows >= 0) & (rows < n))[:, None],
                          other=0.0)
            kf_a = tl.load(KF + (a * n + offs_n[:, None]) * D + offs_d[None, :], mask=key_ok[:, None], other=0.0)
            c = tl.dot(q_a, tl.trans(kf_a), c, input_precision="ieee")
        if BUG == 1:
            c = c * qk_scale
        else:
            c = tl.where(key_ok[None, :], c * qk_scale, float("-inf"))
        if BUG == 3:
            m_new = m
        else:
            m_new = tl.maximum(m, tl.max(c, 1))
        p = tl.exp2(c - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        v = tl.load(V + offs_n[:, None] * D + offs_d[None, :], mask=key_ok[:, None], other=0.0)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        l = l * alpha + tl.sum(p, 1)
        m = m_new
    row_ok = offs_m < n
    tl.store(O + offs_m[:, None] * D + offs_d[None, :], acc / l[:, None], mask=row_ok[:, None])
    if BUG == 4:
        tl.store(LSE + offs_m, m + tl.log2(l), mask=row_ok)
    else:
        tl.store(LSE + offs_m, (m + tl.log2(l)) / 1.4426950408889634, mask=row_ok)


def _forward_with(bug):
    def forward(q, kf, v, scale, block=16):
        N, D = q.shape
        o = torch.empty(N, D, device=q.device)
        lse = torch.empty(N, device=q.device)
        _forward_bug[(triton.cdiv(N, block),)](q, kf, v, o, lse, N, scale * SOLUTIONS.LOG2E, CQ=kf.shape[0], D=D,
                                               BLOCK_M=block, BLOCK_N=block, BUG=bug)
        return o, lse
    return forward


def test_wrong_4_scores_the_padded_keys_zero():
    # One token in a tile of 16 keys: 15 keys past the end, each weighted e^0 instead of 0.
    result = ch04.check_folded_forward(_forward_with(1))
    assert result.attempted and not result.passed
    assert "case 'N=1, D=16, 3x5' fails: o: max abs error" in result.message, result.message


def test_wrong_4_shifts_the_queries_the_wrong_way():
    # With one token only the shift a = cq - 1 reads a real query, and both directions read row 0: N = 1 passes.
    result = ch04.check_folded_forward(_forward_with(2))
    assert "case 'N=37, D=16, 2x9 (a ragged last key tile)' fails: o: max abs error" in result.message, \
        result.message


def test_wrong_4_keeps_no_running_max():
    # 2^c without subtracting a running max: right while the scores are small, inf (then NaN) once they are not.
    result = ch04.check_folded_forward(_forward_with(3))
    assert "case 'N=48, D=16, 3x5, scale 30 (scores in the hundreds: exp overflows without a running max)' " \
        "fails: o: contains NaN or inf" in result.message, result.message


def test_wrong_4_base_2_log_sum_exp():
    result = ch04.check_folded_forward(_forward_with(4))
    assert "case 'N=1, D=16, 3x5' fails: lse: max abs error" in result.message, result.message


def test_wrong_4_a_pytorch_forward():
    # The right numbers without a kernel of one's own.
    def in_pytorch(q, kf, v, scale):
        N = q.shape[0]
        cq = kf.shape[0]
        c = scale * sum(F.pad(q, (0, 0, cq - 1 - a, 0))[:N] @ kf[a].T for a in range(cq))
        return torch.softmax(c, -1) @ v, torch.logsumexp(c, -1)

    result = ch04.check_folded_forward(in_pytorch)
    assert "launched no Triton kernel of its own" in result.message, result.message


@pytest.mark.parametrize("N,BM,BN,cq,ck", [(37, 16, 16, 2, 9), (200, 16, 16, 6, 11), (1024, 64, 64, 6, 11)])
def test_tile_kinds_follow_the_kernel(N, BM, BN, cq, ck):
    # The grid from the kernel's key_tile_bounds is the one from the definition, and the fused kernel's checks in
    # the notebook rely on it.
    kinds = ch04.tile_kinds(N, cq, ck, BM, BN)
    for t in range(kinds.shape[0]):
        for u in range(kinds.shape[1]):
            assert kinds[t, u] == SOLUTIONS.classify_by_definition(t * BM, u * BN, BM, BN, N, cq, ck)
