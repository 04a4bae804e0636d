"""Checkers for chapter 02's exercises (online softmax, attention states).

Each ``check_*`` takes the learner's function, runs it on named cases chosen to
catch the usual mistakes, prints one line and returns a :class:`~mta.course.exercises.Result`.
It never raises.
"""

from __future__ import annotations

import math
import random
import tracemalloc

import torch

from ...online_softmax import AttentionState, attention_state, empty_state, merge_states
from ...reference import naive_attention
from . import (CaseFailed, Result, WatchScores, call_on_copies, expect_close_beside_neginf,
               finished_attention, refusing, run_cases)

__all__ = ["check_stream_normalizer", "check_my_merge", "check_block_state", "check_online_attention"]

F64 = torch.float64
INF = float("inf")


def _randn(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=F64) * scale


def _expect_state(got, want, *, exact=False):
    """Compare two states: m always bit for bit (a max of the same values involves no rounding),
    l and acc bit for bit when ``exact``, else to 1e-12."""
    if not isinstance(got, AttentionState):
        raise CaseFailed(f"expected an mta.AttentionState, got {type(got).__name__}")
    for name, g, w in zip(AttentionState._fields, got, want):
        if exact or name == "m":
            if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(w.shape):
                raise CaseFailed(f"{name}: expected a tensor of shape {tuple(w.shape)}")
            if g.dtype != w.dtype:
                raise CaseFailed(f"{name}: dtype {g.dtype}, expected {w.dtype}")
            if not torch.equal(g, w):
                bad = ~((g == w) | (torch.isnan(g) & torch.isnan(w)))
                index = tuple(int(i) for i in torch.nonzero(bad)[0])
                raise CaseFailed(f"{name}: at index {index} got {g[index].item():.17g}, "
                                 f"expected {w[index].item():.17g} exactly")
        else:
            expect_close_beside_neginf(name, g, w, atol=1e-12, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Exercise 1: online normalizer of a stream


class _OneShot:
    """An iterator that may be read once; it notes any attempt to read it again."""

    def __init__(self, values):
        self._it = iter(values)
        self.done = False
        self.read_again = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.done:
            self.read_again = True
            raise StopIteration
        try:
            return next(self._it)
        except StopIteration:
            self.done = True
            raise


def _stream_truth(values):
    finite = [x for x in values if x != -INF]
    if not finite:
        return -INF, 0.0
    m = max(finite)
    return m, math.fsum(math.exp(x - m) for x in finite)


def check_stream_normalizer(stream_normalizer) -> Result:
    """Exercise 1: ``stream_normalizer(stream) -> (m, l)`` over a stream read once, in O(1) memory.

    Cases: one value; an empty stream; a max that grows at every step; values of +-800
    (``math.exp`` overflows); masked entries (``-inf``) first; only masked entries; 100000 values
    with the peak memory of the call measured.
    """
    rng = random.Random(1)
    big = [rng.gauss(0.0, 30.0) for _ in range(1000)] + [800.0, -800.0]
    rng.shuffle(big)

    def case(values):
        def run():
            stream = _OneShot(values)
            got = stream_normalizer(stream)
            if stream.read_again:
                raise CaseFailed("the stream was read a second time; it can be read only once")
            try:
                m, l = (float(x) for x in got)
            except (TypeError, ValueError):
                raise CaseFailed(f"expected a pair of numbers (m, l), got {got!r}") from None
            want_m, want_l = _stream_truth(values)
            if math.isnan(m) or math.isnan(l):
                raise CaseFailed(f"got m = {m}, l = {l} (NaN); expected m = {want_m}, l = {want_l:.6g}")
            if m != want_m:
                raise CaseFailed(f"m = {m!r}, expected the largest value {want_m!r}")
            if not math.isclose(l, want_l, rel_tol=1e-12, abs_tol=0.0):
                raise CaseFailed(f"l = {l!r}, expected {want_l!r}")
        return run

    def constant_memory():
        n = 100_000
        stream = _OneShot(float(i % 7) - 3.0 for i in range(n))
        tracing = tracemalloc.is_tracing()
        if not tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        try:
            got = stream_normalizer(stream)
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            if not tracing:
                tracemalloc.stop()
        if peak > 256 * 1024:
            raise CaseFailed(f"the call held {peak / 2**20:.1f} MiB at its peak for {n} values; "
                             "keep only m and l, not the values")
        want_m, want_l = _stream_truth([float(i % 7) - 3.0 for i in range(n)])
        if float(got[0]) != want_m or not math.isclose(float(got[1]), want_l, rel_tol=1e-12):
            raise CaseFailed(f"got {got!r}, expected ({want_m!r}, {want_l!r})")

    return run_cases("exercise 1 (stream_normalizer)", [
        ("one value", case([2.5])),
        ("an empty stream (expect m = -inf, l = 0)", case([])),
        ("the max grows at every step", case([float(i) for i in range(50)])),
        ("1002 values including +-800", case(big)),
        ("masked entries (-inf) come first", case([-INF, -INF, 1.0, 2.0, -INF])),
        ("only masked entries (expect m = -inf, l = 0)", case([-INF, -INF, -INF])),
        ("O(1) memory: 100000 values", constant_memory),
    ])


# ---------------------------------------------------------------------------------------------
# Exercise 2: merge two states by hand


def check_my_merge(my_merge) -> Result:
    """Exercise 2: ``my_merge(a, b)`` is the state of the union, written without ``mta.merge_states``.

    Each case compares m (exactly), l and acc with the state of all keys at once. Cases: two
    halves; arguments swapped (same bits); batch and head axes in front; states whose maxima
    are 1000 apart; one side empty (a fully masked block: the other side comes back bit for
    bit); both sides empty (still empty, no NaN); and no call of ``mta.merge_states``.
    """
    gen = torch.Generator().manual_seed(202)

    def split_states(prefix, n, cut, D, scale=4.0):
        s = _randn(gen, *prefix, n, scale=scale)
        v = _randn(gen, *prefix[:-1], n, D)
        a = attention_state(s[..., :cut], v[..., :cut, :])
        b = attention_state(s[..., cut:], v[..., cut:, :])
        return a, b, attention_state(s, v)

    def halves():
        a, b, whole = split_states((4,), 20, 11, 6)
        _expect_state(my_merge(a, b), whole)

    def no_library_merge():
        a, b, _ = split_states((3,), 9, 4, 5)
        with refusing({merge_states: "my_merge calls mta.merge_states; write the boxed formula yourself"}):
            my_merge(a, b)

    def swapped():
        a, b, _ = split_states((4,), 20, 7, 6)
        _expect_state(my_merge(b, a), my_merge(a, b), exact=True)

    def batched():
        a, b, whole = split_states((2, 3, 5), 12, 5, 4)
        _expect_state(my_merge(a, b), whole)

    def far_apart():
        s = torch.cat([_randn(gen, 3, 6) + 1000.0, _randn(gen, 3, 6)], dim=-1)
        v = _randn(gen, 12, 5)
        a, b = attention_state(s[:, :6], v[:6]), attention_state(s[:, 6:], v[6:])
        _expect_state(my_merge(b, a), attention_state(s, v))

    def one_empty():
        a, _, _ = split_states((3,), 10, 4, 5)
        e = empty_state((3,), 5, dtype=F64)
        _expect_state(my_merge(a, e), a, exact=True)
        _expect_state(my_merge(e, a), a, exact=True)

    def both_empty():
        e = empty_state((3,), 5, dtype=F64)
        _expect_state(my_merge(e, e), e, exact=True)

    return run_cases("exercise 2 (my_merge)", [
        ("two halves: keys 0:11 and 11:20", halves),
        ("written without mta.merge_states", no_library_merge),
        ("arguments swapped give the same bits", swapped),
        ("batch and head axes in front: states [2, 3, 5], acc [2, 3, 5, 4]", batched),
        ("maxima 1000 apart", far_apart),
        ("one side is the empty state (a fully masked block)", one_empty),
        ("both sides empty", both_empty),
    ])


# ---------------------------------------------------------------------------------------------
# Exercise 3: the state of a block, masked rows included


#: Exercise 3 asks for what mta.attention_state computes: calling it fails the case.
NO_ATTENTION_STATE = {attention_state: "it calls mta.attention_state; compute m, l and acc yourself"}


def check_block_state(block_state) -> Result:
    """Exercise 3: ``block_state(s, v)`` returns the :class:`AttentionState` of a block.

    m must be each row's own maximum (exactly), l and acc are compared too, not only the
    finalized output. Cases: one row; rows on very different scales; batch and head axes;
    some keys masked; a fully masked row; a fully masked block (exactly the empty state, and
    merging it into another state changes no bit); scores around 1000; a single key.
    """
    gen = torch.Generator().manual_seed(303)

    def compare(s, v):
        with refusing(NO_ATTENTION_STATE):
            got = call_on_copies(block_state, s, v)
        _expect_state(got, attention_state(s, v))

    def one_row():
        compare(_randn(gen, 1, 6, scale=2.0), _randn(gen, 6, 4))

    def scales():
        s = torch.stack([_randn(gen, 8), _randn(gen, 8) + 500.0, _randn(gen, 8) - 300.0])
        compare(s, _randn(gen, 8, 3))

    def batched():
        compare(_randn(gen, 2, 3, 5, 7, scale=3.0), _randn(gen, 2, 3, 7, 4))

    def some_masked():
        s = _randn(gen, 4, 9, scale=3.0)
        s[:, ::3] = -INF
        compare(s, _randn(gen, 9, 5))

    def masked_row():
        s = _randn(gen, 4, 6, scale=3.0)
        s[1] = -INF
        compare(s, _randn(gen, 6, 5))

    def masked_block():
        with refusing(NO_ATTENTION_STATE):
            got = block_state(torch.full((3, 8), -INF, dtype=F64), _randn(gen, 8, 5))
        empty = empty_state((3,), 5, dtype=F64)
        _expect_state(got, empty, exact=True)
        x = attention_state(_randn(gen, 3, 10), _randn(gen, 10, 5))
        _expect_state(merge_states(x, got), x, exact=True)

    def large():
        compare(_randn(gen, 3, 7) + 1000.0, _randn(gen, 7, 4))

    def one_key():
        compare(_randn(gen, 5, 1), _randn(gen, 1, 3))

    return run_cases("exercise 3 (block_state)", [
        ("one query row, 6 keys", one_row),
        ("rows on different scales (m is each row's own max)", scales),
        ("batch and head axes in front: s [2, 3, 5, 7]", batched),
        ("some keys masked (-inf)", some_masked),
        ("one fully masked row", masked_row),
        ("a fully masked block is the empty state; merging it changes nothing", masked_block),
        ("scores around 1000", large),
        ("a single key", one_key),
    ])


# ---------------------------------------------------------------------------------------------
# Exercise 4: attention one key block at a time


def check_online_attention(online_attention) -> Result:
    """Exercise 4: ``online_attention(q, k, v, *, block_size, causal) -> (o, lse)`` equals
    ``naive_attention(q, k, v, causal=causal, return_lse=True)`` and never creates a whole
    ``[Nq, Nk]`` score matrix.

    Cases: full blocks; Nk not a multiple of the block size; a block larger than Nk; blocks of
    one key; Nq = Nk = 1; GQA; causal with Nq = Nk, Nq < Nk and Nq > Nk (queries that see no
    key give o = 0, lse = -inf); large logits; every score below -1000 (a running max that starts at 0
    underflows); and the memory property.
    """
    gen = torch.Generator().manual_seed(404)

    def case(B, Hq, Hkv, Nq, Nk, D, block, causal, scale=1.0, negative=False):
        def run():
            q = _randn(gen, B, Hq, Nq, D, scale=scale)
            k, v = _randn(gen, B, Hkv, Nk, D, scale=scale), _randn(gen, B, Hkv, Nk, D)
            if negative:  # q <= 0 <= k: every score is far below 0
                q, k = -q.abs(), k.abs()
            with refusing(finished_attention()):
                got = call_on_copies(online_attention, q, k, v, block_size=block, causal=causal)
            if not (isinstance(got, (tuple, list)) and len(got) == 2):
                raise CaseFailed(f"expected a pair (o, lse), got {type(got).__name__}")
            o_ref, lse_ref = naive_attention(q, k, v, causal=causal, return_lse=True)
            expect_close_beside_neginf("o", got[0], o_ref, atol=1e-10, rtol=1e-10)
            expect_close_beside_neginf("lse", got[1], lse_ref, atol=1e-10, rtol=1e-10)
        return run

    def no_score_matrix():
        Nq, Nk = 9, 37
        q, k, v = _randn(gen, 1, 2, Nq, 16), _randn(gen, 1, 2, Nk, 16), _randn(gen, 1, 2, Nk, 16)
        with WatchScores(Nq, Nk, any_rows=True) as watch, refusing(finished_attention()):
            online_attention(q, k, v, block_size=8, causal=True)
        if watch.seen is not None:
            name, shape = watch.seen
            raise CaseFailed(f"{name} made a float tensor of shape {shape}: scores against all {Nk} keys at once; "
                             "compute scores one key block [Nq, block_size] at a time and carry a running state")

    return run_cases("exercise 4 (online_attention)", [
        ("not causal, Nq = Nk = 32, block 8", case(1, 2, 2, 32, 32, 16, 8, False)),
        ("not causal, Nk = 37 (not a multiple of block 8)", case(2, 2, 2, 9, 37, 16, 8, False)),
        ("block 64 > Nk = 37", case(1, 2, 2, 9, 37, 16, 64, False)),
        ("blocks of one key", case(1, 1, 1, 5, 11, 8, 1, False)),
        ("Nq = Nk = 1", case(1, 2, 2, 1, 1, 16, 8, False)),
        ("GQA: 4 query heads share 2 kv heads", case(2, 4, 2, 9, 37, 16, 8, False)),
        ("causal, Nq = Nk = 37, block 8", case(1, 4, 2, 37, 37, 16, 8, True)),
        ("causal, Nq = 5 < Nk = 37 (bottom-right)", case(1, 2, 1, 5, 37, 16, 8, True)),
        ("causal, Nq = 12 > Nk = 5: 7 queries see no key", case(1, 2, 2, 12, 5, 8, 2, True)),
        ("large logits (inputs times 30)", case(1, 2, 2, 9, 37, 16, 8, True, scale=30.0)),
        # Every score below -1000: exp(s - 0) underflows even in float64, so a running max that starts at 0
        # instead of -inf (right whenever a row's max is above about -745) gives o = 0 and lse = -inf here.
        ("every score below -1000 (a running max that starts at 0 underflows)",
         case(1, 2, 2, 9, 37, 16, 8, True, scale=40.0, negative=True)),
        ("never the scores of all keys at once", no_score_matrix),
    ])
