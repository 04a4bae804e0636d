"""Checker for chapter 07's exercise (the MTA layer and the toy task).

The checker runs the learner's function on a few small, awkward cases and compares with the truth; it prints one
line and returns a :class:`mta.course.exercises.Result`; it never raises.

* :func:`check_pair_kernel`: a hand-built MTA kernel that makes a head find two letters next to each other, in
  either order (the problem is :func:`pair_problem`, the one the notebook draws).
"""

from __future__ import annotations

from typing import Callable

import torch

from ...reference import conv_attention_reference
from ..toy_task import DOT, HASH, LETTERS
from . import CaseFailed, Result, run_cases

# --- exercise 1: a kernel that finds a pair of letters -------------------------------------------------------

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

    return run_cases("exercise 1 (a kernel that finds two adjacent letters)",
                     [(name, make(text)) for name, text in PAIR_CASES])


__all__ = ["BETA", "PAIR_CASES", "check_pair_kernel", "last_row_attention", "pair_problem", "tokens_of"]
