"""Input validation shared by every public function of ``mta``.

Each check raises ``TypeError`` (wrong kind of object or dtype) or
``ValueError`` (wrong shape or value) with a message that names the argument
and the problem, so that a caller never sees a wrong answer or an error from
deep inside Triton.
"""

from __future__ import annotations

import math
import numbers

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(name: str, x, *, ndim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:  # the kernels address memory through strides
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {x.layout}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (fp16, bf16, fp32, fp64), got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")


def check_qkv(q, k, v, names: tuple[str, str, str] = ("q", "k", "v")) -> tuple[int, int, int, int, int, int]:
    """Check ``q [B, Hq, Nq, D]``, ``k, v [B, Hkv, Nk, D]`` (called ``names`` in the messages); return
    (B, Hq, Hkv, Nq, Nk, D)."""
    qn, kn, vn = names
    for name, x in zip(names, (q, k, v)):
        check_tensor(name, x, ndim=4)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{qn}, {kn} and {vn} must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{qn}, {kn} and {vn} must be on one device, got {q.device}, {k.device}, {v.device}")
    B, Hq, Nq, D = q.shape
    Bk, Hkv, Nk, Dk = k.shape
    if k.shape != v.shape:
        raise ValueError(f"{kn} and {vn} must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if Bk != B:
        raise ValueError(f"batch sizes differ: {qn} has {B}, {kn} and {vn} have {Bk}")
    if Dk != D:
        raise ValueError(f"head dims differ: {qn} has D={D}, {kn} and {vn} have D={Dk}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"query heads must be a multiple of kv heads (GQA), got Hq={Hq}, Hkv={Hkv}")
    if D == 0:
        raise ValueError("head dim D must be at least 1")
    return B, Hq, Hkv, Nq, Nk, D


def check_weight(weight, *, num_heads: int, device: torch.device) -> tuple[int, int]:
    """Check an MTA kernel ``weight [Hq, cq, ck]``; return (cq, ck)."""
    check_tensor("weight", weight, ndim=3)
    Hw, cq, ck = weight.shape
    if Hw != num_heads:
        raise ValueError(f"weight must have one kernel per query head: shape[0]={Hw}, but Hq={num_heads}")
    if cq < 1 or ck < 1:
        raise ValueError(f"weight kernel must be at least 1 x 1, got {cq} x {ck}")
    if ck % 2 == 0:
        raise ValueError(f"the key-axis kernel size ck must be odd (it is centred on the key), got ck={ck}")
    if weight.device != device:
        raise ValueError(f"weight is on {weight.device} but q, k, v are on {device}")
    return cq, ck


def resolve_scale(scale, head_dim: int) -> float:
    """``scale`` or its default ``head_dim ** -0.5``, checked to be a finite number."""
    if scale is None:
        return head_dim ** -0.5
    if isinstance(scale, torch.SymFloat):  # traced with dynamic shapes: a value only known when the graph runs
        return scale
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if torch.compiler.is_compiling():  # the value may be symbolic here: the op checks it when the graph runs
        return scale
    try:
        value = float(scale)
    except OverflowError:  # an int too large for a float
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"scale must be finite, got {value}")
    return value


def check_causal(causal, name: str = "causal") -> bool:
    """``causal`` (or another flag, ``name``) as a Python bool: a bool (Python's or numpy's), nothing else
    (``causal="no"`` is not False)."""
    if isinstance(causal, bool) or (type(causal).__module__ == "numpy" and type(causal).__name__ in ("bool", "bool_")):
        return bool(causal)
    raise TypeError(f"{name} must be a bool, got {type(causal).__name__} {causal!r}")


def is_int(value) -> bool:
    """Whether ``value`` is an integer (Python's or numpy's), not a bool: ``True`` is not a length."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_int_list(values) -> bool:
    """Whether ``values`` is a list or tuple of integers (:func:`is_int`)."""
    return isinstance(values, (list, tuple)) and all(is_int(x) for x in values)


def check_count(name: str, value, *, minimum: int = 1) -> int:
    """An integer argument (a Python or numpy int, not a bool) of at least ``minimum``: TypeError for another kind of
    object, ValueError for a smaller value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def check_block_size(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return int(block_size)
