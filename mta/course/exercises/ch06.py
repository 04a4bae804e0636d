"""Checkers for chapter 06's exercises (split-K decode).

Each checker runs the learner's function on a few small, awkward problems (one key, a length that is not a
multiple of the split, grouped-query attention with several new queries, ragged lengths with the cache poisoned
with NaN past them, splits that see no key, logits in the thousands) and compares its answer with the truth
computed in float64 from the references (:func:`mta.naive_attention`, :func:`mta.conv_attention_reference`,
chapter 02's states). It prints one line and returns a :class:`mta.course.exercises.Result`; it never raises.

* :func:`check_split_kernel`: the states ``(m, l, acc)`` of each split of the keys (a Triton kernel, one program
  per (sequence, kv head, split));
* :func:`check_combine`: the merge of split states into outputs (a Triton kernel);
* :func:`check_split_k_decode`: the two kernels together, a whole decode step;
* :func:`check_mta_decode_rows`: MTA's newest rows from the query window (plain PyTorch);
* :func:`check_band_scores`: the convolved scores of the ``E`` keys next to each new query's diagonal, from the
  query window (a Triton kernel).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ...online_softmax import attention_state, finalize_state
from ...reference import conv_attention_reference, naive_attention
from . import (CaseFailed, Result, TritonLaunches, WatchNaNProducts, WatchScores, expect_close,
               expect_close_beside_neginf, expect_equal, finished_attention, own_triton_kernel, refusing, run_cases)


def _randn(gen, *shape, std=1.0):
    return std * torch.randn(*shape, generator=gen, dtype=torch.float64)


def poisoned_caches(B, Hq, Hkv, n_max, D, lens, seed, *, with_q_cache=False):
    """Float64 caches ``[B, H, n_max, D]`` holding NaN at every position at or past ``lens[b]``."""
    gen = torch.Generator().manual_seed(seed)
    caches = [_randn(gen, B, h, n_max, D) for h in ((Hq, Hkv, Hkv) if with_q_cache else (Hkv, Hkv))]
    for b, length in enumerate(lens):
        for c in caches:
            c[b, :, length:] = float("nan")
    return caches, gen


# --- exercise 1: the split kernel ----------------------------------------------------------------------------

#: ``(name, (B, Hq, Hkv, Nmax, D, Nq, lens, num_splits), options)``; options: ``dtype`` of the inputs (float32 if
#: absent), ``q_scale`` (multiplies the queries). A state's ``m`` is its split's largest score, so a running max
#: that starts at 0 instead of -inf fails wherever a row's scores are all negative.
SPLIT_CASES = (
    ("L=1: one key, one split", (1, 2, 2, 1, 16, 1, [1], 1), {}),
    ("L=37, 3 splits of 13 keys (not a multiple of a key tile)", (1, 2, 2, 37, 16, 1, [37], 3), {}),
    ("GQA 8:2, Nq=3: a group's 12 rows in one tile, 3 splits", (1, 8, 2, 29, 16, 3, [29], 3), {}),
    ("ragged lengths [5, 70], NaN past them, 2 splits", (2, 4, 2, 72, 16, 2, [5, 70], 2), {}),
    ("8 splits over 5 keys (empty splits: m = -inf, l = 0, acc = 0)", (1, 2, 1, 5, 16, 3, [5], 8), {}),
    ("D=24 (not a power of two)", (1, 2, 1, 20, 24, 2, [20], 2), {}),
    ("float16 queries and caches, GQA 4:2, ragged [33, 17]", (2, 4, 2, 33, 16, 2, [33, 17], 2),
     {"dtype": torch.float16}),
    ("logits in the thousands (exp overflows without the running max)", (1, 2, 1, 30, 16, 2, [30], 3),
     {"q_scale": 1000.0}),
)

#: ``(B, Hq, Hkv, num_splits)`` of the case that counts the programs: one per (sequence, kv head, split).
GRID_CASE = (2, 8, 2, 3)

#: elementwise tolerances ``(atol, rtol)`` of the states, by input dtype
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (6e-3, 6e-3)}


def split_decode_truth(q, k_cache, v_cache, lens):
    """Per sequence: ``mta.naive_attention(q[b], k[b, :, :L], v[b, :, :L], causal=True)``, float64."""
    return torch.cat([naive_attention(q[b:b + 1], k_cache[b:b + 1, :, :L], v_cache[b:b + 1, :, :L], causal=True)
                      for b, L in enumerate(lens)])


def split_ranges(L: int, num_splits: int) -> list[tuple[int, int]]:
    """The keys ``[start, stop)`` of each split of a sequence of ``L`` keys: contiguous, ``ceil(L / S)`` each,
    the last ones short or empty."""
    per = -(-L // num_splits)
    return [(min(s * per, L), min((s + 1) * per, L)) for s in range(num_splits)]


def split_states_truth(q, k_cache, v_cache, lens, num_splits):
    """``(m, l [S, B, Hq, Nq], acc [S, B, Hq, Nq, D])`` in float64, natural-log units: the state of each split's
    keys (:func:`split_ranges`) for each new query, bottom-right causal; ``(-inf, 0, 0)`` where a split holds no
    key the query sees."""
    B, Hq, Nq, D = q.shape
    G = Hq // k_cache.shape[1]
    m = torch.full((num_splits, B, Hq, Nq), float("-inf"), dtype=torch.float64)
    l = torch.zeros_like(m)
    acc = torch.zeros((num_splits, B, Hq, Nq, D), dtype=torch.float64)
    pos = torch.arange(Nq)
    for b, L in enumerate(lens):
        k, v = (x[b, :, :L].double().repeat_interleave(G, 0) for x in (k_cache, v_cache))   # [Hq, L, D]
        for s, (start, stop) in enumerate(split_ranges(L, num_splits)):
            if start == stop:
                continue
            scores = D ** -0.5 * q[b].double() @ k[:, start:stop].transpose(-1, -2)             # [Hq, Nq, keys]
            future = torch.arange(start, stop)[None, :] > (L - Nq + pos)[:, None]
            state = attention_state(scores.masked_fill(future, float("-inf")), v[:, start:stop])
            m[s, b], l[s, b], acc[s, b] = state.m, state.l, state.acc
    return m, l, acc


def _expect_states(got, want, atol, rtol):
    """``got = (m, l, acc)`` against ``want``: ``m = -inf`` exactly where the truth has it, the rest close."""
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise CaseFailed(f"split_states must return (m, l, acc), got {type(got).__name__}")
    m, l, acc = got
    m_want, l_want, acc_want = want
    expect_close_beside_neginf("m", m, m_want, atol=atol, rtol=rtol, axes="(split, sequence, head, query)",
                               shape_axes="[S, B, Hq, Nq]", neginf_means="this split holds no key the query sees")
    expect_close("l", l, l_want, atol=atol, rtol=rtol)
    expect_close("acc", acc, acc_want, atol=atol, rtol=rtol)


def split_problem(B, Hq, Hkv, n_max, D, nq, lens, *, dtype=torch.float32, q_scale=1.0, seed=0):
    """``(q [B, Hq, nq, D], k_cache, v_cache)`` in ``dtype`` on the CPU: caches ``[B, Hkv, n_max, D]``, NaN past
    each length."""
    (k, v), gen = poisoned_caches(B, Hq, Hkv, n_max, D, lens, seed)
    q = _randn(gen, B, Hq, nq, D) * q_scale
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _split_call(fn, q, k, v, lens, splits):
    """The learner's call on :data:`mta.runtime.DEVICE`: lengths as an int32 tensor there, as a kernel reads them."""
    from ... import runtime
    dev = runtime.DEVICE
    with refusing({**finished_attention(), split_states_truth: "it calls split_states_truth, the checker's own "
                   "answer", split_decode_truth: "it calls split_decode_truth, the checker's own answer"}):
        return fn(q.to(dev).contiguous(), k.to(dev).contiguous(), v.to(dev).contiguous(),
                  torch.tensor(lens, dtype=torch.int32, device=dev), splits)


