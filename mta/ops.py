"""The public kernels as ``torch.library`` custom ops, so that ``torch.compile`` keeps them whole.

``torch.compile`` cannot trace into a Triton launcher written in Python with host-side logic (tile tables,
pre-passes, split counts), and an ``autograd.Function`` around it costs a graph break. Registering each entry
point as a custom op gives the compiler what it needs instead: an opaque operator with a *fake* implementation
(output shapes and dtypes only, run on meta/fake tensors while tracing) and, for the differentiable ones, an
autograd formula whose backward is itself a custom op. The compiled graph then calls the real kernels.

Ops (namespace ``mta``):

* ``mta::conv_attention(q, k, v, weight, causal, scale) -> (o, lse)`` and ``mta::conv_attention_backward``;
* ``mta::flash_attention(q, k, v, causal, scale) -> (o, lse)`` and ``mta::flash_attention_backward``;
* ``mta::decode_attention(q, k_cache, v_cache, cache_seqlens, scale, num_splits) -> o`` (no gradient);
* ``mta::conv_decode_attention(q_cache, k_cache, v_cache, weight, cache_seqlens, num_queries, scale,
  num_splits) -> o`` (no gradient).

The Python functions of this module have the same keyword interface as :func:`mta.conv_attention`,
:func:`mta.flash_attention`, :func:`mta.decode_attention` and :func:`mta.conv_decode_attention` and call the ops.
Those functions run their launchers directly when called eagerly, and call these ops while ``torch.compile``
traces them, so a compiled model may use either. Inputs are checked by the eager functions inside each op, so errors
read the same either way. Two crossings the other way: under ``torch.func``'s transforms (and
``is_grads_batched``) the eager functions' backward calls the backward ops (an op unwraps the transforms' tensors
for Triton; :func:`mta.flash.wrapped_by_functorch`), and this module's functions call the eager ones
(:func:`_transformed`).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import conv as _conv
from . import flash as _flash
from .checks import check_causal, check_weight, is_int, resolve_scale
from .decode import check_num_splits, seqlens_argument
from .differentiable_once import MESSAGE
from .launch import batch_chunks, check_kernel_inputs, concat_chunks
from .conv_decode import conv_decode_attention as _conv_decode_attention
from .decode import decode_attention as _decode_attention


def _transformed() -> bool:
    """Called eagerly under ``torch.func``'s transforms (grad, vmap, jvp): the op's generated autograd cannot be
    transformed there (torch refuses it under grad, and gives jvp a zero tangent without a word); the eager
    functions' ``autograd.Function`` can, or names what it cannot do."""
    return not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active()


# ----------------------------------------------------------------------------------------------------------------
# MTA: forward, backward, autograd


@torch.library.custom_op("mta::conv_attention", mutates_args=())
def _conv_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor, causal: bool,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    # Checked and run as the public function runs them (under the op autograd is off, so only the forward runs;
    # a forward-mode tangent is refused by name), with no CUDA graphs of its own (mta.conv.plan_of).
    causal, scale, _ = _conv.check_conv_call(q, k, v, weight, causal, scale, True)
    return _conv.planned_conv_attention(q, k, v, weight, causal, scale, _conv.plan_of(q, weight, causal, graphs=False))


@_conv_attention_op.register_fake
def _(q, k, v, weight, causal, scale):
    B, Hq, N, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, Hq, N), dtype=torch.float32)


@torch.library.custom_op("mta::conv_attention_backward", mutates_args=())
def _conv_attention_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                o: torch.Tensor, lse: torch.Tensor, weight: torch.Tensor, causal: bool,
                                scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, dweight = _conv.conv_attention_backward(do, q, k, v, o, lse, weight, causal, scale,
                                                        _conv.plan_of(q, weight, causal, graphs=False))
    return dq, dk, dv, dweight.to(weight.dtype)


@_conv_attention_backward_op.register_fake
def _(do, q, k, v, o, lse, weight, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), weight.new_empty(weight.shape)


def _conv_setup_context(ctx, inputs, output):
    q, k, v, weight, causal, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, weight)
    ctx.causal, ctx.scale = causal, scale
    ctx.mark_non_differentiable(lse)


def _conv_backward(ctx, do, _dlse):
    q, k, v, o, lse, weight = ctx.saved_tensors
    dq, dk, dv, dweight = torch.ops.mta.conv_attention_backward(do, q, k, v, o, lse, weight, ctx.causal, ctx.scale)
    return dq, dk, dv, dweight, None, None


_conv_attention_op.register_autograd(_conv_backward, setup_context=_conv_setup_context)


