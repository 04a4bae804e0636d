"""``mta.MultiTokenAttention``: identity init is causal attention, GQA and RoPE against the materialized
reference, errors, autocast, ``torch.compile`` without graph breaks, gradients, and decoding with the cache."""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, ON_GPU, mta, rand

from mta import MultiTokenAttention
from mta.rope import apply_rope

TOL = dict(atol=2e-5, rtol=2e-5)


def make_layer(dim=32, heads=2, kv_heads=None, kernel_size=(2, 5), rope_theta=None, random_kernel=True):
    layer = MultiTokenAttention(dim, heads, num_kv_heads=kv_heads, kernel_size=kernel_size,
                                rope_theta=rope_theta).to(DEVICE)
    if random_kernel and layer.conv_weight is not None:
        with torch.no_grad():
            layer.conv_weight.add_(0.3 * torch.randn_like(layer.conv_weight))
    return layer


def reference_forward(layer: MultiTokenAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer in plain PyTorch, with :func:`mta.conv_attention_reference` (materialized)."""
    B, N, _ = x.shape
    H, Hkv, D = layer.num_heads, layer.num_kv_heads, layer.head_dim
    q = layer.q_proj(x).view(B, N, H, D).transpose(1, 2)
    k = layer.k_proj(x).view(B, N, Hkv, D).transpose(1, 2)
    v = layer.v_proj(x).view(B, N, Hkv, D).transpose(1, 2)
    if layer.rope_theta is not None:
        pos = torch.arange(N, device=x.device)
        q, k = apply_rope(q, pos, layer.rope_theta), apply_rope(k, pos, layer.rope_theta)
    w = layer.conv_weight if layer.is_mta else torch.ones(H, 1, 1, device=x.device)
    o = mta.conv_attention_reference(q, k, v, w, causal=True)
    return layer.o_proj(o.transpose(1, 2).reshape(B, N, H * D))


def test_identity_init_is_causal_attention():
    layer = make_layer(kernel_size=(6, 11), random_kernel=False)
    w = layer.conv_weight.detach()
    assert w.dtype == torch.float32 and w.shape == (2, 6, 11)
    assert w[:, 5, 5].eq(1).all() and w.sum() == 2
    x = rand(2, 13, 32)
    plain = make_layer(kernel_size=(1, 1))
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if k != "conv_weight"})
    assert plain.conv_weight is None
    with torch.no_grad():
        torch.testing.assert_close(layer(x), plain(x), **TOL)
        B, N, _ = x.shape
        q, k, v = (p(x).view(B, N, 2, 16).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
        o = mta.flash_attention(q, k, v, causal=True).transpose(1, 2).reshape(B, N, 32)
        torch.testing.assert_close(layer(x), layer.o_proj(o), **TOL)


@pytest.mark.parametrize("kv_heads,kernel_size,rope", [(1, (2, 9), 1e4), (2, (3, 5), None), (2, (1, 1), 100.0)])
def test_matches_reference_gqa_rope(kv_heads, kernel_size, rope):
    layer = make_layer(heads=4, kv_heads=kv_heads, kernel_size=kernel_size, rope_theta=rope)
    x = rand(2, 11, 32)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), reference_forward(layer, x), **TOL)


@pytest.mark.parametrize("kv_heads,kernel_size", [(1, (2, 9)), (2, (1, 1))])
def test_attention_probabilities_give_the_layers_output(kv_heads, kernel_size):
    """``P`` is causal with rows summing to 1, and ``o_proj(P @ v)`` (GQA: a kv head per query group) is the
    layer's forward."""
    layer = make_layer(heads=4, kv_heads=kv_heads, kernel_size=kernel_size, rope_theta=1e4)
    x = rand(2, 11, 32)
    probs, out = layer.attention_probabilities(x, with_output=True)
    assert probs.shape == (2, 4, 11, 11) and probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 11, device=probs.device))
    assert (probs.triu(1) == 0).all()
    torch.testing.assert_close(layer.attention_probabilities(x), probs)
    with torch.no_grad():
        torch.testing.assert_close(out, layer(x), **TOL)


