"""Chapter 07's exercises: every reference solution passes its checker, and a plausible wrong answer fails it
with a message that names the failing case."""

from __future__ import annotations

import pytest
import torch

import mta  # noqa: F401
from conftest import assert_stubs_not_attempted, load_solutions
from mta.course.exercises import ch07

SOLUTIONS = load_solutions("ch07")


def test_solutions_pass(capsys):
    assert ch07.check_append_to_cache(SOLUTIONS.append_to_cache).passed
    assert ch07.check_sequence_error(SOLUTIONS.sequence_error).passed
    assert ch07.check_pair_kernel(SOLUTIONS.pair_kernel).passed
    out = capsys.readouterr().out
    assert "all 4 cases pass" in out and "all 5 cases pass" in out


def test_stubs_are_not_attempted(capsys):
    assert_stubs_not_attempted((ch07.check_append_to_cache, ch07.check_sequence_error, ch07.check_pair_kernel), capsys)


def test_wrong_1_writes_every_sequence_at_the_longest_length():
    # One position for the whole batch: right while the lengths are equal, wrong once they are ragged.
    def shared_position(buf, lengths, new):
        start = int(lengths.max())
        buf[:, start:start + new.shape[1]] = new
        return lengths + new.shape[1]

    result = ch07.check_append_to_cache(shared_position)
    assert result.attempted and not result.passed
    assert "case 'ragged lengths [1, 4, 0], one token' fails: buf after the append" in result.message


def test_wrong_1_forgets_the_lengths():
    def no_new_lengths(buf, lengths, new):
        SOLUTIONS.append_to_cache(buf, lengths, new)
        return lengths

    result = ch07.check_append_to_cache(no_new_lengths)
    assert "case 'one sequence, empty cache, one token' fails: new lengths: got [0], expected [1]" in result.message


def test_wrong_2_counts_tokens_not_sequences():
    def token_error(logits, tokens, block_len):
        return (logits[:, -block_len:].argmax(-1) != tokens[:, -block_len:]).float().mean().item()

    result = ch07.check_sequence_error(token_error)
    assert "case 'one sequence with one wrong token of five' fails: error: got 0.05, expected 0.25" in result.message


def test_wrong_2_misses_the_first_target_token():
    def from_second(logits, tokens, block_len):
        return (logits[:, -(block_len - 1):].argmax(-1) != tokens[:, -(block_len - 1):]).any(1).float().mean().item()

    result = ch07.check_sequence_error(from_second)
    assert "case \"one sequence wrong only at the target's first token\" fails" in result.message, result.message


def test_wrong_2_off_by_one():
    # Compares each prediction with the token at its own position instead of the next one.
    def same_position(logits, tokens, block_len):
        return (logits[:, -block_len:].argmax(-1) != tokens[:, -block_len - 1:-1]).any(1).float().mean().item()

    result = ch07.check_sequence_error(same_position)
    assert "case 'all right' fails" in result.message


def test_wrong_3_plain_attention_cannot():
    # The identity kernel (plain attention): the y query matches every y equally.
    result = ch07.check_pair_kernel(lambda: torch.ones(1, 1, 1))
    assert "case \"'xy' in order, x and y also elsewhere\" fails: the pair at positions 7, 8 gets" in result.message


def test_wrong_3_one_order_only():
    # x one key back, y on the key: finds "xy" but not "yx".
    def in_order():
        w = torch.zeros(1, 2, 3)
        w[0, 0, 0] = w[0, 1, 1] = 1.0
        return w

    result = ch07.check_pair_kernel(in_order)
    assert "case \"reversed: 'yx' in the block\" fails" in result.message


def test_wrong_3_bad_shape():
    result = ch07.check_pair_kernel(lambda: torch.ones(1, 2, 4))
    assert "expected [1, cq <= 6, odd ck <= 11]" in result.message


def test_pair_cases_hold_the_pair_once():
    for _, text in ch07.PAIR_CASES:
        body = text[:text.index("#")]
        x, y = text[-2:]
        assert body.count(x + y) + body.count(y + x) == 1, text
        assert body.count(x) >= 2 and body.count(y) >= 2, text


def test_sequence_error_accepts_a_numpy_float(capsys):
    """Right: the fraction as a NumPy float32 (an answer that finishes in NumPy) is a float for the exercise."""
    np = pytest.importorskip("numpy")
    result = ch07.check_sequence_error(lambda logits, tokens, block_len: np.float32(
        SOLUTIONS.sequence_error(logits, tokens, block_len)))
    assert result.passed, result.message
