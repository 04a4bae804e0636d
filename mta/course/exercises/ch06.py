"""Checkers for chapter 06's exercises (split-K decode).

Each checker runs the learner's function on a few small, awkward problems (one key, a length that is not a
multiple of the split, grouped-query attention with several new queries, ragged lengths with the cache poisoned
with NaN past them, splits that see no key, logits in the thousands) and compares its answer with the truth
computed in float64 from the references (:func:`mta.naive_attention`, :func:`mta.conv_attention_reference`,
chapter 02's states). It prints one line and returns a :class:`mta.course.exercises.Result`; it never raises.

* :func:`check_split_decode`: decode of ``Nq`` new queries, split over the keys, merged (plain PyTorch);
* :func:`check_combine`: the merge of split states into outputs (a Triton kernel);
* :func:`check_mta_decode_rows`: MTA's newest rows from the query window (plain PyTorch).
"""

from __future__ import annotations

from typing import Callable

import torch

from ...online_softmax import attention_state, finalize_state
from ...reference import conv_attention_reference, naive_attention
from . import (CaseFailed, Result, WatchNaNProducts, WatchScores, expect_close, expect_equal, finished_attention,
               own_triton_kernel, refusing, run_cases)


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


# --- exercise 1: split-K decode in PyTorch -----------------------------------------------------------------

#: ``(name, (B, Hq, Hkv, Nmax, D, Nq, lens, num_splits[, q_scale]))``; ``q_scale`` multiplies the queries.
SPLIT_CASES = (
    ("N=1: one key, one split", (1, 2, 2, 1, 8, 1, [1], 1)),
    ("L=37, 4 splits (not a multiple)", (1, 2, 2, 37, 8, 1, [37], 4)),
    ("GQA 8:2, Nq=3, 3 splits", (1, 8, 2, 29, 8, 3, [29], 3)),
    ("ragged lengths [5, 37], NaN past them", (2, 4, 2, 40, 8, 2, [5, 37], 3)),
    ("8 splits over 5 keys (empty splits)", (1, 2, 1, 5, 8, 3, [5], 8)),
    ("logits in the thousands (exp overflows without the running max)", (1, 2, 1, 30, 8, 2, [30], 3, 1000.0)),
)


def split_decode_truth(q, k_cache, v_cache, lens):
    """Per sequence: ``mta.naive_attention(q[b], k[b, :, :L], v[b, :, :L], causal=True)``, float64."""
    return torch.cat([naive_attention(q[b:b + 1], k_cache[b:b + 1, :, :L], v_cache[b:b + 1, :, :L], causal=True)
                      for b, L in enumerate(lens)])


def check_split_decode(fn: Callable) -> Result:
    """``fn(q, k_cache, v_cache, cache_seqlens, num_splits) -> o``: ``q [B, Hq, Nq, D]``, caches
    ``[B, Hkv, Nmax, D]`` (float64, NaN past each length), ``cache_seqlens`` a list of ints; ``o [B, Hq, Nq, D]``
    equal to the causal attention of each sequence's newest ``Nq`` queries over its first ``L`` keys."""

    def make(shape, seed):
        B, Hq, Hkv, n_max, D, nq, lens, splits, q_scale = (*shape, 1.0)[:9]

        def case():
            (k, v), gen = poisoned_caches(B, Hq, Hkv, n_max, D, lens, seed)
            q = _randn(gen, B, Hq, nq, D) * q_scale
            with refusing({**finished_attention(), split_decode_truth: "it calls split_decode_truth, the "
                           "checker's own answer"}):
                got = fn(q.clone(), k.clone(), v.clone(), list(lens), splits)
            expect_close("o", got, split_decode_truth(q, k, v, lens), atol=1e-10, rtol=1e-8)
        return case

    def splits_make_their_own_scores():
        (k, v), gen = poisoned_caches(1, 2, 2, 40, 8, [40], 59)
        q = _randn(gen, 1, 2, 2, 8)
        with WatchScores(2, 40, any_rows=True) as watch, refusing(finished_attention()):
            fn(q, k, v, [40], 4)
        if watch.seen is not None:
            name, shape = watch.seen
            raise CaseFailed(f"{name} made a float tensor of shape {shape}, the scores of all 40 keys; make each "
                             "split's scores [.., Nq, keys of the split] and merge the splits' states")

    return run_cases("exercise 1 (split-K decode in PyTorch)",
                     [(name, make(shape, 60 + i)) for i, (name, shape) in enumerate(SPLIT_CASES)]
                     + [("4 splits over 40 keys: no split makes all 40 keys' scores", splits_make_their_own_scores)])


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


__all__ = ["COMBINE_CASES", "MTA_CASES", "SPLIT_CASES", "check_combine", "check_mta_decode_rows", "check_split_decode",
           "combine_problem", "mta_rows_truth", "poisoned_caches", "split_decode_truth"]
