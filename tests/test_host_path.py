"""What a user's loop needs of every public op on a GPU: no host-device synchronisation inside a call, forward
or backward, and a call captured in a CUDA graph that replays exactly what eager calls compute."""

from __future__ import annotations

import pytest
import torch

import mta
from mta import runtime

pytestmark = pytest.mark.skipif(runtime.INTERPRET, reason="CUDA graphs and sync checks need a GPU")

B, HQ, HKV, N, D, NMAX = 2, 4, 2, 96, 64, 160


def inputs(dtype=torch.bfloat16, grad=False):
    q = torch.randn(B, HQ, N, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=dtype) for _ in range(2))
    w = 0.3 * torch.randn(HQ, 6, 11, device="cuda")
    return [t.requires_grad_(grad) for t in (q, k, v, w)]


def decode_inputs(dtype=torch.bfloat16):
    q_cache = torch.randn(B, HQ, NMAX, D, device="cuda", dtype=dtype)
    k_cache, v_cache = (torch.randn(B, HKV, NMAX, D, device="cuda", dtype=dtype) for _ in range(2))
    lengths = torch.tensor([NMAX - 17, 40], device="cuda", dtype=torch.int32)
    return q_cache, k_cache, v_cache, 0.3 * torch.randn(HQ, 6, 11, device="cuda"), lengths


def flash_forward(q, k, v, w):
    return (mta.flash_attention(q, k, v, causal=True),)


def conv_forward(q, k, v, w):
    return (mta.conv_attention(q, k, v, w),)


def flash_training(q, k, v, w, do):
    o = mta.flash_attention(q, k, v, causal=True)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


def conv_training(q, k, v, w, do):
    o = mta.conv_attention(q, k, v, w)
    return (o, *torch.autograd.grad(o, (q, k, v, w), do))


def decode(q_cache, k_cache, v_cache, w, lengths):
    q = q_cache[:, :, -1:]
    return (mta.decode_attention(q, k_cache, v_cache, cache_seqlens=lengths),
            mta.conv_decode_attention(q_cache, k_cache, v_cache, w, cache_seqlens=lengths, num_queries=2))


CASES = {
    "flash forward": (flash_forward, lambda: inputs()),
    "conv forward": (conv_forward, lambda: inputs()),
    "flash forward+backward": (flash_training, lambda: [*inputs(grad=True), torch.randn(B, HQ, N, D, device="cuda",
                                                                                         dtype=torch.bfloat16)]),
    "conv forward+backward": (conv_training, lambda: [*inputs(grad=True), torch.randn(B, HQ, N, D, device="cuda",
                                                                                       dtype=torch.bfloat16)]),
    "decode (device lengths)": (decode, decode_inputs),
}


@pytest.mark.parametrize("case", CASES)
def test_no_host_device_synchronisation_inside_a_call(case):
    fn, make = CASES[case]
    args = make()
    fn(*args)  # the first call compiles
    fresh = [make() for _ in range(2)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:  # a call signature's second call captures its CUDA graph (mta.graphed_calls), the third replays it
        for new in fresh:
            fn(*new)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("case", CASES)
def test_a_captured_call_replays_what_eager_calls_compute(case):
    torch.manual_seed(0)
    fn, make = CASES[case]
    static = make()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles, allocator pools) off the capturing stream, as graphs need
        for _ in range(2):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn(*static)
    for _ in range(3):  # new values in the same buffers, then replay
        fresh = make()
        with torch.no_grad():
            for s, f in zip(static, fresh):
                s.copy_(f)
        graph.replay()
        expected = fn(*static)
        for name, got, want in zip(range(len(outs)), outs, expected):
            assert torch.equal(got, want), f"{case}: output {name} differs from the eager call"
