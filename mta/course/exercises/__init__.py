"""Checkers for the notebooks' exercises: one module per chapter (``mta.course.exercises.ch05``, ...).

An exercise in a notebook is a stub that raises ``NotImplementedError``; the
cell below it calls a checker from here. A checker never raises: it runs the
learner's function on a list of named cases, prints one line saying whether
the exercise is not attempted yet, which case fails and by how much, or that
every case passes, and returns that :class:`Result`. The notebooks store the
unsolved state; the reference solutions live outside the notebooks, in
``solutions/``, and ``tests/`` checks that they pass their checkers.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import linecache
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch.overrides import TorchFunctionMode


@dataclass(frozen=True)
class Result:
    """What a checker found. ``passed`` is True only when every case passed."""

    exercise: str
    passed: bool
    attempted: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed


#: The products a score matrix comes from.
PRODUCTS = frozenset({"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "baddbmm", "einsum", "linear", "tensordot"})


#: Fused attention calls: they make the scores inside, where no product of the caller's shows them.
ATTENTION_CALLS = frozenset({"scaled_dot_product_attention"})


class WatchScores(TorchFunctionMode):
    """Notes any floating-point tensor whose last two axes are ``(Nq, Nk)``, in either order, created while active:
    a whole score matrix, transposed or not. With ``any_rows``, also a product (:data:`PRODUCTS`) with ``Nk`` in
    its last two axes: the scores of some rows (one query, a block of them) against all the keys at once. A fused
    attention call (:data:`ATTENTION_CALLS`) counts as the scores it makes inside, ``[..., queries, keys]``."""

    def __init__(self, nq, nk, *, any_rows: bool = False):
        super().__init__()
        self.nq, self.nk, self.any_rows, self.seen = nq, nk, any_rows, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        name = getattr(func, "__name__", str(func))
        if self.seen is None and name in ATTENTION_CALLS:
            query = args[0] if args else (kwargs or {}).get("query")
            key = args[1] if len(args) > 1 else (kwargs or {}).get("key")
            if isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and key.dim() >= 2 and (
                    key.shape[-2] == self.nk and (self.any_rows or query.shape[-2] == self.nq)):
                self.seen = (name, (*query.shape[:-1], key.shape[-2]))
        for t in outs:
            if self.seen is None and isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2 and (
                    tuple(t.shape[-2:]) in ((self.nq, self.nk), (self.nk, self.nq))
                    or self.any_rows and name in PRODUCTS and self.nk in t.shape[-2:]) and not _mask_like(t):
                self.seen = (name, tuple(t.shape))
        return out


def _mask_like(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is 0, 1 or an infinity: a mask (an additive ``0 / -inf`` one over all the keys,
    made once and sliced per block, included), which holds no score. Scores of real queries and keys are not."""
    return bool(((t == 0) | (t == 1) | torch.isinf(t)).all())


class WatchNaNProducts(TorchFunctionMode):
    """Notes the first product (:data:`PRODUCTS`) whose floating-point result holds a NaN while active: with the
    unneeded rows of a cache set to NaN, such a product read rows it had no use for (even if the rows it kept are
    right)."""

    def __init__(self):
        super().__init__()
        self.seen = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (self.seen is None and getattr(func, "__name__", None) in PRODUCTS and isinstance(out, torch.Tensor)
                and out.is_floating_point() and bool(out.isnan().any())):
            self.seen = (func.__name__, tuple(out.shape))
        return out


class CaseFailed(Exception):
    """Raised inside a case to report why it fails (the checker catches it)."""


#: What a refused function raises (a builtin, since its code runs in its own module's globals), then turned into
#: :class:`CaseFailed` by :func:`refusing`.
_REFUSED = "mta.course.exercises refused a call: "


def _refused_call(*args, **kwargs):
    raise RuntimeError("PLACEHOLDER")


