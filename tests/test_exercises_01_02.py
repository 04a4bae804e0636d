"""Chapters 01 and 02: every checker passes its reference solution and rejects plausible wrong ones.

A wrong solution must fail on the case that its mistake breaks, and the checker's message must
name that case. Checkers never raise, also for a stub that raises NotImplementedError.
"""

from __future__ import annotations

import math

import pytest
import torch

import mta
from conftest import load_solutions
from mta.course.exercises import ch01, ch02


SOL1, SOL2 = load_solutions("ch01"), load_solutions("ch02")

CHECKS = [
    (ch01.check_causal_attention, SOL1.causal_attention),
    (ch01.check_first_n_not_fitting, SOL1.first_n_not_fitting),
    (ch01.check_decode_intensity, SOL1.decode_intensity),
    (ch01.check_tiled_traffic, SOL1.tiled_traffic),
    (ch02.check_stream_normalizer, SOL2.stream_normalizer),
    (ch02.check_my_merge, SOL2.my_merge),
    (ch02.check_block_state, SOL2.block_state),
    (ch02.check_online_attention, SOL2.online_attention),
]


@pytest.mark.parametrize("check, solution", CHECKS, ids=[c.__name__ for c, _ in CHECKS])
def test_solution_passes(check, solution, capsys):
    result = check(solution)
    assert result.passed and result.attempted, result.message
    assert "cases pass" in capsys.readouterr().out


@pytest.mark.parametrize("check", [c for c, _ in CHECKS], ids=[c.__name__ for c, _ in CHECKS])
def test_stub_is_not_attempted(check, capsys):
    def stub(*args, **kwargs):
        raise NotImplementedError

    result = check(stub)
    assert not result.passed and not result.attempted
    assert "not attempted yet" in capsys.readouterr().out


def expect_failure(result, case, *words):
    assert not result.passed and result.attempted, result.message
    assert f"case {case!r}" in result.message, result.message
    for word in words:
        assert word in result.message, result.message


# ---------------------------------------------------------------------------------------------
# Chapter 01


