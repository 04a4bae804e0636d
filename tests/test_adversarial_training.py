"""Training through the kernels the way a demanding user does: ``torch.func``'s transforms, second derivatives
through the custom ops, the layer under ``torch.func.functional_call``. References: float64 autograd through the materialized definitions."""

import warnings

import pytest
import torch
import torch.autograd.forward_ad as forward_ad

from conftest import DEVICE, mta
from mta.differentiable_once import MESSAGE
from mta.reference import conv_attention_reference, naive_attention

B, H, N, D = 1, 2, 9, 8


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g).to(DEVICE) for _ in range(3))
    return q, k, v, 0.4 * torch.randn(H, 2, 3, generator=g).to(DEVICE)


def f64(*t):
    return [x.double() for x in t]


# The eager functions and their custom ops (what the layer and torch.compile call), on one signature.
CONV = {"eager": mta.conv_attention, "op": mta.ops.conv_attention}
FLASH = {"eager": mta.flash_attention, "op": mta.ops.flash_attention}


@pytest.mark.parametrize("path", ["eager", "op"])
def test_torch_func_grad_of_conv_and_flash_attention(path):
    # Before: eager, torch's "must override the setup_context staticmethod" (then Triton handed functorch's
    # wrappers); through the op, the same error from the op's generated autograd.
    q, k, v, w = inputs()
    dq, dw = torch.func.grad(lambda q, w: CONV[path](q, k, v, w).pow(2).sum(), argnums=(0, 1))(q, w)
    q64, w64 = (x.double().requires_grad_() for x in (q, w))
    conv_attention_reference(q64, *f64(k, v), w64).pow(2).sum().backward()
    torch.testing.assert_close(dq.double(), q64.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dw.double(), w64.grad, atol=1e-5, rtol=1e-4)

    dq = torch.func.grad(lambda q: FLASH[path](q, k, v, causal=True).pow(2).sum())(q)
    q64 = q.double().requires_grad_()
    naive_attention(q64, *f64(k, v), causal=True).pow(2).sum().backward()
    torch.testing.assert_close(dq.double(), q64.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("path", ["eager", "op"])
def test_torch_func_vmap_and_per_sample_gradients(path):
    q, k, v, w = inputs()
    qs = torch.randn(3, B, H, N, D, device=DEVICE)
    ks = torch.randn(B, H, 3, N, D, device=DEVICE)  # mapped along another axis than the first
    o = torch.func.vmap(lambda q, k: CONV[path](q, k, v, w), in_dims=(0, 2))(qs, ks)
    expected = torch.stack([conv_attention_reference(*f64(a, b, v, w)) for a, b in zip(qs, ks.unbind(2))])
    torch.testing.assert_close(o.double(), expected, atol=1e-5, rtol=1e-4)
    ws = 0.4 * torch.randn(3, H, 2, 3, device=DEVICE)  # a kernel per entry: the entries as more heads
    o = torch.func.vmap(lambda w: CONV[path](q, k, v, w))(ws)
    torch.testing.assert_close(o.double(), torch.stack([conv_attention_reference(*f64(q, k, v, x)) for x in ws]),
                               atol=1e-5, rtol=1e-4)
    o = torch.func.vmap(lambda q: FLASH[path](q, k, v))(qs)
    torch.testing.assert_close(o.double(), torch.stack([naive_attention(*f64(a, k, v)) for a in qs]),
                               atol=1e-5, rtol=1e-4)

    # Per-sample gradients (vmap of grad) and grad of vmap.
    per_sample = torch.func.vmap(torch.func.grad(lambda w, q: CONV[path](q, k, v, w).pow(2).sum()),
                                 in_dims=(None, 0))(w, qs)
    for x, g in zip(qs, per_sample):
        w64 = w.double().requires_grad_()
        conv_attention_reference(*f64(x, k, v), w64).pow(2).sum().backward()
        torch.testing.assert_close(g.double(), w64.grad, atol=1e-5, rtol=1e-4)
    g = torch.func.grad(lambda qs: torch.func.vmap(lambda q: CONV[path](q, k, v, w))(qs).pow(2).sum())(qs)
    q64 = qs.double().requires_grad_()
    torch.stack([conv_attention_reference(x, *f64(k, v, w)) for x in q64]).pow(2).sum().backward()
    torch.testing.assert_close(g.double(), q64.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("path", ["eager", "op"])
def test_forward_mode_and_second_derivatives_raise_by_name(path):
    # Before: torch.func.jvp through the op returned a zero tangent without a word (the op's generated autograd
    # has no forward formula and jvp skipped it); eagerly, torch's "You must implement the jvp function".
    q, k, v, w = inputs()
    for fn in (lambda q: CONV[path](q, k, v, w), lambda q: FLASH[path](q, k, v)):
        with pytest.raises(NotImplementedError, match="no forward-mode derivative"):
            torch.func.jvp(fn, (q,), (torch.ones_like(q),))
        with forward_ad.dual_level(), pytest.raises(NotImplementedError, match="no forward-mode derivative"):
            fn(forward_ad.make_dual(q, torch.ones_like(q)))  # the kernels alone would drop the tangent
        with pytest.raises(RuntimeError, match="differentiable once"):
            torch.func.grad(lambda q: torch.func.grad(lambda x: fn(x).pow(2).sum())(q).sum())(q)


@pytest.mark.parametrize("fn", [lambda q, k, v, w: mta.ops.conv_attention(q, k, v, w),
                                lambda q, k, v, w: mta.ops.flash_attention(q, k, v)], ids=["conv", "flash"])
def test_a_second_derivative_through_the_ops_raises_as_eagerly(fn):
    # Before: "Trying to backward through mta.conv_attention_backward.default but no autograd formula was
    # registered", where the eager functions say what mta supports and what to use instead.
    q, k, v, w = inputs()
    q = q.requires_grad_()
    (dq,) = torch.autograd.grad(fn(q, k, v, w).pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once") as raised:
        dq.sum().backward()
    assert str(raised.value) == MESSAGE


def test_the_layer_under_functional_call_and_torch_func_grad():
    # A functional training step over the layer's parameters (the layer calls the custom ops).
    torch.manual_seed(0)
    layer = mta.MultiTokenAttention(16, 2, num_kv_heads=1, kernel_size=(2, 3), rope_theta=10000.0).to(DEVICE)
    with torch.no_grad():
        layer.conv_weight.add_(0.3 * torch.randn_like(layer.conv_weight))
    x = torch.randn(2, 7, 16, device=DEVICE)
    params = dict(layer.named_parameters())
    grads = torch.func.grad(lambda p: torch.func.functional_call(layer, p, (x,)).pow(2).mean())(
        {n: p.detach() for n, p in params.items()})
    layer(x).pow(2).mean().backward()
    for name, p in params.items():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_batched_gradients_and_jacobians():
    # Before: Triton handed a BatchedTensor ("Cannot access storage of BatchedTensorImpl") by
    # autograd.grad(is_grads_batched=True) and autograd.functional.jacobian(vectorize=True), which vmap the
    # backward; torch's setup_context error under jacrev.
    q, k, v, w = inputs()
    w = w.requires_grad_()
    o = mta.conv_attention(q, k, v, w)
    grads = torch.randn(3, *o.shape, device=DEVICE)
    (batched,) = torch.autograd.grad(o, w, grads, is_grads_batched=True)
    w64 = w.detach().double().requires_grad_()
    o64 = conv_attention_reference(*f64(q, k, v), w64)
    for g, expected in zip(grads, batched):
        (dw,) = torch.autograd.grad(o64, w64, g.double(), retain_graph=True)
        torch.testing.assert_close(expected.double(), dw, atol=1e-5, rtol=1e-4)
    jac = torch.func.jacrev(lambda w: mta.conv_attention(q, k, v, w).sum(dim=(0, 2, 3)))(w.detach())
    jac64 = torch.autograd.functional.jacobian(lambda w: conv_attention_reference(*f64(q, k, v), w).sum(dim=(0, 2, 3)),
                                               w64.detach())
    torch.testing.assert_close(jac.double(), jac64, atol=1e-5, rtol=1e-4)


# Every pair of the three settings' values, in four cases rather than eight (each case is seconds of interpreter).
@pytest.mark.parametrize("path,weight_per_entry,grid_axis", [
    ("eager", False, None), ("eager", True, 9), ("op", True, None), ("op", False, 9)],
    ids=["eager-one_kernel-one_call", "eager-kernel_per_entry-entries_in_two_calls",
         "op-kernel_per_entry-one_call", "op-one_kernel-entries_in_two_calls"])
def test_per_sample_gradients_run_one_backward(path, weight_per_entry, grid_axis, monkeypatch):
    """``vmap`` over ``grad`` (per-sample gradients; with a kernel per entry, an ensemble) runs each forward and
    backward once for all entries, GQA kept, bitwise as a loop over the entries. Before: torch looped over the
    entries itself in the backward and warned that the backward ops had no batching rule, and the forward looped
    over kernels per entry (the vmap rules now fold the entries into the heads). Where the entries' heads pass a
    grid axis (made 9 programs here: two entries of 4 heads fit), ranges of entries, one call each."""
    if grid_axis is not None:
        monkeypatch.setattr(mta.launch, "MAX_GRID_AXIS_1", grid_axis)
    g = torch.Generator().manual_seed(5)
    n, hq, hkv = 3, 4, 2
    qs = torch.randn(n, hq, N, D, generator=g).to(DEVICE)
    ks, vs = (torch.randn(n, hkv, N, D, generator=g).to(DEVICE) for _ in range(2))
    w = 0.4 * torch.randn(hq, 2, 3, generator=g).to(DEVICE)
    ws = 0.4 * torch.randn(n, hq, 2, 3, generator=g).to(DEVICE)
    calls = {"conv": 0, "flash": 0, "conv forward": 0}
    for name, module, fn in (("conv", mta.conv, "conv_attention_backward"), ("flash", mta.flash, "flash_backward"),
                             ("conv forward", mta.conv, "conv_attention_forward")):
        def counted(*args, _real=getattr(module, fn), _name=name, **kwargs):
            calls[_name] += not mta.launch.in_dry_run()  # a GPU's first call also compiles ahead, in a dry run
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, fn, counted)

    def conv_loss(q, k, v, w):
        return CONV[path](q[None], k[None], v[None], w).pow(2).sum()

    def flash_loss(q, k, v):
        return FLASH[path](q[None], k[None], v[None], causal=True).pow(2).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "performance drop ... batching rule" warning fails the test
        conv = torch.func.vmap(torch.func.grad(conv_loss, argnums=(0, 1, 2, 3)),
                               in_dims=(0, 0, 0, 0 if weight_per_entry else None))(qs, ks, vs, ws if weight_per_entry
                                                                                    else w)
        flash = torch.func.vmap(torch.func.grad(flash_loss, argnums=(0, 1, 2)))(qs, ks, vs)
    ranges = 1 if grid_axis is None else 2  # entries {0, 1} and {2}
    assert calls["conv"] == calls["flash"] == ranges
    if weight_per_entry or grid_axis is None:  # else the forward folds the entries into the batch, which the
        assert calls["conv forward"] == ranges  # launcher chunks by sequences itself
    for i in range(n):
        xs = [t.clone().requires_grad_() for t in (qs[i], ks[i], vs[i], ws[i] if weight_per_entry else w)]
        conv_loss(*xs).backward()
        assert all(torch.equal(a[i], x.grad) for a, x in zip(conv, xs))
        for x in xs:
            x.grad = None
        flash_loss(*xs[:3]).backward()
        assert all(torch.equal(a[i], x.grad) for a, x in zip(flash, xs[:3]))
