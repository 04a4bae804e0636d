"""Adversarial pass on deploying: autocast, export, RoPE and generation, mixed dtypes and devices, as an ML engineer
training under mixed precision and serving a model would meet them. Each test was checked to fail before its fix."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.errors import OutOfResources

import mta
import mta.conv
import mta.conv_decode
from conftest import DEVICE, ON_GPU, chunked_by_default, rand, rand_qkv, rel_err

#: Autocast's low precision where the kernels run: bf16 on a GPU, fp16 on the CPU (the interpreter's bf16 products
#: are wrong, and these paths must not reach them anyway).
LOW = torch.bfloat16 if ON_GPU else torch.float16
#: fp32 work on values of order 1: far below one fp16 (or bf16) rounding of the scores.
FP32_TOL = 1e-5


def refused(*args, **kwargs):
    raise OutOfResources(237568, 232448, "shared memory")


# --- autocast: the references and the unfused paths compute in fp32, as the fused kernels do ------------------


def test_the_references_compute_in_fp32_under_autocast():
    """``naive_attention``, ``blocked_attention``, ``conv_attention_reference`` and its probabilities compute in fp32
    for fp32 inputs (the definition, ``docs/mta-semantics.md``), whatever autocast the caller runs under; the fused
    kernels do. Autocast made their products fp16 (bf16 on a GPU): an fp32 result with a 4e-4 error (1e-2)."""
    q, k, v = rand_qkv(1, 2, 1, 12, 12, 16)
    weight = rand(2, 3, 5, scale=0.3)
    calls = {
        "naive_attention": lambda: mta.naive_attention(q, k, v, causal=True),
        "blocked_attention": lambda: mta.blocked_attention(q, k, v, block_size=5, causal=True),
        "conv_attention_reference": lambda: mta.conv_attention_reference(q, k, v, weight),
        "conv_attention_probabilities": lambda: mta.reference.conv_attention_probabilities(q, k, weight),
    }
    for name, call in calls.items():
        want = call()
        with torch.autocast(DEVICE.type, dtype=LOW):
            got = call()
        assert got.dtype == torch.float32 and rel_err(got, want) < FP32_TOL, name


def test_an_attention_state_keeps_one_dtype_under_autocast():
    """``attention_state(s, v)`` of fp32 scores and values: ``m`` and ``l`` were fp32 and ``acc`` autocast's fp16 (its
    ``p @ v``), a state of two dtypes and one fp16 rounding; now all fp32, as without autocast."""
    s, v = rand(2, 4, 6), rand(2, 6, 8)
    want = mta.attention_state(s, v)
    with torch.autocast(DEVICE.type, dtype=LOW):
        got = mta.attention_state(s, v)
    for name, x, y in zip(("m", "l", "acc"), got, want):
        assert x.dtype == torch.float32 and rel_err(x, y) < FP32_TOL, name


def test_the_unfused_fallbacks_compute_in_fp32_under_autocast(monkeypatch):
    """Where a fused launch is refused (or the fused backward does not fit), ``conv_attention`` and
    ``conv_decode_attention`` give the same answer from PyTorch code (:mod:`mta.conv_chunked`,
    :mod:`mta.conv_decode_rows`); under autocast its products and convolutions ran in fp16 (bf16 on a GPU) where the
    fused kernels compute in fp32: the answer depended on whether a tile fits. Backward inside the autocast region
    too."""
    monkeypatch.setattr(mta.conv, "planned_forward", refused)
    chunked_by_default(monkeypatch)
    monkeypatch.setattr(mta.conv_decode, "run_decode", refused)
    q, k, v = (x.requires_grad_() for x in rand_qkv(1, 2, 1, 12, 12, 16))
    weight = rand(2, 3, 5, scale=0.3).requires_grad_()
    do = rand(1, 2, 12, 16)
    leaves = (q, k, v, weight)
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    ref = mta.conv_attention_reference(*ref_leaves)
    ref_grads = torch.autograd.grad(ref, ref_leaves, do.double())
    with torch.autocast(DEVICE.type, dtype=LOW):
        out = mta.conv_attention(q, k, v, weight)
        got_grads = torch.autograd.grad(out, leaves, do)
        rows = mta.conv_decode_attention(q.detach(), k.detach(), v.detach(), weight.detach(), cache_seqlens=[12],
                                         num_queries=3)
    assert out.dtype == torch.float32 and rel_err(out, ref) < FP32_TOL
    for name, got, want in zip("q k v weight".split(), got_grads, ref_grads):
        assert rel_err(got, want) < FP32_TOL, name
    assert rel_err(rows, ref[:, :, -3:]) < FP32_TOL


# --- mixed devices -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["ops", "compiled"])
def test_lengths_on_the_meta_device_are_refused_by_name_through_the_ops(path):
    """``cache_seqlens`` on a device that is neither the host nor the caches' reached the custom op unchecked: a meta
    tensor among its inputs sent the call to the op's fake implementation, which returned uninitialised memory of
    the output's shape (eagerly, ``mta.decode_attention`` names it)."""
    q, k, v = rand_qkv(2, 2, 1, 8, 8, 16)
    weight = rand(2, 2, 3, scale=0.3)
    lengths = torch.tensor([5, 8], device="meta")
    if path == "ops":
        decode, conv_decode = mta.ops.decode_attention, mta.ops.conv_decode_attention
    else:
        decode = torch.compile(lambda *a, **kw: mta.decode_attention(*a, **kw), backend="aot_eager")
        conv_decode = torch.compile(lambda *a, **kw: mta.conv_decode_attention(*a, **kw), backend="aot_eager")
    with pytest.raises(ValueError, match=f"cache_seqlens is on meta but the caches are on {q.device}"):
        decode(q[:, :, -1:], k, v, cache_seqlens=lengths)
    with pytest.raises(ValueError, match=f"cache_seqlens is on meta but the caches are on {q.device}"):
        conv_decode(q, k, v, weight, cache_seqlens=lengths)