def check_split_kernel(fn: Callable) -> Result:
    """``fn(q, k_cache, v_cache, cache_seqlens, num_splits) -> (m, l, acc)``: ``q [B, Hq, Nq, D]``, caches
    ``[B, Hkv, Nmax, D]`` (fp32 or fp16, contiguous, on :data:`mta.runtime.DEVICE`, NaN past each length),
    ``cache_seqlens`` int32 ``[B]`` on the device; ``m, l [S, B, Hq, Nq]`` and ``acc [S, B, Hq, Nq, D]`` fp32,
    the state of split ``s``'s keys (:func:`split_ranges`) for every new query (bottom-right causal), in
    natural-log units, from one program per (sequence, kv head, split) of a Triton kernel of the learner's."""

    def make(shape, options, seed):
        B, Hq, Hkv, n_max, D, nq, lens, splits = shape

        def case():
            q, k, v = split_problem(B, Hq, Hkv, n_max, D, nq, lens, seed=seed, **options)
            want = split_states_truth(q.double(), k.double(), v.double(), lens, splits)
            got = own_triton_kernel("split_states", lambda: _split_call(fn, q, k, v, lens, splits))
            _expect_states(got, want, *TOL[options.get("dtype", torch.float32)])
        return case

    def one_program_per_group():
        B, Hq, Hkv, splits = GRID_CASE
        q, k, v = split_problem(B, Hq, Hkv, 24, 16, 1, [24, 19], seed=99)
        with TritonLaunches() as launched:
            got = _split_call(fn, q, k, v, [24, 19], splits)
        _expect_states(got, split_states_truth(q.double(), k.double(), v.double(), [24, 19], splits),
                       *TOL[torch.float32])
        if launched.programs != B * Hkv * splits:
            raise CaseFailed(f"{launched.programs} programs launched, expected B x Hkv x S = {B} x {Hkv} x {splits} "
                             f"= {B * Hkv * splits}: one program per (sequence, kv head, split), the {Hq // Hkv} "
                             "query heads of a group as rows of one tile, so that K and V are read once per group")

    B, Hq, Hkv, splits = GRID_CASE
    return run_cases("exercise 1 (Triton: the split kernel)",
                     [(name, make(shape, options, 60 + i)) for i, (name, shape, options) in enumerate(SPLIT_CASES)]
                     + [(f"B={B}, GQA {Hq}:{Hkv}, {splits} splits: one program per (sequence, kv head, split)",
                         one_program_per_group)])


