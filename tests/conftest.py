"""Shared test helpers: fresh random inputs, the device and dtypes to test on."""

from __future__ import annotations

import zlib

import pytest
import torch  # noqa: E402

import mta  # noqa: E402
from mta import runtime  # noqa: E402

DEVICE = runtime.DEVICE
ON_GPU = not runtime.INTERPRET


def rand(*shape, dtype=torch.float32, device=DEVICE, scale=1.0):
    """Fresh standard-normal values (never zeros), times ``scale``."""
    return (torch.randn(*shape, dtype=torch.float64) * scale).to(dtype=dtype, device=device)


def rand_qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float32, device=DEVICE):
    return rand(B, Hq, Nq, D, dtype=dtype, device=device), rand(B, Hkv, Nk, D, dtype=dtype, device=device), \
        rand(B, Hkv, Nk, D, dtype=dtype, device=device)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref|| / ||ref||`` in fp64; NaN anywhere gives inf."""
    x, ref = x.double().cpu(), ref.double().cpu()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()


@pytest.fixture(autouse=True)
def _seed(request):
    # A different but reproducible seed per test: inputs are fresh for each case.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


__all__ = ["DEVICE", "ON_GPU", "mta", "rand", "rand_qkv", "rel_err"]
