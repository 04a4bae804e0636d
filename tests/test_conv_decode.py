"""``mta.conv_decode_attention`` (MTA decode, split-K) against the float64 reference rows, and its input checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import mta
from conftest import DEVICE, ON_GPU, close_in_norm as close, rand
from mta import conv_decode, decode

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
KERNELS = [(1, 1), (2, 9), (6, 11), (11, 15)]
LENGTHS = (1, 37, 300)
# Plans made "as on" these GPUs without one (as in test_decode.py).
H100 = decode.DeviceFacts(sms=132, family="hopper", bandwidth_per_sm=25.4e9, shared_per_sm=233472)
H200 = decode.DeviceFacts(sms=132, family="hopper", bandwidth_per_sm=36.5e9, shared_per_sm=233472)


def caches(B, Hq, Hkv, n_max, D, lengths, dtype):
    """``q, k, v`` caches with NaN past each sequence's length: a read past it shows."""
    q = rand(B, Hq, n_max, D, dtype=dtype)
    k, v = rand(B, Hkv, n_max, D, dtype=dtype), rand(B, Hkv, n_max, D, dtype=dtype)
    for b, n in enumerate(lengths):
        for x in (q, k, v):
            x[b, :, n:] = float("nan")
    return q, k, v


def reference(q, k, v, weight, lengths, n):
    """Rows ``L - n .. L - 1`` of the float64 causal MTA forward on each sequence's first ``L`` positions
    (on the caches' device: on a GPU the long caches' N x N float64 matrices would not fit a CPU worker)."""
    return torch.cat([mta.conv_attention_reference(*(x[b:b + 1, :, :L].double() for x in (q, k, v)),
                                                   weight.double())[:, :, L - n:].cpu()
                      for b, L in enumerate(lengths)])


def run_case(cq, ck, n, dtype=torch.float32, Hq=4, Hkv=2, D=32, lengths=LENGTHS, num_splits=None,
             noncontiguous=False, force=None):
    """``mta.conv_decode_attention`` against the float64 rows on ragged lengths with NaN past them; ``force``: run
    instead the plan :func:`mta.conv_decode.plan_conv_decode` makes, changed by ``force(plan)``, through
    :func:`mta.conv_decode.run_conv_decode`."""
    lengths = [max(L, n) for L in lengths]
    q, k, v = caches(len(lengths), Hq, Hkv, max(lengths), D, lengths, dtype)
    if noncontiguous:  # [B, N, H, D] storage, as a model's projections write it
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    weight = rand(Hq, cq, ck, scale=0.2)
    lens = torch.tensor(lengths, dtype=torch.int32)
    if force is None:
        out = mta.conv_decode_attention(q, k, v, weight, cache_seqlens=lens, num_queries=n, num_splits=num_splits)
    else:
        plan = force(conv_decode.plan_conv_decode(len(lengths), Hq, Hkv, n, max(lengths), D, dtype, (cq, ck),
                                                  num_splits=num_splits))
        out = conv_decode.run_conv_decode(plan, q, k, v, weight, lens.to(DEVICE), D ** -0.5)
    assert out.shape == (len(lengths), Hq, n, D) and out.dtype == dtype
    assert close(out, reference(q, k, v, weight, lengths, n), TOL[dtype])


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("cq,ck", KERNELS, ids=str)
def test_kernels_ragged_lengths_gqa(cq, ck, n, poisoned_outputs):
    run_case(cq, ck, n)


@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if ON_GPU else []), ids=str)
@pytest.mark.parametrize("D", [8, 24])
def test_small_head_dims_padded_in_16_bits(D, dtype, poisoned_outputs):
    run_case(6, 11, 3, dtype, D=D)


# Split edges: every split reads pk halo keys each side. On the CPU a 32-key window owns 32 - (ck - 1) keys (22 at
# ck = 11, 18 at ck = 15: 300 keys are 14 and 17 tiles, mta.decode.key_window): 12 splits all run, 20 are more
# than the key tiles and run as 14 and 17 (mta.decode.splits_run).
@pytest.mark.parametrize("num_splits", [1, 3, 12, 20])
@pytest.mark.parametrize("cq,ck", [(6, 11), (11, 15)], ids=str)
def test_forced_split_counts(cq, ck, num_splits, poisoned_outputs):
    run_case(cq, ck, 3, Hq=2, Hkv=1, D=16, lengths=(37, 300), num_splits=num_splits)