def test_rope_depends_on_relative_position_only():
    q, k = rand(1, 1, 1, 16, dtype=torch.float64), rand(1, 1, 1, 16, dtype=torch.float64)

    def score(m, n):
        return (apply_rope(q, torch.tensor([m]), 1e4) * apply_rope(k, torch.tensor([n]), 1e4)).sum()

    torch.testing.assert_close(score(7, 3), score(104, 100))
    assert not torch.allclose(score(7, 3), score(7, 4))
    torch.testing.assert_close(apply_rope(q, torch.tensor([0]), 1e4), q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_sequence", [False, True])
def test_rope_turns_each_pair_by_its_angle(dtype, per_sequence):
    """Channels c and c + D/2 of a head at position p turn by p * theta ** (-2c / D), in fp32, back in x's dtype, to
    the last bit, forward and backward: the full-width (cos, sin) that rotate reads is the pair rotation written
    out; one rotation serves queries and keys."""
    from mta.rope import rope_angles, rope_rotation, rotate
    B, H, N, D = 2, 3, 11, 10
    x, grad = rand(B, H, N, D, dtype=dtype).requires_grad_(), rand(B, H, N, D, dtype=dtype)
    positions = torch.randint(0, 10 ** 6, (B, N) if per_sequence else (N,), device=DEVICE)
    angles = rope_angles(positions, D, 1e4)
    angles = angles[:, None] if per_sequence else angles
    x1, x2 = x.float().chunk(2, dim=-1)
    want = torch.cat((x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()), -1).to(dtype)
    got = rotate(x, rope_rotation(x, positions, 1e4))
    assert got.dtype == dtype and torch.equal(got, want) and torch.equal(apply_rope(x, positions, 1e4), want)
    assert torch.equal(torch.autograd.grad(got, x, grad)[0], torch.autograd.grad(want, x, grad)[0])


def test_bad_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="dim must be a multiple of num_heads"):
        MultiTokenAttention(30, 4)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        MultiTokenAttention(32, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="ck must be odd"):
        MultiTokenAttention(32, 4, kernel_size=(2, 8))
    with pytest.raises(ValueError, match="at least"):
        MultiTokenAttention(32, 4, kernel_size=(0, 3))
    with pytest.raises(ValueError, match="even head dim"):
        MultiTokenAttention(36, 4, rope_theta=1e4)
    with pytest.raises(NotImplementedError, match="post_softmax_conv.*") as info:
        MultiTokenAttention(32, 4, post_softmax_conv=True, head_mixing=True, group_norm=True)
    for name in ("post_softmax_conv", "head_mixing", "group_norm"):
        assert name in str(info.value)
    with pytest.raises(TypeError, match="unexpected keyword"):
        MultiTokenAttention(32, 4, dropout=0.1)
    with pytest.raises(TypeError, match="two ints"):
        MultiTokenAttention(32, 4, kernel_size=(2.7, 3))
    with pytest.raises(TypeError, match="two ints"):
        MultiTokenAttention(32, 4, kernel_size=(2, 3, 1))
    with pytest.raises(ValueError, match="not supported"):  # at construction, not at the first forward
        MultiTokenAttention(32, 4, kernel_size=(33, 3))
    with pytest.raises(ValueError, match="at most 256"):
        MultiTokenAttention(4 * 264, 4)
    # The paper's options switched off are what this layer is: accepted.
    layer = MultiTokenAttention(32, 4, kernel_size=(2, 3), head_mixing=False, group_norm=None, post_softmax_conv=False)
    assert layer.kernel_size == (2, 3)


def test_gradients_reach_the_kernel_and_the_projections():
    layer = make_layer(heads=2, kv_heads=1, kernel_size=(2, 3), rope_theta=1e4)
    ref = make_layer(heads=2, kv_heads=1, kernel_size=(2, 3), rope_theta=1e4)
    ref.load_state_dict(layer.state_dict())
    x = rand(2, 9, 32)
    layer(x).square().sum().backward()
    reference_forward(ref, x).square().sum().backward()
    for (name, p), r in zip(layer.named_parameters(), ref.parameters()):
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        torch.testing.assert_close(p.grad, r.grad, atol=1e-4, rtol=1e-4, msg=name)
    assert layer.conv_weight.grad.dtype == torch.float32


def test_autocast_half_precision_activations_fp32_kernel():
    # CPU autocast to fp16 (the interpreter's tl.dot is wrong in bf16); bf16 autocast is tested on a GPU below.
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    layer = make_layer(heads=2, kv_heads=1, kernel_size=(2, 5), rope_theta=1e4)
    x = rand(2, 10, 32)
    want = layer(x).detach()
    with torch.autocast(DEVICE.type, dtype=dtype):
        y = layer(x)
    assert y.dtype == dtype and layer.conv_weight.dtype == torch.float32
    y.float().sum().backward()
    assert layer.conv_weight.grad.dtype == torch.float32 and torch.isfinite(layer.conv_weight.grad).all()
    torch.testing.assert_close(y.float(), want, atol=3e-2, rtol=3e-2)


