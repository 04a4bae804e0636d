"""Rotary position embedding (RoPE, arXiv 2104.09864) at arbitrary positions.

Pairs channel ``c`` with channel ``c + D/2`` (the "rotate half" layout) and turns each pair by the angle
``position * theta ** (-2c / D)``. Positions are explicit so that a decode step can rotate each sequence's new
tokens at that sequence's own length. The angles are computed in fp32 and the result is cast back to the input's
dtype, so bf16 activations stay bf16.
"""

from __future__ import annotations

import torch


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """``positions [...]`` (ints) -> angles ``[..., head_dim // 2]`` fp32."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dim, got {head_dim}")
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    return positions.to(torch.float32)[..., None] * inv_freq


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x [B, H, N, D]`` at ``positions``: ``[N]`` (shared by the batch) or ``[B, N]`` (per sequence).

    Returns a tensor of x's shape and dtype.
    """
    # Positions may live on the host (a cache keeps its lengths there); the angles go where x is.
    angles = rope_angles(positions.to(x.device, non_blocking=True), x.shape[-1], theta)  # [N, D/2] or [B, N, D/2]
    if angles.dim() == 3:
        angles = angles[:, None]                                  # broadcast over the heads
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


__all__ = ["apply_rope", "rope_angles"]
