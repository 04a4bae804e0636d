"""``mta.decode_attention`` (split-K decode) against the float64 reference, the split rule, the input checks."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import triton

import mta
from conftest import DEVICE, ON_GPU, close_in_norm as close, rand
from mta import decode

# ||out - ref|| <= tol * ||ref|| + 1e-6 sqrt(numel). fp32 on a GPU: three TF32 products each (mta.launch.dot_precision).
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
LENGTHS = (1, 37, 300)
# Plans made "as on" these GPUs without one: 132 SMs of 228 KB, memory at 25.4 and 36.5 GB/s an SM (as their
# drivers report it, mta.tuning.memory_bandwidth_per_sm).
H100 = decode.DeviceFacts(sms=132, family="hopper", bandwidth_per_sm=25.4e9, shared_per_sm=233472)
H200 = decode.DeviceFacts(sms=132, family="hopper", bandwidth_per_sm=36.5e9, shared_per_sm=233472)


def ragged_cache(B, Hkv, n_max, D, lengths, dtype):
    """``k, v [B, Hkv, n_max, D]`` with NaN past each sequence's length: a read past it shows."""
    k, v = rand(B, Hkv, n_max, D, dtype=dtype), rand(B, Hkv, n_max, D, dtype=dtype)
    for b, n in enumerate(lengths):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    return k, v


def reference(q, k, v, lengths):
    """Per sequence: float64 attention of its ``Nq`` queries on its first ``L`` keys, bottom-right causal."""
    return torch.cat([mta.naive_attention(q[b:b + 1].double().cpu(), k[b:b + 1, :, :n].double().cpu(),
                                          v[b:b + 1, :, :n].double().cpu(), causal=True)
                      for b, n in enumerate(lengths)])


def run_case(nq, dtype=torch.float32, Hq=4, Hkv=2, D=96, lengths=LENGTHS, num_splits=None, n_max=300,
             noncontiguous=False, force=None):
    """``mta.decode_attention`` against float64 on ragged lengths with NaN past them; ``force``: run instead the
    plan :func:`mta.decode.plan_decode` makes, changed by ``force(plan)``, through :func:`mta.decode.run_decode`."""
    lengths = [max(n, nq) for n in lengths]
    B = len(lengths)
    q = rand(B, Hq, nq, D, dtype=dtype)
    k, v = ragged_cache(B, Hkv, n_max, D, lengths, dtype)
    if noncontiguous:  # [B, N, H, D] storage, as a model's projection writes it
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
        k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
        assert not q.is_contiguous() and not k.is_contiguous()
    if force is None:
        out = mta.decode_attention(q, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
                                   num_splits=num_splits)
    else:
        plan = force(decode.plan_decode(B, Hq, Hkv, nq, n_max, D, dtype, num_splits=num_splits))
        out = decode.run_decode(plan, q, k, v, torch.tensor(lengths, dtype=torch.int32, device=DEVICE), D ** -0.5)
    assert out.shape == (B, Hq, nq, D) and out.dtype == dtype
    assert close(out, reference(q, k, v, lengths), TOL[dtype])
    return out


@pytest.mark.parametrize("nq", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ragged_lengths_gqa_head_dim_96(nq, dtype, poisoned_outputs):
    run_case(nq, dtype)


@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if ON_GPU else []), ids=str)
@pytest.mark.parametrize("D", [8, 24])
def test_small_head_dims_padded_in_16_bits(D, dtype, poisoned_outputs):
    run_case(3, dtype, D=D)


# 12: more splits than key tiles (300 keys, 32 a tile on CPU: 10 tiles, run as 10 splits, mta.decode.splits_run)
@pytest.mark.parametrize("interleave", [True, False], ids=["interleaved", "ranges"])
@pytest.mark.parametrize("num_splits", [1, 3, 12])
def test_forced_split_counts(num_splits, interleave, poisoned_outputs):
    """Both orders of a split's key tiles (every S-th tile, as plain decode's plans run them, or one range, as MTA
    decode's do) against float64, ragged lengths, NaN past them."""
    run_case(3, num_splits=num_splits, D=32, force=lambda plan: dataclasses.replace(plan, interleave=interleave))


def test_noncontiguous_and_multi_head_attention():
    run_case(3, torch.float16, Hq=3, Hkv=3, D=48, noncontiguous=True)


