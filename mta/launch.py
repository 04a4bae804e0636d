"""What every launcher shares: input checks for the kernels, head-dim tiles, and launching.

Every kernel is launched through :func:`launch`. :func:`tiled_launch` takes the tile from :mod:`mta.tuning`'s
tables (the default: nothing is timed at call time) or, with ``MTA_AUTOTUNE=1``, from Triton's autotuner over
the table's candidates. The autotuner's choices are cached
on disk, so each shape bucket is timed once per machine, and candidates that cannot fit in shared memory or
registers are pruned before they are compiled.

A first call compiles its kernels; :func:`compile_ahead` compiles all of them side by side instead of one
after the other.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
import os
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import triton
from triton.runtime.autotuner import Heuristics

try:  # Triton >= 3.5: a launch inside this mode queues its compile in an executor
    from triton import AsyncCompileMode
except ImportError:  # pragma: no cover - older Triton compiles at each launch
    AsyncCompileMode = None

from . import runtime, tuning
from .checks import check_qkv
from .compiled_launches import launch_again, run_kept, with_heuristics

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256

# Triton turns an int argument equal to 1 into a constant. With n_q = n_k = 1
# both constant, the causal fp16/bf16 flash forward makes the ptxas bundled
# with Triton 3.6 (CUDA 12.8; 12.9 too, 13.0 not) segfault: seen on an H200,
# reproduced offline. Sequence lengths stay run-time values (and the bucket
# is only the autotuner's key: specializing it would only add compiles).
#: Kernel arguments passed to ``triton.jit(do_not_specialize=...)``.
NO_SPECIALIZE = ["n_q", "n_k", "N_BUCKET"]


def check_kernel_device(**tensors: torch.Tensor) -> None:
    """Each named tensor is where the Triton kernels run: the GPU, or the CPU in interpreter mode."""
    for name, x in tensors.items():
        if runtime.INTERPRET and x.device.type != "cpu":
            raise ValueError(f"Triton runs in interpreter mode (TRITON_INTERPRET=1): {name} must be on the cpu, "
                             f"got {x.device}")
        if not runtime.INTERPRET and x.device.type != "cuda":
            raise ValueError(f"Triton kernels run on the GPU: {name} must be a cuda tensor, got {x.device}")


#: CUDA's limit on a grid's second axis, where the kernels put batch x heads: a larger batch is launched in
#: chunks of sequences (:func:`batch_chunks`).
MAX_GRID_AXIS_1 = 65535


def batch_chunks(batch: int, programs_per_sequence: int) -> list[tuple[int, int]] | None:
    """None when ``batch * programs_per_sequence`` fit on a grid's second axis (:data:`MAX_GRID_AXIS_1`); else
    the ``[start, stop)`` ranges of sequences, in order, whose programs do."""
    if batch * programs_per_sequence <= MAX_GRID_AXIS_1:
        return None
    step = MAX_GRID_AXIS_1 // programs_per_sequence
    return [(b, min(b + step, batch)) for b in range(0, batch, step)]


def concat_chunks(chunks: list[tuple[int, int]], fn, batched: tuple, *rest) -> tuple:
    """``fn(*(t[a:b] for t in batched), *rest)`` for each ``(a, b)`` of ``chunks`` (:func:`batch_chunks`), its
    outputs concatenated along the batch."""
    parts = [fn(*(t[a:b] for t in batched), *rest) for a, b in chunks]
    return tuple(torch.cat(x) for x in zip(*parts))


def check_kernel_inputs(q, k, v, *, per_kv_head: bool = False,
                        names: tuple[str, str, str] = ("q", "k", "v")) -> tuple[int, int, int, int, int, int]:
    """Shapes as :func:`mta.checks.check_qkv`, plus what the Triton kernels need. ``per_kv_head``: the kernels'
    grids count ``Hkv`` programs per sequence on the axis of :data:`MAX_GRID_AXIS_1` (decode), not ``Hq``."""
    dims = check_qkv(q, k, v, names)
    heads = dims[2] if per_kv_head else dims[1]
    if heads > MAX_GRID_AXIS_1:  # more batch x heads is launched in chunks of sequences; one sequence must fit
        raise ValueError(f"{heads} {'kv heads' if per_kv_head else 'heads'} are over {MAX_GRID_AXIS_1}, the most "
                         f"programs a CUDA grid takes on the axis the kernels give a sequence's heads")
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(f"Triton kernels take fp16, bf16 or fp32 inputs, got {q.dtype}")
    check_kernel_device(q=q)
    if runtime.INTERPRET and q.dtype == torch.bfloat16:
        raise TypeError("bf16 is not supported in Triton's interpreter (its tl.dot gives wrong bf16 results); "
                        "use fp16 or fp32 on the CPU, or bf16 on a GPU")
    if dims[5] > MAX_HEAD_DIM:
        raise ValueError(f"head dim D={dims[5]} is not supported (at most {MAX_HEAD_DIM})")
    return dims


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints. The launchers use these two, not ``triton.cdiv`` / ``triton.next_power_of_2``:
    Triton's are constexpr functions, a few microseconds per call on the host, and a decode step is host-bound."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << max(n - 1, 0).bit_length()


def head_dim_block(d: int) -> int:
    """Tile width for head dim ``d``: a power of two >= 16 (tl.dot needs K >= 16)."""
    return max(16, next_power_of_2(d))


def shifted_head_dim_block(d: int, dtype: torch.dtype) -> int:
    """Tile width for the MTA kernels, whose tiles hold ``cq`` shifted copies of the head dim side by side:
    :func:`head_dim_block`, except 64 for 16-bit inputs whose head dim is padded inside a tile of 16 or 32
    (``d`` in 1..15 or 17..31). With Triton 3.6 on Hopper those padded tiles give wrong outputs where their rows
    are also read element by element (a row stride that is not a multiple of 16); padded tiles of 64 are exact."""
    block = head_dim_block(d)
    return 64 if block <= 32 and d != block and dtype in (torch.float16, torch.bfloat16) else block


def dot_precision(dtype: torch.dtype, split_fp32: bool = True) -> str:
    """fp32 inputs get fp32-accurate products: each one as three TF32 products on the tensor cores
    (``"tf32x3"``: the high and low halves of each operand, the tiny low x low term dropped), not plain TF32
    (a 10-bit mantissa). True fp32 products (``"ieee"``) run on the CUDA cores and take several times longer
    to compile and run, for no accuracy the fp32 tests can see; ``split_fp32=False`` asks for them in the MTA
    kernels, whose wide shifted-query tiles split into tf32x3 operands do not fit in shared memory (308 KB
    for 11 x 15 at d = 32, more than an H100 has). fp16/bf16 use the tensor cores directly."""
    if dtype != torch.float32:
        return "tf32"
    return "tf32x3" if split_fp32 else "ieee"


def fits_on_chip(config: dict, block_d: int, elem_bytes: int, shared_bytes: int) -> bool:
    """A rough bound that rules out tiles before they are compiled: the query tile plus ``num_stages``
    key/value tiles in shared memory, and the fp32 accumulator at most 128 registers per thread."""
    m, n, stages = config["BLOCK_M"], config["BLOCK_N"], config["num_stages"]
    shared = (m + 2 * max(stages - 1, 1) * n) * block_d * elem_bytes
    acc_registers = m * block_d // (32 * config["num_warps"])
    return shared <= shared_bytes and acc_registers <= 128


def shared_memory_limit(device: torch.device) -> int:
    """Bytes of shared memory one program may use on ``device``."""
    return _shared_memory_limit(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _shared_memory_limit(index) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def _prune(configs, named_args, **kwargs):
    meta = {**named_args, **kwargs}
    device = next(a.device for a in named_args.values() if isinstance(a, torch.Tensor))
    shared = shared_memory_limit(device)
    elem = next(a.element_size() for a in named_args.values() if isinstance(a, torch.Tensor))
    kept = [c for c in configs if fits_on_chip({**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages},
                                               meta["BLOCK_D"], elem, shared)]
    return kept or configs[-1:]


#: The autotuned kernels made so far (``MTA_AUTOTUNE=1``), by kernel name; ``tools/tune_tables.py`` reads them.
AUTOTUNED: dict = {}


@functools.cache
def _autotuned(kernel_name: str, kernel, key: tuple[str, ...], pre_hook):
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s, pre_hook=pre_hook)
               for m, n, w, s in tuning.CANDIDATES[kernel_name]]
    # Triton >= 3.3 keeps the choice on disk (its cache directory), so each shape bucket is timed once per machine.
    on_disk = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    tuner = triton.autotune(configs=configs, key=list(key), prune_configs_by={"early_config_prune": _prune},
                            **on_disk)(kernel)
    AUTOTUNED[kernel_name] = tuner
    return tuner


@dataclass(frozen=True)
class Launch:
    """One kernel launch, made before it runs: ``kernel[grid](*args, **meta)`` (:func:`launch`). Calling it
    launches; a benchmark may run the same launch with another build of the kernel (``dataclasses.replace``)."""

    kernel: object
    grid: tuple
    args: tuple
    meta: dict

    def __call__(self):
        return launch(self.kernel, self.grid, *self.args, **self.meta)

    def plan(self, tensors: int) -> LaunchPlan:
        """This launch as a :class:`LaunchPlan` whose first ``tensors`` arguments change from call to call."""
        if isinstance(self.grid, tuple) and max(self.grid[1:], default=0) > MAX_GRID_AXIS_1:
            raise RuntimeError(f"grid {self.grid} is over CUDA's {MAX_GRID_AXIS_1} programs on its second or third "
                               "axis")
        kernel, meta = self.kernel, self.meta
        if isinstance(kernel, Heuristics):  # their values depend on what the plan fixes: made once, here
            kernel, meta = kernel.fn, with_heuristics(kernel, self.args, meta)
        return LaunchPlan(kernel, self.grid, self.args[tensors:], meta)


@dataclass(frozen=True, eq=False)
class LaunchPlan:
    """A launch made once per call signature: ``kernel[grid](*tensors, *fixed, **meta)``, where only the leading
    ``tensors`` (None for an optional one) change from call to call. Calling it with them launches; on a GPU,
    after the first call, without Triton's argument binding (:func:`mta.compiled_launches.run_kept`). Made from
    a :class:`Launch` by :meth:`Launch.plan`, kept by :class:`LaunchPlans`."""

    kernel: object
    grid: tuple
    fixed: tuple
    meta: dict
    kept: dict = field(default_factory=dict, repr=False)

    def __call__(self, *tensors):
        if not (runtime.INTERPRET or in_dry_run()) and isinstance(self.kernel, triton.runtime.jit.JITFunction):
            device = torch.cuda.current_device()
            if tensors[0].device.index == device:  # else launch's device guard
                return run_kept(self.kept, self.kernel, self.grid, tensors, self.fixed, self.meta, device)
        return launch(self.kernel, self.grid, *tensors, *self.fixed, **self.meta)

    def on(self, *tensors) -> "Launch":
        """The :class:`Launch` of this plan on ``tensors``."""
        return Launch(self.kernel, self.grid, (*tensors, *self.fixed), self.meta)


class LaunchPlans:
    """:class:`LaunchPlan` s by call signature (any hashable key: shapes, strides, dtypes, device, flags), at most
    ``size`` of them (the oldest dropped first)."""

    def __init__(self, size: int = 1024):
        self.size = size
        self._plans: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, key, make) -> LaunchPlan:
        """The plan kept for ``key``, else ``make()``'s, kept."""
        plan = self._plans.get(key)
        if plan is None:
            plan = self.keep(key, make())
        return plan

    def find(self, key):
        """The plan kept for ``key``, else None (None for a ``key`` of None)."""
        return None if key is None else self._plans.get(key)

    def keep(self, key, plan):
        """Keep ``plan`` for ``key``, dropping the oldest past :attr:`size`; returns ``plan``."""
        self._plans[key] = plan
        if len(self._plans) > self.size:
            self._plans.popitem(last=False)
        return plan


