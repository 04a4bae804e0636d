"""Reference solution to chapter 07's exercise (a kernel for the toy task). Try the exercise first.

Checked by ``tests/test_exercises_07.py`` with the checker in :mod:`mta.course.exercises.ch07`.
"""

from __future__ import annotations

import mta  # noqa: F401  (first: sets TRITON_INTERPRET when there is no GPU)
import torch


# Exercise 1: a kernel that finds two adjacent letters, in either order.
def pair_kernel():
    """Row 0 of the kernel reads the x query (one position back), row 1 the y query. Weights on the key offsets
    -1 and 0 of both rows: the second letter of an adjacent pair matches once through each row (2 BETA), any other
    position at most once (BETA)."""
    w = torch.zeros(1, 2, 3)
    w[0, 0, 0:2] = 1.0
    w[0, 1, 0:2] = 1.0
    return w
