"""Checkers for the notebooks' exercises: one module per chapter (``mta.exercises.ch05``, ...).

An exercise in a notebook is a stub that raises ``NotImplementedError``; the
cell below it calls a checker from here. A checker never raises: it runs the
learner's function on a list of named cases, prints one line saying whether
the exercise is not attempted yet, which case fails and by how much, or that
every case passes, and returns that :class:`Result`. The notebooks store the
unsolved state; the reference solutions live outside the notebooks, in
``solutions/``, and ``tests/`` checks that they pass their checkers.
"""

from __future__ import annotations

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


class WatchScores(TorchFunctionMode):
    """Notes any floating-point tensor of shape ``[..., Nq, Nk]`` created while active."""

    def __init__(self, nq, nk):
        super().__init__()
        self.nq, self.nk, self.seen = nq, nk, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for t in outs:
            if (self.seen is None and isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2
                    and tuple(t.shape[-2:]) == (self.nq, self.nk)):
                self.seen = (getattr(func, "__name__", str(func)), tuple(t.shape))
        return out


class CaseFailed(Exception):
    """Raised inside a case to report why it fails (the checker catches it)."""


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
        except NotImplementedError:
            return _report(Result(exercise, False, False, f"{exercise}: not attempted yet "
                                  "(the stub raises NotImplementedError)"))
        except CaseFailed as failure:
            return _report(Result(exercise, False, True, f"{exercise}: case {name!r} fails: {failure}"))
        except Exception as error:  # the learner's code crashed: say where, keep going in the notebook
            return _report(Result(exercise, False, True,
                                  f"{exercise}: case {name!r} raised {type(error).__name__}: {error}"))
        count += 1
    return _report(Result(exercise, True, True, f"{exercise}: all {count} cases pass"))


def _report(result: Result) -> Result:
    print(result.message)
    return result
