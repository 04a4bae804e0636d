"""The MTA backward in row chunks (:mod:`mta.conv_chunked`): what a GPU runs where the fused backward's smallest
tile does not fit in shared memory. Checked against autograd through the float64 reference, through
``mta.conv_attention`` with the dispatch forced, for determinism and for causality."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.errors import OutOfResources

import mta
from mta.launch import LaunchPlans
import mta.conv
from conftest import chunked_by_default, rand, rand_qkv
from mta.conv_chunked import LIVE_BLOCKS, chunk_rows, conv_attention_backward_chunked, conv_attention_forward_chunked
from test_conv_backward import NAMES, TOL, check, grads, reference_grads


# N = 1; N < cq (5 rows, 16 x 15); chunks of 3 rows under a 31-row halo (32 x 33); chunk sizes that do not divide
# N; GQA with a padded head dim; a batch of two (dweight sums over it); not causal.
@pytest.mark.parametrize("N,cq,ck,causal,rows,Hq,Hkv,D,B", [
    (1, 6, 11, True, None, 2, 1, 16, 1), (5, 16, 15, True, 2, 2, 1, 16, 1), (37, 32, 33, True, 3, 2, 2, 8, 1),
    (40, 16, 15, False, 7, 2, 1, 16, 1), (33, 6, 11, True, 8, 4, 2, 24, 2), (20, 1, 1, True, 6, 2, 2, 16, 1),
    (26, 3, 3, False, None, 4, 2, 24, 2)], ids=str)
def test_chunks_against_the_float64_reference(N, cq, ck, causal, rows, Hq, Hkv, D, B):
    q, k, v = rand_qkv(B, Hq, Hkv, N, N, D)
    weight, do = rand(Hq, cq, ck, scale=0.2), rand(B, Hq, N, D)
    out = conv_attention_backward_chunked(do, q, k, v, weight, causal, D ** -0.5, rows)
    ref = reference_grads(q, k, v, weight, do, causal)
    for name, x, y, like in zip(NAMES, out, ref, (q, k, v, weight)):
        assert x.dtype == like.dtype and x.shape == like.shape, name
        check(name, x, y, TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_conv_attention_takes_the_chunks_where_the_fused_backward_does_not_fit(dtype, monkeypatch):
    """The forward stays fused; the backward is the chunked one (a spy counts its calls) and matches the
    reference in the inputs' dtypes."""
    calls = []
    chunked = mta.conv.conv_attention_backward_chunked
    chunked_by_default(monkeypatch)
    monkeypatch.setattr(mta.conv, "conv_attention_backward_chunked", lambda *a: calls.append(not mta.launch.in_dry_run()) or chunked(*a))
    q, k, v = rand_qkv(2, 4, 2, 30, 30, 16, dtype=dtype)
    weight, do = rand(4, 5, 7, scale=0.2), rand(2, 4, 30, 16, dtype=dtype)
    out = grads(mta.conv_attention, q, k, v, weight, do)
    assert calls.count(True) == 1  # on a GPU, compile_ahead's dry run calls it too
    for name, x, y, like in zip(NAMES, out, reference_grads(q, k, v, weight, do, True), (q, k, v, weight)):
        assert x.dtype == like.dtype, name
        check(name, x, y, TOL[dtype])