# The widest kernel: a key window keeps block_n - 32 keys' scores (the rest is halo) and the band's window is widest.
@pytest.mark.parametrize("cq,ck", [(1, 33), (3, 31)], ids=str)
def test_widest_kernels(cq, ck, poisoned_outputs):
    run_case(cq, ck, 2, Hq=2, Hkv=1, D=16, lengths=(1, 20, 150), num_splits=None)


# The band's two forms (the plan's band: mta.tuning.STACKED_BAND picks one per head-dim width by default): each
# kernel row's own product, or the kernel rows stacked into one product, in groups of A_GROUP rows where they do not
# fit at once (mta.decode.band_stack_rows; on the CPU: all at once for the first three cases, groups of 4 and of 1 at
# d = 256). Both against the float64 rows; GQA, several rows per program, ragged poisoned caches.
@pytest.mark.parametrize("band", ["by_row", "stacked"])
@pytest.mark.parametrize("cq,ck,n,Hq,Hkv,D", [(6, 11, 1, 4, 2, 32), (11, 15, 3, 8, 2, 16), (3, 1, 2, 2, 1, 32),
                                              (6, 3, 1, 8, 1, 256), (5, 3, 4, 8, 1, 256)], ids=str)
def test_both_band_forms(cq, ck, n, Hq, Hkv, D, band, poisoned_outputs):
    run_case(cq, ck, n, Hq=Hq, Hkv=Hkv, D=D, force=lambda plan: dataclasses.replace(plan, band=band))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else []), ids=str)
def test_head_dim_96_noncontiguous(dtype):
    run_case(6, 11, 3, dtype, D=96, lengths=(2, 37, 80), noncontiguous=True)


def test_default_lengths_and_list_lengths():
    q, k, v = caches(2, 2, 1, 30, 16, [30, 30], torch.float32)
    weight = rand(2, 2, 9, scale=0.2)
    full = mta.conv_decode_attention(q, k, v, weight, num_queries=2)
    assert close(full, reference(q, k, v, weight, [30, 30], 2), TOL[torch.float32])
    ragged = mta.conv_decode_attention(q, k, v, weight, cache_seqlens=[30, 11], num_queries=2)
    assert torch.equal(ragged[0], full[0])
    assert close(ragged, reference(q, k, v, weight, [30, 11], 2), TOL[torch.float32])


def test_step_by_step_decoding_reproduces_the_full_forward():
    """Decoding one token at a time (and the last 3 at once) gives every row of the causal MTA forward:
    lengths under cq, under ck, and past both."""
    N, cq, ck = 20, 6, 11
    q, k, v = rand(1, 2, N, 16), rand(1, 1, N, 16), rand(1, 1, N, 16)
    weight = rand(2, cq, ck, scale=0.2)
    full = mta.conv_attention(q, k, v, weight)
    ref = mta.conv_attention_reference(q.double(), k.double(), v.double(), weight.double())
    rows = torch.cat([mta.conv_decode_attention(q, k, v, weight, cache_seqlens=[t]) for t in range(1, N + 1)], 2)
    assert close(rows, ref, TOL[torch.float32])
    torch.testing.assert_close(rows, full, rtol=1e-5, atol=1e-5)
    last3 = mta.conv_decode_attention(q, k, v, weight, num_queries=3, num_splits=2)
    torch.testing.assert_close(last3, full[:, :, N - 3:], rtol=1e-5, atol=1e-5)


def test_identity_kernel_is_plain_decode():
    q, k, v = rand(2, 4, 20, 16), rand(2, 2, 20, 16), rand(2, 2, 20, 16)
    weight = torch.zeros(4, 6, 11, device=DEVICE)
    weight[:, 5, 5] = 1.0
    lengths = [20, 9]
    mtad = mta.conv_decode_attention(q, k, v, weight, cache_seqlens=lengths, num_queries=2)
    plain = mta.decode_attention(torch.stack([q[b, :, L - 2:L] for b, L in enumerate(lengths)]), k, v,
                                 cache_seqlens=lengths)
    torch.testing.assert_close(mtad, plain, rtol=1e-5, atol=1e-5)


