"""The MTA forward and backward replayed from CUDA graphs per call signature (:mod:`mta.graphed_calls`): what a
replay returns is what the eager call returns, bit for bit, on new inputs each call."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import mta
from mta import conv, conv_plan, graphed_calls, runtime
from mta.bench.timing import peak_extra_memory_bytes
from mta.graphed_calls import GraphedCalls

pytestmark = pytest.mark.skipif(runtime.INTERPRET, reason="CUDA graphs need a GPU")

B, HQ, HKV, N, D = 2, 4, 2, 200, 64


@pytest.fixture
def fresh_graphs(monkeypatch):
    """New graph caches for the test; after it, no capture has failed and CUDA's random numbers still work (a
    failed capture would leave the default generator in capture mode)."""
    monkeypatch.setattr(conv, "FORWARD_GRAPHS", GraphedCalls())
    monkeypatch.setattr(conv, "BACKWARD_GRAPHS", GraphedCalls())
    graphed_calls.CAPTURE_ERRORS.clear()
    yield
    assert graphed_calls.CAPTURE_ERRORS == []
    torch.randn(4, device="cuda")


def plans(dtype, kernel=(6, 11)):
    """``(graphed, eager)``: this GPU's plan for ``dtype`` and ``kernel``, with and without graphs."""
    plan = conv_plan.plan_conv(dtype, D, kernel, True)
    assert plan.replay_graphs  # the default on a GPU
    return plan, dataclasses.replace(plan, replay_graphs=False)


def training_call(plan, dtype, kernel=(6, 11), seed=0, expanded_gradient=False):
    g = torch.Generator("cuda").manual_seed(seed)
    q = torch.randn(B, HQ, N, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=dtype, generator=g).requires_grad_() for _ in range(2))
    w = (0.3 * torch.randn(HQ, *kernel, device="cuda", generator=g)).requires_grad_()
    o, _ = conv.ConvAttention.apply(q, k, v, w, True, D ** -0.5, plan)
    if expanded_gradient:  # dO of a sum: one value broadcast, stride 0 (no dense copy of that layout)
        o.sum().backward()
    else:
        o.backward(torch.randn(o.shape, device="cuda", dtype=dtype, generator=g))
    return [o.detach(), q.grad, k.grad, v.grad, w.grad]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_replays_return_what_eager_calls_return(dtype, fresh_graphs):
    graphed, eager = plans(dtype)
    for seed in range(4):  # eager, captured, then replayed twice: each on new inputs in new buffers
        got, want = training_call(graphed, dtype, seed=seed), training_call(eager, dtype, seed=seed)
        for name, a, b in zip(("o", "dq", "dk", "dv", "dweight"), got, want):
            assert torch.equal(a, b), f"call {seed}: {name} differs from the eager call's"
    assert len(conv.FORWARD_GRAPHS) == 1 and len(conv.BACKWARD_GRAPHS) == 1


def test_each_signature_has_its_graph(fresh_graphs):
    for _ in range(3):
        for kernel in ((6, 11), (2, 3)):
            training_call(plans(torch.bfloat16, kernel)[0], torch.bfloat16, kernel=kernel)
    assert len(conv.BACKWARD_GRAPHS) == 2 and len(conv.FORWARD_GRAPHS) == 2


def test_a_layout_without_a_dense_copy_runs_eagerly(fresh_graphs):
    graphed, eager = plans(torch.bfloat16)
    for seed in range(3):
        got = training_call(graphed, torch.bfloat16, seed=seed, expanded_gradient=True)
        want = training_call(eager, torch.bfloat16, seed=seed, expanded_gradient=True)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len(conv.BACKWARD_GRAPHS) == 0 and len(conv.FORWARD_GRAPHS) == 1


def test_graphs_are_kept_per_stream(fresh_graphs):
    graphed, eager = plans(torch.bfloat16)
    want = training_call(eager, torch.bfloat16)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side, torch.cuda.current_stream(), side):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                got = training_call(graphed, torch.bfloat16)
        torch.cuda.current_stream().wait_stream(side)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len(conv.BACKWARD_GRAPHS) == 2