def test_the_chunks_inside_the_custom_op_and_the_layer(monkeypatch):
    """The backward of the ``mta::conv_attention`` op (what ``torch.compile`` and the layer call) runs with autograd
    off: the chunks there give the reference's gradients too, compiled or not."""
    chunked_by_default(monkeypatch)
    q, k, v = rand_qkv(1, 4, 2, 21, 21, 16)
    weight, do = rand(4, 5, 7, scale=0.2), rand(1, 4, 21, 16)
    want = reference_grads(q, k, v, weight, do, True)
    compiled = torch.compile(lambda *t: mta.conv_attention(*t), backend="aot_eager")
    for fn in (mta.ops.conv_attention, compiled):
        for name, x, y in zip(NAMES, grads(fn, q, k, v, weight, do), want):
            check(name, x, y, TOL[torch.float32])
    layer = mta.MultiTokenAttention(32, 2, kernel_size=(3, 5)).to(q.device)
    layer(rand(1, 8, 32)).square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_chunks_are_bitwise_deterministic_and_causal():
    """Two calls give equal bits; a loss on the outputs before t gives exactly zero gradient to q, k and v at
    t and after (future rows set to 1e3, so a leak would show)."""
    q, k, v = rand_qkv(1, 2, 1, 29, 29, 16)
    weight, do = rand(2, 6, 11, scale=0.2), rand(1, 2, 29, 16)
    first = conv_attention_backward_chunked(do, q, k, v, weight, True, 0.25, 4)
    second = conv_attention_backward_chunked(do, q, k, v, weight, True, 0.25, 4)
    for name, x, y in zip(NAMES, first, second):
        assert torch.equal(x, y), name
    t = 17
    q, k, v = (x.clone() for x in (q, k, v))
    for x in (q, k, v):
        x[:, :, t:] = 1e3
    do = do.clone()
    do[:, :, t:] = 0
    full = conv_attention_backward_chunked(do, q, k, v, weight, True, 0.25, 5)
    for name, g in zip(NAMES, full[:3]):
        assert torch.isfinite(g).all(), name
        assert torch.equal(g[:, :, t:], torch.zeros_like(g[:, :, t:])), f"{name} leaks into rows >= {t}"
        assert g[:, :, :t].abs().amax() > 0, name
    # The rows before t, and dweight, are those of the problem truncated to its first t positions: to fp32
    # rounding (PyTorch's products of other shapes sum in another order; measured 1e-7 of the largest entry).
    prefix = conv_attention_backward_chunked(do[:, :, :t], *(x[:, :, :t] for x in (q, k, v)), weight, True, 0.25, 5)
    for name, g, want in zip(NAMES, full, prefix):
        torch.testing.assert_close(g if name == "dweight" else g[:, :, :t], want, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("B,H,N,budget", [(1, 8, 8192, 256 * 2 ** 20), (4, 32, 131072, 256 * 2 ** 20),
                                          (1, 1, 10, 2 ** 30), (2, 2, 100, 1)])
def test_chunk_rows_keep_the_blocks_within_the_budget(B, H, N, budget):
    rows = chunk_rows(B, H, N, budget)
    assert 1 <= rows <= N
    assert rows == 1 or LIVE_BLOCKS * 4 * B * H * N * rows <= budget
    assert rows == N or LIVE_BLOCKS * 4 * B * H * N * (rows + 1) > budget


@pytest.mark.parametrize("N,cq,ck,causal,rows", [(1, 6, 11, True, None), (37, 32, 33, True, 3), (40, 16, 15, False, 7)],
                         ids=str)
def test_chunked_forward_against_the_float64_reference(N, cq, ck, causal, rows):
    q, k, v = rand_qkv(2, 4, 2, N, N, 16)
    weight = rand(4, cq, ck, scale=0.2)
    o, lse = conv_attention_forward_chunked(q, k, v, weight, causal, 0.25, rows)
    ref_o, ref_lse = mta.conv_attention_reference(*(x.double() for x in (q, k, v, weight)), causal=causal,
                                                  scale=0.25, return_lse=True)
    check("o", o, ref_o, TOL[torch.float32])
    check("lse", lse, ref_lse, TOL[torch.float32])


def test_refused_launches_fall_back_to_the_chunks(monkeypatch):
    """A fused forward or backward launch that the GPU refuses for its shared memory (Triton's OutOfResources,
    which the shared-memory model can miss) gives the chunks' results instead of the error."""
    def refused(*args, **kwargs):
        raise OutOfResources(237568, 232448, "shared memory")
    monkeypatch.setattr(mta.conv, "planned_forward", refused)
    monkeypatch.setattr(mta.conv, "_fused_backward", refused)
    q, k, v = rand_qkv(1, 4, 2, 30, 30, 16)
    weight, do = rand(4, 8, 17, scale=0.2), rand(1, 4, 30, 16)
    out = mta.conv_attention(q, k, v, weight)
    check("o", out, mta.conv_attention_reference(*(x.double() for x in (q, k, v, weight))), TOL[torch.float32])
    for name, x, y in zip(NAMES, grads(mta.conv_attention, q, k, v, weight, do),
                          reference_grads(q, k, v, weight, do, True)):
        check(name, x, y, TOL[torch.float32])


@pytest.mark.parametrize("Hq,Hkv,autotune,stages", [(4, 4, False, None), (4, 2, False, 1), (8, 2, True, 1)])
def test_gqa_groups_walk_their_query_tiles_in_one_stage(Hq, Hkv, autotune, stages, monkeypatch):
    """The dK/dV side's tile with queries as rows gets one stage for GQA groups, autotuned or not (the tile is then
    given, never picked by the autotuner); without GQA the table's tile and the fit stand."""
    made, tabled = [], []
    real_dkdv, real_tiled = mta.conv._dkdv_launch, mta.conv.tiled_launch
    monkeypatch.setattr(mta.tuning, "AUTOTUNE", autotune)
    monkeypatch.setattr(mta.conv, "BACKWARD_LAUNCHES", LaunchPlans())  # plans kept by other tests skip the tables
    monkeypatch.setattr(mta.conv, "_dkdv_launch", lambda *a, **k: made.append(real_dkdv(*a, **k)) or made[-1])
    monkeypatch.setattr(mta.conv, "tiled_launch", lambda name, *a, **k: tabled.append(name) or real_tiled(name, *a, **k))
    q, k, v = rand_qkv(1, Hq, Hkv, 20, 20, 16)
    weight, do = rand(Hq, 3, 3, scale=0.2), rand(1, Hq, 20, 16)
    grads(mta.conv_attention, q, k, v, weight, do)
    assert made  # on a GPU, compile_ahead's dry run launches too
    if stages is None:  # the table's tile (or the autotuner's pick), asked of tiled_launch
        assert "conv_dkdv" in tabled
    else:
        assert "conv_dkdv" not in tabled and all(launch.meta["num_stages"] == stages for launch in made)