# --- exercise 2: the combine kernel -------------------------------------------------------------------------

#: ``(name, (S, R, D, keys per split, what))``; ``what``: ``None``, ``"empty split"``, ``"empty row"``, ``"far"``,
#: ``"low"``, ``"second block low"``.
COMBINE_CASES = (
    ("S=1 split", (1, 3, 16, 7, None)),
    ("S=5 splits, D=24 (not a power of two)", (5, 4, 24, 6, None)),
    ("S=37 splits (more than one block of 16)", (37, 2, 16, 3, None)),
    ("a split that saw no key (m=-inf, l=0)", (4, 3, 16, 5, "empty split")),
    ("a row that no split saw (output 0)", (3, 3, 16, 5, "empty row")),
    ("maxima 200 apart (exp overflows without rescaling)", (3, 2, 16, 5, "far")),
    # Every score near -200: exp(m_s - 0) underflows in float32, so a running max that starts at 0 instead of
    # -inf (no guard needed, and right whenever some maximum is above about -87) gives 0 here.
    ("every maximum near -200 (a running max that starts at 0 underflows)", (3, 2, 16, 5, "low")),
    # Splits 16 on 200 below the rest: a kernel that gives each block of splits its own max instead of the running
    # one keeps an exact state (alpha > 1 is a consistent rescale) until exp(m - m_new) overflows, as here.
    ("S=20: the second block of splits 200 below the first (a block's own max, not the running one, overflows)",
     (20, 2, 16, 5, "second block low")),
)


def combine_problem(S, R, D, n, what, seed):
    """Split states ``(m [S, R], l [S, R], acc [S, R, D])`` of random scores and values (natural-log units, as
    :func:`mta.attention_state`), and the outputs ``[R, D]`` of all their keys together, float64."""
    gen = torch.Generator().manual_seed(seed)
    s = _randn(gen, S, R, n, std=2.0)
    v = _randn(gen, S, R, n, D)
    if what == "empty split":
        s[1] = float("-inf")
    elif what == "empty row":
        s[:, 1] = float("-inf")
    elif what == "far":
        s[0] += 100.0
        s[-1] -= 100.0
    elif what == "low":
        s -= 200.0
    elif what == "second block low":
        s[16:] -= 200.0
    states = [attention_state(s[i][:, None, :], v[i]) for i in range(S)]          # [R, 1], [R, 1], [R, 1, D]
    whole = attention_state(s.permute(1, 0, 2).reshape(R, 1, S * n), v.permute(1, 0, 2, 3).reshape(R, S * n, D))
    o, _ = finalize_state(whole)
    m = torch.stack([st.m[:, 0] for st in states])
    l = torch.stack([st.l[:, 0] for st in states])
    acc = torch.stack([st.acc[:, 0] for st in states])
    return m, l, acc, o[:, 0]


