"""Checkers for chapter 07's exercises (the MTA layer, its cache and the toy task).

Each checker runs the learner's function on a few small, awkward cases and compares with the truth; it prints one
line and returns a :class:`mta.course.exercises.Result`; it never raises.

* :func:`check_append_to_cache`: write new tokens into a cache at each sequence's own length;
* :func:`check_sequence_error`: the toy task's metric, the fraction of sequences with any wrong target token;
* :func:`check_pair_kernel`: a hand-built MTA kernel that makes a head find two letters next to each other, in
  either order (the problem is :func:`pair_problem`, the one the notebook draws).
"""

from __future__ import annotations

import numbers
from typing import Callable

import torch

from ...reference import conv_attention_reference
from ..toy import DOT, HASH, LETTERS, loss_and_error, TaskConfig
from . import CaseFailed, Result, expect_close, expect_equal, run_cases

# --- exercise 1: appending to the cache ----------------------------------------------------------------------

#: ``(name, (B, Nmax, H, D, lengths, n))``.
CACHE_CASES = (
    ("one sequence, empty cache, one token", (1, 6, 2, 4, [0], 1)),
    ("equal lengths [3, 3], one token", (2, 6, 2, 4, [3, 3], 1)),
    ("ragged lengths [1, 4, 0], one token", (3, 6, 1, 4, [1, 4, 0], 1)),
    ("ragged lengths [2, 5], two tokens, the last fills the cache", (2, 7, 2, 4, [2, 5], 2)),
)


def check_append_to_cache(fn: Callable) -> Result:
    """``fn(buf, lengths, new) -> new_lengths``: ``buf [B, Nmax, H, D]`` float64 (written in place), ``lengths``
    ``[B]`` int64, ``new [B, n, H, D]``; token ``t`` of sequence ``b`` goes to ``buf[b, lengths[b] + t]``, nothing
    else of ``buf`` changes, and the returned lengths are ``lengths + n`` (``lengths`` itself may be left as is)."""

    def make(shape, seed):
        B, n_max, H, D, lens, n = shape

        def case():
            gen = torch.Generator().manual_seed(seed)
            buf = torch.randn(B, n_max, H, D, generator=gen, dtype=torch.float64)
            new = torch.randn(B, n, H, D, generator=gen, dtype=torch.float64)
            want = buf.clone()
            for b, length in enumerate(lens):
                want[b, length:length + n] = new[b]
            got_lens = fn(buf, torch.tensor(lens, dtype=torch.int64), new.clone())
            expect_close("buf after the append", buf, want, atol=0, rtol=0)
            if not isinstance(got_lens, torch.Tensor):
                raise CaseFailed(f"new lengths: expected a tensor, got {type(got_lens).__name__}")
            expect_equal("new lengths", [int(x) for x in got_lens], [length + n for length in lens])
        return case

    return run_cases("exercise 1 (append to the cache at each sequence's length)",
                     [(name, make(shape, 80 + i)) for i, (name, shape) in enumerate(CACHE_CASES)])


# --- exercise 2: the toy task's metric -----------------------------------------------------------------------

#: ``(name, (B, block_len, wrong tokens per sequence))``: which target tokens of each sequence are mispredicted.
ERROR_CASES = (
    ("all right", (3, 5, [[], [], []])),
    ("one sequence with one wrong token of five", (4, 5, [[], [2], [], []])),
    ("one sequence wrong everywhere, one wrong on its last token", (4, 5, [list(range(5)), [], [4], []])),
    ("a wrong prediction just before the target does not count", (2, 3, [[-1], []])),
    ("one sequence wrong only at the target's first token", (3, 5, [[], [0], []])),
)


def error_problem(B: int, block_len: int, wrong, seed: int):
    """Tokens of ``B`` random samples and logits whose argmax is right except at the listed target positions
    (``-1``: the position just before the target, which the metric ignores)."""
    task = TaskConfig(num_blocks=3, block_len=block_len, query_len=2, letters=8)
    from ..toy import make_batch
    tokens, _ = make_batch(task, B, torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1)
    logits = torch.randn(B, task.seq_len - 1, 28, generator=gen)
    logits.scatter_(2, tokens[:, 1:, None], 20.0)
    for b, positions in enumerate(wrong):
        for p in positions:
            t = task.seq_len - 1 - block_len + p        # index into the logits (next-token targets)
            logits[b, t, tokens[b, t + 1]] = -20.0
    return logits, tokens, task


def check_sequence_error(fn: Callable) -> Result:
    """``fn(logits, tokens, block_len) -> float``: ``logits [B, N - 1, 28]`` from ``tokens[:, :-1]`` (position
    ``t`` predicts ``tokens[:, t + 1]``), ``tokens [B, N]`` whose last ``block_len`` tokens are the target block;
    the fraction of sequences whose argmax is wrong at one or more of the target positions."""

    def make(shape, seed):
        def case():
            logits, tokens, task = error_problem(*shape, seed)
            got = fn(logits.clone(), tokens.clone(), task.block_len)
            want = loss_and_error(logits, tokens, task)[1].float().mean().item()
            if isinstance(got, torch.Tensor):
                got = got.item()
            if isinstance(got, numbers.Real) and not isinstance(got, (bool, int)):  # a NumPy float, say
                got = float(got)
            if not isinstance(got, float):
                raise CaseFailed(f"error: expected a float, got {type(got).__name__}")
            if abs(got - want) > 1e-6:
                raise CaseFailed(f"error: got {got:.4g}, expected {want:.4g}")
        return case

    return run_cases("exercise 2 (the per-sequence error)",
                     [(name, make(shape, 90 + i)) for i, (name, shape) in enumerate(ERROR_CASES)])