def conv_attention(q, k, v, weight, *, causal: bool = True, scale: float | None = None, return_lse: bool = False):
    """:func:`mta.conv_attention` through the ``mta::conv_attention`` op (same arguments, same results).

    Args:
        q: ``[B, Hq, N, D]``; k, v: ``[B, Hkv, N, D]``; weight: ``[Hq, cq, ck]`` (any float dtype, used in fp32).
    Returns:
        ``o [B, Hq, N, D]`` in q's dtype (and the fp32 ``lse [B, Hq, N]`` with ``return_lse``).
    """
    check_kernel_inputs(q, k, v)  # here too: the op's schema would turn a wrong argument into another error
    check_weight(weight, num_heads=q.shape[1], device=q.device)
    causal, return_lse = check_causal(causal), check_causal(return_lse, "return_lse")
    scale = resolve_scale(scale, q.shape[-1])
    if _transformed():
        return _conv.conv_attention(q, k, v, weight, causal=causal, scale=scale, return_lse=return_lse)
    _conv.compile_conv_ahead(q, k, v, weight, causal, scale)  # eager first calls only
    o, lse = torch.ops.mta.conv_attention(q, k, v, weight, causal, scale)
    return (o, lse) if return_lse else o


# ----------------------------------------------------------------------------------------------------------------
# Flash attention: forward, backward, autograd


@torch.library.custom_op("mta::flash_attention", mutates_args=())
def _flash_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _flash.flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True)


@_flash_attention_op.register_fake
def _(q, k, v, causal, scale):
    B, Hq, Nq, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, Hq, Nq), dtype=torch.float32)


@torch.library.custom_op("mta::flash_attention_backward", mutates_args=())
def _flash_attention_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 o: torch.Tensor, lse: torch.Tensor, causal: bool,
                                 scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _flash.flash_backward(do, q, k, v, o, lse, causal, scale)