class CallLaunches:
    """The launches of one call signature by name, each a :class:`LaunchPlan` made at the signature's first call:
    for a launcher whose launches are many and vary with the shapes (the MTA backward's, chunk by chunk). Kept per
    signature in a :class:`LaunchPlans` (``plans.get(signature, CallLaunches)``)."""

    def __init__(self):
        self.plans: dict = {}

    def run(self, name, make, *tensors):
        """Launch ``make(*tensors)`` (a :class:`Launch` whose arguments start with ``tensors``) on ``tensors``:
        made into a plan under ``name`` at the first call, launched without ``make`` after. ``name`` stands for
        everything of the launch that is not a tensor, given the call signature (a kernel and a chunk index)."""
        plan = self.plans.get(name)
        if plan is None:
            made = make(*tensors)
            if any(a is not t for a, t in zip(made.args, tensors)):
                raise RuntimeError(f"launch {name!r}: its arguments do not start with the tensors it is run on")
            plan = self.plans[name] = made.plan(len(tensors))
        return plan(*tensors)


def tensor_facts(t: torch.Tensor) -> tuple:
    """``(shape, strides, dtype, device)`` of ``t``: with the other arguments, what a checked call's signature
    holds of a tensor (its address aside)."""
    return t.shape, t.stride(), t.dtype, t.device


