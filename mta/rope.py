"""Rotary position embedding (RoPE, arXiv 2104.09864) at arbitrary positions.

Pairs channel ``c`` with channel ``c + D/2`` (the "rotate half" layout) and turns each pair by the angle
``position * theta ** (-2c / D)``. Positions are explicit so that a decode step can rotate each sequence's new
tokens at that sequence's own length. The angles are computed in fp32 and the result is cast back to the input's
dtype, so bf16 activations stay bf16.
"""

from __future__ import annotations

import math
import numbers

import torch

#: Positions below this have finite angles in fp32 for every base :func:`check_theta` accepts.
MAX_POSITION = 2 ** 31


def check_theta(theta, head_dim: int, name: str = "theta") -> float:
    """The RoPE base ``theta`` (called ``name`` in the messages) as a float: a real number, finite and positive, whose
    angles ``position * theta ** (-2c / head_dim)`` are finite fp32 numbers for every position below
    :data:`MAX_POSITION` (a base under 1 has frequencies over 1; fp32 holds a base under 1e-38 as 0, an infinite
    frequency). ``head_dim`` must be even."""
    if isinstance(theta, bool) or not isinstance(theta, numbers.Real):
        raise TypeError(f"{name} must be a real number (the RoPE base, e.g. 10000), got {theta!r}")
    try:
        value = float(theta)
    except OverflowError:  # an int too large for a float
        value = math.inf
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number (the RoPE base), got {theta}")
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dim, got {head_dim}")
    fp32 = torch.finfo(torch.float32)
    highest = value ** (-(head_dim - 2) / head_dim) if value < 1 else 1.0  # the first pair's frequency is 1
    if value < fp32.tiny or highest * MAX_POSITION > fp32.max:
        raise ValueError(f"{name}={value} is too small for RoPE in fp32: its highest frequency at head dim {head_dim}, "
                         f"{highest:.3g}, times positions up to 2**31 leaves fp32's range (NaN angles)")
    return value


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """``positions [...]`` (ints) -> angles ``[..., head_dim // 2]`` fp32 (``theta``: :func:`check_theta`)."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dim, got {head_dim}")
    if not torch.compiler.is_compiling():  # traced, theta may be symbolic (as a scale: mta.checks.resolve_scale)
        check_theta(theta, head_dim)
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    return positions.to(torch.float32)[..., None] * inv_freq


def rope_rotation(x: torch.Tensor, positions: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` for heads shaped like ``x [B, H, N, D]`` at ``positions`` (``[N]``, shared by the batch, or
    ``[B, N]``, per sequence): fp32 ``[N, D]`` or ``[B, 1, N, D]`` on x's device, ``cos`` of the angles repeated
    for both halves of a pair, ``sin`` with the first half negated, so that :func:`rotate` is two products and a
    sum. Made once, they rotate the queries and the keys alike."""
    _check_positions(x, positions)
    # Positions may live on the host (a cache keeps its lengths there); the angles go where x is.
    angles = rope_angles(positions.to(x.device, non_blocking=True), x.shape[-1], theta)  # [N, D/2] or [B, N, D/2]
    if angles.dim() == 3:
        angles = angles[:, None]                                  # broadcast over the heads
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def rotate(x: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``x [B, H, N, D]`` turned by ``rotation`` (:func:`rope_rotation`'s ``(cos, sin)``), in fp32: the pair
    ``(x1, x2)`` of channels ``c`` and ``c + D/2`` becomes ``(x1 cos - x2 sin, x2 cos + x1 sin)``. Returns a tensor
    of x's shape and dtype."""
    cos, sin = rotation
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    return (x32 * cos + torch.cat((x2, x1), dim=-1) * sin).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x [B, H, N, D]`` at ``positions``: ``[N]`` (shared by the batch) or ``[B, N]`` (per sequence).

    Returns a tensor of x's shape and dtype.
    """
    return rotate(x, rope_rotation(x, positions, theta))


def _check_positions(x, positions) -> None:
    """``x`` is ``[B, H, N, D]`` and ``positions`` a tensor ``[N]`` or ``[B, N]`` (no other shape broadcasts
    silently)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a [B, H, N, D] tensor, got {got}")
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"positions must be a tensor [N] or [B, N], got {type(positions).__name__}")
    B, _, N, _ = x.shape
    if tuple(positions.shape) not in ((N,), (B, N)):
        raise ValueError(f"positions must be [N] or [B, N] for x [B, H, N, D] = {tuple(x.shape)}, got shape "
                         f"{tuple(positions.shape)}")


__all__ = ["apply_rope", "check_theta", "rope_angles", "rope_rotation", "rotate"]