def test_compile_fullgraph_no_graph_breaks():
    layer = make_layer(heads=2, kv_heads=1, kernel_size=(2, 3), rope_theta=1e4)
    x = rand(1, 8, 32)
    explained = torch._dynamo.explain(layer)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)          # inductor: the rest of the layer compiled around the ops
    y = compiled(x)
    y.square().sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    want = layer(x)
    want.square().sum().backward()
    torch.testing.assert_close(y, want, **TOL)
    for g, p in zip(grads, layer.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-4, rtol=1e-4)


def test_a_compiled_layer_generates_the_rows_of_its_forward():
    """``torch.compile(layer, fullgraph=True)`` prefills and steps through the same rows as the whole forward; a
    cache is compared by identity, so it can be hashed and looked up."""
    layer = make_layer(heads=2, kernel_size=(3, 5))
    x = rand(2, 9, 32)
    want = layer(x)
    model = torch.compile(layer, backend="aot_eager", fullgraph=True)
    cache = layer.new_cache(2, 12)
    with torch.no_grad():
        got = torch.cat([model(x[:, :6], cache=cache), *(model(x[:, t:t + 1], cache=cache) for t in range(6, 9))], 1)
    torch.testing.assert_close(got, want, **TOL)
    assert cache == cache and cache != layer.new_cache(2, 12) and len({cache, cache}) == 1


def test_compile_plain_arm_no_graph_breaks():
    layer = make_layer(heads=2, kernel_size=(1, 1))
    explained = torch._dynamo.explain(layer)(rand(1, 6, 32))
    assert explained.graph_break_count == 0


def decode_all(layer, x, prompt_lens, n_new=1, dtype=None):
    """Prefill each sequence's first ``prompt_lens[b]`` tokens of ``x`` (right-padded), then feed the following
    tokens ``n_new`` at a time; return ``{(b, position): output row}``."""
    B, N, _ = x.shape
    cache = layer.new_cache(B, N, dtype=dtype)
    rows = {}
    with torch.no_grad():
        out = layer(x[:, :max(prompt_lens)], cache=cache) if max(prompt_lens) == min(prompt_lens) else \
            layer.prefill(x[:, :max(prompt_lens)], cache, lengths=prompt_lens)
        for b, n in enumerate(prompt_lens):
            rows.update({(b, t): out[b, t] for t in range(n)})
        while int(cache.lengths.max()) + n_new <= N:
            pos = cache.lengths.clone()
            xs = torch.stack([x[b, pos[b]:pos[b] + n_new] for b in range(B)])
            out = layer(xs, cache=cache)
            rows.update({(b, int(pos[b]) + t): out[b, t] for b in range(B) for t in range(n_new)})
    return rows


@pytest.mark.parametrize("kernel_size,kv_heads,n_new", [((2, 5), 1, 1), ((3, 3), 2, 2), ((1, 1), 1, 1)])
def test_incremental_decoding_reproduces_the_forward(kernel_size, kv_heads, n_new):
    layer = make_layer(heads=2, kv_heads=kv_heads, kernel_size=kernel_size, rope_theta=1e4)
    x = rand(2, 12, 32)
    with torch.no_grad():
        full = layer(x)
    rows = decode_all(layer, x, [3, 7], n_new=n_new)
    assert len(rows) >= 18           # every position but the last of one sequence when n_new = 2
    for (b, t), row in rows.items():
        torch.testing.assert_close(row, full[b, t], **TOL, msg=f"sequence {b}, position {t}")


def test_cache_errors():
    layer = make_layer(kernel_size=(2, 3))
    cache = layer.new_cache(1, 4)
    assert cache.q is not None and cache.k.shape == (1, 4, 2, 16)
    assert make_layer(kernel_size=(1, 1)).new_cache(1, 4).q is None
    with torch.no_grad():
        layer(rand(1, 3, 32), cache=cache)
        layer(rand(1, 1, 32), cache=cache)
        with pytest.raises(ValueError, match="does not fit"):
            layer(rand(1, 1, 32), cache=cache)
        with pytest.raises(ValueError, match="empty cache"):
            layer.prefill(rand(1, 2, 32), cache)