def test_many_query_heads_take_several_row_tiles():
    """G * Nq = 16 * 5 = 80 rows: more than one row tile (64 rows at most)."""
    run_case(5, Hq=16, Hkv=1, D=16, lengths=(9, 70), n_max=70)


def test_default_lengths_and_list_lengths_and_int64():
    q = rand(2, 2, 2, 32)
    k, v = rand(2, 1, 50, 32), rand(2, 1, 50, 32)
    full = mta.decode_attention(q, k, v)
    assert close(full, reference(q, k, v, [50, 50]), TOL[torch.float32])
    as_list = mta.decode_attention(q, k, v, cache_seqlens=[50, 20])
    as_int64 = mta.decode_attention(q, k, v, cache_seqlens=torch.tensor([50, 20]))
    assert torch.equal(as_list, as_int64) and torch.equal(as_list[0], full[0])
    assert close(as_list, reference(q, k, v, [50, 20]), TOL[torch.float32])


def test_equals_flash_attention_per_sequence():
    """The docstring's statement: flash attention, bottom-right causal, on each sequence's valid keys."""
    lengths = [5, 40]
    q = rand(2, 4, 3, 32)
    k, v = ragged_cache(2, 2, 40, 32, lengths, torch.float32)
    out = mta.decode_attention(q, k, v, cache_seqlens=lengths, num_splits=2)
    for b, n in enumerate(lengths):
        flash = mta.flash_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=True)
        torch.testing.assert_close(out[b:b + 1], flash, rtol=1e-5, atol=1e-5)


def test_step_by_step_decoding_reproduces_the_full_forward():
    """Decoding a sequence one token at a time (and the last 3 at once) gives every row of the causal forward."""
    N = 36  # past one interpreter key tile (32)
    q, k, v = rand(1, 4, N, 16), rand(1, 2, N, 16), rand(1, 2, N, 16)
    full = mta.flash_attention(q, k, v, causal=True)
    ref = mta.naive_attention(q.double(), k.double(), v.double(), causal=True)
    rows = [mta.decode_attention(q[:, :, t - 1:t], k, v, cache_seqlens=[t]) for t in range(1, N + 1)]
    rows = torch.cat(rows, dim=2)
    assert close(rows, ref, TOL[torch.float32])
    torch.testing.assert_close(rows, full, rtol=1e-5, atol=1e-5)
    last3 = mta.decode_attention(q[:, :, N - 3:], k, v, num_splits=3)
    torch.testing.assert_close(last3, full[:, :, N - 3:], rtol=1e-5, atol=1e-5)


def test_bitwise_deterministic():
    """Two calls give the same bits, with several splits merged and with one."""
    q = rand(2, 4, 3, 16)
    k, v = ragged_cache(2, 2, 100, 16, [100, 37], torch.float32)
    for num_splits in (None, 1, 3):
        first = mta.decode_attention(q, k, v, cache_seqlens=[100, 37], num_splits=num_splits)
        second = mta.decode_attention(q, k, v, cache_seqlens=[100, 37], num_splits=num_splits)
        assert torch.equal(first, second), num_splits


def test_device_lengths_are_clamped_to_the_cache():
    """Lengths on the device are not checked (that would synchronise); the kernel clamps them to the cache."""
    q = rand(1, 2, 1, 16)
    k, v = rand(1, 1, 40, 16), rand(1, 1, 40, 16)
    too_long = torch.tensor([45], dtype=torch.int32, device=DEVICE)
    out = decode.run_decode(decode.plan_decode(1, 2, 1, 1, 40, 16, torch.float32, num_splits=2), q, k, v, too_long,
                            0.25)
    torch.testing.assert_close(out, mta.decode_attention(q, k, v, scale=0.25), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not ON_GPU, reason="synchronisation is a GPU matter")
def test_a_decode_step_does_not_synchronise():
    q = rand(2, 4, 1, 64, dtype=torch.float16)
    k, v = rand(2, 2, 4096, 64, dtype=torch.float16), rand(2, 2, 4096, 64, dtype=torch.float16)
    on_device = torch.tensor([4096, 1000], dtype=torch.int32, device=DEVICE)
    mta.decode_attention(q, k, v, cache_seqlens=on_device)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for lengths in (on_device, [4096, 1000], None):
            mta.decode_attention(q, k, v, cache_seqlens=lengths)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# --- the split rule ----------------------------------------------------------------------------


