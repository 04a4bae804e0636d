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
    result = ch06.check_split_decode(SOLUTIONS.split_decode)
    assert result.passed and result.attempted
    assert f"all {len(ch06.SPLIT_CASES) + 1} cases pass" in capsys.readouterr().out  # + the no-whole-scores case


def test_solution_2_passes(capsys):
    assert ch06.check_combine(SOLUTIONS.combine).passed
    assert f"all {len(ch06.COMBINE_CASES)} cases pass" in capsys.readouterr().out


def test_solution_3_passes(capsys):
    assert ch06.check_mta_decode_rows(SOLUTIONS.mta_decode_rows).passed
    assert f"all {len(ch06.MTA_CASES) + 1} cases pass" in capsys.readouterr().out  # and the window-only case


def test_answers_without_the_running_max_fail_on_large_logits(capsys):
    """``exp`` of raw scores overflows in the thousands: both PyTorch exercises have a case that catches it."""
    def split_without_max(q, k, v, lens, num_splits):
        outs = []
        for b, L in enumerate(lens):
            kk, vv = (t[b:b + 1, :, :L].repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (k, v))
            s = q[b:b + 1] @ kk.transpose(-1, -2) * q.shape[-1] ** -0.5
            s = s.masked_fill(torch.arange(L)[None, :] > torch.arange(L - q.shape[2], L)[:, None], float("-inf"))
            outs.append(s.exp() @ vv / s.exp().sum(-1, keepdim=True))
        return torch.cat(outs)

    def rows_without_max(q_cache, k, v, w, lens, n):
        with torch.no_grad():  # the solution with softmax(c) replaced by exp(c) / sum(exp(c))
            real_softmax = torch.softmax
            torch.softmax = lambda c, dim: c.exp() / c.exp().sum(dim, keepdim=True)
            try:
                return SOLUTIONS.mta_decode_rows(q_cache, k, v, w, lens, n)
            finally:
                torch.softmax = real_softmax

    for check, fn in ((ch06.check_split_decode, split_without_max), (ch06.check_mta_decode_rows, rows_without_max)):
        result = check(fn)
        assert result.attempted and not result.passed
        assert "logits in the thousands" in result.message and "NaN or inf" in result.message