@contextlib.contextmanager
def refusing(functions: dict[Callable, str]):
    """While active, a call of any of ``functions`` (``{function: why the exercise refuses it}``) fails the case
    with that reason, under whatever name the learner reached it (``import ... as``, an attribute, a local alias):
    the function's own code is swapped, so there is no binding to go around."""
    swapped = []
    try:
        for fn, why in functions.items():
            target = inspect.unwrap(fn)
            if target.__code__.co_freevars:  # a closure's code cannot be swapped; none of the refused ones is
                raise TypeError(f"refusing: {target.__qualname__} is a closure")
            message = _REFUSED + why
            code = _refused_call.__code__.replace(co_consts=tuple(
                message if c == "PLACEHOLDER" else c for c in _refused_call.__code__.co_consts))
            swapped.append((target, target.__code__))
            target.__code__ = code
        yield
    except RuntimeError as error:
        if error.args and isinstance(error.args[0], str) and error.args[0].startswith(_REFUSED):
            raise CaseFailed(error.args[0][len(_REFUSED):]) from None
        raise
    finally:
        for target, code in swapped:
            target.__code__ = code


def finished_attention() -> dict[Callable, str]:
    """The package's finished attention functions, each with the reason an exercise refuses it (for
    :func:`refusing`): an exercise asks for the computation, not a call of the answer."""
    from ... import conv, conv_decode, conv_decode_rows, decode, flash, online_softmax, reference
    functions = {reference.naive_attention: "mta.naive_attention", online_softmax.blocked_attention:
                 "mta.blocked_attention", flash.flash_attention: "mta.flash_attention",
                 conv.conv_attention: "mta.conv_attention", reference.conv_attention_reference:
                 "mta.conv_attention_reference", reference.conv_attention_probabilities:
                 "mta.conv_attention_probabilities", decode.decode_attention: "mta.decode_attention",
                 conv_decode.conv_decode_attention: "mta.conv_decode_attention",
                 conv_decode_rows.conv_decode_rows: "mta.conv_decode_rows.conv_decode_rows"}
    return {fn: f"it calls {name}, the package's finished version; the exercise asks you to compute it yourself"
            for fn, name in functions.items()}


class TritonLaunches:
    """Counts the launches of Triton kernels defined outside the ``mta`` package (the learner's) while active, and
    their programs (from each launch's grid), on a GPU and in the interpreter alike:
    ``with TritonLaunches() as launches: ...; launches.count, launches.programs``."""

    def __init__(self):
        self.count = 0
        self.programs = 0

    def _classes(self):
        from triton.runtime.jit import JITFunction
        classes = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except ImportError:  # pragma: no cover  (a Triton without the interpreter)
            pass
        return classes

    def __enter__(self):
        self._saved = []
        for cls in self._classes():
            original = cls.__dict__.get("run")
            if original is None:
                continue

            def run(kernel, *args, _original=original, grid, warmup, **kwargs):
                module = getattr(getattr(kernel, "fn", None), "__module__", "") or ""
                if not warmup and module != "mta" and not module.startswith("mta."):
                    size = grid
                    if callable(grid):   # grid(meta): the launch's arguments by name
                        size = grid({**dict(zip(getattr(kernel, "arg_names", []), args)), **kwargs})
                    self.count += 1
                    self.programs += math.prod(int(n) for n in tuple(size))
                return _original(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            self._saved.append((cls, original))
            cls.run = run
        return self

    def __exit__(self, *exc):
        for cls, original in self._saved:
            cls.run = original
        return False


def own_triton_kernel(what: str, call: Callable):
    """``call()``, failing the case unless it launched a Triton kernel of the learner's own (the exercise asks for
    one: a PyTorch answer or the package's finished kernel does not count)."""
    with TritonLaunches() as launches:
        result = call()
    if launches.count == 0:
        raise CaseFailed(f"{what} launched no Triton kernel of its own; this exercise asks for one "
                         "(a @triton.jit function launched as kernel[grid](...))")
    return result


def expect_close(what: str, got, want, *, atol: float, rtol: float) -> None:
    """Raise :class:`CaseFailed` unless ``got`` matches ``want`` (shape, finiteness, values)."""
    if not isinstance(got, torch.Tensor):
        raise CaseFailed(f"{what}: expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(want.shape):
        raise CaseFailed(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    got64, want64 = got.detach().double().cpu(), want.detach().double().cpu()
    if not torch.isfinite(got64).all():
        raise CaseFailed(f"{what}: contains NaN or inf")
    err = (got64 - want64).abs()
    bound = atol + rtol * want64.abs()
    if (err > bound).any():
        worst = int(torch.argmax(err - bound))
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), err.shape))
        raise CaseFailed(f"{what}: max abs error {err.max().item():.3g} (worst at index {index}: "
                         f"got {got64[index].item():.6g}, expected {want64[index].item():.6g})")


