"""Exact references in plain PyTorch: ordinary attention and MTA's conv attention.

They materialize the full score matrix (memory O(N^2) by design), compute the
softmax in fp32 (fp64 for fp64 inputs), under autocast too (as the kernels do),
and are differentiable by autograd. Every Triton kernel in ``mta`` is checked
against them.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from .checks import check_causal, check_qkv, check_weight, resolve_scale


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """fp64 if any input is fp64, else fp32: the precision references compute in."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def autocast_off(device) -> contextlib.AbstractContextManager:
    """Autocast off for ``device``'s type (a no-op for a type autocast does not know: meta). The references, and the
    PyTorch paths the fused functions fall back on, compute in the precision they say (fp32, fp64 for fp64 inputs),
    as the fused kernels do, not in the fp16 or bf16 autocast would give their products and convolutions."""
    kind = torch.device(device).type
    return torch.autocast(kind, enabled=False) if torch.amp.is_autocast_available(kind) else contextlib.nullcontext()


def outside_autocast(function):
    """``function(x, ...)`` run with autocast off for the device of its first argument ``x`` (:func:`autocast_off`)."""
    @functools.wraps(function)
    def wrapper(x, *args, **kwargs):
        with autocast_off(x.device) if isinstance(x, torch.Tensor) else contextlib.nullcontext():
            return function(x, *args, **kwargs)
    return wrapper


def expand_kv(x: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """``[B, Hkv, N, D] -> [B, Hq, N, D]``: query head h reads kv head ``h // (Hq // Hkv)``."""
    return x.repeat_interleave(num_q_heads // x.shape[1], dim=1)


def causal_future(n_q: int, n_k: int, device) -> torch.Tensor:
    """Boolean ``[Nq, Nk]``, True where key j lies in query i's future.

    Bottom-right alignment, as in flash-attn: the last query sees every key,
    so query i sees keys ``j <= i + (Nk - Nq)``. With ``Nq > Nk`` the first
    ``Nq - Nk`` queries see no key at all.
    """
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    return j > i + (n_k - n_q)


@outside_autocast
def naive_attention(q, k, v, *, causal: bool = False, scale: float | None = None, return_lse: bool = False):
    """Softmax attention straight from the formula ``softmax(scale * q k^T) v``.

    Args:
        q: ``[B, Hq, Nq, D]``.
        k, v: ``[B, Hkv, Nk, D]`` with ``Hq % Hkv == 0`` (grouped-query attention).
        causal: mask keys in each query's future, aligned bottom-right
            (see :func:`causal_future`). A query that sees no key outputs 0.
        scale: score scale, default ``D ** -0.5``.
        return_lse: also return the log-sum-exp of each score row.

    Returns:
        ``o [B, Hq, Nq, D]`` in q's dtype; with ``return_lse`` also
        ``lse [B, Hq, Nq]`` in fp32 (fp64 for fp64 inputs), ``-inf`` for a
        query that sees no key.
    """
    _, Hq, _, Nq, Nk, D = check_qkv(q, k, v)
    causal, return_lse = check_causal(causal), check_causal(return_lse, "return_lse")
    scale = resolve_scale(scale, D)
    ct = compute_dtype(q)
    k, v = expand_kv(k, Hq).to(ct), expand_kv(v, Hq).to(ct)
    s = scale * (q.to(ct) @ k.transpose(-1, -2))
    if causal:
        s = s.masked_fill(causal_future(Nq, Nk, q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    seen_nothing = torch.isneginf(lse)[..., None]
    # Rows with no visible key would give 0/0; give them a finite dummy row and
    # zero their probabilities, so that forward and autograd stay finite.
    p = torch.softmax(torch.where(seen_nothing, torch.zeros_like(s), s), dim=-1)
    p = torch.where(seen_nothing, torch.zeros_like(p), p)
    o = (p @ v).to(q.dtype)
    return (o, lse) if return_lse else o


@outside_autocast
def conv_attention_reference(q, k, v, weight, *, causal: bool = True, scale: float | None = None,
                             return_lse: bool = False):
    """Multi-Token Attention's key-query convolution, materialized.

    Exactly ``docs/mta-semantics.md``: ``S = scale * q k^T``; causal: zero
    the future; depthwise 2D cross-correlation with ``weight[h]``, the query
    axis padded on top with ``cq - 1`` rows and the key axis with
    ``(ck - 1) / 2`` columns each side; causal: ``-inf`` in the future;
    fp32 softmax; ``P @ v``.

    Args:
        q: ``[B, Hq, N, D]``.
        k, v: ``[B, Hkv, N, D]``, ``Hq % Hkv == 0``.
        weight: ``[Hq, cq, ck]``, ``cq >= 1``, ``ck`` odd. Any float dtype:
            an fp32 weight with fp16/bf16 activations is the normal case.
        causal: the MTA case (default). Non-causal keeps only the padding.
        scale: default ``D ** -0.5``, applied before the convolution.
        return_lse: also return the log-sum-exp of each row of the convolved scores.

    Returns:
        ``o [B, Hq, N, D]`` in q's dtype; with ``return_lse`` also ``lse [B, Hq, N]``
        in fp32 (fp64 when q or the weight is fp64).
    """
    return_lse = check_causal(return_lse, "return_lse")
    c = _convolved_scores(q, k, weight, causal, scale, v=v)
    lse = torch.logsumexp(c, dim=-1)
    o = (torch.softmax(c, dim=-1) @ expand_kv(v, q.shape[1]).to(c.dtype)).to(q.dtype)
    return (o, lse) if return_lse else o


@outside_autocast
def conv_attention_probabilities(q, k, weight, *, causal: bool = True, scale: float | None = None):
    """The attention probabilities of :func:`conv_attention_reference`: ``P [B, Hq, N, N]`` in fp32 (fp64 when q
    or the weight is fp64), ``softmax`` of the convolved scores; ``conv_attention_reference(q, k, v, weight) == P @ v``.
    For looking at what heads attend to (small ``N``). A ``[Hq, 1, 1]`` weight of ones gives plain attention's."""
    return torch.softmax(_convolved_scores(q, k, weight, causal, scale), dim=-1)


def _convolved_scores(q, k, weight, causal: bool, scale, v=None):
    """``C [B, Hq, N, N]``: the scaled scores, masked before and after the convolution when causal (``v``, when
    the caller has one, is only checked against ``q`` and ``k``)."""
    _, Hq, _, Nq, Nk, D = check_qkv(q, k, k if v is None else v)
    if Nq != Nk:
        raise ValueError(f"conv attention needs as many queries as keys, got Nq={Nq}, Nk={Nk}")
    cq, ck = check_weight(weight, num_heads=Hq, device=q.device)
    causal = check_causal(causal)
    scale = resolve_scale(scale, D)
    ct = compute_dtype(q, weight)
    s = scale * (q.to(ct) @ expand_kv(k, Hq).to(ct).transpose(-1, -2))  # [B, Hq, N, N]
    if s.numel() == 0:  # no batch, head or position: nothing to convolve (F.conv2d refuses it); the weight
        return s + 0.0 * weight.to(ct).sum()  # stays in the graph, so its gradient is zeros, as the kernel's
    future = causal_future(Nq, Nk, q.device)
    if causal:
        s = s.masked_fill(future, 0.0)
    pad_k = (ck - 1) // 2
    c = F.conv2d(F.pad(s, (pad_k, pad_k, cq - 1, 0)), weight.to(ct)[:, None], groups=Hq)
    if causal:
        c = c.masked_fill(future, float("-inf"))
    return c
