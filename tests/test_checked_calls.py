"""Decode calls and calls of ``mta.flash_attention`` whose signature passed the checks run again at once
(``CHECKED_CALLS`` of :mod:`mta.decode` and :mod:`mta.conv_decode`, ``CHECKED_FORWARDS`` and ``CHECKED_TRAINING`` of
:mod:`mta.flash`, and the flash backward's ``BACKWARD_PLANS``): the same answers as checked calls on fresh inputs,
and any input that differs from a checked signature is checked again."""

from __future__ import annotations

import pytest
import torch

import mta
from conftest import DEVICE, close_in_norm as close, rand
from mta import conv_decode, decode, flash, launch
from test_conv_decode import caches, reference as conv_reference
from test_decode import ragged_cache, reference

B, HQ, HKV, NMAX, D = 3, 4, 2, 70, 24
LENGTHS = [NMAX, 33, 5]
DTYPE = torch.float16


def lengths_on_device():
    """The lengths as a decode loop keeps them (on the caches' device); on the CPU no lengths (every position
    valid), as lengths on the host are checked at every call."""
    return torch.tensor(LENGTHS, device=DEVICE, dtype=torch.int32) if DEVICE.type == "cuda" else None


def test_a_repeated_decode_call_runs_its_checked_launches_on_new_inputs():
    lens = lengths_on_device()
    lengths = LENGTHS if lens is not None else [NMAX] * B
    for step in range(3):  # the first call is checked and kept; the others run from the signature
        q = rand(B, HQ, 2, D, dtype=DTYPE)
        k, v = ragged_cache(B, HKV, NMAX, D, lengths, DTYPE)
        out = mta.decode_attention(q, k, v, cache_seqlens=lens)
        assert close(out, reference(q, k, v, lengths), 4e-3), step
        assert decode.call_signature(q, k, v, lens, None, None) in decode.CHECKED_CALLS._plans


def test_a_repeated_conv_decode_call_reads_the_weight_of_each_call():
    lens = lengths_on_device()
    lengths = LENGTHS if lens is not None else [NMAX] * B
    for step in range(3):
        q, k, v = caches(B, HQ, HKV, NMAX, D, lengths, DTYPE)
        weight = rand(HQ, 3, 5, scale=0.3)  # fp32 contiguous: the kernels read the caller's own tensor
        out = mta.conv_decode_attention(q, k, v, weight, cache_seqlens=lens, num_queries=2)
        assert close(out, conv_reference(q, k, v, weight, lengths, 2), 4e-3), step
    assert conv_decode.call_signature(q, k, v, lens, weight, 2, None, None) in conv_decode.CHECKED_CALLS._plans


def test_inputs_that_differ_from_a_checked_call_are_checked_again():
    q = rand(B, HQ, 1, D, dtype=DTYPE)
    k, v = ragged_cache(B, HKV, NMAX, D, [NMAX] * B, DTYPE)
    mta.decode_attention(q, k, v, num_splits=1, scale=0.5)
    mta.decode_attention(q, k, v, num_splits=1, scale=0.5)
    with pytest.raises(TypeError, match="num_splits"):  # True == 1, but a bool is no split count
        mta.decode_attention(q, k, v, num_splits=True, scale=0.5)
    with pytest.raises(ValueError, match="scale"):
        mta.decode_attention(q, k, v, num_splits=1, scale=float("nan"))
    with pytest.raises(TypeError, match="share a dtype"):
        mta.decode_attention(q.float(), k, v, num_splits=1, scale=0.5)
    with pytest.raises(ValueError, match="same shape"):
        mta.decode_attention(q, k, v[:, :, :-1], num_splits=1, scale=0.5)
    with pytest.raises(TypeError, match="cache_seqlens"):
        mta.decode_attention(q, k, v, num_splits=1, scale=0.5, cache_seqlens="all")
    with pytest.raises(TypeError, match="scale must be a real number"):  # unhashable: no signature at all
        mta.decode_attention(q, k, v, num_splits=1, scale=[0.5])
    with pytest.raises(TypeError, match="num_splits must be an int"):
        mta.decode_attention(q, k, v, num_splits=[1], scale=0.5)