def checked_signature(*arguments):
    """What the checks and the plan of a public call depend on: each tensor's :func:`tensor_facts`, each other
    argument's type and value (``True == 1``, but only a bool is a flag). None outside plain eager calls (a trace
    takes the custom op; ``torch.func``'s transforms take the checked way) or where an argument is of no hashable
    value (the checks name it)."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return None
    try:
        signature = tuple(tensor_facts(a) if isinstance(a, torch.Tensor) else (type(a), a) for a in arguments)
        hash(signature)
    except TypeError:
        return None
    return signature


def tiled_launch(kernel_name: str, kernel, grid, args: tuple, meta: dict, *, dtype: torch.dtype, fit=None,
                 pre_hook=None, key=("N_BUCKET", "BLOCK_D", "CAUSAL"), n: int | None = None) -> Launch:
    """The :class:`Launch` of ``kernel`` with the table's tile (:func:`mta.tuning.config_for` with ``kernel_name``,
    passed through ``fit(tile) -> tile`` where the kernel has a rule of its own; ``grid(tile)`` is the grid), or,
    with ``MTA_AUTOTUNE=1`` on a GPU, the autotuner's choice among ``tuning.CANDIDATES[kernel_name]`` per ``key``.

    ``n`` (the longer sequence) picks the table's tile where it depends on the length. ``pre_hook(named_args)``
    runs before the launch with every argument by name, the tile's included (the MTA forward fits its TMA boxes
    to the tile there).
    """
    if tuning.AUTOTUNE and not runtime.INTERPRET:
        return Launch(_autotuned(kernel_name, kernel, tuple(key), pre_hook), grid, args, meta)
    config = tuning.config_for(kernel_name, meta["BLOCK_D"], dtype, meta.get("CAUSAL", False), n=n)
    if fit is not None:
        config = fit(config)
    if pre_hook is not None:
        pre_hook({**dict(zip(kernel.arg_names, args)), **meta, **config})
    return Launch(kernel, grid(config) if callable(grid) else grid, args, {**meta, **config})


# ----------------------------------------------------------------------------------------------------------------
# Launching, and compiling a first call's kernels side by side

#: ``MTA_COMPILE_AHEAD=0`` turns :func:`compile_ahead` off (each launch then compiles its own kernel).
COMPILE_AHEAD = os.environ.get("MTA_COMPILE_AHEAD", "1") != "0"
_DRY_RUN = contextvars.ContextVar("mta_dry_run", default=False)
_COMPILED_AHEAD: set = set()
_SEEN_EXACTLY: set = set()
#: ``(name, error)`` of each dry run that failed (the calls then compiled as they went): for tests.
DRY_RUN_ERRORS: list = []


def in_dry_run() -> bool:
    """Inside :func:`compile_ahead`'s dry run, where :func:`launch` only compiles."""
    return _DRY_RUN.get()