def test_host_integer_helpers_match_tritons():
    """The launchers' plain-Python ``cdiv`` and ``next_power_of_2`` (Triton's cost microseconds a call on the host)
    give Triton's answers."""
    from mta.launch import cdiv, next_power_of_2
    assert all(next_power_of_2(n) == triton.next_power_of_2(n) for n in range(1, 4100))
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 300) for b in range(1, 70))


def test_split_rule():
    # The GPU is already full: one split.
    assert decode.choose_num_splits(programs=128, n_max=131072, block_n=64, sms=132) == 1
    # One sequence, 8 kv heads, 1k keys in 8 tiles: every tile its own split.
    assert decode.choose_num_splits(programs=8, n_max=1024, block_n=128, sms=132) == 8
    # 64 programs on 132 SMs: 2 splits fill 97% of one wave.
    assert decode.choose_num_splits(programs=64, n_max=131072, block_n=64, sms=132) == 2
    # Never more splits than key tiles, SMs or the cap.
    assert decode.choose_num_splits(programs=1, n_max=100, block_n=64, sms=132) == 2
    assert decode.choose_num_splits(programs=1, n_max=10 ** 6, block_n=64, sms=132) <= decode.MAX_SPLITS
    assert all(1 <= decode.choose_num_splits(p, 1 << 17, 64, 132) <= 128 for p in range(1, 140))
    # MTA's band counted as one more program per (sequence, kv head): 64 x (3 + 1) programs fill 97% of 264
    # slots, where 64 x (4 + 1) would spill into a second wave.
    mta_rule = functools.partial(decode.choose_num_splits, efficiency=decode.MTA_SPLIT_EFFICIENCY)
    assert mta_rule(programs=64, n_max=4096, block_n=118, sms=264) == 4
    assert mta_rule(programs=64, n_max=4096, block_n=118, sms=264, extra=1) == 3
    # One sequence, 8 kv heads, 32k keys: plain decode fills one wave to 128 of 132 SMs (16 splits); within 85%
    # of the best, as MTA decode keeps, 14 splits (112 programs) would do.
    assert decode.choose_num_splits(programs=8, n_max=32768, block_n=64, sms=132) == 16
    assert mta_rule(programs=8, n_max=32768, block_n=64, sms=132) == 14


def test_bandwidth_per_sm_from_the_driver(monkeypatch):
    """The driver's memory clock and bus width give the bandwidth per SM: an H100 SXM 25.4 GB/s, an H200 36.5 GB/s,
    as their drivers report them (the facts of :data:`H100` and :data:`H200`)."""
    h100 = type("P", (), dict(memory_clock_rate=2_619_000, memory_bus_width=5120, multi_processor_count=132))
    h200 = type("P", (), dict(memory_clock_rate=3_201_000, memory_bus_width=6016, multi_processor_count=132))
    for props, facts in ((h100, H100), (h200, H200)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index, props=props: props)
        mta.tuning._bandwidth_per_sm.cache_clear()
        assert abs(mta.tuning._bandwidth_per_sm(0) - facts.bandwidth_per_sm) < 0.1e9
    mta.tuning._bandwidth_per_sm.cache_clear()


def test_plain_decode_takes_long_tiles_where_memory_feeds_each_sm_fast():
    """The tile rule: plain 16-bit decode over 16k positions or more on a Hopper GPU at 30 GB/s an SM or more takes
    the long tiles, MTA decode there the short windows at d = 64, everything else the general tables."""
    for gpu, plain, n_max, dtype, wide in ((H200, True, 16384, torch.bfloat16, True),
                                           (H200, True, 16383, torch.bfloat16, False),
                                           (H200, False, 1 << 17, torch.bfloat16, False),
                                           (H200, True, 1 << 17, torch.float32, False),
                                           (H100, True, 1 << 17, torch.float16, False)):
        for width in (64, 128, 256):
            table = (mta.tuning.DECODE_PLAIN_WIDE if wide else
                     mta.tuning.DECODE_FP32 if dtype == torch.float32 else mta.tuning.DECODE)
            if not plain and gpu is H200 and dtype != torch.float32 and width == 64:  # MTA: the short windows
                table = mta.tuning.DECODE_MTA_FAST
            assert decode.decode_tile(width, dtype, plain=plain, n_max=n_max, gpu=gpu) == table[width]
    other = dataclasses.replace(H200, family="other")
    assert decode.decode_tile(64, torch.bfloat16, plain=True, n_max=1 << 17, gpu=other) == mta.tuning.DECODE[64]
    assert decode.decode_tile(64, torch.bfloat16, n_max=1 << 17, gpu=other) == mta.tuning.DECODE[64]
    assert decode.decode_tile(64, torch.bfloat16, gpu=decode.INTERPRETER) == mta.tuning.DECODE_INTERPRETER


