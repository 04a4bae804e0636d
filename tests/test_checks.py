"""Every public function rejects bad input with an error that names the problem."""

from __future__ import annotations

import pytest
import torch

import mta
from conftest import DEVICE, rand


def qkv(B=1, Hq=4, Hkv=2, Nq=8, Nk=8, D=16, dtype=torch.float32):
    return rand(B, Hq, Nq, D, dtype=dtype, device="cpu"), rand(B, Hkv, Nk, D, dtype=dtype, device="cpu"), \
        rand(B, Hkv, Nk, D, dtype=dtype, device="cpu")


def bad_qkv_cases():
    q, k, v = qkv()
    yield "4 dimensions", (q[0], k, v), ValueError
    yield "must have 4", (q, k[0], v), ValueError
    yield "torch.Tensor", (q.numpy(), k, v), TypeError
    yield "share a dtype", (q, k.half(), v), TypeError
    yield "floating-point", (q.long(), k.long(), v.long()), TypeError
    yield "batch", (torch.cat([q, q]), k, v), ValueError
    yield "head dims", (q[..., :8], k, v), ValueError
    yield "same shape", (q, k, v[:, :, :5]), ValueError
    yield "multiple of kv heads", (q[:, :3], k, v), ValueError


@pytest.mark.parametrize("fn", [mta.naive_attention, lambda q, k, v: mta.blocked_attention(q, k, v, block_size=4),
                                lambda q, k, v: mta.conv_attention_reference(q, k, v, torch.ones(q.shape[1], 1, 1))])
@pytest.mark.parametrize("message,args,error", list(bad_qkv_cases()), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_qkv(fn, message, args, error):
    with pytest.raises(error, match=message):
        fn(*args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_mixed_devices():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="one device"):
        mta.naive_attention(q.cuda(), k, v)


def test_meta_device_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="one device"):
        mta.naive_attention(q, k.to("meta"), v)


@pytest.mark.parametrize("weight,message", [
    (torch.ones(4, 2, 4), "must be odd"),
    (torch.ones(3, 2, 3), "one kernel per query head"),
    (torch.ones(4, 3), "3 dimensions"),
    (torch.ones(4, 0, 3), "at least 1 x 1"),
    (torch.ones(4, 2, 3, dtype=torch.int32), "floating-point"),
    (torch.ones(4, 2, 3, device="meta"), "weight is on"),
])
def test_bad_weight(weight, message):
    q, k, v = qkv()
    with pytest.raises((ValueError, TypeError), match=message):
        mta.conv_attention_reference(q, k, v, weight)


def test_conv_needs_square_scores():
    q, k, v = qkv(Nq=5, Nk=8)
    with pytest.raises(ValueError, match="as many queries as keys"):
        mta.conv_attention_reference(q, k, v, torch.ones(4, 1, 1))


def test_fp32_weight_with_half_activations_is_accepted():
    q, k, v = qkv(dtype=torch.bfloat16)
    out = mta.conv_attention_reference(q, k, v, torch.ones(4, 2, 3) * 0.1)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@pytest.mark.parametrize("scale,error", [("0.5", TypeError), (float("nan"), ValueError), (float("inf"), ValueError)])
def test_bad_scale(scale, error):
    with pytest.raises(error, match="scale"):
        mta.naive_attention(*qkv(), scale=scale)


def test_numpy_scales_and_an_overflowing_one():
    import numpy as np

    q, k, v = qkv()
    expected = mta.naive_attention(q, k, v, scale=0.25)
    for scale in (np.float32(0.25), np.float64(0.25), np.int64(1) / 4):
        assert torch.equal(mta.naive_attention(q, k, v, scale=scale), expected)
    with pytest.raises(ValueError, match="scale must be finite"):
        mta.naive_attention(q, k, v, scale=2 ** 1100)  # no float holds it: named, not an OverflowError