def check_combine(fn: Callable) -> Result:
    """``fn(m_part, l_part, acc_part) -> o``: ``m_part, l_part [S, R]`` and ``acc_part [S, R, D]`` fp32 on
    :data:`mta.runtime.DEVICE` (contiguous; ``m`` in natural-log units, ``-inf`` and ``l = 0`` for a split that saw
    no key of the row); ``o [R, D]`` fp32, the merged state normalised, 0 for a row that no split saw."""
    from ... import runtime

    def make(shape, seed):
        def case():
            m, l, acc, want = combine_problem(*shape, seed)
            got = own_triton_kernel("combine", lambda: fn(*(x.float().contiguous().to(runtime.DEVICE)
                                                            for x in (m, l, acc))))
            if not isinstance(got, torch.Tensor):
                expect_equal("o type", type(got).__name__, "Tensor")
            expect_close("o", got.cpu(), want, atol=1e-5, rtol=1e-4)
        return case

    return run_cases("exercise 2 (Triton: merge the split states)",
                     [(name, make(shape, 70 + i)) for i, (name, shape) in enumerate(COMBINE_CASES)])


# --- exercises 1 and 2 together: a whole decode step ---------------------------------------------------------

#: ``(name, (B, Hq, Hkv, Nmax, D, Nq, lens, num_splits), options)``, as :data:`SPLIT_CASES`.
DECODE_CASES = (
    ("GQA 8:2, Nq=3, ragged [29, 6], NaN past them, 3 splits", (2, 8, 2, 32, 16, 3, [29, 6], 3), {}),
    ("20 splits over 7 keys (empty splits, more than a block of 16)", (1, 4, 2, 7, 24, 2, [7], 20), {}),
    ("float16, logits in the thousands", (1, 4, 1, 40, 16, 1, [40], 4), {"dtype": torch.float16,
                                                                          "q_scale": 1000.0}),
)


def check_split_k_decode(split_fn: Callable, combine_fn: Callable) -> Result:
    """Exercise 1's ``split_fn`` and exercise 2's ``combine_fn`` as one decode step: the split states reshaped to
    ``[S, B * Hq * Nq]`` (and ``[.., D]``), merged, reshaped to ``o [B, Hq, Nq, D]``, against the causal attention
    of each sequence's newest ``Nq`` queries over its first ``L`` keys (float64)."""

    def make(shape, options, seed):
        B, Hq, Hkv, n_max, D, nq, lens, splits = shape

        def case():
            q, k, v = split_problem(B, Hq, Hkv, n_max, D, nq, lens, seed=seed, **options)
            want = split_decode_truth(q.double(), k.double(), v.double(), lens)

            def step():
                m, l, acc = _split_call(split_fn, q, k, v, lens, splits)
                with refusing(finished_attention()):
                    o = combine_fn(m.reshape(splits, -1).contiguous(), l.reshape(splits, -1).contiguous(),
                                   acc.reshape(splits, -1, D).contiguous())
                return o.reshape(B, Hq, nq, D)
            got = own_triton_kernel("the decode step", step)
            atol, rtol = TOL[options.get("dtype", torch.float32)]
            expect_close("o", got, want, atol=atol, rtol=rtol)
        return case

    return run_cases("exercises 1 and 2 together (Triton: a split-K decode step)",
                     [(name, make(shape, options, 90 + i)) for i, (name, shape, options) in enumerate(DECODE_CASES)])


# --- exercise 3: MTA's newest rows from the query window ----------------------------------------------------

#: ``(name, (B, Hq, Hkv, Nmax, D, cq, ck, lens, n[, q_scale]))``.
MTA_CASES = (
    ("L=1, kernel 3x5", (1, 2, 1, 1, 8, 3, 5, [1], 1)),
    ("L=4 < cq=6, kernel 6x11, n=2", (1, 2, 2, 4, 8, 6, 11, [4], 2)),
    ("L=7 < ck=9, kernel 2x9", (1, 2, 1, 7, 8, 2, 9, [7], 1)),
    ("GQA 4:2, ragged [9, 30], kernel 3x5, n=3", (2, 4, 2, 32, 8, 3, 5, [9, 30], 3)),
    ("kernel 1x1 (a scalar: plain attention), L=19", (1, 2, 1, 19, 8, 1, 1, [19], 2)),
    ("logits in the thousands (exp overflows without the max)", (1, 2, 1, 25, 8, 3, 5, [25], 2, 1000.0)),
)


