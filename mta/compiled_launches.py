"""Launching a kernel again the way it was launched before, without Triton's argument binding.

``kernel[grid](*args, **meta)`` binds every argument, works out what Triton specializes on (each pointer's
16-byte alignment, each int's value being 1 or a multiple of 16, the constexprs), hashes that to find the
compiled kernel, then launches it: tens of microseconds of Python per launch, more than many of the kernels
take on the GPU. A training step or a decode loop launches the same kernels on tensors of the same shapes call
after call, so :func:`launch_again` keeps, per launch signature, the compiled kernel Triton returned and the
constant tail of its argument list, and launches it directly the next time. A launcher that makes its launch
once per call signature (:class:`mta.launch.LaunchPlan`) keeps its compiled kernels itself
(:func:`run_kept`) and skips even the signature.

A kept launch also skips Triton's per-launch wrapper where no launch hook is installed (:func:`direct_launch`):
that wrapper looks up the device and stream and builds a dictionary for the hooks at every launch, whether or not
a hook reads it. With a hook installed (a profiler such as Proton), kept launches go through Triton's wrapper.

The signature holds everything the compile can depend on: the kernel, the grid, the current GPU, every
argument but a tensor's address (a tensor's dtype and alignment, an int's or float's type and value, a TMA
descriptor's shapes, strides and box) and every keyword. A call whose signature matches is the same compile,
launched on new addresses.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import triton
from triton.runtime.autotuner import Heuristics

try:  # Triton >= 3.4: the runtime's switches, launch hooks among them
    from triton import knobs
except ImportError:  # pragma: no cover
    knobs = None

try:  # Triton >= 3.4: TMA descriptors made on the host
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

#: Launch signatures kept (the oldest dropped first): a model has a few dozen; a loop over ever new shapes only
#: pays the signature's cost on top of Triton's own launch.
MAX_SIGNATURES = 4096
_SCALARS = (int, float, bool, str, type(None))

_made: OrderedDict = OrderedDict()


def signature(kernel, grid: tuple, args: tuple, meta: dict, device: int):
    """What a launch's compile depends on, hashable; None where an argument is of a kind not listed in the module
    docstring (such a launch always goes through Triton's binding)."""
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append((a.dtype, a.data_ptr() % 16 == 0))
        elif type(a) in _SCALARS:
            parts.append((type(a), a))
        elif TensorDescriptor is not None and isinstance(a, TensorDescriptor):
            parts.append((a.base.dtype, a.base.data_ptr() % 16 == 0, tuple(a.shape), tuple(a.strides),
                          tuple(a.block_shape), getattr(a, "padding", None)))
        else:
            return None
    return kernel, grid, device, tuple(parts), tuple(meta.items())


def launch_again(kernel, grid: tuple, args: tuple, meta: dict):
    """``kernel[grid](*args, **meta)`` on the current GPU: from the kept compiled kernel where this signature was
    launched before, else through Triton, keeping what it returns. Returns Triton's compiled kernel."""
    if isinstance(kernel, Heuristics):
        kernel, meta = kernel.fn, with_heuristics(kernel, args, meta)
    if not isinstance(kernel, triton.runtime.jit.JITFunction):  # an autotuner picks its own compile per call
        return kernel[grid](*args, **meta)
    key = signature(kernel, grid, args, meta, torch.cuda.current_device())
    try:
        made = _made.get(key) if key is not None else None
    except TypeError:  # an unhashable keyword
        key = made = None
    if made is not None:
        run, tail = made
        run(*args, *tail)
        return None
    compiled = kernel[grid](*args, **meta)
    if key is not None and compiled is not None:
        _made[key] = (direct_launch(compiled, grid, key[2]), _tail(kernel, len(args), meta))
        if len(_made) > MAX_SIGNATURES:
            _made.popitem(last=False)
    return compiled


def with_heuristics(kernel: Heuristics, args: tuple, meta: dict) -> dict:
    """``meta`` with the values of ``kernel``'s ``triton.heuristics``, made from the arguments as Triton makes
    them (in order, each seeing those before it), so that the kernel under them is launched as a plain one."""
    meta = dict(meta)
    for name, value in kernel.values.items():
        meta[name] = value({**dict(zip(kernel.arg_names, args)), **meta})
    return meta


def run_kept(kept: dict, kernel, grid: tuple, tensors: tuple, fixed: tuple, meta: dict, device: int):
    """``kernel[grid](*tensors, *fixed, **meta)`` on the current GPU ``device``, for a launch whose arguments but
    its leading ``tensors`` (None for an optional one; a TMA descriptor stands for its tensor) were fixed once:
    from ``kept`` (a plan's own dict: the compiled kernel per GPU and alignment of the tensors) where launched so
    before, else through Triton."""
    key = (device, *[None if t is None else getattr(t, "base", t).data_ptr() % 16 == 0 for t in tensors])
    made = kept.get(key)
    if made is not None:
        run, rest = made
        return run(*tensors, *rest)
    compiled = kernel[grid](*tensors, *fixed, **meta)
    if compiled is not None:
        kept[key] = (direct_launch(compiled, grid, device), fixed + _tail(kernel, len(tensors) + len(fixed), meta))
    return compiled


def direct_launch(compiled, grid: tuple, device: int):
    """``compiled[grid]`` (Triton's launch of a compiled kernel, taking every argument but the constexprs), made
    to call the kernel's C launcher directly, on the current stream of GPU ``device``, while no launch hook is
    installed; through Triton's own wrapper (which calls the hooks) otherwise, or where this Triton's compiled
    kernel lacks what the direct call needs."""
    grid = tuple(grid) + (1,) * (3 - len(grid))  # a compiled kernel's launch takes all three grid axes
    wrapped = compiled[grid]
    try:
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        current_stream = torch._C._cuda_getCurrentRawStream
    except AttributeError:
        return wrapped
    if knobs is None:
        return wrapped
    gx, gy, gz = grid

    def launch(*args):
        if launch_hooks_installed():
            return wrapped(*args)
        return run(gx, gy, gz, current_stream(device), function, packed, None, None, None, *args)

    return launch


def launch_hooks_installed() -> bool:
    """Whether Triton's launch hooks (a profiler's, such as Proton's) call anything: launches must then go through
    Triton's wrapper, where the hooks see them."""
    hooks = getattr(knobs, "runtime", None)
    return hooks is not None and (hook_installed(hooks.launch_enter_hook) or hook_installed(hooks.launch_exit_hook))


def hook_installed(hook) -> bool:
    """Whether Triton's launch hook ``hook`` calls anything: a chain of hooks (Triton >= 3.5) holding one, or a
    function (older Triton)."""
    return bool(getattr(hook, "calls", hook))


def _tail(kernel, positional: int, meta: dict) -> tuple:
    """The kernel's parameters after the ``positional`` ones, in order: the keywords given, else the defaults
    (what Triton's binding passes the compiled kernel, constexprs included)."""
    return tuple(meta[p.name] if p.name in meta else p.default for p in kernel.params[positional:])


def forget() -> None:
    """Drop every kept launch (for tests)."""
    _made.clear()