@pytest.mark.parametrize("which", ["q", "k", "weight"])
def test_sparse_tensors_are_refused_by_name(which):
    """The kernels address memory through strides: a sparse layout is named, not met inside Triton."""
    q, k, v = (x.to(DEVICE) for x in qkv(Nq=6, Nk=6))
    x = {"q": q, "k": k, "v": v, "w": torch.zeros(4, 2, 3, device=DEVICE)}
    x[which[0]] = x[which[0]].to_sparse()
    calls = [lambda: mta.conv_attention(x["q"], x["k"], x["v"], x["w"]),
             lambda: mta.conv_decode_attention(x["q"], x["k"], x["v"], x["w"])]
    if which != "weight":
        calls += [lambda: mta.flash_attention(x["q"], x["k"], x["v"]), lambda: mta.decode_attention(x["q"], x["k"], x["v"])]
    for call in calls:
        with pytest.raises(TypeError, match=rf"{which}(_cache)? must be a dense"):
            call()


@pytest.mark.parametrize("block", [0, -3, 2.5, True])
def test_bad_block_size(block):
    with pytest.raises(ValueError, match="block_size"):
        mta.blocked_softmax(torch.ones(3), block)
    with pytest.raises(ValueError, match="block_size"):
        mta.blocked_attention(*qkv(), block_size=block)


@pytest.mark.parametrize("causal", ["no", None, 1, torch.tensor(True)])
def test_causal_must_be_a_bool(causal):
    """``bool("no")`` is True: anything but a bool is refused, not coerced."""
    q, k, v = (x.to(DEVICE) for x in qkv())
    w = torch.zeros(4, 2, 3, device=DEVICE)
    calls = (lambda **f: mta.naive_attention(q, k, v, **f),
             lambda **f: mta.blocked_attention(q, k, v, block_size=4, **f),
             lambda **f: mta.conv_attention_reference(q, k, v, w, **f),
             lambda **f: mta.flash_attention(q, k, v, **f),
             lambda **f: mta.conv_attention(q, k, v, w, **f),
             lambda **f: mta.ops.flash_attention(q, k, v, **f),
             lambda **f: mta.ops.conv_attention(q, k, v, w, **f))
    for flag in ("causal", "return_lse"):
        for call in calls + ((lambda **f: mta.reference.conv_attention_probabilities(q, k, w, **f)),) * (
                flag == "causal"):
            with pytest.raises(TypeError, match=f"{flag} must be a bool"):
                call(**{flag: causal})


def test_numpy_bools_and_ints_are_accepted():
    import numpy as np

    q, k, v = (x.to(DEVICE) for x in qkv(Nq=1))
    expected = mta.flash_attention(q, k, v, causal=True)
    assert torch.equal(mta.flash_attention(q, k, v, causal=np.bool_(True)), expected)
    assert torch.allclose(mta.decode_attention(q, k, v, num_splits=np.int64(2)), expected, atol=1e-5)
    lengths = [np.int64(8)]
    assert torch.allclose(mta.decode_attention(q, k, v, cache_seqlens=lengths), expected, atol=1e-5)
    assert torch.allclose(mta.ops.decode_attention(q, k, v, cache_seqlens=lengths), expected, atol=1e-5)
    q_cache, w = q.expand(-1, -1, 8, -1), torch.zeros(4, 2, 3, device=DEVICE)
    want = mta.conv_decode_attention(q_cache, k, v, w, num_queries=2)
    for fn in (mta.conv_decode_attention, mta.ops.conv_decode_attention):
        assert torch.equal(fn(q_cache, k, v, w, num_queries=np.int64(2), cache_seqlens=lengths), want)


@pytest.mark.parametrize("num_splits,error", [(2.0, TypeError), (True, TypeError), ("2", TypeError),
                                              (0, ValueError), (-1, ValueError)])