def mta_rows_truth(q_cache, k_cache, v_cache, weight, lens, n):
    """Rows ``L - n .. L - 1`` of ``mta.conv_attention_reference(..., causal=True)`` on each sequence's first
    ``L`` positions, float64."""
    rows = []
    for b, L in enumerate(lens):
        rows.append(conv_attention_reference(q_cache[b:b + 1, :, :L], k_cache[b:b + 1, :, :L],
                                             v_cache[b:b + 1, :, :L], weight)[:, :, L - n:])
    return torch.cat(rows)


def check_mta_decode_rows(fn: Callable) -> Result:
    """``fn(q_cache, k_cache, v_cache, weight, cache_seqlens, num_queries) -> o [B, Hq, n, D]``: MTA's causal
    outputs of the ``n`` newest positions of each sequence. Float64; ``weight [Hq, cq, ck]``; the caches hold NaN
    past each length, and ``q_cache`` also before the window of the last ``cq - 1 + n`` queries."""

    def make(shape, seed):
        B, Hq, Hkv, n_max, D, cq, ck, lens, n, q_scale = (*shape, 1.0)[:10]

        def case():
            (qc, k, v), gen = poisoned_caches(B, Hq, Hkv, n_max, D, lens, seed, with_q_cache=True)
            qc = qc * q_scale
            w = _randn(gen, Hq, cq, ck, std=0.3)
            want = mta_rows_truth(qc, k, v, w, lens, n)
            for b, L in enumerate(lens):
                qc[b, :, :max(L - n - (cq - 1), 0)] = float("nan")   # before the window: never needed
            with refusing({**finished_attention(), mta_rows_truth: "it calls mta_rows_truth, the checker's own "
                           "answer; use the window of the last cq - 1 + n queries"}):
                got = fn(qc.clone(), k.clone(), v.clone(), w.clone(), list(lens), n)
            expect_close("o", got, want, atol=1e-10, rtol=1e-8)
        return case

    def window_only():
        (qc, k, v), gen = poisoned_caches(1, 2, 1, 30, 8, [30], 89, with_q_cache=True)
        qc[:, :, :30 - 5] = float("nan")  # before the window: never needed
        with WatchScores(30, 30) as watch, WatchNaNProducts() as nan_watch, refusing(finished_attention()):
            fn(qc, k, v, _randn(gen, 2, 3, 5, std=0.3), [30], 3)
        if watch.seen is not None:
            name, shape = watch.seen
            raise CaseFailed(f"{name} made a float tensor of shape {shape}, the scores of all 30 positions against "
                             "all 30 keys; only the window's cq - 1 + n = 5 queries are needed")
        if nan_watch.seen is not None:
            name, shape = nan_watch.seen
            raise CaseFailed(f"{name} gave NaN (shape {shape}): it multiplied query rows before the window (set to "
                             "NaN here), e.g. walking every position one at a time; only the window's cq - 1 + n = 5 "
                             "queries are needed")

    return run_cases("exercise 3 (MTA decode rows from the query window)",
                     [(name, make(shape, 80 + i)) for i, (name, shape) in enumerate(MTA_CASES)]
                     + [("L=30, kernel 3x5, n=3: only the window's 5 queries' scores", window_only)])


# --- exercise 4: the band's scores ---------------------------------------------------------------------------

#: ``(name, (B, Hq, Hkv, Nmax, D, cq, ck, lens, n))``: each cache holds 6 positions past the longest length (NaN),
#: more than the ``pk <= 5`` keys a band reaches past its row.
BAND_CASES = (
    ("L=1, kernel 3x5 (keys before position 0: -inf)", (1, 2, 1, 7, 16, 3, 5, [1], 1)),
    ("L=4 < E=10, kernel 6x11, n=2", (1, 2, 2, 10, 16, 6, 11, [4], 2)),
    ("L=7 < ck=9, kernel 2x9", (1, 2, 1, 13, 16, 2, 9, [7], 1)),
    ("GQA 4:2, ragged [9, 30], kernel 3x5, n=3", (2, 4, 2, 36, 16, 3, 5, [9, 30], 3)),
    ("kernel 4x1 (ck = 1: E = cq - 1), L=19, n=2", (1, 2, 1, 25, 16, 4, 1, [19], 2)),
    ("kernel 1x3 (cq = 1: E = 1), L=12, n=4", (1, 2, 1, 18, 16, 1, 3, [12], 4)),
)