def test_bad_inputs_raise_clear_errors_before_anything_is_written():
    """``x`` of the wrong width, rank or dtype, and a cache made for another layer's heads, raise errors that name
    the problem (not a matmul's shape error deep inside), and a refused call leaves the cache as it was."""
    layer = make_layer(kernel_size=(2, 3))                   # dim 32, 2 heads of 16
    cache = layer.new_cache(1, 8)
    for call in (lambda x: layer(x), lambda x: layer.prefill(x, cache), lambda x: layer.attention_probabilities(x)):
        with pytest.raises(ValueError, match=r"x must be \[B, N, dim=32\], got shape \(1, 3, 24\)"):
            call(rand(1, 3, 24))
        with pytest.raises(ValueError, match=r"got shape \(3, 32\)"):
            call(rand(3, 32))
        with pytest.raises(TypeError, match="floating-point"):
            call(torch.ones(1, 3, 32, dtype=torch.int64, device=DEVICE))
    assert cache.is_empty
    other = make_layer(dim=48, heads=3, kernel_size=(2, 3)).new_cache(1, 8)   # heads of 16, three of them
    with torch.no_grad(), pytest.raises(ValueError, match="3 heads of dim 16"):
        layer.prefill(rand(1, 3, 32), other)
    assert other.is_empty
    with torch.no_grad():
        layer.prefill(rand(1, 3, 32), cache)
        with pytest.raises(ValueError, match=r"x must be \[B, N, dim=32\]"):
            layer.step(rand(1, 1, 31), cache)
    assert cache.lengths.tolist() == [3]
    plain = make_layer(kernel_size=(1, 1)).new_cache(1, 8)
    with pytest.raises(ValueError, match="k and v must be"):
        plain.append(None, rand(1, 1, 2, 16), rand(1, 1, 2, 8))
    with pytest.raises(ValueError, match="keeps the queries"):
        cache.append(None, rand(1, 1, 2, 16), rand(1, 1, 2, 16))
    assert cache.lengths.tolist() == [3] and plain.is_empty


def test_prefill_with_gradients_caches_values_not_a_graph():
    layer = make_layer(kernel_size=(2, 3))
    cache = layer.new_cache(2, 12)
    y = layer.prefill(rand(2, 5, 32), cache)  # gradients on: the output keeps its graph, the cache does not
    assert y.requires_grad and not (cache.k.requires_grad or cache.v.requires_grad or cache.q.requires_grad)
    y.sum().backward()
    assert layer.conv_weight.grad is not None


@pytest.mark.parametrize("kernel_size", [(2, 3), (1, 1)])
def test_a_refused_step_or_prefill_leaves_the_cache_as_it_was(kernel_size):
    """A step of more than 16 tokens, or a batch that is not the cache's, raises before anything is written: the
    next valid step still gives the forward's row."""
    layer = make_layer(kernel_size=kernel_size)
    x = rand(2, 40, 32)
    with torch.no_grad():
        cache = layer.new_cache(2, 40)
        with pytest.raises(ValueError, match="batch 3 but the cache holds 2"):
            layer.prefill(rand(3, 4, 32), cache)
        assert cache.is_empty
        layer.prefill(x[:, :4], cache)
        with pytest.raises(ValueError, match="1 to 16 new tokens"):
            layer.step(x[:, 4:21], cache)
        with pytest.raises(ValueError, match="batch 1 but the cache holds 2"):
            layer.step(x[:1, 4:5], cache)
        assert cache.lengths.tolist() == [4, 4]
        torch.testing.assert_close(layer.step(x[:, 4:5], cache), layer(x[:, :5])[:, 4:5], **TOL)


@pytest.mark.skipif(not ON_GPU, reason="bf16 needs a GPU (the interpreter's bf16 tl.dot is wrong)")
def test_bf16_autocast_decoding_matches_the_forward_on_gpu():
    layer = MultiTokenAttention(128, 4, num_kv_heads=2, kernel_size=(6, 11), rope_theta=1e4).to(DEVICE)
    with torch.no_grad():
        layer.conv_weight.add_(0.2 * torch.randn_like(layer.conv_weight))
    x = rand(2, 64, 128)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with torch.no_grad():
            full = layer(x)
        rows = decode_all(layer, x, [17, 40], dtype=torch.bfloat16)
    worst = max((row.float() - full[b, t].float()).abs().max().item() for (b, t), row in rows.items())
    assert worst < 3e-2 * full.float().abs().max().item()


