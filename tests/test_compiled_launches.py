"""Launching a kernel again without Triton's argument binding (``mta.compiled_launches``).

Everywhere: the launch signature separates what a compile depends on and nothing else, and a repeated signature
runs the kept compiled kernel with the call's own tensors and the constant tail of its arguments. On a GPU: the
public functions give the same results through kept launches as through Triton's binding.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import mta
from mta import compiled_launches, runtime
from mta.reference import naive_attention


def add_one(x_ptr, n, scale, BLOCK: tl.constexpr, HALF: tl.constexpr = False):
    pass


class FakeCompiled:
    def __init__(self, runs):
        self.runs = runs

    def __getitem__(self, grid):
        return lambda *args: self.runs.append((grid, args))


class RecordingKernel(triton.runtime.jit.JITFunction):
    """A JITFunction whose ``kernel[grid](...)`` records the binding and returns a fake compiled kernel."""

    def __init__(self):
        super().__init__(add_one)
        self.binds, self.runs = [], []

    def __getitem__(self, grid):
        return lambda *args, **meta: self.binds.append((grid, args, meta)) or FakeCompiled(self.runs)


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(compiled_launches.torch.cuda, "current_device", lambda: 0)
    compiled_launches.forget()
    yield RecordingKernel()
    compiled_launches.forget()


def test_a_repeated_signature_runs_the_kept_kernel_with_the_new_tensors(kernel):
    x, y = torch.zeros(64), torch.ones(64)
    compiled_launches.launch_again(kernel, (4,), (x, 64, 0.5), {"BLOCK": 16, "num_warps": 4})
    compiled_launches.launch_again(kernel, (4,), (y, 64, 0.5), {"BLOCK": 16, "num_warps": 4})
    assert len(kernel.binds) == 1
    (grid, args), = kernel.runs
    assert grid == (4, 1, 1) and args[0] is y  # a compiled kernel's launch takes all three grid axes and args[1:] == (64, 0.5, 16, False)  # BLOCK given, HALF's default


@pytest.mark.parametrize("change", ["int", "int to bool", "float", "dtype", "alignment", "keyword", "grid"])
def test_anything_a_compile_depends_on_makes_another_signature(kernel, change):
    x = torch.zeros(64)
    base = ((4, 1, 1), (x, 1 if change == "int to bool" else 64, 0.5), {"BLOCK": 16})
    grid, args, meta = base
    if change == "int":
        args = (x, 65, 0.5)
    elif change == "int to bool":
        args = (x, True, 0.5)     # equal to 1, and of equal hash, but another compile
    elif change == "float":
        args = (x, 64, 0.25)
    elif change == "dtype":
        args = (x.double(), 64, 0.5)
    elif change == "alignment":
        args = (x[1:], 64, 0.5)   # 4 bytes in: not 16-byte aligned
    elif change == "keyword":
        meta = {"BLOCK": 32}
    elif change == "grid":
        grid = (8, 1, 1)
    compiled_launches.launch_again(kernel, *base)
    compiled_launches.launch_again(kernel, grid, args, meta)
    assert len(kernel.binds) == 2 and kernel.runs == []


def test_a_kernel_under_heuristics_is_launched_plain_with_their_values(kernel):
    halves = triton.runtime.autotuner.Heuristics(kernel, kernel.arg_names,
                                                 {"HALF": lambda args: args["n"] > args["BLOCK"]})
    for _ in range(2):
        compiled_launches.launch_again(halves, (1, 1, 1), (torch.zeros(4), 64, 0.5), {"BLOCK": 16})
    assert len(kernel.binds) == 1 and kernel.binds[0][2] == {"BLOCK": 16, "HALF": True}
    assert kernel.runs[0][1][1:] == (64, 0.5, 16, True)


def test_an_argument_of_another_kind_always_goes_through_triton(kernel):
    for _ in range(2):
        compiled_launches.launch_again(kernel, (1, 1, 1), (torch.zeros(4), [1, 2], 0.5), {"BLOCK": 16})
    assert len(kernel.binds) == 2 and kernel.runs == []


@pytest.mark.skipif(runtime.INTERPRET, reason="compiled kernels need a GPU")
def test_kept_launches_give_the_results_of_fresh_ones():
    torch.manual_seed(0)
    for dtype in (torch.float16, torch.float32):
        outs = []
        for _ in range(3):  # the first binds, the others run the kept kernels
            q, k, v = (torch.randn(2, 4, 77, 40, device="cuda", dtype=dtype) for _ in range(3))
            w = 0.3 * torch.randn(4, 3, 5, device="cuda")
            for out, ref in ((mta.flash_attention(q, k, v, causal=True), naive_attention(q, k, v, causal=True)),
                             (mta.conv_attention(q, k, v, w), mta.conv_attention_reference(q, k, v, w))):
                outs.append((out.float() - ref.float()).abs().max().item())
        assert max(outs) < (2e-2 if dtype == torch.float16 else 5e-3), outs


@pytest.mark.skipif(runtime.INTERPRET, reason="compiled kernels need a GPU")
def test_a_launch_hook_sees_kept_launches_and_results_stay_the_same():
    # Kept launches call the C launcher directly while no hook is installed; a profiler's hook must still see them.
    knobs = pytest.importorskip("triton.knobs")
    if not hasattr(knobs.runtime.launch_enter_hook, "add"):
        pytest.skip("this Triton's launch hook is not a chain")
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 32, device="cuda", dtype=torch.float16) for _ in range(3))
    w = 0.3 * torch.randn(2, 3, 5, device="cuda")
    before = [mta.conv_attention(q, k, v, w) for _ in range(2)]  # compiled, then kept
    seen = []

    def hook(metadata):
        seen.append(metadata)

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        during = mta.conv_attention(q, k, v, w)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(seen) >= 2  # the fold and the fused kernel at least
    after = mta.conv_attention(q, k, v, w)
    assert torch.equal(before[1], during) and torch.equal(during, after)