def expect_close_beside_neginf(what: str, got, want, *, atol: float, rtol: float, axes: str = "index",
                               shape_axes: str = "", neginf_means: str = "") -> None:
    """:func:`expect_close` where ``want`` holds ``-inf`` (a query that sees no key, a key before position 0):
    ``got`` must be ``-inf`` exactly there, and close everywhere else. ``axes`` names the index in the message
    (e.g. ``"(sequence, head, query, delta)"``), ``shape_axes`` follows a wrong shape, ``neginf_means`` says why an
    entry is ``-inf`` where ``got`` misses one."""
    if not isinstance(got, torch.Tensor):
        raise CaseFailed(f"{what}: expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(want.shape):
        raise CaseFailed(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
                         + (f" {shape_axes}" if shape_axes else ""))
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    neg = torch.isneginf(want)
    if not torch.equal(torch.isneginf(got), neg):
        index = tuple(int(i) for i in torch.nonzero(torch.isneginf(got) != neg)[0])
        raise CaseFailed(f"{what} at {axes} {index}: got {got[index].item():.6g}, expected "
                         f"{want[index].item():.6g}" + (f" ({neginf_means})" if neginf_means and neg[index] else ""))
    expect_close(what, got.masked_fill(neg, 0.0), want.masked_fill(neg, 0.0), atol=atol, rtol=rtol)


def call_on_copies(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` on copies of the tensor arguments, failing the case if it changed one of them in
    place: a caller's tensors are not the function's to change (and the checker's reference is computed from
    them)."""
    copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    result = fn(*copies, **kwargs)
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or another callable without a signature
        names = []
    for i, (arg, copy) in enumerate(zip(args, copies)):
        if isinstance(arg, torch.Tensor) and not (torch.equal(arg.isnan(), copy.isnan())
                                                  and torch.equal(arg.nan_to_num(), copy.nan_to_num())):
            name = names[i] if i < len(names) else f"argument {i + 1}"
            raise CaseFailed(f"the function changed its input {name} in place; leave the inputs as they are "
                             "(work on a copy, e.g. q = q * scale rather than q *= scale)")
    return result


def expect_equal(what: str, got, want) -> None:
    """Raise :class:`CaseFailed` unless ``got == want`` (plain Python values)."""
    if got != want:
        raise CaseFailed(f"{what}: got {got!r}, expected {want!r}")


def run_cases(exercise: str, cases: Iterable[tuple[str, Callable[[], None]]]) -> Result:
    """Run ``(name, case)`` pairs in order; stop at the first failure and say which case it was.

    A case calls the learner's function and checks its answer with :func:`expect_close` /
    :func:`expect_equal`. A ``NotImplementedError`` from the learner's stub means "not attempted".
    """
    count = 0
    for name, case in cases:
        try:
            case()
        except NotImplementedError as error:
            if not _raised_by_a_stub(error):  # from a library the learner's code called: a crash like any other
                return _report(Result(exercise, False, True,
                                      f"{exercise}: case {name!r} raised NotImplementedError: {error}"))
            return _report(Result(exercise, False, False, f"{exercise}: not attempted yet "
                                  "(the stub raises NotImplementedError)"))
        except CaseFailed as failure:
            return _report(Result(exercise, False, True, f"{exercise}: case {name!r} fails: {failure}"))
        except Exception as error:  # the learner's code crashed: say where, keep going in the notebook
            return _report(Result(exercise, False, True,
                                  f"{exercise}: case {name!r} raised {type(error).__name__}: {error}"))
        count += 1
    return _report(Result(exercise, True, True, f"{exercise}: all {count} cases pass"))


def _raised_by_a_stub(error: NotImplementedError) -> bool:
    """Whether ``error`` comes from a ``raise NotImplementedError`` line (a stub), not from inside a library that
    the learner's code called (``torch.softmax`` of an int tensor raises one too). Where the source line cannot
    be read, a stub is assumed."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return True
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
    return not line or "NotImplementedError" in line


def _report(result: Result) -> Result:
    print(result.message)
    return result