# --- RoPE ----------------------------------------------------------------------------------------------------------


def rope_float64(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE ("rotate half") on ``x [..., N, D]`` in float64, frequencies and angles included."""
    D = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
    angles = positions.to(x.device).double()[:, None] * inv_freq
    x1, x2 = x.double().chunk(2, dim=-1)
    return torch.cat((x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()), dim=-1)


@pytest.mark.parametrize("theta", [1e-46, 1e-39, 1e-36])
def test_a_rope_base_whose_angles_leave_fp32_is_refused_by_name(theta):
    """A positive finite ``rope_theta`` so small that fp32 holds it as 0 (``1e-46``: frequencies ``0 ** -x = inf``),
    or whose highest frequency times a position overflows fp32, was accepted and gave NaN outputs from the layer
    (and from :func:`mta.rope.apply_rope`). Now refused where the angles of positions below 2**31 would not be
    finite."""
    with pytest.raises(ValueError, match="rope_theta"):
        mta.MultiTokenAttention(32, 2, kernel_size=(1, 1), rope_theta=theta)
    with pytest.raises(ValueError, match="theta"):
        mta.rope.apply_rope(rand(1, 1, 4, 16), torch.arange(4), theta)


def test_rope_compiles_whole_with_a_symbolic_base():
    """The base's check stays out of a traced graph: dynamo makes a changing float argument symbolic."""
    x, positions = rand(1, 2, 5, 16), torch.arange(5)
    rope = torch.compile(mta.rope.apply_rope, fullgraph=True, dynamic=True, backend="eager")
    for theta in (1e4, 5e5):
        torch.testing.assert_close(rope(x, positions, theta), mta.rope.apply_rope(x, positions, theta))


@pytest.mark.parametrize("x_shape,positions,error", [
    ((2, 3, 5, 8), torch.tensor([4]), ValueError),           # one position for five tokens: broadcast
    ((2, 3, 5, 8), torch.tensor([[4], [6]]), ValueError),    # one per sequence (the lengths) for five new tokens
    ((2, 3, 5, 8), torch.arange(15).view(3, 5), ValueError),  # a batch of 3 for 2 sequences
    ((2, 5, 8), torch.arange(10).view(2, 5), ValueError),    # x [B, N, D]: the result was [2, 2, 5, 8]
    ((2, 3, 5, 8), [0, 1, 2, 3, 4], TypeError)])             # a list: AttributeError from inside
def test_rope_names_positions_that_do_not_match_the_tokens(x_shape, positions, error):
    """``apply_rope(x [B, H, N, D], positions [N] or [B, N])``: other shapes broadcast to something, silently (one
    rotation for every token, or a tensor of another shape); now refused by name."""
    with pytest.raises(error, match="positions|x must be"):
        mta.rope.apply_rope(rand(*x_shape), positions, 1e4)


@pytest.mark.parametrize("theta", [0.5, 1.0, 1e4, 5e5, 1e30])
def test_rope_bases_that_fp32_holds_rotate_as_in_float64(theta):
    x, positions = rand(1, 2, 6, 16), torch.tensor([0, 1, 2, 7, 30, 100])
    got = mta.rope.apply_rope(x, positions, theta)  # angles in fp32 (mta.rope): ~1e-5 of an angle of ~200
    assert got.dtype == x.dtype and rel_err(got, rope_float64(x, positions, theta)) < 5e-5
    mta.MultiTokenAttention(32, 2, kernel_size=(1, 1), rope_theta=theta)  # accepted


@pytest.mark.parametrize("method", ["append", "fill"])
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_tokens_on_another_device_are_refused_by_the_cache_before_anything_is_written(method, where):
    """``KVCache.append`` with keys (or values, or queries) on another device than the cache (meta here) wrote
    nothing and advanced the lengths: the next decode read zeros as keys, a wrong answer without a word; ``fill``
    wrote the keys, then raised torch's "Cannot copy out of meta tensor"."""
    cache = mta.KVCache.empty(2, 8, 2, 1, 4, keep_queries=True, device=DEVICE)
    tokens = {"q": rand(2, 3, 2, 4), "k": rand(2, 3, 1, 4), "v": rand(2, 3, 1, 4)}
    tokens[where] = tokens[where].to("meta")
    with pytest.raises(ValueError, match=f"{where} is on meta but the cache is on {DEVICE}"):
        getattr(cache, method)(tokens["q"], tokens["k"], tokens["v"])
    assert cache.is_empty and not cache.k.any() and not cache.v.any() and not cache.q.any()


# --- deferred initialisation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel_size", [(2, 3), (1, 1)])
def test_a_layer_made_on_the_meta_device_is_initialised_by_reset_parameters(kernel_size):
    """Meta-device initialisation (FSDP's default): ``to_empty``, then ``reset_parameters()`` on every module that
    holds parameters of its own. The layer holds ``conv_weight`` and had no ``reset_parameters``: FSDP raised, and
    ``to_empty`` by hand left the kernel uninitialised (whatever memory held, not the identity)."""
    with torch.device("meta"):
        layer = mta.MultiTokenAttention(32, 2, kernel_size=kernel_size)
    layer.to_empty(device=DEVICE)
    with torch.no_grad():
        for module in layer.modules():  # as torch.distributed.fsdp's _materialize_meta_module
            if any(True for _ in module.parameters(recurse=False)):
                module.reset_parameters()
    if layer.is_mta:
        assert torch.equal(layer.conv_weight, mta.layer.identity_kernel(2, *kernel_size).to(DEVICE))
    x = rand(1, 6, 32)
    plain = mta.MultiTokenAttention(32, 2, kernel_size=(1, 1)).to(DEVICE)
    plain.load_state_dict({name: p for name, p in layer.state_dict().items() if name != "conv_weight"})
    torch.testing.assert_close(layer(x), plain(x), atol=2e-5, rtol=2e-5)  # identity kernel: causal attention


# --- serving from threads ----------------------------------------------------------------------------------------


@pytest.mark.skipif(ON_GPU, reason="Triton's interpreter only (the CPU)")
def test_threads_calling_the_kernels_at_once_in_the_interpreter_get_their_answers():
    """Triton's interpreter patches ``triton.language`` while it runs a kernel: two threads launching at once (a
    server answering requests from a thread pool) failed inside it ("Did you forget to add @triton.jit ?").
    Launches in the interpreter now take turns."""
    import threading

    inputs = [(*rand_qkv(1, 2, 1, 16, 16, 16), rand(2, 2, 3, scale=0.3)) for _ in range(4)]
    want = [mta.conv_attention(*x) for x in inputs]
    got, errors = {}, []

    def serve(i):
        try:
            for step in range(2):
                got[i, step] = mta.conv_attention(*inputs[i])
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(repr(error)[:300])

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    assert all(torch.equal(got[i, step], want[i]) for i in range(4) for step in range(2))