def test_even_deal_rule():
    """Plain decode deals its key tiles out evenly only where one program a (batch, kv head) unit would fill the
    last wave of SMs unevenly, over long caches; the deal covers every tile once, and no unit spans more programs
    than it has slots."""
    deal = decode.stream_programs
    assert deal(units=64, n_max=1 << 16, block_n=128, sms=132) == (0, 0, 0)  # splits fill the GPU instead
    assert deal(units=128, n_max=1 << 16, block_n=128, sms=132) == (0, 0, 0)  # one program an SM, 97% of them
    assert deal(units=264, n_max=1 << 16, block_n=128, sms=132) == (0, 0, 0)  # two an SM, every SM
    assert deal(units=136, n_max=decode.STREAM_MIN_KEYS - 1, block_n=128, sms=132) == (0, 0, 0)  # short cache
    per_program, programs, slots = deal(units=136, n_max=32768, block_n=128, sms=132)
    assert programs <= decode.STREAM_PROGRAMS_PER_SM * 132 and per_program * programs >= 136 * 256
    assert deal(units=136, n_max=32768, block_n=128, sms=132, per_sm=1)[1] <= 132
    # Two programs an SM where two tiles' K and V buffers fit the shared memory, else one (Hopper's tables).
    assert decode.stream_programs_per_sm(128, 64, 3, 2) == 2  # DECODE, d = 64: 64 KB
    assert decode.stream_programs_per_sm(64, 128, 3, 2) == 2  # DECODE, d = 128: 64 KB
    assert decode.stream_programs_per_sm(256, 64, 3, 2) == 1  # DECODE_PLAIN_WIDE, d = 64: 128 KB
    assert decode.stream_programs_per_sm(128, 128, 3, 2) == 1  # DECODE_PLAIN_WIDE, d = 128: 128 KB
    for units, n_max, block_n, sms in ((136, 32768, 128, 132), (192, 8192, 64, 132), (5, 8192, 32, 4),
                                       (7, 9000, 32, 4), (5, 8192, 4096, 4), (300, 1 << 17, 256, 132)):
        per_program, programs, slots = deal(units, n_max, block_n, sms)
        assert per_program > 0, (units, n_max)
        tiles = triton.cdiv(n_max, block_n)
        assert per_program * (programs - 1) < units * tiles <= per_program * programs
        spans = [((u + 1) * tiles - 1) // per_program - u * tiles // per_program + 1 for u in range(units)]
        assert max(spans) <= slots <= programs


# Forced on the CPU's short caches (4 SMs, 1 or 3 programs each): ragged lengths with NaN past them, GQA, several
# row tiles, runs of tiles that cross units and units that span several programs.
@pytest.mark.parametrize("case", [dict(nq=3), dict(nq=1, Hq=2, Hkv=1, D=16, lengths=(1, 64, 65, 200, 7), n_max=200),
                                  dict(nq=5, Hq=16, Hkv=1, D=16, lengths=(9, 70, 33), n_max=70),
                                  dict(nq=2, dtype=torch.float16, Hq=6, Hkv=2, D=32, lengths=(2, 33, 64, 96, 100, 5, 128),
                                       n_max=128, noncontiguous=True)])
@pytest.mark.parametrize("per_sm", [1, 3])
def test_even_deal_matches_the_reference(case, per_sm, poisoned_outputs):
    def deal(plan):
        plan = decode.with_even_deal(plan, sms=decode.INTERPRETER_SMS, per_sm=per_sm)
        assert plan.form == "stream" and plan.tiles_per_program > 0
        return plan
    run_case(**case, force=deal)


def test_even_deal_is_bitwise_repeatable():
    q = rand(5, 4, 2, 16)
    k, v = ragged_cache(5, 2, 100, 16, [100, 37, 2, 64, 99], torch.float32)
    lens = torch.tensor([100, 37, 2, 64, 99], dtype=torch.int32, device=DEVICE)
    plan = decode.with_even_deal(decode.plan_decode(5, 4, 2, 2, 100, 16, torch.float32), decode.INTERPRETER_SMS, 2)
    first = decode.run_decode(plan, q, k, v, lens, 0.25)
    assert torch.equal(first, decode.run_decode(plan, q, k, v, lens, 0.25))


def test_poor_grid_rule():
    """Where an SM runs several programs at once, a grid is poor when the programs past its full rounds fill less
    than half a round (an H100: 132 SMs, three of Hopper's plain decode tiles at once), as well as when one program
    an SM fills its last wave unevenly; plain decode then runs two splits over 2k-8k keys and deals from 8k."""
    poor = decode.poor_grid
    assert poor(512, 132, 3) and poor(528, 132, 3) and poor(592, 132, 3)  # 116, 132 and 196 past 396
    assert not any(poor(p, 132, 3) for p in (128, 384, 396, 600, 640, 768, 1024))
    assert poor(192, 132, 3) and poor(320, 132, 3)  # 1.45 and 2.42 programs an SM: the last wave uneven
    assert not poor(512, 132, 1)  # one program at a time: 3.88 even waves
    two = decode.two_splits_for_a_poor_grid
    assert two(512, 4096, 132, 3) and two(320, 2048, 132, 3) and two(192, 4096, 132, 3)
    assert not two(512, decode.POOR_GRID_MIN_KEYS - 1, 132, 3)  # short caches: the merge costs more
    assert not two(384, 4096, 132, 3) and not two(64, 4096, 132, 3)  # an even grid; splits by the rule
    assert not two(106, 4096, 132, 3)  # 106 and 212 programs are both uneven: no gain in doubling
    assert decode.stream_programs(512, 8192, 128, 132, 2, 3)[0] > 0
    assert decode.stream_programs(512, 8192, 128, 132, 2, 1) == (0, 0, 0)


def test_resident_programs_from_shared_memory():
    """Three of Hopper's plain decode tiles fit an SM's 228 KB (72 KB + 1 KB each at d = 64 and d = 128), one of the
    long tiles; a GPU that does not report its shared memory counts one; the interpreter counts two."""
    for shared, tile, expected in ((233472, (128, 16, 64, 3, 2), 3), (233472, (64, 16, 128, 3, 2), 3),
                                   (233472, (256, 16, 64, 3, 2), 1), (0, (128, 16, 64, 3, 2), 1)):
        assert decode.resident_programs(*tile, dataclasses.replace(H100, shared_per_sm=shared)) == expected
    assert decode.resident_programs(128, 16, 64, 3, 2, decode.INTERPRETER) == decode.INTERPRETER_RESIDENT


@pytest.mark.parametrize("batch, n_max, form, splits", [(64, 4096, "split", 2), (64, 8192, "stream", 1),
                                                        (66, 2048, "split", 2), (64, 1024, "split", 1),
                                                        (48, 4096, "split", 1), (80, 4096, "split", 1),
                                                        (8, 4096, "split", 2)])
def test_plain_decode_plans_on_an_h100(batch, n_max, form, splits):
    """On an H100 (bf16, d = 64, 8 kv heads, one new query), 64 x 8 and 66 x 8 (batch, kv head) units take two
    splits at 2k-4k keys and the even deal at 8k; 1k keys, 48 x 8 and 80 x 8 units take one split, B = 8 the split
    rule's 2. The merge is a programmatic dependent launch on Hopper."""
    plan = decode.plan_decode(batch, 8, 8, 1, n_max, 64, torch.bfloat16, gpu=H100)
    assert (plan.form, plan.splits, plan.pdl) == (form, splits, True)
    assert (plan.block_n, plan.num_warps, plan.num_stages) == mta.tuning.DECODE[64]
    if form == "stream":
        assert plan.programs <= 2 * 132 and plan.tiles_per_program * plan.programs >= plan.units * n_max // 128


def test_each_default_form_in_the_interpreter(poisoned_outputs):
    """The interpreter's facts (4 SMs, two programs each) take every form of plain decode by default: the even deal
    from 8k keys where 10 units fill 2.5 waves of SMs (below: two splits, 20 units fill 5), two splits from 2k keys
    where 11 units leave 3 past a full round of 8 (22 leave 6), and the wave rule's splits otherwise. Two splits
    run against float64."""
    plan = functools.partial(decode.plan_decode, gpu=decode.INTERPRETER)
    assert plan(5, 4, 2, 2, 8192, 16, torch.float32).form == "stream"
    assert plan(5, 4, 2, 2, 8191, 16, torch.float32).splits == 2
    assert plan(11, 2, 1, 1, 2048, 16, torch.float32).splits == 2
    assert plan(11, 2, 1, 1, 2047, 16, torch.float32).splits == 1
    assert plan(1, 2, 1, 1, 2048, 16, torch.float32).splits == 4
    assert all(plan(b, 2, 1, 1, 2048, 16, torch.float32).pdl is False for b in (1, 11))
    lengths = (2048, 1, 33, 64, 2, 2047, 40, 5, 1000, 17, 31)
    if ON_GPU:  # the rule above is the interpreter's: a GPU's facts choose otherwise, so two splits are asked for
        run_case(1, Hq=2, Hkv=1, D=16, lengths=lengths, n_max=2048, num_splits=2)
    else:
        run_case(1, Hq=2, Hkv=1, D=16, lengths=lengths, n_max=2048,
                 force=lambda p: p if p.splits == 2 else pytest.fail(f"not two splits: {p}"))


def test_plans_are_made_from_host_facts_only():
    """A plan is a frozen, hashable value of shapes, dtype, the device's facts and num_splits (the cache size, never
    the lengths on the device: no synchronisation); the same facts give the same plan, and decode_attention runs
    the plan of its inputs' facts."""
    plan = decode.plan_decode(1, 2, 1, 1, 64, 16, torch.float32)
    assert plan == decode.plan_decode(1, 2, 1, 1, 64, 16, torch.float32)
    assert hash(plan) == hash(dataclasses.replace(plan))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.splits = 3
    q = rand(1, 2, 1, 16)
    k, v = rand(1, 1, 64, 16), rand(1, 1, 64, 16)
    lens = torch.tensor([7], dtype=torch.int32, device=DEVICE)
    assert torch.equal(mta.decode_attention(q, k, v, cache_seqlens=lens), decode.run_decode(plan, q, k, v, lens, 0.25))


def test_a_plan_runs_only_on_its_shapes():
    q, k, v = rand(2, 4, 3, 16), rand(2, 2, 40, 16), rand(2, 2, 40, 16)
    plan = decode.plan_decode(2, 4, 2, 3, 40, 16, torch.float32)
    with pytest.raises(ValueError, match="the plan is for n_max=40, the inputs have n_max=39"):
        decode.run_decode(plan, q, k[:, :, :39], v[:, :, :39], None, 0.25)
    with pytest.raises(ValueError, match="the plan is for batch=2, n_new=3, the inputs have batch=1, n_new=2"):
        decode.run_decode(plan, q[:1, :, :2], k[:1], v[:1], None, 0.25)
    with pytest.raises(ValueError, match="not 'rows'"):
        decode.run_decode(dataclasses.replace(plan, form="rows"), q, k, v, None, 0.25)


# --- input checks ------------------------------------------------------------------------------


def inputs(B=2, Hq=4, Hkv=2, nq=1, n_max=20, D=16):
    return rand(B, Hq, nq, D), rand(B, Hkv, n_max, D), rand(B, Hkv, n_max, D)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(cache_seqlens=[20, 21]), ValueError, "over the cache size"),
    (dict(cache_seqlens=[0, 5]), ValueError, "under Nq"),
    (dict(cache_seqlens=[5]), ValueError, r"shape \(2,\)"),
    # A CPU tensor is checked value by value, as a list is.
    (dict(cache_seqlens=torch.tensor([20, 21], dtype=torch.int32)), ValueError, "over the cache size"),
    (dict(cache_seqlens=torch.tensor([0, 5])), ValueError, "under Nq"),
    (dict(cache_seqlens=torch.tensor([5], dtype=torch.int32)), ValueError, r"shape \(2,\)"),
    (dict(cache_seqlens=torch.tensor([5.0, 6.0])), TypeError, "int32 or int64"),
    (dict(cache_seqlens=[5, 6.5]), TypeError, "list of ints"),
    (dict(cache_seqlens="5"), TypeError, "int tensor"),
    (dict(num_splits=0), ValueError, "num_splits"),
    (dict(num_splits=2.0), TypeError, "num_splits must be an int"),
    (dict(num_splits=True), TypeError, "num_splits must be an int"),
    (dict(scale=float("nan")), ValueError, "scale"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        mta.decode_attention(*inputs(), **kwargs)


def test_bad_shapes_and_dtypes():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="between 1 and 16"):
        mta.decode_attention(rand(2, 4, 17, 16), rand(2, 2, 40, 16), rand(2, 2, 40, 16))
    with pytest.raises(ValueError, match="more than the cache holds"):
        mta.decode_attention(rand(2, 4, 3, 16), k[:, :, :2], v[:, :, :2])
    with pytest.raises(ValueError, match="multiple of kv heads"):
        mta.decode_attention(rand(2, 3, 1, 16), k, v)
    with pytest.raises(ValueError, match="head dims differ: q has D=8, k_cache and v_cache have D=16"):
        mta.decode_attention(rand(2, 4, 1, 8), k, v)
    with pytest.raises(ValueError, match="4 dimensions"):
        mta.decode_attention(q[0], k, v)
    with pytest.raises(ValueError, match="k_cache must have 4 dimensions"):
        mta.ops.decode_attention(q, k[0], v)
    with pytest.raises(TypeError, match="q, k_cache and v_cache must share a dtype"):
        mta.decode_attention(q.half(), k, v)
    with pytest.raises(TypeError, match="fp16, bf16 or fp32"):
        mta.decode_attention(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="at most 256"):
        mta.decode_attention(rand(1, 1, 1, 264), rand(1, 1, 4, 264), rand(1, 1, 4, 264))