@pytest.mark.parametrize("kernel_size", [(2, 3), (1, 1)])
def test_a_cache_made_for_the_other_kind_of_layer_is_refused_before_anything_is_written(kernel_size):
    """An MTA layer needs the queries kept, plain attention a cache without them; query heads must match too."""
    layer = make_layer(kernel_size=kernel_size)
    other_kind = make_layer(kernel_size=(1, 1) if layer.is_mta else (2, 3)).new_cache(2, 8)
    x = rand(2, 3, 32)
    with torch.no_grad():
        with pytest.raises(ValueError, match="not made for this layer"):
            layer.prefill(x, other_kind)
        assert other_kind.is_empty
        make_layer(kernel_size=(1, 1) if layer.is_mta else (2, 3)).prefill(x, other_kind)
        with pytest.raises(ValueError, match="not made for this layer"):
            layer.step(x[:, :1], other_kind)
        assert other_kind.lengths.tolist() == [3, 3]
        with pytest.raises(TypeError, match="mta.KVCache"):
            layer(x, cache={"k": None})
    if layer.is_mta:  # the layer's kv heads (2 of dim 16), 4 query heads where the layer has 2
        gqa = mta.KVCache.empty(2, 8, 4, 2, 16, keep_queries=True, device=DEVICE)
        with torch.no_grad(), pytest.raises(ValueError, match="queries have 4 heads"):
            layer.prefill(x, gqa)
        assert gqa.is_empty


@pytest.mark.parametrize("kernel_size", [(2, 3), (1, 1)])
def test_a_step_or_prefill_that_fails_in_the_kernel_leaves_the_cache_as_it_was(kernel_size, monkeypatch):
    """Past the checks, a failure inside the attention (here a stand-in that raises) must not leave the cache
    advanced or filled: the next valid call still gives the forward's rows."""
    layer = make_layer(kernel_size=kernel_size)
    x = rand(2, 6, 32)
    cache = layer.new_cache(2, 8)

    def broken(*args, **kwargs):
        raise RuntimeError("kernel failed")
    with torch.no_grad():
        with monkeypatch.context() as patch:
            patch.setattr(layer, "_attend", broken)
            with pytest.raises(RuntimeError, match="kernel failed"):
                layer.prefill(x[:, :4], cache)
        assert cache.is_empty
        layer.prefill(x[:, :4], cache)
        with monkeypatch.context() as patch:
            patch.setattr(mta.layer, "conv_decode_attention" if layer.is_mta else "decode_attention", broken)
            with pytest.raises(RuntimeError, match="kernel failed"):
                layer.step(x[:, 4:5], cache)
        assert cache.lengths.tolist() == [4, 4]
        torch.testing.assert_close(layer.step(x[:, 4:5], cache), layer(x[:, :5])[:, 4:5], **TOL)


def test_bad_layer_and_cache_arguments_are_named():
    for args, kwargs, error, match in [((32, 2.0), {}, TypeError, "num_heads must be an int"),
                                       ((32.0, 2), {}, TypeError, "dim must be an int"),
                                       ((32, 0), {}, ValueError, "num_heads must be at least 1"),
                                       ((32, 2), dict(num_kv_heads=True), TypeError, "num_kv_heads"),
                                       ((32, 2), dict(kernel_size=3), TypeError, "two ints"),
                                       ((32, 2), dict(rope_theta=0), ValueError, "rope_theta"),
                                       ((32, 2), dict(rope_theta=float("nan")), ValueError, "rope_theta"),
                                       ((32, 2), dict(rope_theta="1e4"), TypeError, "rope_theta")]:
        with pytest.raises(error, match=match):
            MultiTokenAttention(*args, **kwargs)
    layer = make_layer(kernel_size=(2, 3))
    for kwargs, error, match in [(dict(max_len=2.5), TypeError, "max_len must be an int"),
                                 (dict(max_len=0), ValueError, "max_len"),
                                 (dict(dtype=torch.float64), TypeError, "fp32, fp16 or bf16"),
                                 (dict(dtype=torch.int64), TypeError, "fp32, fp16 or bf16"),
                                 (dict(dtype="float16"), TypeError, "torch.dtype")]:
        with pytest.raises(error, match=match):
            layer.new_cache(**{"batch": 2, "max_len": 8, **kwargs})


@pytest.mark.parametrize("lengths", [[2.7, 4], torch.tensor([2.9, 3.5]), [True, 4], torch.tensor([True, True])])
def test_prefill_lengths_must_be_integers_not_rounded(lengths):
    layer = make_layer(kernel_size=(2, 3))
    cache = layer.new_cache(2, 8)
    with torch.no_grad(), pytest.raises(TypeError, match="lengths must be"):
        layer.prefill(rand(2, 4, 32), cache, lengths=lengths)
    assert cache.is_empty