def test_num_splits_of_the_op_path_too(num_splits, error):
    q, k, v = (x.to(DEVICE) for x in qkv(Nq=1))
    with pytest.raises(error, match="num_splits"):
        mta.ops.decode_attention(q, k, v, num_splits=num_splits)


@pytest.mark.parametrize("lengths", [[2 ** 40, 5], [0, 5], [2 ** 63 - 1, 5]])
def test_out_of_range_list_lengths_are_named_on_the_op_path(lengths):
    """The op takes a list as an int64 tensor: a length past int32 is named, not overflowed."""
    q, k, v = (x.to(DEVICE) for x in qkv(B=2, Nq=1))
    with pytest.raises(ValueError, match="cache_seqlens has a length"):
        mta.ops.decode_attention(q, k, v, cache_seqlens=lengths)


def test_attention_state_over_no_keys_is_the_empty_state():
    s, v = torch.randn(2, 3, 0), torch.randn(2, 0, 4)
    state = mta.attention_state(s, v)
    assert state.m.shape == state.l.shape == (2, 3) and state.acc.shape == (2, 3, 4)
    assert torch.isneginf(state.m).all() and not state.l.any() and not state.acc.any()
    other = mta.attention_state(torch.randn(2, 3, 5), torch.randn(2, 5, 4))
    merged = mta.merge_states(state, other)
    assert torch.equal(merged.m, other.m) and torch.equal(merged.l, other.l) and torch.equal(merged.acc, other.acc)


def test_the_attention_state_algebra_names_bad_input():
    import numpy as np

    s, v = torch.randn(2, 5), torch.randn(5, 3)
    with pytest.raises(TypeError, match="s and v must share a dtype"):
        mta.attention_state(s, v.double())
    with pytest.raises(TypeError, match="s and v must share a dtype"):
        mta.attention_state(s[:, :0], v[:0].double())
    with pytest.raises(ValueError, match="do not broadcast"):
        mta.attention_state(torch.randn(2, 3, 5), torch.randn(4, 5, 3))
    assert mta.empty_state(np.int64(3), np.int64(4)).acc.shape == (3, 4)
    assert mta.empty_state((2, np.int64(3)), 4).m.shape == (2, 3)
    for shape, dim, error in [(-1, 3, ValueError), ((2, -1), 3, ValueError), (3, -2, ValueError),
                              (3.0, 4, TypeError), (None, 4, TypeError), (3, 4.0, TypeError), (3, True, TypeError)]:
        with pytest.raises(error, match="prefix_shape|head_dim|sizes"):
            mta.empty_state(shape, dim)
    for dtype in (torch.int64, torch.bool, "float32"):  # int64 raised torch's overflow error on -inf
        with pytest.raises(TypeError, match="state holds floats"):
            mta.empty_state(3, 4, dtype=dtype)
    state = mta.attention_state(s, v)
    for bad in (None, (s, s), "state"):
        with pytest.raises(TypeError, match="AttentionState"):
            mta.merge_states(bad, state)
        with pytest.raises(TypeError, match="AttentionState"):
            mta.finalize_state(bad)
    assert torch.equal(mta.finalize_state(tuple(state))[0], mta.finalize_state(state)[0])  # a plain triple


def test_an_empty_cache_names_a_bad_head_count_or_head_dim():
    # Before: torch's "Dimension size must be non-negative" (-1) or "zeros(): argument 'size'" (2.0).
    import numpy as np
    for args, name in [((1, 4, 2, 1, -1), "head_dim"), ((1, 4, 2.0, 1, 4), "num_heads"),
                       ((1, 4, 2, 0, 4), "num_kv_heads"), ((1, 4, 2, True, 4), "num_kv_heads")]:
        with pytest.raises((TypeError, ValueError), match=name):
            mta.KVCache.empty(*args, keep_queries=True)
    assert mta.KVCache.empty(1, 4, np.int64(2), 1, 4, keep_queries=True).q.shape == (1, 4, 2, 4)