# --- GPU only: bf16 and long caches ------------------------------------------------------------


@pytest.mark.skipif(not ON_GPU, reason="long caches and bf16 on a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [64, 128, 256])
def test_long_caches_on_the_gpu(dtype, D):
    lengths = [1, 4097, 33000]
    q = rand(3, 8, 2, D, dtype=dtype)
    k, v = ragged_cache(3, 2, 33000, D, lengths, dtype)
    out = mta.decode_attention(q, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=DEVICE))
    assert close(out, reference(q, k, v, lengths), TOL[dtype])


@pytest.mark.skipif(not ON_GPU, reason="the SM count of a GPU")
def test_even_deal_on_the_gpu():
    """Two kv heads' worth of units past the SM count, over a cache long enough for the even deal: ragged lengths
    with NaN past them, GQA, two new queries, bf16."""
    B = decode.sm_count(torch.device(DEVICE)) // 8 + 2
    lengths = [8200 - 37 * b for b in range(B)]
    assert decode.plan_decode(B, 16, 8, 2, 8200, 128, torch.bfloat16).form == "stream", "the even deal is not planned"
    q = rand(B, 16, 2, 128, dtype=torch.bfloat16)
    k, v = ragged_cache(B, 8, 8200, 128, lengths, torch.bfloat16)
    out = mta.decode_attention(q, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=DEVICE))
    assert close(out, reference(q, k, v, lengths), TOL[torch.bfloat16])