def band_truth(q_cache, k_cache, weight, lens, n):
    """``[B, Hq, n, E]`` float64: ``C[i, i - delta]`` of :func:`mta.conv_attention_reference`'s causal convolved
    scores (the scale included) on each sequence's first ``L`` positions, for the new queries ``i = L - n + t`` and
    ``0 <= delta < E = cq - 1 + pk``; ``-inf`` where ``i - delta < 0``."""
    B, Hq, _, D = q_cache.shape
    cq, ck = weight.shape[1:]
    pk = (ck - 1) // 2
    E = cq - 1 + pk
    out = torch.full((B, Hq, n, E), float("-inf"), dtype=torch.float64)
    for b, L in enumerate(lens):
        q = q_cache[b, :, :L].double()
        k = k_cache[b, :, :L].double().repeat_interleave(Hq // k_cache.shape[1], 0)
        keys = torch.arange(L)
        s0 = (D ** -0.5 * q @ k.transpose(-1, -2)).masked_fill(keys[None, :] > keys[:, None], 0.0)
        c = F.conv2d(F.pad(s0, (pk, pk, cq - 1, 0))[None], weight.double()[:, None], groups=Hq)[0]   # [Hq, L, L]
        for t in range(n):
            i = L - n + t
            for delta in range(min(E, i + 1)):
                out[b, :, t, delta] = c[:, i, i - delta]
    return out


def check_band_scores(fn: Callable) -> Result:
    """``fn(q_cache, k_cache, weight, cache_seqlens, num_queries) -> c [B, Hq, n, E]`` fp32: the band's scores
    (:func:`band_truth`) by a Triton kernel of the learner's. ``q_cache [B, Hq, Nmax, D]``, ``k_cache
    [B, Hkv, Nmax, D]``, ``weight [Hq, cq, ck]`` fp32 and ``cache_seqlens`` int32 ``[B]``, contiguous, on
    :data:`mta.runtime.DEVICE`; the caches hold NaN past each length, ``q_cache`` also before the window of the
    last ``cq - 1 + n`` queries; ``E = cq - 1 + pk >= 1``, ``D`` a power of two."""
    from ... import conv, runtime

    def make(shape, seed):
        B, Hq, Hkv, n_max, D, cq, ck, lens, n = shape

        def case():
            (qc, k, _), gen = poisoned_caches(B, Hq, Hkv, n_max, D, lens, seed, with_q_cache=True)
            w = _randn(gen, Hq, cq, ck, std=0.3)
            qc, k, w = qc.float(), k.float(), w.float()           # the truth from the fp32 values handed over
            want = band_truth(qc, k, w, lens, n)
            for b, L in enumerate(lens):
                qc[b, :, :max(L - n - (cq - 1), 0)] = float("nan")   # before the window: never needed
            dev = runtime.DEVICE
            with refusing({**finished_attention(), band_truth: "it calls band_truth, the checker's own answer",
                           conv.diagonal_scores: "it calls mta.conv.diagonal_scores, the prefill's band; compute "
                                                 "the new queries' band from the window"}):
                got = own_triton_kernel("band_scores", lambda: fn(
                    qc.to(dev), k.to(dev), w.to(dev), torch.tensor(lens, dtype=torch.int32, device=dev), n))
            expect_close_beside_neginf("c", got, want, atol=1e-4, rtol=1e-4, axes="(sequence, head, query, delta)",
                                       shape_axes="[B, Hq, n, E]",
                                       neginf_means="key i - delta would be before position 0")
        return case

    return run_cases("exercise 4 (Triton: the band's scores from the query window)",
                     [(name, make(shape, 100 + i)) for i, (name, shape) in enumerate(BAND_CASES)])


__all__ = ["BAND_CASES", "COMBINE_CASES", "DECODE_CASES", "GRID_CASE", "MTA_CASES",
           "SPLIT_CASES", "band_truth", "check_band_scores", "check_combine", "check_mta_decode_rows",
           "check_split_k_decode", "check_split_kernel", "combine_problem", "mta_rows_truth", "poisoned_caches",
           "split_decode_truth", "split_problem", "split_ranges", "split_states_truth"]