def test_bitwise_deterministic():
    """Two calls give the same bits: the far splits, the band and their merge."""
    q, k, v = caches(2, 4, 2, 100, 16, [100, 37], torch.float32)
    weight = rand(4, 6, 11, scale=0.2)
    for num_splits in (None, 3):
        first, second = (mta.conv_decode_attention(q, k, v, weight, cache_seqlens=[100, 37], num_queries=2,
                                                   num_splits=num_splits) for _ in range(2))
        assert torch.equal(first, second), num_splits


def test_only_the_last_query_rows_are_read():
    """Queries before the last cq - 1 + n rows never matter (NaN there changes nothing)."""
    cq, n, L = 6, 2, 30
    q, k, v = rand(1, 2, L, 16), rand(1, 1, L, 16), rand(1, 1, L, 16)
    weight = rand(2, cq, 11, scale=0.2)
    before = mta.conv_decode_attention(q, k, v, weight, num_queries=n)
    q[:, :, :L - (cq - 1 + n)] = float("nan")
    assert torch.equal(mta.conv_decode_attention(q, k, v, weight, num_queries=n), before)


def test_folded_queries():
    q = rand(1, 2, 10, 16)
    weight = rand(2, 3, 5, scale=0.2)
    qf = conv_decode.fold_queries(q, weight, torch.tensor([4], dtype=torch.int32, device=DEVICE), 2)  # rows 2, 3 of 4
    for t, i in enumerate((2, 3)):
        for b in range(5):
            want = sum(weight[:, a, b, None] * q[0, :, i - 2 + a] for a in range(3) if i - 2 + a >= 0)
            torch.testing.assert_close(qf[0, :, b, t], want, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not ON_GPU, reason="synchronisation is a GPU matter")
def test_a_decode_step_does_not_synchronise():
    q, k, v = caches(2, 4, 2, 2048, 64, [2048, 2048], torch.float16)
    weight = rand(4, 6, 11, scale=0.2)
    on_device = torch.tensor([2048, 700], dtype=torch.int32, device=DEVICE)
    mta.conv_decode_attention(q, k, v, weight, cache_seqlens=on_device)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for lengths in (on_device, [2048, 700], None):
            mta.conv_decode_attention(q, k, v, weight, cache_seqlens=lengths)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# --- the plan --------------------------------------------------------------------------------------------------


def test_band_form_and_order_of_the_plans():
    """MTA decode's plans keep contiguous ranges of key tiles, stack the band's kernel rows at the head-dim widths
    of mta.tuning.STACKED_BAND (by row elsewhere), and have no band where E = 0; they always take the split form."""
    for D, ck, band in ((16, 11, "by_row"), (128, 11, "stacked"), (128, 1, "stacked"), (256, 3, "by_row")):
        plan = conv_decode.plan_conv_decode(2, 4, 2, 1, 300, D, torch.float16, (6, ck))
        assert (plan.form, plan.interleave, plan.band) == ("split", False, band)
    assert conv_decode.plan_conv_decode(2, 4, 2, 1, 300, 16, torch.float16, (1, 1)).band == "none"


@pytest.mark.parametrize("batch, n_max, splits", [(8, 16384, 8), (1, 131072, 63), (8, 4095, None)])
def test_mta_decode_where_memory_feeds_each_sm_fast(batch, n_max, splits):
    """On an H200 (a Hopper GPU at 36.5 GB/s an SM), MTA decode at d = 64 takes the short key windows from 4096
    positions and counts four programs an SM: 8 kv heads x 8 splits at B = 8 and 63 splits at B = 1 fill 97% and
    95% of 4 x 132 (the band not counted); shorter caches keep the general tile and rule."""
    plan = conv_decode.plan_conv_decode(batch, 8, 8, 1, n_max, 64, torch.bfloat16, (6, 11), gpu=H200)
    tile = (plan.block_n, plan.num_warps, plan.num_stages)
    if splits is None:
        assert tile == mta.tuning.DECODE[64]
    else:
        assert tile == mta.tuning.DECODE_MTA_FAST[64] and plan.splits == splits and plan.units == batch * 8


@pytest.mark.parametrize("n_max, counted", [(4096, True), (8192, True), (32768, False)])
def test_mta_split_count_counts_the_band_when_splits_are_short(n_max, counted):
    """On an H100 (two programs an SM counted: 264), 64 (batch, kv head) units at d = 64 (windows of 128 keys, 118
    owned) take 4 splits by the wave rule; while such a split holds at most BAND_COUNTS_BELOW keys the band's program
    is counted too, and 64 x (3 + 1) programs fill 97% of 264 where 64 x (4 + 1) would spill into a second wave."""
    plan = conv_decode.plan_conv_decode(8, 8, 8, 1, n_max, 64, torch.bfloat16, (6, 11), gpu=H100)
    assert (plan.units, plan.own) == (64, 118)
    assert decode.choose_num_splits(64, n_max, 118, 264, efficiency=decode.MTA_SPLIT_EFFICIENCY) == 4
    assert plan.splits == (3 if counted else 4)


