"""Blocked softmax and attention-state merging equal the direct computation."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

import mta
from conftest import rand, rand_qkv


@pytest.mark.parametrize("n,block", [(1, 1), (7, 3), (64, 16), (100, 7), (5, 64)])
def test_blocked_softmax_equals_torch(n, block):
    x = rand(3, 4, n, scale=5.0, device="cpu")
    torch.testing.assert_close(mta.blocked_softmax(x, block), torch.softmax(x, dim=-1))


def test_blocked_softmax_extreme_and_masked_values():
    x = torch.tensor([[1000.0, -1000.0, 999.0, float("-inf")], [float("-inf"), 3.0, float("-inf"), 88.0]])
    for block in (1, 2, 3):
        torch.testing.assert_close(mta.blocked_softmax(x, block), torch.softmax(x, dim=-1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_blocked_softmax_keeps_dtype(dtype):
    x = rand(2, 50, dtype=dtype, device="cpu")
    y = mta.blocked_softmax(x, 8)
    assert y.dtype == dtype
    torch.testing.assert_close(y, torch.softmax(x.float(), -1).to(dtype))


def random_split(n, parts, rng):
    cuts = sorted(rng.sample(range(1, n), parts - 1))
    return [slice(a, b) for a, b in zip([0] + cuts, cuts + [n])]


@pytest.mark.parametrize("parts", [1, 2, 5])
def test_merge_of_any_split_equals_direct(parts):
    rng = random.Random(parts)
    q, k, v = rand_qkv(2, 3, 3, 6, 40, 8, dtype=torch.float64, device="cpu")
    s = q @ k.transpose(-1, -2) * 8 ** -0.5
    o_ref, lse_ref = mta.naive_attention(q, k, v, return_lse=True)
    states = [mta.attention_state(s[..., sl], v[..., sl, :]) for sl in random_split(40, parts, rng)]
    # Any order and any bracketing: merging is associative and commutative.
    rng.shuffle(states)
    left = mta.empty_state(q.shape[:-1], 8, dtype=torch.float64)
    for st in states:
        left = mta.merge_states(left, st)
    right = mta.empty_state(q.shape[:-1], 8, dtype=torch.float64)
    for st in reversed(states):
        right = mta.merge_states(st, right)
    for state in (left, right):
        o, lse = mta.finalize_state(state)
        torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse, lse_ref, rtol=1e-12, atol=1e-12)


def test_merge_is_associative_on_states():
    s = rand(4, 30, dtype=torch.float64, device="cpu", scale=3.0)
    v = rand(30, 5, dtype=torch.float64, device="cpu")
    a, b, c = (mta.attention_state(s[:, sl], v[sl]) for sl in (slice(0, 9), slice(9, 10), slice(10, 30)))
    ab_c = mta.merge_states(mta.merge_states(a, b), c)
    a_bc = mta.merge_states(a, mta.merge_states(b, c))
    for x, y in zip(ab_c, a_bc):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_fully_masked_block_is_neutral():
    s = rand(3, 8, dtype=torch.float64, device="cpu")
    v = rand(8, 4, dtype=torch.float64, device="cpu")
    masked = mta.attention_state(torch.full((3, 5), float("-inf"), dtype=torch.float64), rand(5, 4, dtype=torch.float64, device="cpu"))
    st = mta.attention_state(s, v)
    merged = mta.merge_states(masked, st)
    for x, y in zip(merged, st):
        torch.testing.assert_close(x, y)
    o, lse = mta.finalize_state(masked)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()


@pytest.mark.parametrize("causal,block", itertools.product([False, True], [1, 4, 16, 64]))
def test_blocked_attention_equals_naive(causal, block):
    q, k, v = rand_qkv(2, 4, 2, 9, 23, 16, dtype=torch.float64, device="cpu")
    o, lse = mta.blocked_attention(q, k, v, block_size=block, causal=causal, return_lse=True)
    o_ref, lse_ref = mta.naive_attention(q, k, v, causal=causal, return_lse=True)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-12, atol=1e-12)


def test_bad_arguments_are_named_not_answered():
    """The states and the blocked softmax refuse what they cannot compute instead of returning something."""
    x = torch.randn(2, 5)
    for bad, error in [(torch.tensor([[1, 2]]), TypeError), (torch.tensor([[True, False]]), TypeError),
                       ([[1.0, 2.0]], TypeError), (torch.tensor(1.0), ValueError)]:
        with pytest.raises(error):
            mta.blocked_softmax(bad, 1)
    for block in (2.0, True, None, "2", 0):
        with pytest.raises(ValueError, match="block_size"):
            mta.blocked_softmax(x, block)
    torch.testing.assert_close(mta.blocked_softmax(x, np.int64(2)), torch.softmax(x, -1))  # any integer
    with pytest.raises(ValueError, match="keys"):
        mta.attention_state(torch.randn(3, 4), torch.randn(5, 8))
    a = mta.attention_state(torch.randn(2, 3, 4), torch.randn(2, 4, 8))
    b = mta.attention_state(torch.randn(3, 4), torch.randn(4, 8))
    with pytest.raises(ValueError, match="one shape"):
        mta.merge_states(a, b)
    assert mta.empty_state(3, 4).acc.shape == (3, 4)
    with pytest.raises(ValueError, match="head_dim"):
        mta.empty_state((3,), -1)


def test_blocked_softmax_gradient_after_a_masked_first_block():
    """A row whose first block is all -inf: the gradient equals torch's (no NaN from exp(-inf - -inf))."""
    x = torch.tensor([[float("-inf"), 1.0, 2.0]], requires_grad=True)
    mta.blocked_softmax(x, 1).pow(2).sum().backward()
    y = x.detach().clone().requires_grad_()
    torch.softmax(y, -1).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_lse_of_a_row_that_saw_no_key_passes_a_finite_gradient():
    """``finalize_state``'s lse of an unseen row is -inf with no log(0) behind it: a loss on the other rows' lse,
    with an additive -inf mask on the scores, gives finite gradients (as ``torch.logsumexp`` would not)."""
    q = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    k, v = torch.randn(5, 4, dtype=torch.float64, requires_grad=True), torch.randn(5, 2, dtype=torch.float64)
    mask = torch.zeros(3, 5, dtype=torch.float64)
    mask[0] = float("-inf")  # row 0 sees no key
    o, lse = mta.finalize_state(mta.attention_state(q @ k.T + mask, v))
    assert torch.isneginf(lse[0]) and torch.equal(o[0], torch.zeros(2, dtype=torch.float64))
    (lse[1:].sum() + o.sum()).backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert torch.equal(q.grad[0], torch.zeros(4, dtype=torch.float64))
