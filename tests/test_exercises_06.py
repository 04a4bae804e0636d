"""Chapter 06's exercises: every reference solution passes its checker, and a plausible wrong answer fails it
with a message that names the failing case."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import mta  # noqa: F401  (sets the runtime before any kernel below is defined)
from conftest import assert_stubs_not_attempted, load_solutions
from mta.course.exercises import ch06

SOLUTIONS = load_solutions("ch06")


def test_solution_1_passes(capsys):
    result = ch06.check_split_kernel(SOLUTIONS.split_states)
    assert result.passed and result.attempted
    assert f"all {len(ch06.SPLIT_CASES) + 1} cases pass" in capsys.readouterr().out  # + the program count


def test_solution_2_passes(capsys):
    assert ch06.check_combine(SOLUTIONS.combine).passed
    assert f"all {len(ch06.COMBINE_CASES)} cases pass" in capsys.readouterr().out


def test_solutions_1_and_2_together_pass(capsys):
    assert ch06.check_split_k_decode(SOLUTIONS.split_states, SOLUTIONS.combine).passed
    assert f"all {len(ch06.DECODE_CASES)} cases pass" in capsys.readouterr().out


def test_solution_3_passes(capsys):
    assert ch06.check_mta_decode_rows(SOLUTIONS.mta_decode_rows).passed
    assert f"all {len(ch06.MTA_CASES) + 1} cases pass" in capsys.readouterr().out  # and the window-only case


def test_answers_without_the_running_max_fail_on_large_logits(capsys):
    """``exp`` of raw scores overflows in the thousands: the MTA exercise has a case that catches it (the split
    kernel has test_wrong_1_kernel: no-running-max)."""
    def rows_without_max(q_cache, k, v, w, lens, n):
        with torch.no_grad():  # the solution with softmax(c) replaced by exp(c) / sum(exp(c))
            real_softmax = torch.softmax
            torch.softmax = lambda c, dim: c.exp() / c.exp().sum(dim, keepdim=True)
            try:
                return SOLUTIONS.mta_decode_rows(q_cache, k, v, w, lens, n)
            finally:
                torch.softmax = real_softmax

    result = ch06.check_mta_decode_rows(rows_without_max)
    assert result.attempted and not result.passed
    assert "logits in the thousands" in result.message and "NaN or inf" in result.message


def test_solution_4_passes(capsys):
    assert ch06.check_band_scores(SOLUTIONS.band_scores).passed
    assert f"all {len(ch06.BAND_CASES)} cases pass" in capsys.readouterr().out


def test_stubs_are_not_attempted(capsys):
    assert_stubs_not_attempted((ch06.check_split_kernel, ch06.check_combine, ch06.check_mta_decode_rows,
                                ch06.check_band_scores), capsys)

    def stub(*args):
        raise NotImplementedError
    result = ch06.check_split_k_decode(stub, stub)
    assert not result.attempted and not result.passed


# --- exercise 1 ------------------------------------------------------------------------------------------------


@triton.jit
def _wrong_split_kernel(Q, K, V, LENS, M, L, ACC, scale, num_splits, num_kv_heads, n_max, n_new, num_rows,
                        G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, GUARD: tl.constexpr, LOAD_TO_LENGTH: tl.constexpr,
                        ZERO_START: tl.constexpr, BASE2: tl.constexpr, RUNNING_MAX: tl.constexpr):
    # The solution with one slip switched off (or on): CAUSAL off: every new query sees all L keys. GUARD off:
    # exp(m - m_new) even where m_new is -inf. LOAD_TO_LENGTH off: K and V loaded up to the cache's end, only the
    # scores masked (0 x NaN is NaN in p @ v). ZERO_START: the running max starts at 0, and a row with l = 0 is
    # given m = -inf at the end. BASE2: exp2 with log2(e) in the scale, m stored in base-2 units. RUNNING_MAX
    # off: exp of the raw scores, no max subtracted (m stored as 0).
    s = tl.program_id(0)
    pair = tl.program_id(1)
    b = pair // num_kv_heads
    seq_len = tl.load(LENS + b)
    per = tl.cdiv(seq_len, num_splits)
    start = s * per
    stop = tl.minimum(start + per, seq_len)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < G * n_new
    d_ok = offs_d < D
    pos = seq_len - n_new + offs_m % n_new
    rows = pair * G * n_new + offs_m
    q = tl.load(Q + rows[:, None] * D + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q = q.to(tl.float32)
    m = tl.full([BLOCK_M], 0.0 if ZERO_START or not RUNNING_MAX else float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for j0 in range(start, stop, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < stop
        load_ok = n_ok if LOAD_TO_LENGTH else offs_n < n_max
        kv = (pair * n_max + offs_n)[:, None] * D + offs_d[None, :]
        k = tl.load(K + kv, mask=load_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        v = tl.load(V + kv, mask=load_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        x = scale * tl.dot(q, tl.trans(k), input_precision="ieee")
        if BASE2:
            x = x * 1.4426950408889634
        seen = n_ok[None, :]
        if CAUSAL:
            seen = seen & (offs_n[None, :] <= pos[:, None])
        x = tl.where(seen, x, float("-inf"))
        if RUNNING_MAX:
            m_new = tl.maximum(m, tl.max(x, 1))
        else:
            m_new = m
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new) if GUARD else m_new
        if BASE2:
            alpha = tl.math.exp2(m - m_safe)
            p = tl.math.exp2(x - m_safe[:, None])
        else:
            alpha = tl.exp(m - m_safe)
            p = tl.exp(x - m_safe[:, None])
        l = alpha * l + tl.sum(p, 1)
        acc = alpha[:, None] * acc + tl.dot(p, v, input_precision="ieee")
        m = m_new
    if ZERO_START:
        m = tl.where(l > 0.0, m, float("-inf"))
    out = s * num_rows + rows
    tl.store(M + out, m, mask=row_ok)
    tl.store(L + out, l, mask=row_ok)
    tl.store(ACC + out[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


def _wrong_split(expand=None, causal=True, guard=True, load_to_length=True, zero_start=False, base2=False,
                 running_max=True):
    """A launcher of :func:`_wrong_split_kernel`; ``expand`` turns the caches into one kv head per query head
    (then ``G = 1``: one program per query head)."""
    def split_states(q, k_cache, v_cache, lens, num_splits):
        B, Hq, Nq, D = q.shape
        if expand is not None:
            k_cache, v_cache = (expand(x, Hq // x.shape[1]).contiguous() for x in (k_cache, v_cache))
        Hkv, n_max = k_cache.shape[1:3]
        G = Hq // Hkv
        m = torch.empty((num_splits, B, Hq, Nq), device=q.device, dtype=torch.float32)
        l = torch.empty_like(m)
        acc = torch.empty((num_splits, B, Hq, Nq, D), device=q.device, dtype=torch.float32)
        _wrong_split_kernel[(num_splits, B * Hkv)](
            q, k_cache, v_cache, lens, m, l, acc, D ** -0.5, num_splits, Hkv, n_max, Nq, B * Hq * Nq, G=G, D=D,
            BLOCK_M=max(16, triton.next_power_of_2(G * Nq)), BLOCK_N=16, BLOCK_D=max(16, triton.next_power_of_2(D)),
            CAUSAL=causal, GUARD=guard, LOAD_TO_LENGTH=load_to_length, ZERO_START=zero_start, BASE2=base2,
            RUNNING_MAX=running_max)
        return m, l, acc
    return split_states


def test_the_planted_kernel_with_no_slip_passes(capsys):
    assert ch06.check_split_kernel(_wrong_split()).passed


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")   # the interpreter, on the slips
@pytest.mark.parametrize("slip,case,what", [
    ({"causal": False}, "GQA 8:2, Nq=3: a group's 12 rows in one tile, 3 splits", "max abs error"),
    ({"expand": lambda x, g: x.repeat(1, g, 1, 1)}, "GQA 8:2, Nq=3: a group's 12 rows in one tile, 3 splits",
     "max abs error"),                                              # query head h reads kv head h % Hkv
    ({"load_to_length": False}, "ragged lengths [5, 70], NaN past them, 2 splits", "contains NaN or inf"),
    ({"guard": False}, "8 splits over 5 keys (empty splits: m = -inf, l = 0, acc = 0)", "l: contains NaN or inf"),
    ({"zero_start": True}, "L=1: one key, one split", "m: max abs error"),      # m = max(0, the largest score)
    ({"base2": True}, "L=1: one key, one split", "m: max abs error"),
    ({"running_max": False}, "L=1: one key, one split", "m: max abs error"),
    ({"expand": lambda x, g: x.repeat_interleave(g, 1)}, "one program per (sequence, kv head, split)",
     "48 programs launched, expected B x Hkv x S = 2 x 2 x 3 = 12"),   # one program per query head: right numbers
], ids=["no-causal-mask", "heads-tiled", "loads-past-the-length", "no-guard", "max-starts-at-0", "base-2-m",
        "no-running-max", "one-program-per-query-head"])
def test_wrong_1_kernel(slip, case, what):
    result = ch06.check_split_kernel(_wrong_split(**slip))
    assert result.attempted and not result.passed
    assert case in result.message and what in result.message, result.message


def test_wrong_1_a_pytorch_answer_or_the_checker_s_states():
    def pytorch(q, k, v, lens, num_splits):
        return tuple(x.float().to(q.device) for x in ch06.split_states_truth(q.cpu(), k.cpu(), v.cpu(),
                                                                             lens.tolist(), num_splits))
    result = ch06.check_split_kernel(pytorch)
    assert not result.passed and "split_states_truth" in result.message, result.message

    def own_states(q, k, v, lens, num_splits):
        qd, kd, vd = (x.double().cpu() for x in (q, k, v))
        B, Hq, Nq, D = q.shape
        m = torch.full((num_splits, B, Hq, Nq), float("-inf"), dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros(num_splits, B, Hq, Nq, D, dtype=torch.float64)
        for b, L in enumerate(lens.tolist()):
            kb, vb = (x[b, :, :L].repeat_interleave(Hq // k.shape[1], 0) for x in (kd, vd))
            for s, (a, z) in enumerate(ch06.split_ranges(L, num_splits)):
                if a < z:
                    sc = D ** -0.5 * qd[b] @ kb[:, a:z].transpose(-1, -2)
                    sc = sc.masked_fill(torch.arange(a, z)[None] > (L - Nq + torch.arange(Nq))[:, None], -torch.inf)
                    st = mta.attention_state(sc, vb[:, a:z])
                    m[s, b], l[s, b], acc[s, b] = st.m, st.l, st.acc
        return m.float(), l.float(), acc.float()
    result = ch06.check_split_kernel(own_states)
    assert not result.passed and "launched no Triton kernel of its own" in result.message, result.message


def test_split_states_merge_to_the_decode_truth():
    for name, shape, options in ch06.SPLIT_CASES + ch06.DECODE_CASES:
        B, Hq, Hkv, n_max, D, nq, lens, splits = shape
        q, k, v = (x.double() for x in ch06.split_problem(B, Hq, Hkv, n_max, D, nq, lens, seed=5, **options))
        m, l, acc = ch06.split_states_truth(q, k, v, lens, splits)
        state = mta.empty_state(m.shape[1:], D, dtype=torch.float64)
        for s in range(splits):
            state = mta.merge_states(state, mta.AttentionState(m=m[s], l=l[s], acc=acc[s]))
        torch.testing.assert_close(mta.finalize_state(state)[0], ch06.split_decode_truth(q, k, v, lens),
                                   atol=1e-10, rtol=1e-10, msg=name)


# --- exercise 2 ------------------------------------------------------------------------------------------------


@triton.jit
def _wrong_combine_kernel(M, L, ACC, O, num_splits, num_rows, D: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_S: tl.constexpr, RESCALE: tl.constexpr, GUARD: tl.constexpr, ALL: tl.constexpr,
                          ZERO_START: tl.constexpr, BLOCK_MAX: tl.constexpr):
    # RESCALE off: sums acc and l as they are (as if every split had the same max). GUARD off: exp(m - m_new)
    # even when m_new is -inf. ALL off: reads only the first BLOCK_S splits. ZERO_START: the running max starts at
    # 0, not -inf: right while some split's max is above about -87, where exp(m_s - 0) still holds a float32.
    # BLOCK_MAX: each block of splits takes its own max, not the running one: exact (alpha > 1 is still a
    # consistent rescale) until a block's max lies more than about 88 below an earlier one: exp(m - m_new) overflows.
    row = tl.program_id(0)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    m = tl.full([], 0.0 if ZERO_START else float("-inf"), dtype=tl.float32)
    l = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    stop = num_splits if ALL else BLOCK_S
    for s0 in range(0, stop, BLOCK_S):
        s = s0 + offs_s
        s_ok = s < num_splits
        m_s = tl.load(M + s * num_rows + row, mask=s_ok, other=float("-inf"))
        l_s = tl.load(L + s * num_rows + row, mask=s_ok, other=0.0)
        acc_s = tl.load(ACC + (s[:, None] * num_rows + row) * D + offs_d[None, :],
                        mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        m_new = tl.max(m_s, 0) if BLOCK_MAX else tl.maximum(m, tl.max(m_s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new) if GUARD else m_new
        if RESCALE:
            alpha = tl.exp(m - m_safe)
            beta = tl.exp(m_s - m_safe)
        else:
            alpha = tl.full([], 1.0, dtype=tl.float32)
            beta = tl.where(s_ok, 1.0, 0.0)
        l = alpha * l + tl.sum(beta * l_s, 0)
        acc = alpha * acc + tl.sum(beta[:, None] * acc_s, 0)
        m = m_new
    o = acc / tl.where(l > 0.0, l, 1.0)
    tl.store(O + row * D + offs_d, o, mask=d_ok)


def _wrong_combine(rescale=True, guard=True, every_split=True, zero_start=False, block_max=False):
    def combine(m_part, l_part, acc_part):
        S, R, D = acc_part.shape
        o = torch.empty((R, D), device=acc_part.device, dtype=torch.float32)
        _wrong_combine_kernel[(R,)](m_part, l_part, acc_part, o, S, R, D=D, BLOCK_D=triton.next_power_of_2(D),
                                    BLOCK_S=16, RESCALE=rescale, GUARD=guard, ALL=every_split,
                                    ZERO_START=zero_start, BLOCK_MAX=block_max)
        return o
    return combine


def test_wrong_2_forgets_to_rescale():
    # Right with one split (nothing to rescale); wrong as soon as splits have different maxima.
    result = ch06.check_combine(_wrong_combine(rescale=False))
    assert result.attempted and not result.passed
    assert "case 'S=5 splits, D=24 (not a power of two)' fails: o: max abs error" in result.message


def test_wrong_2_reads_one_block_of_splits():
    result = ch06.check_combine(_wrong_combine(every_split=False))
    assert "case 'S=37 splits (more than one block of 16)' fails: o: max abs error" in result.message


def test_wrong_2_no_guard_for_a_row_without_keys():
    # exp(-inf - (-inf)) is NaN: fine while some split saw a key, wrong for a row that none saw.
    result = ch06.check_combine(_wrong_combine(guard=False))
    assert "case 'a row that no split saw (output 0)' fails: o: contains NaN or inf" in result.message


def test_wrong_2_starts_the_running_max_at_zero():
    result = ch06.check_combine(_wrong_combine(zero_start=True))
    assert result.attempted and not result.passed
    assert "case 'every maximum near -200 (a running max that starts at 0 underflows)' fails: o: max abs error" \
        in result.message, result.message


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")   # the interpreter, on the slip
def test_wrong_2_takes_each_block_s_own_max():
    result = ch06.check_combine(_wrong_combine(block_max=True))
    assert result.attempted and not result.passed
    assert 'case "S=20: the second block of splits 200 below the first (a block\'s own max, not the running one, ' \
        'overflows)" fails: o: contains NaN or inf' in result.message, result.message


def test_wrong_2_without_a_d_mask():
    # BLOCK_D = D: tl.arange needs a power of two, so D = 24 cannot even launch.
    def no_padding(m_part, l_part, acc_part):
        S, R, D = acc_part.shape
        o = torch.empty((R, D), device=acc_part.device, dtype=torch.float32)
        SOLUTIONS.combine_kernel[(R,)](m_part, l_part, acc_part, o, S, R, D=D, BLOCK_D=D, BLOCK_S=16)
        return o

    result = ch06.check_combine(no_padding)
    assert "case 'S=5 splits, D=24 (not a power of two)' raised" in result.message


# --- exercise 3 ------------------------------------------------------------------------------------------------


def _mta_rows(q_cache, k_cache, v_cache, weight, lens, n, *, pre_mask=True, window=True, pre_mask_value=0.0):
    """The solution with one slip: no zero before the convolution, a window of the n new queries only (the
    cq - 1 rows above them taken as zeros), or another value than 0 put in the future before the convolution."""
    B, Hq, _, D = q_cache.shape
    cq, ck = weight.shape[1:]
    pk = (ck - 1) // 2
    G = Hq // k_cache.shape[1]
    out = q_cache.new_empty(B, Hq, n, D)
    for b, L in enumerate(lens):
        rows = torch.arange(L - n - (cq - 1), L)
        first = L - n - (cq - 1) if window else L - n
        q = torch.where((rows >= max(first, 0))[:, None], q_cache[b][:, rows.clamp_min(max(first, 0))], 0.0)
        k = k_cache[b, :, :L].repeat_interleave(G, 0)
        v = v_cache[b, :, :L].repeat_interleave(G, 0)
        keys = torch.arange(L)
        s = D ** -0.5 * q @ k.transpose(-1, -2)
        if pre_mask:
            s = s.masked_fill(keys[None, :] > rows[:, None], pre_mask_value)
        c = F.conv2d(F.pad(s, (pk, pk))[None], weight[:, None], groups=Hq)[0]
        c = c.masked_fill(keys[None, :] > rows[cq - 1:, None], float("-inf"))
        out[b] = torch.softmax(c, -1) @ v
    return out


def test_wrong_3_forgets_the_pre_mask():
    # With one position there is no future to zero; with L = 4 and two new queries there is.
    result = ch06.check_mta_decode_rows(lambda *a: _mta_rows(*a, pre_mask=False))
    assert result.attempted and not result.passed
    assert "case 'L=4 < cq=6, kernel 6x11, n=2' fails: o: max abs error" in result.message


def test_wrong_3_reads_only_the_new_queries():
    # The convolution also needs the cq - 1 queries above the new ones; at L = 1 they are padding anyway.
    result = ch06.check_mta_decode_rows(lambda *a: _mta_rows(*a, window=False))
    assert "case 'L=4 < cq=6, kernel 6x11, n=2' fails: o: max abs error" in result.message


def test_wrong_3_masks_with_minus_inf_before_the_convolution():
    # The pre-convolution mask written like the post-convolution one: -inf times the kernel's weights gives inf and
    # NaN, already where the window reaches above position 0.
    result = ch06.check_mta_decode_rows(lambda *a: _mta_rows(*a, pre_mask_value=float("-inf")))
    assert "case 'L=1, kernel 3x5' fails: o: contains NaN or inf" in result.message


# --- exercise 4 ------------------------------------------------------------------------------------------------


@triton.jit
def _band_bug(Q, K, W, LENS, OUT, scale, num_heads, group_size, n_max, n_new, CQ: tl.constexpr, CK: tl.constexpr,
              E: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BUG: tl.constexpr):
    # The solution's kernel with one planted bug: BUG = 1 leaves out the zero before the convolution (every key
    # below the length scored); 2 zeroes the future by multiplying with the mask after loading keys up to the
    # cache's end (NaN x 0 is NaN); 3 reads only the new queries (the window's rows above them as zeros); 4 runs the
    # kernel columns the wrong way (key j + pk - b); 5 gives query head h kv head h % Hkv; 6 writes 0, not -inf,
    # where no key is; 7 leaves out the scale.
    PK: tl.constexpr = (CK - 1) // 2
    pid = tl.program_id(0)
    b = pid // num_heads
    h = pid % num_heads
    if BUG == 5:
        kv = b * (num_heads // group_size) + h % (num_heads // group_size)
    else:
        kv = b * (num_heads // group_size) + h // group_size
    seq_len = tl.load(LENS + b)
    t = tl.arange(0, BLOCK_T)
    delta = tl.arange(0, BLOCK_E)
    offs_d = tl.arange(0, D)
    row_ok = t < n_new
    i = seq_len - n_new + t
    j = i[:, None] - delta[None, :]
    c = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for a in tl.static_range(CQ):
        r = i - (CQ - 1) + a
        first = seq_len - n_new if BUG == 3 else 0
        q = tl.load(Q + (pid * n_max + r[:, None]) * D + offs_d[None, :],
                    mask=(row_ok & (r >= 0) & (r >= first))[:, None], other=0.0)
        for kb in tl.static_range(CK):
            if BUG == 4:
                col = j + PK - kb
            else:
                col = j - PK + kb
            if BUG == 1:
                ok = row_ok[:, None] & (col >= 0) & (col < seq_len)
            elif BUG == 2:
                ok = row_ok[:, None] & (col >= 0) & (col < n_max)
            else:
                ok = row_ok[:, None] & (col >= 0) & (col <= r[:, None])
            k = tl.load(K + (kv * n_max + col[:, :, None]) * D + offs_d[None, None, :], mask=ok[:, :, None],
                        other=0.0)
            s = tl.sum(q[:, None, :] * k, 2)
            if BUG == 2:
                s = s * (col <= r[:, None]).to(tl.float32)
            c += tl.load(W + (h * CQ + a) * CK + kb) * s
    if BUG != 7:
        c = scale * c
    c = tl.where(j >= 0, c, 0.0 if BUG == 6 else float("-inf"))
    tl.store(OUT + (pid * n_new + t[:, None]) * E + delta[None, :], c, mask=row_ok[:, None] & (delta < E)[None, :])


def _band_with(bug):
    def band_scores(q_cache, k_cache, weight, lens, n):
        B, Hq, n_max, D = q_cache.shape
        cq, ck = weight.shape[1:]
        E = cq - 1 + (ck - 1) // 2
        out = torch.empty((B, Hq, n, E), device=q_cache.device)
        _band_bug[(B * Hq,)](q_cache, k_cache, weight, lens, out, D ** -0.5, Hq, Hq // k_cache.shape[1], n_max, n,
                             CQ=cq, CK=ck, E=E, D=D, BLOCK_T=triton.next_power_of_2(n),
                             BLOCK_E=triton.next_power_of_2(E), BUG=bug)
        return out
    return band_scores


def test_the_planted_band_kernel_with_no_bug_passes():
    assert ch06.check_band_scores(_band_with(0)).passed


@pytest.mark.parametrize("bug,case,what", [
    (1, "L=4 < E=10, kernel 6x11, n=2", "c: max abs error"),     # with one position there is no future to zero
    (2, "L=1, kernel 3x5 (keys before position 0: -inf)", "c: contains NaN or inf"),
    (3, "L=4 < E=10, kernel 6x11, n=2", "c: max abs error"),     # at L = 1 the rows above are padding anyway
    (4, "L=4 < E=10, kernel 6x11, n=2", "c: max abs error"),     # at L = 1 only the centre column sees a key
    (5, "GQA 4:2, ragged [9, 30], kernel 3x5, n=3", "c: max abs error"),
    (6, "L=1, kernel 3x5 (keys before position 0: -inf)", "c at (sequence, head, query, delta) (0, 0, 0, 1): got 0, "
                                                          "expected -inf (key i - delta would be before position 0)"),
    (7, "L=1, kernel 3x5 (keys before position 0: -inf)", "c: max abs error"),
], ids=["no-zero-before-the-convolution", "mask-multiplied-after-loading-NaN", "only-the-new-queries",
        "columns-the-wrong-way", "heads-tiled", "zero-where-no-key", "no-scale"])
def test_wrong_4_kernel(bug, case, what):
    result = ch06.check_band_scores(_band_with(bug))
    assert result.attempted and not result.passed
    assert f"case '{case}' fails: {what}" in result.message, result.message


def test_wrong_4_a_pytorch_answer():
    # The right numbers from the window in PyTorch, without a kernel of one's own.
    def in_pytorch(q_cache, k_cache, weight, lens, n):
        B, Hq, _, D = q_cache.shape
        cq, ck = weight.shape[1:]
        pk = (ck - 1) // 2
        E = cq - 1 + pk
        out = torch.full((B, Hq, n, E), float("-inf"))
        for b, L in enumerate(lens.tolist()):
            k = k_cache[b].cpu().repeat_interleave(Hq // k_cache.shape[1], 0)
            for t in range(n):
                i = L - n + t
                for delta in range(min(E, i + 1)):
                    total = torch.zeros(Hq)
                    for a in range(cq):
                        for kb in range(ck):
                            r, c = i - (cq - 1) + a, i - delta - pk + kb
                            if 0 <= c <= r:
                                total += weight[:, a, kb].cpu() * (q_cache[b, :, r].cpu() * k[:, c]).sum(-1)
                    out[b, :, t, delta] = D ** -0.5 * total
        return out

    result = ch06.check_band_scores(in_pytorch)
    assert "launched no Triton kernel of its own" in result.message, result.message


@pytest.mark.parametrize("name,shape", ch06.BAND_CASES)
def test_band_truth_is_the_package_s_diagonal_scores(name, shape):
    # The band's truth is what mta.conv.diagonal_scores (the prefill's band, C / scale) gives on each sequence's
    # first L positions, times the scale, on the rows of the new queries.
    from mta.conv import diagonal_scores
    B, Hq, Hkv, n_max, D, cq, ck, lens, n = shape
    (qc, k, _), gen = ch06.poisoned_caches(B, Hq, Hkv, n_max, D, lens, seed=6, with_q_cache=True)
    w = 0.3 * torch.randn(Hq, cq, ck, generator=gen, dtype=torch.float64)
    want = ch06.band_truth(qc, k, w, lens, n)
    E = want.shape[-1]
    dev = mta.runtime.DEVICE
    for b, L in enumerate(lens):
        cd = diagonal_scores(*(x.float().to(dev) for x in (qc[b:b + 1, :, :L], k[b:b + 1, :, :L], w)))
        got = D ** -0.5 * cd[0, :, L - n:, :E].cpu().double()
        i = torch.arange(L - n, L)[:, None] - torch.arange(E)[None, :]
        got = got.masked_fill(i < 0, float("-inf"))
        torch.testing.assert_close(got, want[b], atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("name,shape,options", ch06.SPLIT_CASES + ch06.DECODE_CASES)
def test_split_truth_is_the_shipped_decoder(name, shape, options):
    # The checkers' truth is what mta.decode_attention computes (fp32 on the runtime's device).
    B, Hq, Hkv, n_max, D, nq, lens, splits = shape
    q, k, v = (x.double() for x in ch06.split_problem(B, Hq, Hkv, n_max, D, nq, lens, seed=3, **options))
    dev = mta.runtime.DEVICE
    got = mta.decode_attention(*(x.float().to(dev) for x in (q, k, v)), cache_seqlens=list(lens), num_splits=splits)
    torch.testing.assert_close(got.cpu().double(), ch06.split_decode_truth(q, k, v, lens), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("name,shape", ch06.MTA_CASES)
def test_mta_truth_is_the_shipped_decoder(name, shape):
    B, Hq, Hkv, n_max, D, cq, ck, lens, n, q_scale = (*shape, 1.0)[:10]
    (qc, k, v), gen = ch06.poisoned_caches(B, Hq, Hkv, n_max, D, lens, seed=4, with_q_cache=True)
    qc = qc * q_scale
    w = 0.3 * torch.randn(Hq, cq, ck, generator=gen, dtype=torch.float64)
    dev = mta.runtime.DEVICE
    got = mta.conv_decode_attention(*(x.float().to(dev) for x in (qc, k, v, w)), cache_seqlens=list(lens),
                                    num_queries=n)
    torch.testing.assert_close(got.cpu().double(), ch06.mta_rows_truth(qc, k, v, w, lens, n), atol=2e-5, rtol=2e-5)