def test_a_plan_runs_only_on_its_shapes():
    q, k, v, w = inputs()
    plan = conv_decode.plan_conv_decode(2, 4, 2, 1, 20, 16, torch.float32, (6, 11))
    with pytest.raises(ValueError, match=r"plan is for kernel_size=\(6, 11\), the inputs have kernel_size=\(6, 9\)"):
        conv_decode.run_conv_decode(plan, q, k, v, w[:, :, :9].contiguous(), None, 0.25)
    with pytest.raises(ValueError, match="the plan is for heads=4"):
        conv_decode.run_conv_decode(dataclasses.replace(plan, form="rows"), q[:, :2], k, v, w[:2], None, 0.25)
    with pytest.raises(ValueError, match="not 'stream'"):
        conv_decode.run_conv_decode(dataclasses.replace(plan, form="stream"), q, k, v, w, None, 0.25)


# --- input checks ------------------------------------------------------------------------------


def inputs(B=2, Hq=4, Hkv=2, n_max=20, D=16, cq=6, ck=11):
    return (rand(B, Hq, n_max, D), rand(B, Hkv, n_max, D), rand(B, Hkv, n_max, D), rand(Hq, cq, ck, scale=0.2))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(cache_seqlens=[20, 21]), ValueError, "over the cache size"),
    (dict(cache_seqlens=[2, 5], num_queries=3), ValueError, "under num_queries"),
    (dict(cache_seqlens=[5, 6, 7]), ValueError, r"shape \(2,\)"),
    # A CPU tensor is checked value by value, as a list is.
    (dict(cache_seqlens=torch.tensor([20, 21], dtype=torch.int32)), ValueError, "over the cache size"),
    (dict(cache_seqlens=torch.tensor([2, 5]), num_queries=3), ValueError, "under num_queries"),
    (dict(cache_seqlens=torch.tensor([5, 6, 7], dtype=torch.int32)), ValueError, r"shape \(2,\)"),
    (dict(num_queries=0), ValueError, "between 1 and 16"),
    (dict(num_queries=2.0), TypeError, "num_queries"),
    (dict(num_splits=-1), ValueError, "num_splits"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        mta.conv_decode_attention(*inputs(), **kwargs)


def test_bad_shapes_and_kernels():
    q, k, v, w = inputs()
    with pytest.raises(ValueError, match="as many positions"):
        mta.conv_decode_attention(q[:, :, :10], k, v, w)
    with pytest.raises(ValueError, match="must be odd"):
        mta.conv_decode_attention(q, k, v, rand(4, 6, 10))
    with pytest.raises(ValueError, match="one kernel per query head"):
        mta.conv_decode_attention(q, k, v, rand(2, 6, 11))
    with pytest.raises(ValueError, match="not supported"):
        mta.conv_decode_attention(q, k, v, rand(4, 33, 11))
    with pytest.raises(ValueError, match="more than the cache holds"):
        mta.conv_decode_attention(q[:, :, :2], k[:, :, :2], v[:, :, :2], w, num_queries=3)
    with pytest.raises(TypeError, match="q_cache, k_cache and v_cache must share a dtype"):
        mta.conv_decode_attention(q.half(), k, v, w)
    with pytest.raises(ValueError, match="v_cache must have 4 dimensions"):
        mta.ops.conv_decode_attention(q, k, v[0], w)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        mta.conv_decode_attention(q[:, :3], k, v, w[:3])


# --- GPU only: bf16 and long caches ------------------------------------------------------------


@pytest.mark.skipif(not ON_GPU, reason="long caches and bf16 on a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [64, 128])
def test_long_caches_on_the_gpu(dtype, D):
    lengths = [3, 2049, 4500]
    run_case(6, 11, 2, dtype, Hq=8, Hkv=2, D=D, lengths=lengths)
    run_case(11, 15, 1, dtype, Hq=8, Hkv=2, D=D, lengths=lengths, num_splits=7)