def empty_contiguous(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new contiguous tensor of ``x``'s shape, on its device (``dtype``: default ``x``'s), whatever ``x``'s
    strides (``torch.empty_like`` keeps them)."""
    return torch.empty(x.shape, dtype=x.dtype if dtype is None else dtype, device=x.device)


#: Elements a kernel's int32 index arithmetic reaches: positions and features are int32 in the flash and MTA
#: kernels (batch and head offsets are int64).
INT32_INDEX_LIMIT = 2 ** 31


def within_int32_indexing(*tensors: torch.Tensor, rows_per_head: int = 1) -> list[torch.Tensor]:
    """``tensors`` (``[B, H, N, D]``), each copied contiguous where one head's positions and features span
    :data:`INT32_INDEX_LIMIT` elements (a ``[B, N, H, D]`` view of 512k tokens x 32 heads of 128: position
    stride ``H D``), so that no ``position * stride`` wraps around. ValueError where even a contiguous head does
    not fit (``rows_per_head``: the ``N x D`` blocks a kernel keeps per head, MTA's ``cq`` folded copies)."""
    if all(t.is_contiguous() and t.numel() * rows_per_head < INT32_INDEX_LIMIT for t in tensors):
        return list(tensors)  # every head's span is under its tensor's size: the common case, decided at once
    out = [t.contiguous() if index_span(t, 2) >= INT32_INDEX_LIMIT else t for t in tensors]
    n, d = max((t.shape[2:] for t in out), key=lambda nd: nd[0] * nd[1])
    if rows_per_head * n * d >= INT32_INDEX_LIMIT:
        raise ValueError(f"sequences of {n} positions x head dim {d}"
                         + (f" x {rows_per_head} folded copies" if rows_per_head > 1 else "")
                         + " span 2**31 elements or more per head: more than the kernels index (int32)")
    return out


def index_span(t: torch.Tensor, first_axis: int) -> int:
    """Elements that one index of ``t``'s leading ``first_axis`` axes reaches through the others, first to last,
    plus one: what a kernel's int32 arithmetic must hold below the offsets it takes in int64 (called at every
    launch and decode step: contiguous tensors take the short way)."""
    if t.is_contiguous():
        return math.prod(t.shape[first_axis:])
    return sum(max(n - 1, 0) * st for n, st in zip(t.shape[first_axis:], t.stride()[first_axis:])) + 1


def wants_gradients(*tensors: torch.Tensor) -> bool:
    """An eager call whose backward will follow (autograd on, an input requiring grad, not being traced)."""
    return (not torch.compiler.is_compiling() and torch.is_grad_enabled()
            and any(t.requires_grad for t in tensors))


def on_device_of(args):
    """A context in which the current CUDA device is that of the first tensor in ``args``. Triton launches on the
    current device, not on its arguments' (tensors on ``cuda:1`` while ``cuda:0`` is current would be read from
    the wrong GPU), so every launch runs inside this, as torch's own operators run inside a device guard."""
    for x in args:
        if isinstance(x, torch.Tensor):
            if x.device.type == "cuda" and x.device.index != torch.cuda.current_device():
                return torch.cuda.device(x.device)
            break
    return contextlib.nullcontext()


#: Triton's interpreter patches ``triton.language`` while it runs a kernel: launches from several threads at once
#: fail inside it, so there they take turns (a GPU launch needs no lock).
_INTERPRETER_TURNS = threading.RLock()


def launch(kernel, grid, *args, **meta):
    """``kernel[grid](*args, **meta)`` (``grid`` a tuple, or a function of the tile for an autotuned kernel) on the
    device of its first tensor argument (:func:`on_device_of`), a launch signature seen before without Triton's
    argument binding (:func:`mta.compiled_launches.launch_again`); one thread at a time in Triton's interpreter;
    inside :func:`compile_ahead`'s dry run, only its compile, queued."""
    if isinstance(grid, tuple) and max(grid[1:], default=0) > MAX_GRID_AXIS_1:  # the launchers chunk batches
        raise RuntimeError(f"grid {grid} is over CUDA's {MAX_GRID_AXIS_1} programs on its second or third axis")
    if in_dry_run():
        return kernel.warmup(*args, grid=grid, **meta)
    if runtime.INTERPRET:
        with _INTERPRETER_TURNS:
            return kernel[grid](*args, **meta)
    with on_device_of(args):
        return launch_again(kernel, grid, args, meta)


@functools.cache
def _compile_pool(pid: int) -> ThreadPoolExecutor:
    # One per process: a forked child does not inherit the parent's threads.
    return ThreadPoolExecutor(max_workers=min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                              else os.cpu_count() or 1), thread_name_prefix="mta-compile")


