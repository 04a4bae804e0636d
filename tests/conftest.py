"""Shared test helpers: fresh random inputs, the device and dtypes to test on."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import zlib

import pytest
import torch  # noqa: E402

import mta  # noqa: E402
from mta import runtime  # noqa: E402

DEVICE = runtime.DEVICE
ON_GPU = not runtime.INTERPRET


def patch_the_language_once_per_launch() -> None:
    """Triton's interpreter patches ``triton.language`` for the interpreter at each launch (and undoes it after),
    and again at every call of a ``@triton.jit`` helper inside the kernel: ``inspect.getmembers`` over the language's
    modules, a quarter of the CPU time of the kernels here, which call their shared helpers in their inner loops.
    Inside a launch, a helper whose language modules (``triton.language``, ``triton.language.core``) are patched
    already skips it. Where the interpreter has not these pieces, nothing changes."""
    if not runtime.INTERPRET:
        return
    import triton.language as tl
    from triton.runtime import interpreter

    patch_lang, launch = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "GridExecutor", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if not (callable(patch_lang) and callable(getattr(launch, "__call__", None)) and scope_type is not None):
        return
    state = {"launches": 0, "patched": set()}

    def patch_once(fn):
        langs = {name for name, module in (("tl", tl), ("core", tl.core))
                 if any(value is module for value in fn.__globals__.values())}
        if state["launches"] and langs <= state["patched"]:
            return scope_type()                  # nothing to undo: the launch's own patching stands
        scope = patch_lang(fn)
        if state["launches"]:
            state["patched"] |= langs
        return scope

    def launch_call(self, *args, _call=launch.__call__, **kwargs):
        state["launches"] += 1
        try:
            return _call(self, *args, **kwargs)
        finally:
            state["launches"] -= 1
            if not state["launches"]:
                state["patched"] = set()

    interpreter._patch_lang = patch_once
    launch.__call__ = launch_call


patch_the_language_once_per_launch()


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


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """A notebook's cells share one kernel and run in order: under ``--dist loadgroup`` (``make test``) each
    notebook is one group, kept in one process; every other test goes to whichever process is free. Files whose
    tests share a costly module-scoped fixture name their own group (``pytestmark``), so that it is built once.
    xdist schedules the groups with the most tests first."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


@pytest.fixture(autouse=True)
def _seed(request):
    # A different but reproducible seed per test: inputs are fresh for each case.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def planned_conv_attention(**fields):
    """``conv_attention(q, k, v, weight, causal=True, return_lse=False)`` run by the default plan for its inputs
    (:func:`mta.conv.plan_of`) with ``fields`` replaced: how tests force a path."""
    import dataclasses

    from mta.conv import ConvAttention, plan_of

    def conv_attention(q, k, v, weight, causal=True, return_lse=False):
        plan = dataclasses.replace(plan_of(q, weight, causal), **fields)
        o, lse = ConvAttention.apply(q, k, v, weight, causal, q.shape[-1] ** -0.5, plan)
        return (o, lse) if return_lse else o
    return conv_attention


def chunked_by_default(monkeypatch) -> None:
    """Every ``conv_attention`` call of the test plans the chunked backward (as where no fused tile fits on chip),
    through whatever entry point it comes (the public function, the custom op, the layer)."""
    import dataclasses

    import mta.conv
    plan_of = mta.conv.plan_of
    monkeypatch.setattr(mta.conv, "plan_of",
                        lambda *a, **kw: dataclasses.replace(plan_of(*a, **kw), backward="chunked"))


__all__ = ["DEVICE", "ON_GPU", "mta", "rand", "rand_qkv", "rel_err"]


ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_solutions(chapter: str):
    """The reference answers ``solutions/<chapter>.py`` (kept outside the package), as a module."""
    spec = importlib.util.spec_from_file_location(f"solutions_{chapter}", ROOT / "solutions" / f"{chapter}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_stubs_not_attempted(checks, capsys) -> None:
    """Each checker, given a stub that raises ``NotImplementedError``, neither passes nor counts it as an
    attempt, and prints "not attempted yet" once."""
    def stub(*args, **kwargs):
        raise NotImplementedError

    for check in checks:
        result = check(stub)
        assert not result.passed and not result.attempted, check.__name__
    assert capsys.readouterr().out.count("not attempted yet") == len(checks)


def close_in_norm(out: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    """``||out - ref|| <= tol * ||ref|| + 1e-6 sqrt(numel)`` in fp64, and ``out`` finite."""
    out, ref = out.double().cpu(), ref.double().cpu()
    return bool(torch.isfinite(out).all()) and \
        (out - ref).norm().item() <= tol * ref.norm().item() + 1e-6 * math.sqrt(ref.numel())


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Buffers the launchers allocate start as NaN: an element never written fails the check."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))


def record_hopper_tiles(monkeypatch, module) -> list:
    """Make ``module.tiled_launch`` record the tile each launch would take on an H100
    (the Hopper tables, nothing timed, nothing launched); returns the list they append to."""
    from mta import tuning
    from mta.launch import LaunchPlans
    monkeypatch.setattr(tuning, "gpu_family", lambda device=None: "hopper")
    monkeypatch.setattr(tuning, "AUTOTUNE", False)
    for name, value in vars(module).items():  # plans kept from other tests would launch without asking the tables
        if isinstance(value, LaunchPlans):
            monkeypatch.setattr(module, name, LaunchPlans())
    launched = []

    class Recorded:
        def __call__(self):
            pass

        def plan(self, tensors):
            return lambda *tensors: None

    def tiled_launch(name, kernel, grid, args, meta, *, dtype, config=None, fit=None, **kw):
        tile = config or tuning.config_for(name, meta["BLOCK_D"], dtype, meta["CAUSAL"], n=kw.get("n"))
        launched.append(tile if config or fit is None else fit(tile))
        return Recorded()
    monkeypatch.setattr(module, "tiled_launch", tiled_launch)
    return launched


def run_child_case(test_file: str, case: str) -> None:
    """``python test_file case`` in a child process, for a case whose failure can kill the process (a read outside
    a buffer): passes if it prints "OK" last, skips if it prints "SKIP ...", else fails with its output."""
    import os
    import subprocess
    import sys

    root = str(pathlib.Path(__file__).resolve().parents[1])  # mta importable without an install
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, test_file, case], capture_output=True, text=True, timeout=300, env=env)
    if run.returncode == 0 and "SKIP" in run.stdout:
        pytest.skip(run.stdout.strip())
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), \
        f"exit code {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"


def wide_views(extra: int):
    """``view(shape, stride, offset)``: a view of one lazily allocated fp16 buffer of ``2**31 + extra`` elements,
    filled with seeded normal values (only the elements it covers are touched), or None (and "SKIP" printed, for
    :func:`run_child_case`) where there is no room for it."""
    try:
        buf = torch.empty(2 ** 31 + extra, dtype=torch.float16, device=DEVICE)
    except (RuntimeError, MemoryError):
        print("SKIP: no room for a 4 GiB buffer")
        return None
    rnd = torch.Generator(device="cpu").manual_seed(0)

    def view(shape, stride, offset):
        x = buf.as_strided(shape, stride, offset)
        x.copy_(torch.randn(shape, generator=rnd).half())
        return x
    return view
