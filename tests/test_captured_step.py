"""Generation without the host in the way: the cache's lengths on its device and a host-side bound
(``mta.KVCache``), a step compiled whole (``fullgraph=True``), and ``mta.capture_step``, one CUDA graph per decode
step of a whole model. On the CPU: the cache's bookkeeping, fullgraph compilation, the errors. On a GPU: captured
and compiled steps against eager ones, bit for bit, and no synchronisation anywhere in prefill or step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mta.kv_cache
from conftest import DEVICE, ON_GPU, mta, rand

TOL = dict(atol=2e-5, rtol=2e-5)
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="CUDA graphs and synchronisation are GPU matters")


def make_layer(kernel_size, dim=32, heads=2, kv_heads=None):
    layer = mta.MultiTokenAttention(dim, heads, num_kv_heads=kv_heads, kernel_size=kernel_size,
                                    rope_theta=1e4).to(DEVICE)
    if layer.conv_weight is not None:
        with torch.no_grad():
            layer.conv_weight.add_(0.3 * torch.randn_like(layer.conv_weight))
    return layer


# --- the cache's bookkeeping (any device) -------------------------------------------------------------------------


def test_the_lengths_live_on_the_device_and_the_host_keeps_a_bound():
    layer = make_layer((2, 5))
    cache = layer.new_cache(2, 12)
    assert cache.lengths.dtype == torch.int32 and cache.lengths.device == cache.k.device
    assert cache.is_empty and cache.length_bound == 0
    x = rand(2, 8, 32)
    with torch.no_grad():
        layer.prefill(x[:, :5], cache, lengths=[3, 5])
        assert cache.lengths.tolist() == [3, 5] and cache.length_bound == 5 and not cache.is_empty
        assert cache.positions(2).tolist() == [[3, 4], [5, 6]]
        layer.step(x[:, 5:7], cache)
    assert cache.lengths.tolist() == [5, 7] and cache.length_bound == 7
    tensors = [t.data_ptr() for t in (cache.k, cache.v, cache.q, cache.lengths)]
    cache.reset()                                   # empty again, the same tensors (a captured step keeps them)
    assert cache.is_empty and cache.lengths.tolist() == [0, 0]
    assert [t.data_ptr() for t in (cache.k, cache.v, cache.q, cache.lengths)] == tensors
    copy = cache.clone()
    assert copy.k.data_ptr() != cache.k.data_ptr() and copy.is_empty


def test_a_cache_built_by_hand_reads_its_bound_from_its_lengths():
    k = torch.zeros(2, 6, 1, 4, device=DEVICE)
    cache = mta.KVCache(k=k, v=k.clone(), q=None, lengths=torch.tensor([2, 4], dtype=torch.int32, device=DEVICE))
    assert cache.length_bound == 4 and not cache.is_empty
    with pytest.raises(ValueError, match="holds 6 positions"):
        cache.append(None, rand(2, 3, 1, 4), rand(2, 3, 1, 4))


@pytest.mark.parametrize("lengths", [[3, 5], (3, 5), torch.tensor([3, 5]), torch.tensor([3, 5], dtype=torch.int32)])
def test_prompt_lengths_on_the_host_in_any_form(lengths):
    layer = make_layer((2, 3))
    cache = layer.new_cache(2, 8)
    with torch.no_grad():
        layer.prefill(rand(2, 5, 32), cache, lengths=lengths)
    assert cache.lengths.tolist() == [3, 5] and cache.length_bound == 5


@pytest.mark.parametrize("lengths,match", [([0, 5], "values in 1 .. 5"), ([3, 6], "values in 1 .. 5"),
                                           ([3], "2 values"), (torch.tensor([[3, 5]]), r"shape \(1, 2\)")])
def test_bad_prompt_lengths_are_refused_before_anything_is_written(lengths, match):
    layer = make_layer((2, 3))
    cache = layer.new_cache(2, 8)
    with torch.no_grad(), pytest.raises(ValueError, match=match):
        layer.prefill(rand(2, 5, 32), cache, lengths=lengths)
    assert cache.is_empty and not cache.k.any()


@pytest.mark.parametrize("kernel_size", [(2, 3), (1, 1)])
def test_a_step_that_would_overflow_is_refused_and_leaves_the_cache_as_it_was(kernel_size):
    layer = make_layer(kernel_size)
    x = rand(2, 6, 32)
    cache = layer.new_cache(2, 6)
    with torch.no_grad():
        layer.prefill(x[:, :4], cache, lengths=[2, 4])
        layer.step(x[:, 4:6], cache)                 # the longer sequence is full now
        before = cache.clone()
        with pytest.raises(ValueError, match="the cache holds 6 positions: appending 1 token"):
            layer.step(x[:, :1], cache)
    for name in ("k", "v", "q", "lengths"):
        a, b = getattr(cache, name), getattr(before, name)
        assert (a is None and b is None) or torch.equal(a, b), name
    assert cache.length_bound == 6


def test_writes_while_a_graph_is_built_are_clamped_and_leave_the_bound_unknown(monkeypatch):
    """Inside a capture or a compiled step the host checks nothing: a write past the end lands on the last position
    (nothing outside the buffers), and the bound becomes unknown; the next eager check reads the lengths back."""
    cache = mta.KVCache.empty(1, 4, 1, 1, 2, keep_queries=False, device=DEVICE)
    cache.append(None, rand(1, 4, 1, 2), rand(1, 4, 1, 2))
    new = rand(1, 1, 1, 2)
    monkeypatch.setattr(mta.kv_cache, "building_graph", lambda device: True)
    cache.append(None, new, new)                     # no host check: refused only by the clamp
    assert cache.length_bound is None and torch.equal(cache.k[:, 3:], new)
    monkeypatch.undo()
    assert not cache.is_empty
    with pytest.raises(ValueError, match="holds 4 positions: appending 1 token"):
        cache.check_room(1)
    assert cache.length_bound == 5                   # read back from the lengths


@pytest.mark.skipif(ON_GPU, reason="the CPU's answer")
def test_capture_step_needs_a_cuda_device():
    layer = make_layer((2, 3))
    cache = layer.new_cache(1, 8)
    with torch.no_grad():
        layer.prefill(rand(1, 3, 32), cache)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        mta.capture_step(lambda x: layer.step(x, cache), rand(1, 1, 32), [cache])
    assert cache.lengths.tolist() == [3] and cache.length_bound == 3


# --- torch.compile with fullgraph=True (aot_eager here, inductor with CUDA graphs below) --------------------------


@pytest.mark.parametrize("kernel_size", [(2, 5), (1, 1)])
def test_a_step_compiles_whole_and_gives_the_forward_rows(kernel_size):
    """``torch.compile(layer.step, fullgraph=True)``: one graph for every token (the host bound is not read inside,
    so nothing recompiles), the forward's rows; afterwards an eager step reads the bound back."""
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    layer = make_layer(kernel_size)
    x = rand(2, 9, 32)
    with torch.no_grad():
        full = layer(x)
        cache = layer.new_cache(2, 10)
        layer.prefill(x[:, :4], cache)
        counter = CompileCounterWithBackend("aot_eager")
        step = torch.compile(layer.step, fullgraph=True, backend=counter)
        for t in range(4, 8):
            torch.testing.assert_close(step(x[:, t:t + 1], cache), full[:, t:t + 1], **TOL)
        assert counter.frame_count == 1 and cache.length_bound is None
        torch.testing.assert_close(layer.step(x[:, 8:9], cache), full[:, 8:9], **TOL)
    assert cache.length_bound == 9 and cache.lengths.tolist() == [9, 9]