def test_lengths_on_the_host_are_checked_at_every_call():
    q = rand(B, HQ, 1, D, dtype=DTYPE)
    k, v = ragged_cache(B, HKV, NMAX, D, LENGTHS, DTYPE)
    lens = torch.tensor(LENGTHS, dtype=torch.int32)
    for _ in range(2):
        assert close(mta.decode_attention(q, k, v, cache_seqlens=lens), reference(q, k, v, LENGTHS), 4e-3)
    lens[1] = NMAX + 1  # the same tensor, a length past the cache
    with pytest.raises(ValueError, match="over the cache size"):
        mta.decode_attention(q, k, v, cache_seqlens=lens)
    weight = rand(HQ, 3, 5, scale=0.3)
    with pytest.raises(ValueError, match="over the cache size"):
        mta.conv_decode_attention(q.expand(B, HQ, NMAX, D), k, v, weight, cache_seqlens=lens)


def test_a_weight_that_is_not_fp32_is_converted_at_every_call():
    q, k, v = caches(B, HQ, HKV, NMAX, D, [NMAX] * B, DTYPE)
    for step in range(2):
        weight = rand(HQ, 3, 5, scale=0.3).half()
        out = mta.conv_decode_attention(q, k, v, weight)
        assert close(out, conv_reference(q, k, v, weight.float(), [NMAX] * B, 1), 4e-3), step
    with pytest.raises(ValueError, match="one kernel per query head"):
        mta.conv_decode_attention(q, k, v, weight[:2])


def test_torch_func_transforms_are_refused_by_name_even_after_a_checked_call():
    q = rand(B, HQ, 1, D, dtype=DTYPE)
    k, v = ragged_cache(B, HKV, NMAX, D, [NMAX] * B, DTYPE)
    weight = rand(HQ, 3, 5, scale=0.3)
    mta.decode_attention(q, k, v)  # a checked signature with the same logical shapes as the mapped call
    with pytest.raises(NotImplementedError, match="decode_attention does not run under torch.func"):
        torch.func.vmap(lambda q: mta.decode_attention(q, k, v))(q[None].expand(2, *q.shape))
    q_cache = q.expand(B, HQ, NMAX, D)
    mta.conv_decode_attention(q_cache, k, v, weight)
    with pytest.raises(NotImplementedError, match="conv_decode_attention does not run under torch.func"):
        torch.func.vmap(lambda w: mta.conv_decode_attention(q_cache, k, v, w))(weight[None].expand(2, *weight.shape))


def test_a_split_launch_the_gpu_refuses_runs_the_rows_form_and_is_not_kept(monkeypatch):
    """Where Triton refuses the split kernel's tiles (fp32 with wide key-axis kernels on a GPU), every call runs
    the unfused rows (:mod:`mta.conv_decode_rows`) and no signature is kept."""
    from triton.runtime.errors import OutOfResources

    def refused(self, *args):
        raise OutOfResources(300000, 232448, "shared memory")
    monkeypatch.setattr(decode.DecodeLaunches, "__call__", refused)
    q, k, v = caches(B, HQ, HKV, NMAX, D, [NMAX] * B, torch.float32)
    weight = rand(HQ, 3, 5, scale=0.3)
    for _ in range(2):
        out = mta.conv_decode_attention(q, k, v, weight, num_queries=2)
        assert close(out, conv_reference(q, k, v, weight, [NMAX] * B, 2), 2e-5)
    assert conv_decode.call_signature(q, k, v, None, weight, 2, None, None) not in conv_decode.CHECKED_CALLS._plans


def flash_reference(q, k, v, causal):
    """``(o, lse)`` of float64 attention on the CPU."""
    return mta.naive_attention(*(x.detach().cpu().double() for x in (q, k, v)), causal=causal, return_lse=True)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_a_repeated_flash_inference_call_runs_its_checked_forward_on_new_inputs(layout, poisoned_outputs,
                                                                                  monkeypatch):
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: empty_like(*a, **kw).fill_(float("nan")))

    def inputs():  # [B, N, H, D] memory viewed as [B, H, N, D] where transposed, as a model's projections give it
        if layout == "transposed":
            return [rand(2, 37, h, 24, dtype=DTYPE).transpose(1, 2) for h in (4, 2, 2)]
        return [rand(2, h, 37, 24, dtype=DTYPE) for h in (4, 2, 2)]
    for step in range(3):  # the first call is checked and kept; the others run from the signature
        q, k, v = inputs()
        o, lse = mta.flash_attention(q, k, v, causal=True, return_lse=True)
        ref, ref_lse = flash_reference(q, k, v, causal=True)
        assert o.is_contiguous() and close(o, ref, 4e-3) and close(lse, ref_lse, 1e-4), step
        assert launch.checked_signature(q, k, v, True, None, True) in flash.CHECKED_FORWARDS._plans
        assert close(mta.flash_attention(q, k, v, causal=True), ref, 4e-3), step  # return_lse its own signature