def test_decode_without_splits_fails(capsys):
    """Attention over each whole sequence gives the right numbers; the checker still sees that no split was made."""
    def whole(q, k, v, lens, num_splits):
        outs = []
        for b, L in enumerate(lens):
            kb, vb = (x[b, :, :L].repeat_interleave(q.shape[1] // k.shape[1], 0) for x in (k, v))
            s = q.shape[-1] ** -0.5 * q[b] @ kb.transpose(-1, -2)   # [Hq, Nq, L]: every key's score at once
            nq = q.shape[2]
            s = s.masked_fill(torch.ones(nq, L, dtype=torch.bool).triu(L - nq + 1), float("-inf"))
            outs.append(torch.softmax(s, -1) @ vb)
        return torch.stack(outs)
    result = ch06.check_split_decode(whole)
    assert result.attempted and not result.passed and "scores of all 40 keys" in result.message


def test_decode_one_query_at_a_time_without_splits_fails(capsys):
    """One query at a time against all its keys (no splits, no states): right numbers, and still every key's
    score at once."""
    def per_query(q, k, v, lens, num_splits):
        out = torch.zeros_like(q)
        group, nq = q.shape[1] // k.shape[1], q.shape[2]
        for b, L in enumerate(lens):
            kb, vb = (x[b, :, :L].repeat_interleave(group, 0) for x in (k, v))
            for t in range(nq):
                s = q.shape[-1] ** -0.5 * q[b, :, t:t + 1] @ kb.transpose(-1, -2)   # [Hq, 1, L]
                s = s.masked_fill(torch.arange(L) > L - nq + t, float("-inf"))
                out[b, :, t:t + 1] = torch.softmax(s, -1) @ vb
        return out
    result = ch06.check_split_decode(per_query)
    assert result.attempted and not result.passed and "scores of all 40 keys" in result.message, result.message


def test_decode_through_sdpa_without_splits_fails(capsys):
    """``F.scaled_dot_product_attention`` over each whole sequence (the bottom-right mask passed as ``attn_mask``):
    right numbers, no split, and the scores of every key made inside one call, where no product of the learner's
    shows them."""
    def sdpa(q, k, v, lens, num_splits):
        out = torch.empty_like(q)
        group, nq = q.shape[1] // k.shape[1], q.shape[2]
        for b, L in enumerate(lens):
            kb, vb = (x[b:b + 1, :, :L].repeat_interleave(group, 1) for x in (k, v))
            mask = torch.arange(L)[None, :] <= (L - nq + torch.arange(nq))[:, None]
            out[b:b + 1] = F.scaled_dot_product_attention(q[b:b + 1], kb, vb, attn_mask=mask)
        return out
    result = ch06.check_split_decode(sdpa)
    assert result.attempted and not result.passed
    assert 'case "4 splits over 40 keys: no split makes all 40 keys\' scores" fails: scaled_dot_product_attention' \
        in result.message and "scores of all 40 keys" in result.message, result.message


def test_split_decode_with_an_additive_mask_for_all_keys_passes(capsys):
    """Right: one additive causal mask [Nq, L] (0 or -inf) per sequence, sliced per split. It holds no score: the
    checker must not read it as the scores of all keys."""
    def split_decode(q, k_cache, v_cache, lens, num_splits):
        nq, D = q.shape[2:]
        group = q.shape[1] // k_cache.shape[1]
        out = torch.empty_like(q)
        for b, L in enumerate(lens):
            k, v = (x[b, :, :L].repeat_interleave(group, 0) for x in (k_cache, v_cache))
            bias = torch.zeros(nq, L, dtype=q.dtype).masked_fill(
                torch.arange(L)[None, :] > (L - nq + torch.arange(nq))[:, None], float("-inf"))
            per = -(-L // num_splits)
            state = mta.empty_state(q.shape[1:3], D, dtype=q.dtype)
            for start in range(0, L, per):
                stop = min(start + per, L)
                s = D ** -0.5 * q[b] @ k[:, start:stop].transpose(-1, -2) + bias[:, start:stop]
                state = mta.merge_states(state, mta.attention_state(s, v[:, start:stop]))
            out[b] = mta.finalize_state(state)[0]
        return out
    result = ch06.check_split_decode(split_decode)
    assert result.passed, result.message


def test_stubs_are_not_attempted(capsys):
    assert_stubs_not_attempted((ch06.check_split_decode, ch06.check_combine, ch06.check_mta_decode_rows), capsys)


# --- exercise 1 ------------------------------------------------------------------------------------------------


def _split_decode(q, k_cache, v_cache, lens, num_splits, *, causal=True, expand=None, slice_cache=True,
                  skip_empty=True):
    """The solution with one slip switched on: no causal mask among the new queries, another head expansion,
    the cache not cut at each length, or a state computed for every split, empty ones included."""
    B, Hq, Nq, D = q.shape
    G = Hq // k_cache.shape[1]
    expand = expand or (lambda x: x.repeat_interleave(G, 0))
    out = torch.empty_like(q)
    t = torch.arange(Nq)
    for b, L in enumerate(lens):
        n_keys = L if slice_cache else k_cache.shape[2]
        k, v = expand(k_cache[b, :, :n_keys]), expand(v_cache[b, :, :n_keys])
        per = -(-n_keys // num_splits)
        state = mta.empty_state((Hq, Nq), D, dtype=q.dtype)
        for s in range(num_splits):
            start, stop = s * per, min((s + 1) * per, n_keys)
            if start >= stop and skip_empty:
                continue
            j = torch.arange(start, stop)
            scores = D ** -0.5 * q[b] @ k[:, start:stop].transpose(-1, -2)
            if causal:
                scores = scores.masked_fill(j[None, :] > (L - Nq + t)[:, None], float("-inf"))
            state = mta.merge_states(state, mta.attention_state(scores, v[:, start:stop]))
        out[b] = mta.finalize_state(state)[0]
    return out


def test_wrong_1_no_mask_among_the_new_queries():
    # Every new query sees all L keys: right with one new query, wrong as soon as Nq > 1.
    result = ch06.check_split_decode(lambda *a: _split_decode(*a, causal=False))
    assert result.attempted and not result.passed
    assert "case 'GQA 8:2, Nq=3, 3 splits' fails: o: max abs error" in result.message


def test_wrong_1_tiles_the_heads_instead_of_grouping():
    # Query head h reads kv head h % Hkv (repeat) instead of h // G (repeat_interleave).
    result = ch06.check_split_decode(lambda *a: _split_decode(*a, expand=lambda x: x.repeat(
        a[0].shape[1] // a[1].shape[1], 1, 1)))
    assert "case 'GQA 8:2, Nq=3, 3 splits' fails: o: max abs error" in result.message


def test_wrong_1_reads_past_the_length():
    # Splits the whole cache and masks only causally: the NaN past a shorter sequence's length leaks in.
    result = ch06.check_split_decode(lambda *a: _split_decode(*a, slice_cache=False))
    assert "case 'ragged lengths [5, 37], NaN past them' fails: o: contains NaN or inf" in result.message


def test_wrong_1_computes_a_state_for_an_empty_split():
    # A split with no key has no max to take: attention_state on zero keys raises.
    result = ch06.check_split_decode(lambda *a: _split_decode(*a, skip_empty=False))
    assert "case '8 splits over 5 keys (empty splits)' raised" in result.message


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


@pytest.mark.parametrize("name,shape", ch06.SPLIT_CASES)
def test_split_truth_is_the_shipped_decoder(name, shape):
    # The checker's truth is what mta.decode_attention computes (fp32 on the runtime's device).
    B, Hq, Hkv, n_max, D, nq, lens, splits, q_scale = (*shape, 1.0)[:9]
    (k, v), gen = ch06.poisoned_caches(B, Hq, Hkv, n_max, D, lens, seed=3)
    q = torch.randn(B, Hq, nq, D, generator=gen, dtype=torch.float64) * q_scale
    dev = mta.runtime.DEVICE
    got = mta.decode_attention(*(x.float().to(dev) for x in (q, k, v)), cache_seqlens=list(lens), num_splits=splits)
    torch.testing.assert_close(got.cpu().double(), ch06.split_decode_truth(q, k, v, lens), atol=2e-5, rtol=2e-5)


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
