"""Host-side tensor descriptors for Hopper's copy engine (TMA), where the MTA kernels' streamed tiles use it."""

from __future__ import annotations

import torch

from . import runtime

try:  # host-side TMA descriptors (Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the pointer path only
    TensorDescriptor = None


def tma_ready(t: torch.Tensor) -> bool:
    """The copy engine can read ``t``: contiguous rows, every other stride and the start 16-byte aligned."""
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(stride * t.element_size() % 16 == 0 for stride in t.stride()[:-1]))


def stream_descriptors(q, v, kf, copy_engine: bool = True):
    """``(QD, KFD, VD)``: TMA descriptors over ``q [B, Hq, N, D]``, ``kf [B, Hq, cq, N, D]`` and
    ``v [B, Hkv, N, D]`` for the kernel's reloaded (streamed) path, their boxes fitted to the tile at launch
    (:func:`mta.conv_forward.fit_stream_descriptors`); ``(None, None, None)`` where the copy engine does not
    apply (a GPU before Hopper, fp32, rows not 16-byte aligned) or is not wanted (``copy_engine`` False)."""
    on_hopper = runtime.INTERPRET or torch.cuda.get_device_capability(q.device)[0] >= 9
    if not (copy_engine and TensorDescriptor is not None and on_hopper
            and q.dtype in (torch.float16, torch.bfloat16) and all(tma_ready(t) for t in (q, v, kf))):
        return None, None, None
    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [1] * t.dim()) for t in (q, kf, v))


def descriptor(t: torch.Tensor, box: list[int]):
    """A TMA descriptor over the whole of ``t`` with block ``box`` (loads past its bounds read zeros, stores past
    them are dropped)."""
    return TensorDescriptor(t, list(t.shape), list(t.stride()), box)
