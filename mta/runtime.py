"""Where the kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

This module is the one place that decides it. ``import mta`` imports it
first, before any ``@triton.jit`` function is defined, because Triton reads
``TRITON_INTERPRET`` when a kernel is defined, not when it is launched.

* With a CUDA device, kernels compile for it and every dtype is safe.
* Without one, ``TRITON_INTERPRET=1`` is set so the same kernels run in
  Triton's NumPy interpreter on the CPU. There ``tl.dot`` on bfloat16 gives
  wrong results, so only float32 and float16 are offered as safe.
* A ``TRITON_INTERPRET`` that the user set explicitly (to anything) wins.

Notebooks and tests read ``DEVICE``, ``INTERPRET`` and ``SAFE_DTYPES`` from
here instead of probing the machine themselves.
"""

from __future__ import annotations

import os

import torch

HAS_CUDA: bool = torch.cuda.is_available()

if not HAS_CUDA and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

#: True when Triton kernels run in the interpreter (on CPU tensors): the values Triton itself reads as on.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes", "y")

#: The device that tensors for ``mta`` kernels should live on.
DEVICE: torch.device = torch.device("cpu" if INTERPRET or not HAS_CUDA else "cuda")

#: Dtypes whose results are trustworthy on ``DEVICE``.
SAFE_DTYPES: tuple[torch.dtype, ...] = (
    (torch.float32, torch.float16) if DEVICE.type == "cpu" else (torch.float32, torch.float16, torch.bfloat16)
)


def skip_dropped_overflow_checks() -> bool:
    """In Triton's interpreter, stop computing the int32 overflow checks of integer ``+``, ``-`` and ``*``; True if
    they were on. The interpreter builds each check as NumPy arithmetic and then drops it, since it keeps device
    asserts only in debug mode: about a third of a kernel's time on the CPU for nothing. No value a kernel computes
    changes. Nothing is done where the interpreter is off, in debug mode, or has no such option."""
    if not INTERPRET:
        return False
    import dataclasses

    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not (dataclasses.is_dataclass(options) and getattr(options, "sanitize_overflow", False)
            and getattr(options, "debug", True) is False):
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


skip_dropped_overflow_checks()


def describe() -> str:
    """One line saying where kernels run, for notebooks and bug reports."""
    if INTERPRET:
        return "Triton interpreter on the CPU (no CUDA device, or TRITON_INTERPRET set)"
    if not HAS_CUDA:
        return ("no CUDA device and TRITON_INTERPRET is off: the Triton kernels cannot run here "
                "(unset TRITON_INTERPRET, or set it to 1)")
    return f"compiled Triton on {torch.cuda.get_device_name(DEVICE)}"
