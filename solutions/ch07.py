"""Reference solutions to chapter 07's exercises (the MTA layer, its cache, the toy task). Try the exercises first.

Checked by ``tests/test_exercises_07.py`` with the checkers in :mod:`mta.course.exercises.ch07`.
"""

from __future__ import annotations

import mta  # noqa: F401  (first: sets TRITON_INTERPRET when there is no GPU)
import torch


# Exercise 1: append to the cache.
def append_to_cache(buf, lengths, new):
    """Token ``t`` of sequence ``b`` to ``buf[b, lengths[b] + t]``; returns ``lengths + n``."""
    B, n = new.shape[:2]
    pos = lengths[:, None] + torch.arange(n)                  # [B, n]: each sequence at its own length
    rows = torch.arange(B)[:, None].expand(B, n)
    buf[rows, pos] = new
    return lengths + n


# Exercise 2: the per-sequence error.
def sequence_error(logits, tokens, block_len):
    """Fraction of sequences with at least one wrong argmax among the target block's positions."""
    pred = logits[:, -block_len:].argmax(-1)                  # the last block_len positions predict the target
    wrong = (pred != tokens[:, -block_len:]).any(dim=1)
    return wrong.float().mean().item()


# Exercise 3: a kernel that finds two adjacent letters, in either order.
def pair_kernel():
    """Row 0 of the kernel reads the x query (one position back), row 1 the y query. Weights on the key offsets
    -1 and 0 of both rows: the second letter of an adjacent pair matches once through each row (2 BETA), any other
    position at most once (BETA)."""
    w = torch.zeros(1, 2, 3)
    w[0, 0, 0:2] = 1.0
    w[0, 1, 0:2] = 1.0
    return w