def test_a_compiled_layer_prefills_and_steps_in_full_graphs():
    """``torch.compile(layer, fullgraph=True)``: ``is_empty`` is a host fact, so ``layer(x, cache=cache)`` picks
    prefill or step at trace time; two graphs in all."""
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    layer = make_layer((3, 5))
    x = rand(2, 9, 32)
    counter = CompileCounterWithBackend("aot_eager")
    model = torch.compile(layer, fullgraph=True, backend=counter)
    cache = layer.new_cache(2, 12)
    with torch.no_grad():
        want = layer(x)
        got = torch.cat([model(x[:, :6], cache=cache), *(model(x[:, t:t + 1], cache=cache) for t in range(6, 9))], 1)
    torch.testing.assert_close(got, want, **TOL)
    assert counter.frame_count == 2


# --- CUDA graphs (GPU) ---------------------------------------------------------------------------------------------


def gpu_layer(kernel_size):
    """fp32, 4 query heads of 16 over 2 kv heads, RoPE, a random kernel."""
    return make_layer(kernel_size, dim=64, heads=4, kv_heads=2)


def assert_same_cache(a, b):
    for name in ("k", "v", "q", "lengths"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or torch.equal(x, y), name
    assert a.length_bound == b.length_bound


@needs_gpu
@pytest.mark.parametrize("kernel_size", [(6, 11), (1, 1)])
def test_a_captured_layer_step_replays_exactly_the_eager_steps(kernel_size):
    """``capture_step`` over ``layer.step``: 20 replays give the eager steps' outputs and cache, bit for bit (the
    same kernels run); the capture itself leaves the cache as it was."""
    layer = gpu_layer(kernel_size)
    x = rand(2, 40, 64)
    cache = layer.new_cache(2, 48)
    with torch.no_grad():
        layer.prefill(x[:, :8], cache, lengths=[5, 8])
    eager = cache.clone()
    captured = mta.capture_step(lambda t: layer.step(t, cache), x[:, 8:9], [cache])
    assert isinstance(captured, mta.CapturedStep)
    assert torch.equal(cache.lengths, eager.lengths) and cache.length_bound == eager.length_bound == 8
    with torch.no_grad():
        for t in range(8, 28):
            got = captured(x[:, t:t + 1])
            want = layer.step(x[:, t:t + 1], eager)
            assert torch.equal(got, want), f"token {t}: {(got - want).abs().max().item()}"
    assert cache.lengths.tolist() == [25, 28]
    assert_same_cache(cache, eager)                 # the warm-up's writes were overwritten by the first replay


@needs_gpu
@pytest.mark.parametrize("kernel_size", [(6, 11), (1, 1)])
def test_a_step_captured_by_hand_leaves_the_cache_untouched_until_replayed(kernel_size):
    """``torch.cuda.graph`` around ``layer.step``: the capture writes nothing, the host bound becomes unknown (the
    replays advance the lengths without the host), and each replay appends one token per sequence."""
    layer = gpu_layer(kernel_size)
    x = rand(2, 20, 64)
    cache = layer.new_cache(2, 24)
    with torch.no_grad():
        layer.prefill(x[:, :6], cache)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layer.step(x[:, 6:7], cache.clone())    # warm-up on a copy: kernels compiled, plans made
        torch.cuda.current_stream().wait_stream(stream)
        before = cache.clone()
        static_x = x[:, 6:7].clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = layer.step(static_x, cache)
        torch.cuda.synchronize()
        for name in ("k", "v", "q", "lengths"):
            a, b = getattr(cache, name), getattr(before, name)
            assert (a is None and b is None) or torch.equal(a, b), name
        assert cache.length_bound is None
        for t in range(6, 12):
            static_x.copy_(x[:, t:t + 1])
            graph.replay()
            assert torch.equal(out, layer.step(x[:, t:t + 1], before)), f"token {t}"
    assert cache.lengths.tolist() == [12, 12]
    cache.check_room(1)                             # reads the lengths back
    assert cache.length_bound == 12


@needs_gpu
def test_prefill_step_and_replays_never_synchronise():
    layer, plain = gpu_layer((6, 11)), gpu_layer((1, 1))
    x = rand(2, 16, 64)
    device_lengths = torch.tensor([5, 8], device=DEVICE)
    q, k, v = rand(2, 1, 4, 16), rand(2, 1, 2, 16), rand(2, 1, 2, 16)
    with torch.no_grad():
        for model in (layer, plain):                 # kernels compiled first
            warm = model.new_cache(2, 16)
            model.prefill(x[:, :8], warm, lengths=[5, 8])
            model.step(x[:, 8:9], warm)
            model.step(x[:, 9:11], warm)
        held = layer.new_cache(2, 16)
        layer.prefill(x[:, :8], held)
        captured = mta.capture_step(lambda t: layer.step(t, held), x[:, :1], [held])
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for model in (layer, plain):
                for lengths in ([5, 8], device_lengths, None):
                    cache = model.new_cache(2, 16)
                    model.prefill(x[:, :8], cache, lengths=lengths)
                    model.step(x[:, 8:9], cache)
                    model(x[:, 9:11], cache=cache)
            cache = layer.new_cache(2, 16)
            cache.fill(q, k, v)
            cache.append(q, k, v)
            for t in range(3):
                captured(x[:, t:t + 1])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert cache.lengths.tolist() == [2, 2] and held.length_bound == 11


@needs_gpu
def test_prefill_with_lengths_on_the_device_matches_the_host_lengths():
    layer = gpu_layer((6, 11))
    x = rand(2, 12, 64)
    host, device = layer.new_cache(2, 16), layer.new_cache(2, 16)
    with torch.no_grad():
        a = layer.prefill(x[:, :8], host, lengths=[5, 8])
        b = layer.prefill(x[:, :8], device, lengths=torch.tensor([5, 8], device=DEVICE))
        assert device.length_bound == 8 and torch.equal(host.lengths, device.lengths)
        assert torch.equal(a[0, :5], b[0, :5]) and torch.equal(a[1], b[1])
        assert torch.equal(layer.step(x[:, 8:9], host), layer.step(x[:, 8:9], device))


@needs_gpu
@pytest.mark.parametrize("kernel_size", [(6, 11), (1, 1)])
def test_a_step_compiles_with_fullgraph_and_cuda_graphs(kernel_size):
    """``torch.compile(layer.step, fullgraph=True, mode="reduce-overhead")``: inductor keeps its CUDA graphs (the
    cache's tensors are marked static, so writing into them does not make it skip them) and the tokens match the
    eager steps."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    layer = gpu_layer(kernel_size)
    x = rand(2, 16, 64)
    cache = layer.new_cache(2, 24)
    with torch.no_grad():
        layer.prefill(x[:, :6], cache)
        eager = cache.clone()
        counters.clear()
        step = torch.compile(layer.step, fullgraph=True, mode="reduce-overhead")
        for t in range(6, 12):
            got = step(x[:, t:t + 1], cache).clone()   # the graph's output is overwritten by the next replay
            torch.testing.assert_close(got, layer.step(x[:, t:t + 1], eager), atol=1e-4, rtol=1e-4)
    assert torch.equal(cache.lengths, eager.lengths)
    assert counters["inductor"]["cudagraph_skips"] == 0


class TwoLayerToy(nn.Module):
    """Embedding, an MTA layer and a plain one (residual), a linear head: ``tokens [B, n]`` -> logits."""

    def __init__(self, vocab=40, dim=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([gpu_layer((6, 11)), gpu_layer((1, 1))])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens, caches):
        h = self.embed(tokens)
        for layer, cache in zip(self.layers, caches):
            h = h + layer(h, cache=cache)            # prefill on empty caches, a step otherwise
        return self.head(h)


@needs_gpu
def test_capture_step_generates_a_whole_model_like_eager_steps():
    model = TwoLayerToy().to(DEVICE).eval()
    prompt = torch.randint(0, 40, (2, 7), device=DEVICE)
    caches = [layer.new_cache(2, 32) for layer in model.layers]
    with torch.no_grad():
        logits = model(prompt, caches)
    eager = [cache.clone() for cache in caches]
    captured = mta.capture_step(lambda tokens: model(tokens, caches), prompt[:, -1:], caches)
    for cache, copy in zip(caches, eager):
        assert torch.equal(cache.lengths, copy.lengths) and cache.length_bound == copy.length_bound == 7
    token = logits[:, -1:].argmax(-1)
    with torch.no_grad():
        for _ in range(10):
            got = captured(token)
            assert torch.equal(got, model(token, eager))
            token = got[:, -1:].argmax(-1)
        for cache, copy in zip(caches, eager):
            assert_same_cache(cache, copy)
        for cache in caches + eager:                 # the next prompt, in the same caches: the graph still serves
            cache.reset()
        model(prompt[:, :4], caches)
        model(prompt[:, :4], eager)
        assert torch.equal(captured(prompt[:, 4:5]), model(prompt[:, 4:5], eager))
    assert [cache.lengths.tolist() for cache in caches] == [[5, 5], [5, 5]]


@needs_gpu
def test_misuse_of_a_captured_step_is_refused_by_name():
    layer = gpu_layer((6, 11))
    x = rand(2, 12, 64)
    cache = layer.new_cache(2, 10)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"caches\[0\] is empty"):
            mta.capture_step(lambda t: layer.step(t, cache), x[:, :1], [cache])
        layer.prefill(x[:, :7], cache)
        captured = mta.capture_step(lambda t: layer.step(t, cache), x[:, :1], [cache])
        with pytest.raises(ValueError, match=r"captured for x of shape \(2, 1, 64\)"):
            captured(x[:, :2])
        for t in range(7, 10):
            captured(x[:, t:t + 1])
        before = cache.clone()
        with pytest.raises(ValueError, match=r"caches\[0\]: the cache holds 10 positions"):
            captured(x[:, 10:11])                    # full: refused before the replay
        assert_same_cache(cache, before)
        with pytest.raises(ValueError, match=r"caches\[0\]: the cache holds 10 positions"):
            mta.capture_step(lambda t: layer.step(t, cache), x[:, :1], [cache])
        cache.reset()
        layer.prefill(x[:, :3], cache)
        cache.lengths = cache.lengths.cpu()          # lengths on the host: refused in a capture, and eagerly too
        with pytest.raises(ValueError, match="cache.lengths is on cpu"):
            mta.capture_step(lambda t: layer.step(t, cache), x[:, :1], [cache])
        with pytest.raises(ValueError, match="cache.lengths is on cpu"):
            layer.step(x[:, 3:4], cache)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        mta.capture_step(lambda t: t, torch.zeros(2, 1), [])