# --- exercise 3: a kernel that finds a pair of letters -------------------------------------------------------

#: Score of one query-key match (the queries are ``BETA`` times a one-hot letter).
BETA = 8.0


def tokens_of(text: str) -> list[int]:
    """Letters, ``.`` and ``#`` -> the toy task's token ids."""
    return [DOT if c == "." else HASH if c == "#" else LETTERS.index(c) for c in text]


def pair_problem(text: str, dtype=torch.float64, device="cpu"):
    """``(q, k, v)`` ``[1, 1, N, D]`` for a hand-built head over ``text = "<blocks>#xy"`` (``N = len(text)``).

    * keys: the one-hot token of each position of the blocks (``.`` included); zero from ``#`` on, the query
      part not being content;
    * queries: zero, except ``BETA * onehot(x)`` at position ``N - 2`` and ``BETA * onehot(y)`` at ``N - 1``;
    * values: one-hot *positions*, so that output row ``i`` is the attention row ``P[i, :N]`` itself.

    ``D = 64``, so ``N <= 64``. Use ``scale=1.0``.
    """
    ids = tokens_of(text)
    N, D = len(ids), 64
    if N > D or text[-3] != "#":
        raise ValueError("text must be '<blocks>#xy' with at most 64 characters")
    hash_at = text.index("#")
    k = torch.zeros(1, 1, N, D, dtype=dtype)
    k[0, 0, torch.arange(hash_at), torch.tensor(ids[:hash_at])] = 1.0
    q = torch.zeros(1, 1, N, D, dtype=dtype)
    q[0, 0, N - 2, ids[-2]] = BETA
    q[0, 0, N - 1, ids[-1]] = BETA
    v = torch.zeros(1, 1, N, D, dtype=dtype)
    v[0, 0, torch.arange(N), torch.arange(N)] = 1.0
    return q.to(device), k.to(device), v.to(device)


def last_row_attention(text: str, weight: torch.Tensor) -> torch.Tensor:
    """``[N]`` float64: the attention of the last query of :func:`pair_problem` with kernel ``weight [1, cq, ck]``
    (the materialized reference)."""
    q, k, v = pair_problem(text)
    return conv_attention_reference(q, k, v, weight.double(), scale=1.0)[0, 0, -1, :len(text)]


#: ``(name, text)``: each text holds the query pair next to each other exactly once.
PAIR_CASES = (
    ("'xy' in order, x and y also elsewhere", "axcde.bxyfg.ghyij.#xy"),
    ("reversed: 'yx' in the block", "abyde.fghxj.kyxmn.#xy"),
    ("the pair at the very start", "qrstu.aqceg.rbdfh.#qr"),
    ("the pair just before '#', reversed", "kmpon.mbcdn.abcnm.#mn"),
    ("many decoys", "ghzab.cdefw.zwijk.zlmno.pwqrs.#zw"),
)


def check_pair_kernel(fn: Callable) -> Result:
    """``fn() -> weight [1, cq, ck]``, ``cq <= 6``, odd ``ck <= 11``: with that kernel, the last query of
    :func:`pair_problem` puts at least half of its attention on the two adjacent letters of the query pair (in
    either order), on every case of :data:`PAIR_CASES`."""
    state = {}

    def weight():
        if "w" not in state:
            w = fn()
            if not isinstance(w, torch.Tensor):
                raise CaseFailed(f"weight: expected a tensor, got {type(w).__name__}")
            if w.dim() != 3 or w.shape[0] != 1 or not (1 <= w.shape[1] <= 6) or not (1 <= w.shape[2] <= 11) \
                    or w.shape[2] % 2 == 0:
                raise CaseFailed(f"weight: shape {tuple(w.shape)}, expected [1, cq <= 6, odd ck <= 11]")
            state["w"] = w.detach().double().cpu()
        return state["w"]

    def make(text):
        def case():
            x, y = text[-2], text[-1]
            body = text[:text.index("#")]
            at = body.find(x + y) if x + y in body else body.find(y + x)
            p = last_row_attention(text, weight())
            mass = float(p[at] + p[at + 1])
            if mass < 0.5:
                top = int(p.argmax())
                raise CaseFailed(f"the pair at positions {at}, {at + 1} gets {mass:.3f} of the attention; the "
                                 f"largest weight, {float(p[top]):.3f}, is at position {top} ({text[top]!r})")
        return case

    return run_cases("exercise 3 (a kernel that finds two adjacent letters)",
                     [(name, make(text)) for name, text in PAIR_CASES])


__all__ = ["BETA", "CACHE_CASES", "ERROR_CASES", "PAIR_CASES", "check_append_to_cache", "check_pair_kernel",
           "check_sequence_error", "error_problem", "last_row_attention", "pair_problem", "tokens_of"]
