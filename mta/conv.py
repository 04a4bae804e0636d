"""``mta.conv_attention``: Multi-Token Attention's forward, fused in Triton.

The kernel is in :mod:`mta.conv_forward`; this module checks inputs, folds
the key axis of the convolution into the keys, and launches it.
"""

from __future__ import annotations

import torch
import triton

from . import runtime, tuning
from ._checks import check_weight, resolve_scale
from .conv_forward import conv_forward_kernel, fold_keys_kernel
from .flash import check_kernel_inputs, dot_precision, head_dim_block, size_bucket

MAX_CQ = 32


def fold_keys(k: torch.Tensor, weight: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """``Kf[b, h, a, j] = sum_b' w[h, a, b'] * k[b, h // G, j - pk + b']`` (zero outside ``[0, N)``).

    The key axis of the convolution, applied to the keys once (O(N) memory).

    Args:
        k: ``[B, Hkv, N, D]``.
        weight: ``[Hq, cq, ck]``.
    Returns:
        ``[B, Hq, cq, N, D]`` in k's dtype (accumulated in fp32).
    """
    B, Hkv, N, D = k.shape
    _, cq, ck = weight.shape
    w = weight.detach().float().contiguous()
    kf = torch.empty((B, num_q_heads, cq, N, D), device=k.device, dtype=k.dtype)
    block_d = head_dim_block(D)
    # The interpreter pays per operation, not per element; on a GPU, 32 x 64 fp32 accumulators per warp.
    block_n = 128 if runtime.INTERPRET else max(16, 8192 // block_d)
    fold_keys_kernel[(triton.cdiv(N, block_n), cq, B * num_q_heads)](
        k, w, kf, *k.stride(), *kf.stride(), N, num_q_heads, num_q_heads // Hkv,
        CQ=cq, CK=ck, D=D, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=4)
    return kf


def conv_attention_forward(q, k, v, weight, causal: bool, scale: float):
    """Launch the fused kernel: ``o [B, Hq, N, D]`` (q's dtype) and ``lse [B, Hq, N]`` (fp32)."""
    B, Hq, N, D = q.shape
    Hkv = k.shape[1]
    cq, ck = weight.shape[1:]
    w = weight.detach().float().contiguous()
    kf = fold_keys(k.detach(), w, Hq)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, N), device=q.device, dtype=torch.float32)
    precision = dot_precision(q.dtype)
    conv_forward_kernel[lambda meta: (triton.cdiv(N, meta["BLOCK_M"]), B * Hq)](
        q, k, v, kf, w, o, lse, *q.stride(), *k.stride(), *v.stride(), *kf.stride(), *o.stride(),
        N, N, Hq, Hq // Hkv, scale, size_bucket(N),
        CAUSAL=causal, CQ=cq, CK=ck, D=D, BLOCK_D=head_dim_block(D), PRECISION=precision,
        # The Toeplitz product multiplies fp32 scores; for 16-bit inputs tf32 (10-bit mantissa) is
        # as fine as the folded keys' own rounding to fp16/bf16.
        CONV_PRECISION="ieee" if precision == "ieee" else "tf32")
    return o, lse


class ConvAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, weight, causal, scale):
        o, lse = conv_attention_forward(q, k, v, weight, causal, scale)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        raise NotImplementedError(
            "the backward of mta.conv_attention (dq, dk, dv, dweight) is not implemented yet (chapter 05); "
            "for gradients use mta.conv_attention_reference, which autograd differentiates")


def conv_attention(q, k, v, weight, *, causal: bool = True, scale: float | None = None, return_lse: bool = False):
    """Multi-Token Attention (key-query convolution before the softmax), fused, O(N) memory.

    Exactly :func:`mta.conv_attention_reference` (``shared/mta-semantics.md``)
    without materializing any N x N matrix.

    Args:
        q: ``[B, Hq, N, D]``; fp16, bf16 or fp32.
        k, v: ``[B, Hkv, N, D]``, ``Hq % Hkv == 0``.
        weight: ``[Hq, cq, ck]``, ``1 <= cq <= 32``, odd ``ck`` up to 33 on a GPU
            (17 in the interpreter); any float dtype, used in fp32.
        causal: the MTA case (default).
        scale: default ``D ** -0.5``, applied before the convolution.
        return_lse: also return the fp32 log-sum-exp of each row of the convolved scores.

    Forward only for now: backward raises ``NotImplementedError``.
    """
    _, Hq, _, Nq, Nk, D = check_kernel_inputs(q, k, v)
    if Nq != Nk:
        raise ValueError(f"conv attention needs as many queries as keys, got Nq={Nq}, Nk={Nk}")
    cq, ck = check_weight(weight, num_heads=Hq, device=q.device)
    if cq > MAX_CQ or ck > tuning.CONV_MAX_CK:
        raise ValueError(f"kernel {cq} x {ck} is not supported: at most cq={MAX_CQ} and ck={tuning.CONV_MAX_CK} here")
    scale = resolve_scale(scale, D)
    o, lse = ConvAttention.apply(q, k, v, weight, bool(causal), scale)
    return (o, lse) if return_lse else o
