"""Chapter 07's exercise: the reference solution passes its checker, and a plausible wrong answer fails it with a
message that names the failing case."""

from __future__ import annotations

import torch

import mta  # noqa: F401
from conftest import assert_stubs_not_attempted, load_solutions
from mta.course.exercises import ch07

SOLUTIONS = load_solutions("ch07")


def test_solutions_pass(capsys):
    assert ch07.check_pair_kernel(SOLUTIONS.pair_kernel).passed
    assert "all 5 cases pass" in capsys.readouterr().out


def test_stubs_are_not_attempted(capsys):
    assert_stubs_not_attempted((ch07.check_pair_kernel,), capsys)


def test_wrong_plain_attention_cannot():
    # The identity kernel (plain attention): the y query matches every y equally.
    result = ch07.check_pair_kernel(lambda: torch.ones(1, 1, 1))
    assert "case \"'xy' in order, x and y also elsewhere\" fails: the pair at positions 7, 8 gets" in result.message


def test_wrong_one_order_only():
    # x one key back, y on the key: finds "xy" but not "yx".
    def in_order():
        w = torch.zeros(1, 2, 3)
        w[0, 0, 0] = w[0, 1, 1] = 1.0
        return w

    result = ch07.check_pair_kernel(in_order)
    assert "case \"reversed: 'yx' in the block\" fails" in result.message


def test_wrong_bad_shape():
    result = ch07.check_pair_kernel(lambda: torch.ones(1, 2, 4))
    assert "expected [1, cq <= 6, odd ck <= 11]" in result.message


def test_pair_cases_hold_the_pair_once():
    for _, text in ch07.PAIR_CASES:
        body = text[:text.index("#")]
        x, y = text[-2:]
        assert body.count(x + y) + body.count(y + x) == 1, text
        assert body.count(x) >= 2 and body.count(y) >= 2, text