def _gqa(k, Hq):
    return k.repeat_interleave(Hq // k.shape[1], dim=1)


def causal_top_left(q, k, v):
    """Wrong: mask j > i (PyTorch's is_causal alignment) instead of j > i + (Nk - Nq)."""
    k, v = _gqa(k, q.shape[1]), _gqa(v, q.shape[1])
    S = q.shape[-1] ** -0.5 * (q @ k.transpose(-2, -1))
    future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
    return torch.softmax(S.masked_fill(future, float("-inf")), dim=-1) @ v


def causal_repeat(q, k, v):
    """Wrong: kv heads repeated as 0, 1, 0, 1, ... (repeat instead of repeat_interleave)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
    Nq, Nk = q.shape[-2], k.shape[-2]
    S = q.shape[-1] ** -0.5 * (q @ k.transpose(-2, -1))
    future = torch.ones(Nq, Nk, dtype=torch.bool).triu(Nk - Nq + 1)
    return torch.softmax(S.masked_fill(future, float("-inf")), dim=-1) @ v


def causal_two_fills(q, k, v):
    """Right values, but two masked_fill calls (scores, then probabilities)."""
    k, v = _gqa(k, q.shape[1]), _gqa(v, q.shape[1])
    Nq, Nk = q.shape[-2], k.shape[-2]
    S = q.shape[-1] ** -0.5 * (q @ k.transpose(-2, -1))
    future = torch.ones(Nq, Nk, dtype=torch.bool).triu(Nk - Nq + 1)
    P = torch.softmax(S.masked_fill(future, float("-inf")), dim=-1).masked_fill(future, 0.0)
    return P @ v


def causal_fixed_scale(q, k, v):
    """Wrong: scale 1/4 = 1/sqrt(16) hard-coded."""
    k, v = _gqa(k, q.shape[1]), _gqa(v, q.shape[1])
    Nq, Nk = q.shape[-2], k.shape[-2]
    S = 0.25 * (q @ k.transpose(-2, -1))
    future = torch.ones(Nq, Nk, dtype=torch.bool).triu(Nk - Nq + 1)
    return torch.softmax(S.masked_fill(future, float("-inf")), dim=-1) @ v


def causal_scaled_in_place(q, k, v):
    """Wrong: q *= scale on the caller's q, then the scale again (1/d in all); a reference computed from the same
    q after the call would agree."""
    k, v = _gqa(k, q.shape[1]), _gqa(v, q.shape[1])
    Nq, Nk = q.shape[-2], k.shape[-2]
    q *= q.shape[-1] ** -0.5
    S = q.shape[-1] ** -0.5 * (q @ k.transpose(-2, -1))
    future = torch.ones(Nq, Nk, dtype=torch.bool).triu(Nk - Nq + 1)
    return torch.softmax(S.masked_fill(future, float("-inf")), dim=-1) @ v


def causal_int_mask_softmax(q, k, v):
    """Crashes inside torch (softmax of an int tensor raises NotImplementedError): a crash, not "not attempted"."""
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.long).tril(k.shape[-2] - q.shape[-2])
    return torch.softmax(keep, -1)


def test_a_not_implemented_error_from_torch_is_a_crash_not_a_stub():
    result = ch01.check_causal_attention(causal_int_mask_softmax)
    expect_failure(result, "Nq = Nk = 8", "raised NotImplementedError")


@pytest.mark.parametrize("wrong, case", [
    (causal_scaled_in_place, "Nq = Nk = 8"),
    (causal_top_left, "Nq = 3 < Nk = 8 (bottom-right alignment)"),
    (causal_repeat, "GQA: 6 query heads share 2 kv heads, Nq = 4, Nk = 7"),
    (causal_fixed_scale, "head dimension d = 40 (scale 1/sqrt(d))"),
    (causal_two_fills, "exactly one masked_fill per call"),
])
def test_causal_attention_rejects(wrong, case):
    expect_failure(ch01.check_causal_attention(wrong), case)


def test_causal_attention_names_an_input_changed_in_place():
    expect_failure(ch01.check_causal_attention(causal_scaled_in_place), "Nq = Nk = 8", "changed its input q in place")


def test_causal_attention_names_the_masked_fill_count():
    expect_failure(ch01.check_causal_attention(causal_two_fills), "exactly one masked_fill per call", "2 times")


def n_float_sqrt(B, H, itemsize, capacity):
    """Wrong for huge capacities: float square root."""
    return int(math.sqrt(capacity / (2 * B * H * itemsize))) + 1


def n_ceil(B, H, itemsize, capacity):
    """Wrong at the boundary: ceil(sqrt(C / per)) is an N that may fill the capacity exactly, and still fit."""
    return math.ceil(math.sqrt(capacity / (2 * B * H * itemsize)))


def n_one_matrix(B, H, itemsize, capacity):
    """Wrong: counts S only, not S and P."""
    return math.isqrt(capacity // (B * H * itemsize)) + 1


@pytest.mark.parametrize("wrong, case", [
    (n_one_matrix, "B=8, H=32, fp16, 80 GB"),
    (n_ceil, "B=1, H=16, fp32, 80 GB"),  # S + P take exactly 80 GB at N = 25000: they still fit
    (n_float_sqrt, "capacity of 2 * (2**53 + 1)**2 bytes (float sqrt rounds)"),
])
def test_first_n_not_fitting_rejects(wrong, case):
    expect_failure(ch01.check_first_n_not_fitting(wrong), case)


def intensity_kv_only(Hq, Hkv, Nq, Nk, d, itemsize, *, kv_once_per_group):
    """Wrong: forgets the bytes of Q and O."""
    heads = Hkv if kv_once_per_group else Hq
    return 4 * Hq * Nq * Nk * d / (2 * heads * Nk * d * itemsize)


def intensity_half_flops(Hq, Hkv, Nq, Nk, d, itemsize, *, kv_once_per_group):
    """Wrong: counts only Q K^T (2 N d per query), not P V."""
    heads = Hkv if kv_once_per_group else Hq
    return 2 * Hq * Nq * Nk * d / ((2 * Hq * Nq * d + 2 * heads * Nk * d) * itemsize)


def intensity_always_shared(Hq, Hkv, Nq, Nk, d, itemsize, *, kv_once_per_group):
    """Wrong: ignores the flag and always reads K, V once per kv head."""
    return 4 * Hq * Nq * Nk * d / ((2 * Hq * Nq * d + 2 * Hkv * Nk * d) * itemsize)


@pytest.mark.parametrize("wrong, case, word", [
    (intensity_kv_only, "Hq=32, Hkv=8, Nq=1, Nk=32768, d=128, bf16", "kv_once_per_group=False"),
    (intensity_half_flops, "Hq=32, Hkv=8, Nq=1, Nk=32768, d=128, bf16", "expected"),
    (intensity_always_shared, "Hq=32, Hkv=8, Nq=1, Nk=32768, d=128, bf16", "kv_once_per_group=False"),
])
def test_decode_intensity_rejects(wrong, case, word):
    expect_failure(ch01.check_decode_intensity(wrong), case, word)


def traffic_floor_tiles(N, d, itemsize, block_m, block_n, *, causal):
    """Wrong: N // BLOCK_M query tiles (the ragged last tile is forgotten)."""
    tiles = N // block_m
    kv = tiles * N if not causal else sum(min(N, (t + 1) * block_m) for t in range(tiles))
    return (2 * N + 2 * kv) * d * itemsize


def traffic_causal_half(N, d, itemsize, block_m, block_n, *, causal):
    """Wrong: causal as exactly half the K/V traffic of the non-causal kernel."""
    kv = math.ceil(N / block_m) * N
    return (2 * N + 2 * (kv / 2 if causal else kv)) * d * itemsize


def traffic_causal_exact_keys(N, d, itemsize, block_m, block_n, *, causal):
    """Wrong: causal tiles read exactly their visible keys, ignoring that keys come in blocks of BLOCK_N."""
    kv = sum(min(N, m + block_m) if causal else N for m in range(0, N, block_m))
    return (2 * N + 2 * kv) * d * itemsize


@pytest.mark.parametrize("wrong, case", [
    (traffic_floor_tiles, "not causal, N = 1000 (not a multiple of BLOCK_M = 128)"),
    (traffic_causal_half, "causal, N = 1024, BLOCK_M = BLOCK_N = 128"),
    (traffic_causal_exact_keys, "causal, N = 1024, BLOCK_M = 64 < BLOCK_N = 128"),
])
def test_tiled_traffic_rejects(wrong, case):
    expect_failure(ch01.check_tiled_traffic(wrong), case, "bytes")


def test_tiled_traffic_simulation_matches_the_plain_formula():
    # Non-causal: Q and O once, K and V once per query tile.
    for N, bm in [(1, 64), (50, 64), (1000, 128), (1024, 128)]:
        assert ch01.tiled_traffic_by_simulation(N, 64, 2, bm, 32, False) == (2 * N + 2 * N * math.ceil(N / bm)) * 64 * 2


# ---------------------------------------------------------------------------------------------
# Chapter 02


def stream_unguarded(stream):
    """Wrong: no care for masked entries; -inf - (-inf) is NaN."""
    m, l = float("-inf"), 0.0
    for x in stream:
        m_new = max(m, x)
        l = l * math.exp(m - m_new) + math.exp(x - m_new)
        m = m_new
    return m, l


def stream_two_passes(stream):
    """Wrong: keeps every value (O(n) memory), then takes the two-pass route."""
    values = list(stream)
    finite = [x for x in values if x != float("-inf")]
    if not finite:
        return float("-inf"), 0.0
    m = max(finite)
    return m, math.fsum(math.exp(x - m) for x in finite)


def stream_reads_twice(stream):
    """Wrong: reads the stream once for the max and again for the sum."""
    m = max(stream, default=float("-inf"))
    return m, sum(math.exp(x - m) for x in stream)


def stream_no_max(stream):
    """Wrong: plain sum of exponentials (overflows)."""
    l = 0.0
    m = float("-inf")
    for x in stream:
        m = max(m, x)
        l += math.exp(x) if x != float("-inf") else 0.0
    return m, l / math.exp(m) if m != float("-inf") else 0.0


@pytest.mark.parametrize("wrong, case, word", [
    (stream_unguarded, "masked entries (-inf) come first", "NaN"),
    (stream_two_passes, "O(1) memory: 100000 values", "MiB"),
    (stream_reads_twice, "one value", "read a second time"),
    (stream_no_max, "1002 values including +-800", "OverflowError"),
])
def test_stream_normalizer_rejects(wrong, case, word):
    expect_failure(ch02.check_stream_normalizer(wrong), case, word)


def merge_unguarded(a, b):
    """Wrong: no guard for the empty state; e^(-inf - (-inf)) is NaN."""
    m = torch.maximum(a.m, b.m)
    alpha, beta = torch.exp(a.m - m), torch.exp(b.m - m)
    return mta.AttentionState(m=m, l=alpha * a.l + beta * b.l,
                              acc=alpha[..., None] * a.acc + beta[..., None] * b.acc)


def merge_2d_only(a, b):
    """Wrong: alpha[:, None] works only for states of shape [Nq]."""
    m = torch.maximum(a.m, b.m)
    alpha = torch.where(torch.isneginf(m), torch.zeros_like(m), torch.exp(a.m - m))
    beta = torch.where(torch.isneginf(m), torch.zeros_like(m), torch.exp(b.m - m))
    return mta.AttentionState(m=m, l=alpha * a.l + beta * b.l, acc=alpha[:, None] * a.acc + beta[:, None] * b.acc)


def merge_no_rescale(a, b):
    """Wrong: adds l and acc without bringing them to the common max."""
    return mta.AttentionState(m=torch.maximum(a.m, b.m), l=a.l + b.l, acc=a.acc + b.acc)


def merge_library(a, b):
    """Right values, but it calls the library instead of writing the formula."""
    return mta.merge_states(a, b)


@pytest.mark.parametrize("wrong, case", [
    (merge_no_rescale, "two halves: keys 0:11 and 11:20"),
    (merge_library, "written without mta.merge_states"),
    (merge_2d_only, "batch and head axes in front: states [2, 3, 5], acc [2, 3, 5, 4]"),
    (merge_unguarded, "both sides empty"),
])
def test_my_merge_rejects(wrong, case):
    expect_failure(ch02.check_my_merge(wrong), case)


def state_unguarded(s, v):
    """Wrong: exp(s - max s) is NaN on a fully masked row."""
    m = s.amax(dim=-1)
    p = torch.exp(s - m[..., None])
    return mta.AttentionState(m=m, l=p.sum(-1), acc=p @ v)


def state_global_max(s, v):
    """Wrong: one max for the whole block instead of one per row (o and lse would still come out right)."""
    m = s.amax().expand(s.shape[:-1])
    p = torch.exp(s - m[..., None])
    return mta.AttentionState(m=m, l=p.sum(-1), acc=p @ v)


def state_normalized(s, v):
    """Wrong: returns normalized probabilities (l = 1, acc = o), not the unnormalized sums."""
    m = s.amax(dim=-1)
    p = torch.softmax(s, dim=-1)
    return mta.AttentionState(m=m, l=p.sum(-1), acc=p @ v)


def state_in_place(s, v):
    """Right values, but s -= m in place on the caller's scores."""
    m = s.amax(dim=-1)
    s -= torch.where(torch.isneginf(m), 0.0, m)[..., None]
    p = s.exp_()
    return mta.AttentionState(m=m, l=p.sum(-1), acc=p @ v)


@pytest.mark.parametrize("wrong, case, word", [
    (state_in_place, "one query row, 6 keys", "changed its input s in place"),
    (state_global_max, "rows on different scales (m is each row's own max)", "m:"),
    (state_normalized, "one query row, 6 keys", "l:"),
    (state_unguarded, "one fully masked row", "NaN"),
])
def test_block_state_rejects(wrong, case, word):
    expect_failure(ch02.check_block_state(wrong), case, word)


def attention_top_left(q, k, v, *, block_size, causal=False):
    """Wrong: top-left causal alignment."""
    Nq, Nk = q.shape[-2], k.shape[-2]
    k, v = _gqa(k, q.shape[1]), _gqa(v, q.shape[1])
    state = mta.empty_state(q.shape[:-1], q.shape[-1], dtype=q.dtype)
    for start in range(0, Nk, block_size):
        s = q.shape[-1] ** -0.5 * (q @ k[..., start:start + block_size, :].transpose(-1, -2))
        if causal:
            cols = torch.arange(start, min(start + block_size, Nk))[None, :]
            s = s.masked_fill(cols > torch.arange(Nq)[:, None], float("-inf"))
        state = mta.merge_states(state, mta.attention_state(s, v[..., start:start + block_size, :]))
    return mta.finalize_state(state)


def attention_drops_tail(q, k, v, *, block_size, causal=False):
    """Wrong: range(0, Nk - block_size + 1, block_size) forgets a ragged last block."""
    Nk = k.shape[-2]
    k, v = _gqa(k, q.shape[1]), _gqa(v, q.shape[1])
    state = mta.empty_state(q.shape[:-1], q.shape[-1], dtype=q.dtype)
    for start in range(0, max(Nk - block_size + 1, 1), block_size):
        s = q.shape[-1] ** -0.5 * (q @ k[..., start:start + block_size, :].transpose(-1, -2))
        if causal:
            cols = torch.arange(start, min(start + block_size, Nk))[None, :]
            s = s.masked_fill(cols > torch.arange(q.shape[-2])[:, None] + (Nk - q.shape[-2]), float("-inf"))
        state = mta.merge_states(state, mta.attention_state(s, v[..., start:start + block_size, :]))
    return mta.finalize_state(state)


def attention_unguarded_finalize(q, k, v, *, block_size, causal=False):
    """Wrong: o = acc / l and lse = m + log l without care for queries that saw no key."""
    state = None
    Nq, Nk = q.shape[-2], k.shape[-2]
    k, v = _gqa(k, q.shape[1]), _gqa(v, q.shape[1])
    state = mta.empty_state(q.shape[:-1], q.shape[-1], dtype=q.dtype)
    for start in range(0, Nk, block_size):
        s = q.shape[-1] ** -0.5 * (q @ k[..., start:start + block_size, :].transpose(-1, -2))
        if causal:
            cols = torch.arange(start, min(start + block_size, Nk))[None, :]
            s = s.masked_fill(cols > torch.arange(Nq)[:, None] + (Nk - Nq), float("-inf"))
        state = mta.merge_states(state, mta.attention_state(s, v[..., start:start + block_size, :]))
    return state.acc / state.l[..., None], state.m + torch.log(state.l)


def attention_materialized(q, k, v, *, block_size, causal=False):
    """Right values, but through the whole score matrix (written out, not a call of the finished function)."""
    k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], 1) for x in (k, v))
    s = q.shape[-1] ** -0.5 * q @ k.transpose(-1, -2)
    if causal:
        nq, nk = s.shape[-2:]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(nk - nq + 1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
    return p @ v, lse


def attention_row_by_row(q, k, v, *, block_size, causal=False):
    """Right values, but one query at a time against all the keys: no key blocks, no running state."""
    k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], 1) for x in (k, v))
    nq, nk = q.shape[-2], k.shape[-2]
    outs, lses = [], []
    for i in range(nq):
        s = q.shape[-1] ** -0.5 * q[..., i:i + 1, :] @ k.transpose(-1, -2)
        if causal:
            s = s.masked_fill(torch.arange(nk) > i + nk - nq, float("-inf"))
        lse = torch.logsumexp(s, -1)
        outs.append(torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse)[..., None]) @ v)
        lses.append(lse)
    return torch.cat(outs, -2), torch.cat(lses, -1)


