"""Online softmax and mergeable attention states, in plain PyTorch, for teaching.

A flash-attention kernel never holds a whole row of scores. It keeps, per
query row, a running maximum ``m``, a running normalizer
``l = sum_j exp(s_j - m)`` and an unnormalized output
``acc = sum_j exp(s_j - m) v_j``. Two such states over disjoint key sets merge
into the state over their union (:func:`merge_states`); the merge is
associative and commutative, so keys may be visited in any blocks, in any
order, on any number of processors (chapter 06's split-K decode combines its
splits with it).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .checks import check_block_size, check_causal, check_qkv, is_int, resolve_scale
from .reference import causal_future, compute_dtype, expand_kv, outside_autocast


def _check_float(name: str, x, *, min_dims: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if x.dim() < min_dims:
        raise ValueError(f"{name} must have at least {min_dims} dimension(s), got shape {tuple(x.shape)}")


def rescale_factor(m_old: torch.Tensor, m_new: torch.Tensor) -> torch.Tensor:
    """``exp(m_old - m_new)``, with 0 (not NaN) when both are ``-inf`` (nothing seen yet)."""
    nothing = torch.isneginf(m_new)  # exp of a 0, not of -inf - -inf: no NaN in the gradient either
    return torch.where(nothing, torch.zeros_like(m_new), torch.exp(torch.where(nothing, 0.0, m_old - m_new)))


def finite_or_zero(m: torch.Tensor) -> torch.Tensor:
    """``m`` with ``-inf`` (a row that has seen only masked scores) replaced by 0, to subtract safely."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def blocked_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Softmax over the last axis, read block by block as a kernel reads it.

    Pass 1 walks the blocks keeping the running max ``m`` and normalizer
    ``l``; each time the max grows, ``l`` is rescaled by ``exp(m_old - m_new)``.
    Pass 2 writes ``exp(x - m) / l``. Equals ``torch.softmax(x, -1)``
    (computed in fp32, or fp64 for fp64 input; returned in x's dtype).

    Args:
        x: ``[..., n]``.
        block_size: how many entries of a row each step reads.
    """
    _check_float("x", x, min_dims=1)
    check_block_size(block_size)
    ct = compute_dtype(x)
    m = torch.full(x.shape[:-1], float("-inf"), dtype=ct, device=x.device)
    l = torch.zeros(x.shape[:-1], dtype=ct, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        xb = x[..., start:start + block_size].to(ct)
        m_new = torch.maximum(m, xb.amax(dim=-1))
        l = l * rescale_factor(m, m_new) + torch.exp(xb - finite_or_zero(m_new)[..., None]).sum(dim=-1)
        m = m_new
    return (torch.exp(x.to(ct) - m[..., None]) / l[..., None]).to(x.dtype)


class AttentionState(NamedTuple):
    """Softmax attention of some queries over a subset of the keys, not yet normalized.

    Shapes for queries ``[..., Nq]`` and head dim ``D``:
        m: ``[..., Nq]`` max score seen (``-inf`` if none),
        l: ``[..., Nq]`` ``sum_j exp(s_j - m)``,
        acc: ``[..., Nq, D]`` ``sum_j exp(s_j - m) v_j``.
    """

    m: torch.Tensor
    l: torch.Tensor
    acc: torch.Tensor


def empty_state(prefix_shape, head_dim: int, *, dtype=torch.float32, device=None) -> AttentionState:
    """The state over no keys: the identity element of :func:`merge_states`. ``prefix_shape``: a shape (or an
    int); ``head_dim``: ``D >= 0``."""
    if is_int(prefix_shape):
        prefix_shape = (prefix_shape,)
    if not isinstance(prefix_shape, (tuple, list, torch.Size)) or not all(is_int(n) for n in prefix_shape):
        raise TypeError(f"prefix_shape must be an int or a shape (ints), got {prefix_shape!r}")
    if not is_int(head_dim):
        raise TypeError(f"head_dim must be an int, got {type(head_dim).__name__} {head_dim!r}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"a state holds floats (m is -inf where no key was seen), got dtype={dtype!r}")
    prefix_shape, head_dim = tuple(int(n) for n in prefix_shape), int(head_dim)
    if head_dim < 0 or any(n < 0 for n in prefix_shape):
        raise ValueError(f"sizes must be >= 0, got prefix_shape {prefix_shape} and head_dim {head_dim}")
    return AttentionState(
        m=torch.full(prefix_shape, float("-inf"), dtype=dtype, device=device),
        l=torch.zeros(prefix_shape, dtype=dtype, device=device),
        acc=torch.zeros(prefix_shape + (head_dim,), dtype=dtype, device=device),
    )


@outside_autocast
def attention_state(s: torch.Tensor, v: torch.Tensor) -> AttentionState:
    """State of scores ``s [..., Nq, n]`` (``-inf`` = masked) over values ``v [..., n, D]``; with ``n = 0`` the
    state over no keys (:func:`empty_state`)."""
    _check_float("s", s, min_dims=2)
    _check_float("v", v, min_dims=2)
    if s.dtype != v.dtype:
        raise TypeError(f"s and v must share a dtype, got {s.dtype} and {v.dtype}")
    if s.shape[-1] != v.shape[-2]:
        raise ValueError(f"s has {s.shape[-1]} keys (last axis) but v has {v.shape[-2]} (second to last): "
                         f"s {tuple(s.shape)}, v {tuple(v.shape)}")
    try:
        torch.broadcast_shapes(s.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading axes of s {tuple(s.shape)} and v {tuple(v.shape)} do not broadcast") from None
    if s.shape[-1] == 0:  # amax over an empty axis raises; p @ v of no keys is zeros of its shape
        return AttentionState(m=torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype, device=s.device),
                              l=s.new_zeros(s.shape[:-1]), acc=s @ v)
    m = s.amax(dim=-1)
    p = torch.exp(s - finite_or_zero(m)[..., None])
    return AttentionState(m=m, l=p.sum(dim=-1), acc=p @ v)


def _as_state(name: str, x) -> AttentionState:
    """``x`` as an :class:`AttentionState`: one already, or an ``(m, l, acc)`` triple of tensors."""
    if isinstance(x, (tuple, list)) and len(x) == 3 and all(isinstance(t, torch.Tensor) for t in x):
        return x if isinstance(x, AttentionState) else AttentionState(*x)
    raise TypeError(f"{name} must be an mta.AttentionState (m, l, acc), got {type(x).__name__}")


def merge_states(a: AttentionState, b: AttentionState) -> AttentionState:
    """The state over the union of two disjoint key sets.

    ``m = max(m_a, m_b)``; each side is rescaled to the common max by
    ``exp(m_side - m)`` before ``l`` and ``acc`` are added.
    """
    a, b = _as_state("a", a), _as_state("b", b)
    for name, x, y in (("m", a.m, b.m), ("l", a.l, b.l), ("acc", a.acc, b.acc)):
        if x.shape != y.shape:  # no broadcasting: two states of the same rows
            raise ValueError(f"merge_states needs states of one shape: {name} {tuple(x.shape)} and {tuple(y.shape)}")
    m = torch.maximum(a.m, b.m)
    alpha, beta = rescale_factor(a.m, m), rescale_factor(b.m, m)
    return AttentionState(
        m=m,
        l=alpha * a.l + beta * b.l,
        acc=alpha[..., None] * a.acc + beta[..., None] * b.acc,
    )


def finalize_state(state: AttentionState) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)``: ``o = acc / l`` (0 for a query that saw no key) and ``lse = m + log l``."""
    state = _as_state("state", state)
    seen = state.l > 0
    l_or_one = torch.where(seen, state.l, torch.ones_like(state.l))  # no 0/0, and no log(0) for autograd to meet
    o = state.acc / l_or_one[..., None]
    lse = torch.where(seen, state.m + torch.log(l_or_one), torch.full_like(state.m, float("-inf")))
    return o, lse


@outside_autocast
def blocked_attention(q, k, v, *, block_size: int, causal: bool = False, scale: float | None = None,
                      return_lse: bool = False):
    """Attention computed one key block at a time with :func:`merge_states`.

    Same arguments, shapes and results as :func:`mta.naive_attention`; only
    ``[Nq, block_size]`` scores exist at any moment. This is the algorithm a
    flash-attention kernel runs per query tile.
    """
    _, Hq, _, Nq, Nk, D = check_qkv(q, k, v)
    check_block_size(block_size)
    causal, return_lse = check_causal(causal), check_causal(return_lse, "return_lse")
    scale = resolve_scale(scale, D)
    ct = compute_dtype(q)
    k, v = expand_kv(k, Hq).to(ct), expand_kv(v, Hq).to(ct)
    qc = q.to(ct)
    future = causal_future(Nq, Nk, q.device)
    state = empty_state(q.shape[:-1], D, dtype=ct, device=q.device)
    for start in range(0, Nk, block_size):
        stop = min(start + block_size, Nk)
        s = scale * (qc @ k[..., start:stop, :].transpose(-1, -2))
        if causal:
            s = s.masked_fill(future[:, start:stop], float("-inf"))
        state = merge_states(state, attention_state(s, v[..., start:stop, :]))
    o, lse = finalize_state(state)
    o = o.to(q.dtype)
    return (o, lse) if return_lse else o
