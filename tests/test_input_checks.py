"""Every public function rejects bad input with an error that names the problem."""

from __future__ import annotations

import pytest
import torch

import mta
from conftest import rand


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


@pytest.mark.parametrize("block", [0, -3, 2.5, True])
def test_bad_block_size(block):
    with pytest.raises(ValueError, match="block_size"):
        mta.blocked_softmax(torch.ones(3), block)
    with pytest.raises(ValueError, match="block_size"):
        mta.blocked_attention(*qkv(), block_size=block)