@_flash_attention_backward_op.register_fake
def _(do, q, k, v, o, lse, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _flash_setup_context(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale = causal, scale
    ctx.mark_non_differentiable(lse)


def _flash_backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.mta.flash_attention_backward(do, q, k, v, o, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


_flash_attention_op.register_autograd(_flash_backward, setup_context=_flash_setup_context)


def _second_derivative(ctx, *_):
    raise RuntimeError(MESSAGE)


for _op in (_conv_attention_backward_op, _flash_attention_backward_op):  # as eagerly (mta.differentiable_once)
    _op.register_autograd(_second_derivative)


# vmap of the backward ops (per-sample gradients, ``torch.func.vmap`` over ``grad``): one launch, the mapped axis
# folded into the heads (:func:`mta.flash.entries_into_heads`). Into the heads, not the batch: the weight's
# gradient sums over the batch, and each entry needs its own; a weight per entry is then a weight per head.


@_flash_attention_backward_op.register_vmap
def _(info, in_dims, do, q, k, v, o, lse, causal, scale):
    entries = [_flash.as_entries(x, d, info.batch_size) for x, d in zip((do, q, k, v, o, lse), in_dims)]

    def run(*tensors):
        grads = _flash.flash_backward(*map(_flash.entries_into_heads, tensors), causal, scale)
        return tuple(_flash.entries_out_of_heads(g, tensors[0].shape[0]) for g in grads)
    chunks = batch_chunks(info.batch_size, entries[1].shape[2])  # q's heads: [n, B, Hq, N, D]
    return (run(*entries) if chunks is None else concat_chunks(chunks, run, entries)), (0, 0, 0)


@_conv_attention_backward_op.register_vmap
def _(info, in_dims, do, q, k, v, o, lse, weight, causal, scale):
    entries = [_flash.as_entries(x, d, info.batch_size) for x, d in zip((do, q, k, v, o, lse, weight), in_dims)]

    def run(*tensors):
        *xs, w = tensors  # w: [entries, Hq, cq, ck], a kernel per head once the entries are heads
        dq, dk, dv, dw = _conv.conv_attention_backward(*map(_flash.entries_into_heads, xs), w.flatten(0, 1), causal,
                                                       scale)
        n = w.shape[0]
        return (*(_flash.entries_out_of_heads(g, n) for g in (dq, dk, dv)), dw.to(weight.dtype).unflatten(0, (n, -1)))
    chunks = batch_chunks(info.batch_size, entries[6].shape[1])
    return (run(*entries) if chunks is None else concat_chunks(chunks, run, entries)), (0, 0, 0, 0)


def flash_attention(q, k, v, *, causal: bool = False, scale: float | None = None, return_lse: bool = False):
    """:func:`mta.flash_attention` through the ``mta::flash_attention`` op (same arguments, same results)."""
    check_kernel_inputs(q, k, v)
    causal, return_lse = check_causal(causal), check_causal(return_lse, "return_lse")
    scale = resolve_scale(scale, q.shape[-1])
    if _transformed():
        return _flash.flash_attention(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    _flash.compile_flash_ahead(q, k, v, causal, scale)  # eager first calls only
    o, lse = torch.ops.mta.flash_attention(q, k, v, causal, scale)
    return (o, lse) if return_lse else o


# ----------------------------------------------------------------------------------------------------------------
# Decode (inference only: the outputs are marked non-differentiable)


@torch.library.custom_op("mta::decode_attention", mutates_args=())
def _decode_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         cache_seqlens: Optional[torch.Tensor], scale: float,
                         num_splits: Optional[int]) -> torch.Tensor:
    return _decode_attention(q, k_cache, v_cache, cache_seqlens=cache_seqlens, scale=scale, num_splits=num_splits)


@_decode_attention_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, scale, num_splits):
    return q.new_empty(q.shape)


@torch.library.custom_op("mta::conv_decode_attention", mutates_args=())
def _conv_decode_attention_op(q_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              weight: torch.Tensor, cache_seqlens: Optional[torch.Tensor], num_queries: int,
                              scale: float, num_splits: Optional[int]) -> torch.Tensor:
    return _conv_decode_attention(q_cache, k_cache, v_cache, weight, cache_seqlens=cache_seqlens,
                                  num_queries=num_queries, scale=scale, num_splits=num_splits)


@_conv_decode_attention_op.register_fake
def _(q_cache, k_cache, v_cache, weight, cache_seqlens, num_queries, scale, num_splits):
    B, Hq, _, D = q_cache.shape
    return q_cache.new_empty((B, Hq, num_queries, D))


def _not_differentiable(ctx, inputs, output):
    # Decode is for inference: its output carries no gradient, under torch.compile as when called eagerly (the
    # launchers run outside autograd), instead of failing to compile where an input requires grad.
    ctx.mark_non_differentiable(output)


def _no_backward(ctx, do):
    raise RuntimeError("mta's decode kernels have no backward (their outputs are marked non-differentiable)")


for _op in (_decode_attention_op, _conv_decode_attention_op):
    _op.register_autograd(_no_backward, setup_context=_not_differentiable)


def decode_attention(q, k_cache, v_cache, *, cache_seqlens=None, scale: float | None = None,
                     num_splits: int | None = None) -> torch.Tensor:
    """:func:`mta.decode_attention` through the ``mta::decode_attention`` op.

    Args:
        q: ``[B, Hq, Nq, D]``; k_cache, v_cache: ``[B, Hkv, Nmax, D]``; cache_seqlens: ``[B]`` ints or None.
    Returns:
        ``[B, Hq, Nq, D]`` in q's dtype.
    """
    check_kernel_inputs(q, k_cache, v_cache, per_kv_head=True, names=("q", "k_cache", "v_cache"))
    num_splits = check_num_splits(num_splits)
    return torch.ops.mta.decode_attention(q, k_cache, v_cache, seqlens_argument(cache_seqlens, q.device),
                                          resolve_scale(scale, q.shape[-1]), num_splits)


def conv_decode_attention(q_cache, k_cache, v_cache, weight, *, cache_seqlens=None, num_queries: int = 1,
                          scale: float | None = None, num_splits: int | None = None) -> torch.Tensor:
    """:func:`mta.conv_decode_attention` through the ``mta::conv_decode_attention`` op.

    Args:
        q_cache: ``[B, Hq, Nmax, D]``; k_cache, v_cache: ``[B, Hkv, Nmax, D]``; weight: ``[Hq, cq, ck]``.
    Returns:
        ``[B, Hq, num_queries, D]`` in q_cache's dtype.
    """
    check_kernel_inputs(q_cache, k_cache, v_cache, per_kv_head=True, names=("q_cache", "k_cache", "v_cache"))
    check_weight(weight, num_heads=q_cache.shape[1], device=q_cache.device)
    num_splits = check_num_splits(num_splits)
    if not is_int(num_queries):
        raise TypeError(f"num_queries must be an int, got {type(num_queries).__name__}")
    num_queries = int(num_queries)
    return torch.ops.mta.conv_decode_attention(q_cache, k_cache, v_cache, weight,
                                               seqlens_argument(cache_seqlens, q_cache.device), num_queries,
                                               resolve_scale(scale, q_cache.shape[-1]), num_splits)


__all__ = ["conv_attention", "conv_decode_attention", "decode_attention", "flash_attention"]
