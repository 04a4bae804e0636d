"""Compiling a first call's kernels side by side (``mta.launch.compile_ahead``).

On a GPU: after the dry run, the real forward and backward compile nothing more (the dry run specialized every
kernel as the real launches do), and the results are those of a process that never compiled ahead.
Everywhere: a launch is a launch outside the dry run and a queued compile inside it; the signature that keys
the dry runs separates what Triton specializes on; in the interpreter nothing happens.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton

import mta
from mta import (conv_backward, conv_dc_kernels, conv_dq_kernels, conv_forward, flash_backward, flash_forward, launch,
                 runtime)

GPU = pytest.mark.skipif(runtime.INTERPRET, reason="compiling needs a GPU (the interpreter compiles nothing)")
MODULES = (conv_forward, conv_backward, conv_dc_kernels, conv_dq_kernels, flash_forward, flash_backward)


class FakeKernel:
    """Records how it was launched."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **meta: self.calls.append(("launch", grid, args, meta))

    def warmup(self, *args, grid, **meta):
        self.calls.append(("warmup", grid, args, meta))


def test_launch_runs_the_kernel_outside_the_dry_run_and_only_compiles_inside():
    kernel = FakeKernel()
    launch.launch(kernel, (3, 2), 1, 2, BLOCK=16)
    token = launch._DRY_RUN.set(True)
    try:
        launch.launch(kernel, (3, 2), 1, 2, BLOCK=16)
    finally:
        launch._DRY_RUN.reset(token)
    assert kernel.calls == [("launch", (3, 2), (1, 2), {"BLOCK": 16}), ("warmup", (3, 2), (1, 2), {"BLOCK": 16})]


def test_the_signature_separates_what_triton_specializes_on():
    sig = launch._signature
    x = torch.empty(2, 8, 64, 32)
    assert sig(x) == sig(torch.empty(5, 8, 128, 32))              # batch and N (both multiples of 16) don't matter
    assert sig(x) != sig(torch.empty(2, 8, 65, 32))               # N not a multiple of 16
    assert sig(x) != sig(torch.empty(2, 8, 1, 32))                # N = 1 (an int equal to 1 is a constant)
    assert sig(x) != sig(torch.empty(2, 8, 64, 48))               # another head dim
    assert sig(x) != sig(x.half())
    assert sig(x) == sig(torch.empty(2, 64, 8, 32).transpose(1, 2))  # strides: multiples of 16 either way
    assert sig(x) != sig(torch.empty(2, 8, 64, 40)[..., :32])      # a row stride of 40
    assert sig(torch.empty(4, 6, 11)) != sig(torch.empty(4, 6, 9))  # a weight's kernel size: every size counts
    assert sig(3) == 3 and sig(True) is True


def test_nothing_is_compiled_ahead_in_the_interpreter(monkeypatch):
    if not runtime.INTERPRET:
        pytest.skip("the interpreter's behaviour")
    calls = []
    launch.compile_ahead("test", lambda *x: calls.append(x), torch.empty(2, 2))
    assert calls == []


def compiled_kernels() -> dict:
    """How many compiled kernels each of the package's Triton kernels holds, over every device."""
    counts = {}
    for module in MODULES:
        for name, value in vars(module).items():
            while hasattr(value, "fn") and not isinstance(value, triton.runtime.jit.JITFunction):
                value = value.fn
            if isinstance(value, triton.runtime.jit.JITFunction) and value.__module__ == module.__name__:
                counts[name] = sum(len(caches[0]) for caches in value.device_caches.values())
    return counts


@GPU
@pytest.mark.parametrize("dtype, head_dim, n, kernel_size", [
    (torch.bfloat16, 64, 200, (6, 11)), (torch.float16, 96, 37, (2, 9)), (torch.float32, 32, 1, (3, 3)),
    (torch.bfloat16, 128, 200, (6, 11))])  # the last: the two-phase backward (mta.conv_two_phase) on Hopper
def test_after_the_dry_run_the_first_forward_and_backward_compile_nothing(dtype, head_dim, n, kernel_size):
    torch.manual_seed(0)
    q = torch.randn(2, 4, n, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, 2, n, head_dim, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    weight = (0.3 * torch.randn(4, *kernel_size, device="cuda")).requires_grad_()
    scale = head_dim ** -0.5
    mta.conv.compile_conv_ahead(q, k, v, weight, True, scale)
    mta.flash.compile_flash_ahead(q, k, v, True, scale)
    assert launch.DRY_RUN_ERRORS == []
    before = compiled_kernels()
    assert sum(before.values()) > 0
    out = mta.conv_attention(q, k, v, weight, causal=True) + mta.flash_attention(q, k, v, causal=True)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    after = compiled_kernels()
    assert {name: (before[name], n) for name, n in after.items() if n != before[name]} == {}
    assert launch.DRY_RUN_ERRORS == []
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, weight))


@pytest.mark.parametrize("backward", ["one_pass", "two_phase", "chunked"])
def test_the_dry_run_leaves_the_inputs_as_they_were(monkeypatch, backward):
    """The dry run runs the launchers on the call's own tensors, kernels compiled, not run, and every other
    operation run on buffers no kernel wrote: the inputs come out of it as they went in."""
    from mta import conv
    from mta.conv_plan import plan_conv
    # Every launch, planned or not, goes through mta.launch.launch: no kernel to compile on the CPU.
    monkeypatch.setattr(launch, "launch", lambda *args, **meta: None)
    monkeypatch.setattr(conv, "BACKWARD_LAUNCHES", launch.LaunchPlans())
    torch.manual_seed(0)
    dev = "cpu" if runtime.INTERPRET else "cuda"
    q, k, v, do = (torch.randn(1, 2, 40, 16, device=dev) for _ in range(4))
    w = torch.randn(2, 3, 5, device=dev)
    inputs = [t.clone() for t in (q, k, v, w, do)]
    plan = dataclasses.replace(plan_conv(torch.float32, 16, (3, 5), True, None), backward=backward)
    token = launch._DRY_RUN.set(True)
    try:
        with torch.no_grad():
            o, lse = conv.conv_attention_forward(q, k, v, w, True, 0.25, plan)
            conv.conv_attention_backward(do, q, k, v, o, lse, w, True, 0.25, plan)
    finally:
        launch._DRY_RUN.reset(token)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, w, do), inputs))


def test_empty_contiguous_is_a_contiguous_tensor_of_the_shape():
    x = torch.randn(2, 3, 4).transpose(1, 2)
    y = launch.empty_contiguous(x)
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    assert launch.empty_contiguous(x, torch.float16).dtype == torch.float16
