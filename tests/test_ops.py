"""The custom ops of ``mta.ops``: the same numbers as the eager functions, fake implementations that agree with
the real ones, autograd through the backward ops, and ``torch.compile(fullgraph=True)`` without graph breaks."""

from __future__ import annotations

import pytest
import torch

from conftest import mta, rand, rand_qkv

from mta import ops

TOL = dict(atol=2e-5, rtol=2e-5)


def _leaves(*tensors):
    return [t.clone().requires_grad_() for t in tensors]


def _grads(fn, leaves, do):
    out = fn(*leaves)
    return [out, *torch.autograd.grad(out, leaves, do)]


def test_conv_op_matches_conv_attention_forward_and_backward():
    q, k, v = rand_qkv(2, 4, 2, 11, 11, 16)
    w = rand(4, 2, 5, scale=0.3)
    do = rand(2, 4, 11, 16)
    got = _grads(lambda *a: ops.conv_attention(*a, causal=True), _leaves(q, k, v, w), do)
    want = _grads(lambda *a: mta.conv_attention(*a, causal=True), _leaves(q, k, v, w), do)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, **TOL)


def test_conv_op_lse_is_not_differentiable():
    q, k, v = _leaves(*rand_qkv(1, 2, 2, 5, 5, 16))
    o, lse = ops.conv_attention(q, k, v, rand(2, 1, 3), return_lse=True)
    assert o.requires_grad and not lse.requires_grad and lse.dtype == torch.float32


def test_flash_op_matches_flash_attention():
    q, k, v = rand_qkv(1, 4, 1, 9, 9, 16)
    do = rand(1, 4, 9, 16)
    got = _grads(lambda *a: ops.flash_attention(*a, causal=True), _leaves(q, k, v), do)
    want = _grads(lambda *a: mta.flash_attention(*a, causal=True), _leaves(q, k, v), do)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, **TOL)


def test_decode_ops_match_the_eager_functions():
    B, Hq, Hkv, n_max, D = 2, 4, 2, 12, 16
    qc, kc, vc = rand_qkv(B, Hq, Hkv, n_max, n_max, D)
    w = rand(Hq, 2, 3, scale=0.3)
    lens = [4, 12]
    got = ops.conv_decode_attention(qc, kc, vc, w, cache_seqlens=lens, num_queries=2)
    want = mta.conv_decode_attention(qc, kc, vc, w, cache_seqlens=lens, num_queries=2)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    q = rand(B, Hq, 1, D)
    got = ops.decode_attention(q, kc, vc, cache_seqlens=torch.tensor(lens, dtype=torch.int32))
    torch.testing.assert_close(got, mta.decode_attention(q, kc, vc, cache_seqlens=lens), atol=0, rtol=0)


def test_ops_check_inputs_like_the_eager_functions():
    q, k, v = rand_qkv(1, 2, 2, 5, 5, 16)
    with pytest.raises(ValueError, match="ck must be odd"):
        ops.conv_attention(q, k, v, rand(2, 2, 4))
    with pytest.raises(ValueError, match="multiple of kv heads"):
        ops.flash_attention(q, k[:, :1].expand(1, 3, 5, 16), v[:, :1].expand(1, 3, 5, 16))
    # Arguments the ops' schemas would coerce or choke on get the eager functions' errors, before the op.
    for call in (lambda: ops.conv_attention(q, k, v, None), lambda: ops.flash_attention([q], k, v)):
        with pytest.raises(TypeError, match="must be a torch.Tensor"):
            call()
    qc, w = rand(1, 2, 8, 16), rand(2, 2, 3)
    with pytest.raises(TypeError, match="num_queries must be an int"):
        ops.conv_decode_attention(qc, k, v, w, num_queries=True)
    for call in (lambda: ops.decode_attention(q[:, :, :1], k, v, num_splits=2.0),
                 lambda: ops.conv_decode_attention(qc, k, v, w, num_splits=2.0)):
        with pytest.raises(TypeError, match="num_splits must be an int"):
            call()
    with pytest.raises(TypeError, match="cache_seqlens must be"):
        ops.decode_attention(q[:, :, :1], k, v, cache_seqlens=(x for x in [5]))


@pytest.mark.parametrize("fn", ["flash", "conv"])
def test_compile_with_dynamic_shapes_and_the_default_scale(fn):
    """``dynamic=True`` makes the default scale ``D ** -0.5`` symbolic; it must reach the op unchecked, not break
    the graph (``math.isfinite`` of a symbolic float)."""
    w = rand(2, 2, 3, scale=0.3)

    def f(q, k, v):
        return mta.flash_attention(q, k, v, causal=True) if fn == "flash" else mta.conv_attention(q, k, v, w)

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in (7, 12):
        q, k, v = rand_qkv(1, 2, 1, n, n, 16)
        torch.testing.assert_close(compiled(q, k, v), f(q, k, v), atol=0, rtol=0)