def _signature(x):
    """What of an argument can change the kernels compiled for it: a tensor's dtype, its sizes but the batch,
    and whether its strides are 1 or multiples of 16 (Triton specializes on those); of the sequence length of a
    ``[B, H, N, D]`` tensor, too, only that (other tensors, such as a ``[H, cq, ck]`` weight, keep every size);
    anything else as it is."""
    if not isinstance(x, torch.Tensor):
        return x
    sizes = tuple((s == 1, s % 16 == 0) if i == 2 and x.dim() == 4 else s for i, s in enumerate(x.shape) if i > 0)
    return x.dtype, sizes, tuple((s == 1, s % 16 == 0) for s in x.stride())


def _build_launcher(compiling) -> None:
    # Triton builds each kernel's C launcher (a C compiler run) at its first launch; built here, in the pool, as
    # soon as its kernel is compiled (``compiling``: the compile's future), that first launch finds it in
    # Triton's cache.
    from triton.runtime.driver import driver
    kernel = compiling.result()
    if kernel is not None and hasattr(driver.active, "launcher_cls"):
        driver.active.launcher_cls(kernel.src, kernel.metadata)


def compile_ahead(name: str, launches, *args) -> None:
    """Compile every kernel that ``launches(*args)`` launches, side by side in threads, launching none: once per
    process for each ``name`` and signature of ``args`` (:func:`_signature`).

    Without it a first call compiles its kernels one after the other (seconds each: Triton's passes, ptxas,
    then a C compiler for the launcher), and the MTA forward and backward launch eleven. Here ``launches(*args)``
    runs once as a dry run on the call's own tensors, in which each :func:`launch` queues its kernel's compile
    (Triton's ``AsyncCompileMode``) in a thread pool, where LLVM and ptxas run without the GIL, and builds its
    launcher there too; every other operation (allocations, cuBLAS products, reductions) runs as usual, on
    buffers no kernel has written, and its results are dropped. The real launches that follow find their kernels
    compiled: they specialize on the same tensors. The launchers write only buffers they allocate, so the dry
    run leaves the inputs as they were. Nothing happens in Triton's interpreter, with ``MTA_AUTOTUNE=1`` (the
    autotuner compiles its candidates itself), with ``MTA_COMPILE_AHEAD=0``, or while ``torch.compile`` traces;
    if the dry run fails, the real call compiles, and reports errors, as it would without it.
    """
    if (torch.compiler.is_compiling() or not COMPILE_AHEAD or runtime.INTERPRET or tuning.AUTOTUNE
            or AsyncCompileMode is None or in_dry_run()):
        return
    # Every call asks: the exact shapes, strides and dtypes seen before answer at once.
    exact = (name, *((x.shape, x.stride(), x.dtype, x.device) if isinstance(x, torch.Tensor) else x for x in args))
    if exact in _SEEN_EXACTLY:
        return
    if len(_SEEN_EXACTLY) > 4096:
        _SEEN_EXACTLY.clear()
    _SEEN_EXACTLY.add(exact)
    device = next((x.device for x in args if isinstance(x, torch.Tensor)), None)  # Triton caches per GPU
    key = (name, device, *map(_signature, args))
    if key in _COMPILED_AHEAD:
        return
    pool = _compile_pool(os.getpid())
    _COMPILED_AHEAD.add(key)
    token = _DRY_RUN.set(True)
    try:
        with on_device_of(args), AsyncCompileMode(pool) as mode, torch.no_grad():  # compiled for args' GPU
            launches(*args)
            # Queued after every compile, so a thread that takes one of these finds its compile already started.
            launchers = [pool.submit(_build_launcher, compiling) for compiling in mode.raw_futures]
        for built in launchers:
            built.result()
    except Exception as error:  # noqa: BLE001 - only a head start: the real call compiles (and reports) for itself
        DRY_RUN_ERRORS.append((name, "".join(traceback.format_exception(error))))
    finally:
        _DRY_RUN.reset(token)