def attention_max_from_zero(q, k, v, *, block_size, causal=False):
    """Wrong: the running max starts at 0 instead of -inf (no guard needed): right while a row's max is above about
    -745, where exp(s - 0) still holds a float64; o = 0 and lse = -inf below."""
    Nq, Nk = q.shape[-2], k.shape[-2]
    k, v = _gqa(k, q.shape[1]), _gqa(v, q.shape[1])
    m = torch.zeros(q.shape[:-1], dtype=q.dtype)
    l, acc = torch.zeros_like(m), torch.zeros_like(q)
    for start in range(0, Nk, block_size):
        s = q.shape[-1] ** -0.5 * (q @ k[..., start:start + block_size, :].transpose(-1, -2))
        if causal:
            cols = torch.arange(start, min(start + block_size, Nk))[None, :]
            s = s.masked_fill(cols > torch.arange(Nq)[:, None] + (Nk - Nq), float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        p, alpha = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
        l, acc, m = alpha * l + p.sum(-1), alpha[..., None] * acc + p @ v[..., start:start + block_size, :], m_new
    seen = l > 0
    l_safe = torch.where(seen, l, torch.ones_like(l))
    return acc / l_safe[..., None], torch.where(seen, m + torch.log(l_safe), torch.full_like(m, -math.inf))


@pytest.mark.parametrize("wrong, case", [
    (attention_max_from_zero, "every score below -1000 (a running max that starts at 0 underflows)"),
    (attention_row_by_row, "never the scores of all keys at once"),
    (attention_drops_tail, "not causal, Nk = 37 (not a multiple of block 8)"),
    (attention_top_left, "causal, Nq = 5 < Nk = 37 (bottom-right)"),
    (attention_unguarded_finalize, "causal, Nq = 12 > Nk = 5: 7 queries see no key"),
    (attention_materialized, "never the scores of all keys at once"),
])
def test_online_attention_rejects(wrong, case):
    expect_failure(ch02.check_online_attention(wrong), case)


def test_online_attention_accepts_an_additive_mask_for_all_keys(capsys):
    """Right: one additive causal mask [Nq, Nk] (0 or -inf) made once, sliced per key block. It is not a score
    matrix: the checker must not read it as the scores of all keys at once."""
    def online_attention(q, k, v, *, block_size, causal=False):
        Nq, Nk = q.shape[-2], k.shape[-2]
        k, v = _gqa(k, q.shape[1]), _gqa(v, q.shape[1])
        bias = torch.zeros(Nq, Nk, dtype=q.dtype)
        if causal:
            bias = bias.masked_fill(torch.ones(Nq, Nk, dtype=torch.bool).triu(Nk - Nq + 1), -math.inf)
        state = mta.empty_state(q.shape[:-1], q.shape[-1], dtype=q.dtype)
        for start in range(0, Nk, block_size):
            stop = min(start + block_size, Nk)
            s = q.shape[-1] ** -0.5 * (q @ k[..., start:stop, :].transpose(-1, -2)) + bias[:, start:stop]
            state = SOL2.my_merge(state, SOL2.block_state(s, v[..., start:stop, :]))
        seen = state.l > 0
        l_safe = torch.where(seen, state.l, torch.ones_like(state.l))
        return (state.acc / l_safe[..., None],
                torch.where(seen, state.m + torch.log(l_safe), torch.full_like(state.m, -math.inf)))

    result = ch02.check_online_attention(online_attention)
    assert result.passed, result.message


def test_first_n_not_fitting_accepts_a_numpy_int(capsys):
    """Right: the smallest N as a NumPy integer (an answer computed with NumPy) is an int for the exercise."""
    np = pytest.importorskip("numpy")
    result = ch01.check_first_n_not_fitting(lambda B, H, itemsize, capacity: np.int64(
        SOL1.first_n_not_fitting(B, H, itemsize, capacity)))
    assert result.passed, result.message