def test_flash_inputs_that_differ_from_a_checked_call_are_checked_again():
    q, k, v = (rand(1, h, 20, 16, dtype=DTYPE) for h in (2, 1, 1))
    for _ in range(2):
        mta.flash_attention(q, k, v, causal=True, scale=0.5)
    with pytest.raises(TypeError, match="causal"):  # True == 1, but only a bool is a flag
        mta.flash_attention(q, k, v, causal=1, scale=0.5)
    with pytest.raises(TypeError, match="return_lse"):
        mta.flash_attention(q, k, v, causal=True, scale=0.5, return_lse=1)
    with pytest.raises(ValueError, match="scale"):
        mta.flash_attention(q, k, v, causal=True, scale=float("nan"))
    with pytest.raises(TypeError, match="share a dtype"):
        mta.flash_attention(q.float(), k, v, causal=True, scale=0.5)


def test_a_checked_flash_signature_still_gives_gradients():
    q, k, v = (rand(1, h, 20, 16, dtype=DTYPE) for h in (2, 1, 1))
    for _ in range(2):  # inference calls keep the signature
        mta.flash_attention(q, k, v, causal=True)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    mta.flash_attention(q, k, v, causal=True).square().sum().backward()
    q64, k64, v64 = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    mta.naive_attention(q64, k64, v64, causal=True).square().sum().backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert got is not None and close(got, want, 8e-3)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_a_repeated_flash_training_call_runs_from_its_signature_with_exact_gradients(layout, poisoned_outputs,
                                                                                     monkeypatch):
    """The second and third calls skip the checks (counted) and the backward's decisions, and still give the
    float64 reference's output and gradients on their own new inputs, every buffer the launchers allocate NaN."""
    checked = []
    check = flash.check_kernel_inputs
    monkeypatch.setattr(flash, "check_kernel_inputs", lambda *a: checked.append(1) or check(*a))

    def inputs():
        if layout == "transposed":
            return [rand(2, 37, h, 24, dtype=DTYPE).transpose(1, 2).requires_grad_() for h in (4, 2, 2)]
        return [rand(2, h, 37, 24, dtype=DTYPE).requires_grad_() for h in (4, 2, 2)]
    for step in range(3):
        q, k, v = inputs()
        do = rand(2, 4, 37, 24, dtype=DTYPE)
        o = mta.flash_attention(q, k, v, causal=True)
        o.backward(do)
        q64, k64, v64 = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
        ref = mta.naive_attention(q64, k64, v64, causal=True)
        ref.backward(do.cpu().double())
        assert close(o, ref, 4e-3), step
        for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
            assert close(got, want, 8e-3), step
        assert launch.checked_signature(q, k, v, True, None, False) in flash.CHECKED_TRAINING._plans
    assert len(checked) == 1


def test_flash_training_inputs_that_differ_from_a_checked_call_are_checked_again():
    q, k, v = (rand(1, h, 20, 16, dtype=DTYPE).requires_grad_() for h in (2, 1, 1))
    for _ in range(2):
        mta.flash_attention(q, k, v, causal=True, scale=0.5).sum().backward()
    with pytest.raises(TypeError, match="causal"):  # True == 1, but only a bool is a flag
        mta.flash_attention(q, k, v, causal=1, scale=0.5)
    with pytest.raises(ValueError, match="scale"):
        mta.flash_attention(q, k, v, causal=True, scale=float("nan"))
    with pytest.raises(TypeError, match="share a dtype"):
        mta.flash_attention(q.float(), k, v, causal=True, scale=0.5)
    with pytest.raises(ValueError, match="head dim"):
        mta.flash_attention(q, k[..., :8], v[..., :8], causal=True, scale=0.5)


def test_no_query_keeps_no_forward():
    q, k, v = rand(1, 2, 0, 16, dtype=DTYPE), rand(1, 1, 5, 16, dtype=DTYPE), rand(1, 1, 5, 16, dtype=DTYPE)
    for _ in range(2):
        assert mta.flash_attention(q, k, v).shape == (1, 2, 0, 16)
    assert launch.checked_signature(q, k, v, False, None, False) not in flash.CHECKED_FORWARDS._plans