@pytest.mark.parametrize("fn", ["flash", "conv"])
@pytest.mark.parametrize("dynamic", [None, True])
def test_compile_with_an_explicit_scale(fn, dynamic):
    """A scale passed in (or derived from a shape) becomes symbolic when dynamo recompiles for a second value: it
    too reaches the op unchecked and is checked there, where it is a number again."""
    w = rand(2, 2, 3, scale=0.3)

    def f(q, k, v, s):
        if fn == "flash":
            return mta.flash_attention(q, k, v, causal=True, scale=s)
        return mta.conv_attention(q, k, v, w, scale=s) + mta.conv_attention(q, k, v, w, scale=q.shape[-1] ** -0.5)

    torch._dynamo.reset()  # f's code is the same in every case: its recompiles would add up to dynamo's limit
    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    q, k, v = rand_qkv(1, 2, 1, 7, 7, 16)
    for s in (0.3, 0.5, 0.7):
        torch.testing.assert_close(compiled(q, k, v, s), f(q, k, v, s), atol=0, rtol=0)
    with pytest.raises(ValueError, match="scale must be finite"):
        compiled(q, k, v, float("inf"))


@pytest.mark.parametrize("op,args", [
    ("conv_attention", lambda: (*rand_qkv(1, 2, 1, 6, 6, 16), rand(2, 2, 3), True, 0.25)),
    ("flash_attention", lambda: (*rand_qkv(1, 2, 1, 6, 6, 16), True, 0.25)),
])
def test_opcheck(op, args):
    # Schema, fake (meta) implementation against the real one, autograd registration.
    torch.library.opcheck(getattr(torch.ops.mta, op).default, args(),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_compile_fullgraph_through_the_ops():
    q, k, v = rand_qkv(1, 2, 1, 7, 7, 16)
    w = rand(2, 2, 3, scale=0.3)

    def f(q, k, v, w):
        return (ops.conv_attention(q, k, v, w) + ops.flash_attention(q, k, v, causal=True)).square().sum()

    explained = torch._dynamo.explain(f)(q, k, v, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = _leaves(q, k, v, w)
    want = _leaves(q, k, v, w)
    torch.autograd.backward(compiled(*got))
    torch.autograd.backward(f(*want))
    for g, r in zip(got, want):
        torch.testing.assert_close(g.grad, r.grad, **TOL)


def test_compile_fullgraph_through_the_public_functions():
    """``mta.conv_attention`` & co. called inside a compiled function route to the ops while traced: one graph, no
    break, the eager numbers; a list of lengths is checked when the op runs."""
    q, k, v = rand_qkv(1, 2, 1, 7, 7, 16)
    w = rand(2, 2, 3, scale=0.3)
    q_new, cache_k, cache_v, cache_q = rand(2, 2, 1, 16), rand(2, 1, 9, 16), rand(2, 1, 9, 16), rand(2, 2, 9, 16)

    def f(q, k, v, w):
        return (mta.conv_attention(q, k, v, w) + mta.flash_attention(q, k, v, causal=True)).square().sum()

    def step(lengths):
        return (mta.decode_attention(q_new, cache_k, cache_v, cache_seqlens=lengths),
                mta.conv_decode_attention(cache_q, cache_k, cache_v, w, cache_seqlens=lengths, num_queries=1))

    explained = torch._dynamo.explain(f)(q, k, v, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    got, want = _leaves(q, k, v, w), _leaves(q, k, v, w)
    torch.autograd.backward(torch.compile(f, fullgraph=True, backend="aot_eager")(*got))
    torch.autograd.backward(f(*want))
    for g, r in zip(got, want):
        torch.testing.assert_close(g.grad, r.grad, **TOL)
    compiled_step = torch.compile(step, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled_step([9, 4]), step([9, 4])):
        torch.testing.assert_close(got, want, **TOL)
    with pytest.raises(ValueError, match="over the cache size"):
        compiled_step([10, 4])


def test_compiled_decode_with_inputs_that_require_grad():
    """Decode is for inference: eager or compiled, its output carries no gradient, also where an input (a weight
    that is a parameter, queries from a projection) requires grad; the compiled function runs instead of failing."""
    q_cache, k, v = rand(1, 2, 9, 16).requires_grad_(), rand(1, 1, 9, 16), rand(1, 1, 9, 16)
    w = torch.nn.Parameter(rand(2, 2, 3, scale=0.3))

    def step(q_cache, w):
        return (mta.decode_attention(q_cache[:, :, -2:], k, v),
                mta.conv_decode_attention(q_cache, k, v, w, num_queries=2))

    for got, want in zip(torch.compile(step, fullgraph=True, backend="aot_eager")(q_cache, w), step(q_cache, w)):
        assert not got.requires_grad and not want.requires_grad
        torch.testing.assert_close(got, want, **TOL)