@pytest.mark.skipif(not ON_GPU, reason="programmatic dependent launch is a GPU matter")
def test_dependent_launch_of_the_merge_changes_no_bit():
    """On Hopper the merge kernel is launched before the split kernel ends (it waits on the GPU for that end):
    the output is bitwise that of an ordinary launch, also under a CUDA graph replay and for MTA."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    from mta import conv_decode
    lengths = torch.tensor([5000, 3001], dtype=torch.int32, device=DEVICE)
    q_cache, (k, v) = rand(2, 8, 5000, 64, dtype=torch.bfloat16), ragged_cache(2, 2, 5000, 64, [5000, 3001],
                                                                                torch.bfloat16)
    w = 0.2 * rand(8, 6, 11)
    q = q_cache[:, :, -2:]
    plain = decode.plan_decode(2, 8, 2, 2, 5000, 64, torch.bfloat16, num_splits=16)
    conv = conv_decode.plan_conv_decode(2, 8, 2, 2, 5000, 64, torch.bfloat16, (6, 11), num_splits=16)
    assert plain.pdl and conv.pdl

    def step(pdl=True):
        return (decode.run_decode(dataclasses.replace(plain, pdl=pdl), q, k, v, lengths, 0.125),
                conv_decode.run_conv_decode(dataclasses.replace(conv, pdl=pdl), q_cache, k, v, w, lengths, 0.125))

    dependent = step()
    ordinary = step(pdl=False)
    graph = torch.cuda.CUDAGraph()
    step()  # compiled before the capture
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        for a, b, c in zip(dependent, ordinary, captured):
            assert torch.equal(a, b) and torch.equal(a, c)