def test_a_dropped_graph_leaves_its_signature_eager_and_later_captures_working(fresh_graphs, monkeypatch):
    """One backward graph kept, three signatures in turn: each is captured once, at its second call, dropping the
    graph before it (whose signature then runs eagerly, never captured again); every call exact."""
    captures = []

    def counted_capture(fn, inputs):
        captures.append(fn)
        return graphed_calls.capture_graph(fn, inputs)
    monkeypatch.setattr(conv, "FORWARD_GRAPHS", GraphedCalls(capture=counted_capture))
    monkeypatch.setattr(conv, "BACKWARD_GRAPHS", GraphedCalls(size=1, capture=counted_capture))
    for seed in range(4):
        for kernel in ((6, 11), (6, 9), (2, 3)):
            plan = plans(torch.bfloat16, kernel)[0]
            got = training_call(plan, torch.bfloat16, kernel=kernel, seed=seed)
            want = training_call(dataclasses.replace(plan, replay_graphs=False), torch.bfloat16, kernel=kernel,
                                 seed=seed)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (seed, kernel)
    assert len(conv.BACKWARD_GRAPHS) == 1 and len(conv.FORWARD_GRAPHS) == 3
    assert len(captures) == 6  # three forward and three backward signatures, once each


def test_released_graphs_are_captured_again(fresh_graphs):
    graphed, eager = plans(torch.bfloat16)
    want = training_call(eager, torch.bfloat16)
    for _ in range(2):
        training_call(graphed, torch.bfloat16)
    assert len(conv.BACKWARD_GRAPHS) == 1
    mta.release_graphs()
    assert len(conv.BACKWARD_GRAPHS) == 0 and len(conv.FORWARD_GRAPHS) == 0
    got = training_call(graphed, torch.bfloat16)  # a first call again: eager
    assert len(conv.BACKWARD_GRAPHS) == 0
    for _ in range(2):
        got = training_call(graphed, torch.bfloat16)
    assert len(conv.BACKWARD_GRAPHS) == 1
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_graphed_call_is_measured_with_its_workspace(fresh_graphs):
    """The benchmarks' peak memory of a call whose graph is kept is its eager call's, workspace included (both
    measured after warm-up calls, so that neither includes a first call's one-off work)."""
    graphed, eager = plans(torch.bfloat16)
    for _ in range(3):
        training_call(eager, torch.bfloat16)
        training_call(graphed, torch.bfloat16)
    assert len(conv.BACKWARD_GRAPHS) == 1
    eager_peak = peak_extra_memory_bytes(lambda: training_call(eager, torch.bfloat16))
    graphed_peak = peak_extra_memory_bytes(lambda: training_call(graphed, torch.bfloat16))
    assert abs(graphed_peak - eager_peak) <= 0.01 * eager_peak, (graphed_peak, eager_peak)


def test_reduce_overhead_training_of_layers_of_one_signature(fresh_graphs):
    """``torch.compile(mode="reduce-overhead")`` over training steps of two MTA layers of one call signature (GQA,
    bf16 autocast): inductor warms its CUDA graphs up, then records the step, custom ops included. The ops run
    their launches with no graphs of their own (a graph of ours captured during the warm-up would keep static
    copies in inductor's memory pool, which inductor refuses), and the gradients are the eager step's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(mta.MultiTokenAttention(128, 4, num_kv_heads=2, kernel_size=(6, 11),
                                                          rope_theta=1e4) for _ in range(2))).cuda()
    for layer in model:
        layer.conv_weight.data += 0.1 * torch.randn_like(layer.conv_weight)
    x = torch.randn(2, 200, 128, device="cuda")

    def loss_of(x):
        with torch.autocast("cuda", torch.bfloat16):
            return model(x).float().square().mean()

    def gradients(loss_fn):
        loss_fn(x).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return grads

    want = gradients(loss_of)  # eagerly: the second layer's calls are captured (one signature)
    graphs = len(conv.FORWARD_GRAPHS), len(conv.BACKWARD_GRAPHS)
    compiled = torch.compile(loss_of, mode="reduce-overhead")
    for step in range(4):  # warm-up, recording, then replays
        got = gradients(compiled)
        for (name, _), a, b in zip(model.named_parameters(), got, want):
            assert (a - b).norm() <= 2e-2 * b.norm(), f"step {step}: {name}"
    assert (len(conv.FORWARD_GRAPHS), len(conv.BACKWARD_GRAPHS)) == graphs  # none captured by the compiled steps
