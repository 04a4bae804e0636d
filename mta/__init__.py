"""Fused attention kernels in Triton, from flash attention to Multi-Token Attention.

``mta.runtime`` is imported first: it switches Triton to its interpreter when
no CUDA device is present, before any kernel is defined.
"""

from . import runtime  # noqa: F401  (must come before any Triton kernel)
from .captured_step import CapturedStep, capture_step
from .conv import conv_attention
from .conv_decode import conv_decode_attention
from .decode import decode_attention
from .flash import flash_attention
from .graphed_calls import release_graphs
from .kv_cache import KVCache
from .layer import MultiTokenAttention
from .online_softmax import (
    AttentionState,
    attention_state,
    blocked_attention,
    blocked_softmax,
    empty_state,
    finalize_state,
    merge_states,
)
from .reference import conv_attention_reference, naive_attention
from . import ops  # noqa: E402  (the kernels as torch.library custom ops, for torch.compile)

__all__ = [
    "AttentionState",
    "CapturedStep",
    "KVCache",
    "MultiTokenAttention",
    "attention_state",
    "blocked_attention",
    "blocked_softmax",
    "capture_step",
    "conv_attention",
    "conv_attention_reference",
    "conv_decode_attention",
    "decode_attention",
    "empty_state",
    "finalize_state",
    "flash_attention",
    "merge_states",
    "naive_attention",
    "ops",
    "release_graphs",
    "runtime",
]

__version__ = "0.1.0"
