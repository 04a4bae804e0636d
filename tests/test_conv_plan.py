"""The MTA plan's rules (:mod:`mta.conv_plan`): which backward form a call takes, and how a backward tile is fitted
on chip. Host arithmetic only: the same answers on any machine, GPU families passed in by name."""

import pytest
import torch

import mta
from conftest import rand
from mta.conv import plan_of


@pytest.mark.parametrize("cq,head_dim,dtype,fits", [
    (11, 256, torch.bfloat16, True), (12, 256, torch.bfloat16, True), (13, 256, torch.bfloat16, False),
    (16, 128, torch.bfloat16, True), (6, 256, torch.float32, True), (7, 256, torch.float32, False),
    (12, 128, torch.float32, True), (13, 128, torch.float32, False), (24, 64, torch.float32, True),
    (25, 64, torch.float32, False), (24, 128, torch.bfloat16, True), (25, 128, torch.bfloat16, False)])
def test_fused_backward_fits_up_to_the_shared_memory_bound(cq, head_dim, dtype, fits):
    """The bound past which the backward runs in row chunks (sm_90 builds: 16 x 15 at d = 256 in bf16 needs
    296 KB, 11 x 15 fits in 208 KB)."""
    assert mta.conv_plan.backward_fits(cq, head_dim, dtype) is fits
    assert (mta.conv_plan.plan_conv(dtype, head_dim, (cq, 3), True, "hopper").backward == "chunked") is (not fits)


@pytest.mark.parametrize("cq,block_d,elem", [(1, 64, 2), (6, 64, 2), (6, 128, 2), (11, 64, 2), (11, 128, 2),
                                             (16, 64, 2), (24, 128, 2), (6, 64, 4), (32, 256, 4)])
@pytest.mark.parametrize("warps,stages", [(4, 2), (8, 2), (8, 3)])
def test_backward_tiles_shrink_to_fit(cq, block_d, elem, warps, stages):
    """The launcher fits a backward tile on chip: a wide fp32 accumulator first gets more warps (up to
    ``MAX_WARPS``), then fewer owned rows, until it fits ``ACC_REGISTERS`` per thread; with one streamed tile it
    fits ``TILE_REGISTERS`` by fewer streamed rows; the held and streamed blocks then fit ``SHARED_BYTES`` by fewer
    streamed rows, then owned rows, then stages; never below 16 rows."""
    from mta.conv_plan import ACC_REGISTERS, MAX_WARPS, SHARED_BYTES, TILE_REGISTERS
    start = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": warps, "num_stages": stages}
    tile = mta.conv_plan.fit_backward_tile(start, "BLOCK_M", "BLOCK_N", cq, block_d, elem)
    cols = sum(mta.conv_forward.query_shift_groups(cq)) * block_d
    registers = tile["BLOCK_M"] * cols / (32 * tile["num_warps"])
    shared = (tile["BLOCK_M"] + tile["BLOCK_N"] * tile["num_stages"]) * cols * elem

    def tile_registers(streamed):
        return registers + streamed * cols * elem / (4 * 32 * tile["num_warps"])

    assert tile_registers(tile["BLOCK_N"]) <= TILE_REGISTERS or tile["BLOCK_N"] == 16
    if tile["BLOCK_N"] < 128:  # fewer streamed rows only where twice as many would not fit
        twice = (tile["BLOCK_M"] + 2 * tile["BLOCK_N"] * tile["num_stages"]) * cols * elem
        assert tile_registers(2 * tile["BLOCK_N"]) > TILE_REGISTERS or twice > SHARED_BYTES
    assert tile["BLOCK_M"] >= 16 and tile["BLOCK_N"] >= 16 and 1 <= tile["num_stages"] <= stages
    assert warps <= tile["num_warps"] <= max(warps, MAX_WARPS)
    if tile["num_warps"] > warps:  # more warps only for an accumulator that does not fit
        assert 64 * cols / (32 * tile["num_warps"] // 2) > ACC_REGISTERS
    if tile["BLOCK_M"] < 64:  # fewer owned rows only once the warps are spent (or the shared memory asks)
        assert tile["num_warps"] == max(warps, MAX_WARPS) or (64 * cols / (32 * tile["num_warps"]) <= ACC_REGISTERS
                                                               and tile["BLOCK_N"] == 16)
    if tile["num_stages"] < stages:  # stages go last
        assert tile["BLOCK_M"] == tile["BLOCK_N"] == 16
    assert registers <= ACC_REGISTERS or tile["BLOCK_M"] == 16
    assert shared <= SHARED_BYTES or (tile["BLOCK_M"], tile["BLOCK_N"], tile["num_stages"]) == (16, 16, 1)
    if (cq, block_d, elem) == (6, 64, 2) and warps == 4:  # the H100's d = 64 tile: 192 registers, left alone
        assert (tile["BLOCK_M"], tile["num_warps"]) == (64, 4)
    if (cq, block_d, elem) == (11, 64, 2):  # 12 shifts at d = 64: 64 rows over 8 warps (as 6 x 11 at d = 128)
        assert (tile["BLOCK_M"], tile["num_warps"]) == (64, 8)
    if cq == 1 and block_d == 64:
        assert tile == start  # small enough: left alone


@pytest.mark.parametrize("cq,block_d,owned,streamed,start,fitted", [
    (6, 128, "BLOCK_N", "BLOCK_M", (32, 64, 8, 1), (32, 64, 8, 1)),   # 6 x 11 at d = 128: the table's tile
    (11, 128, "BLOCK_N", "BLOCK_M", (32, 64, 8, 1), (16, 32, 8, 1)),  # 11 x 11: 16 queries beside 32 keys' U
    (11, 128, "BLOCK_M", "BLOCK_N", (64, 32, 8, 2), (32, 16, 8, 2)),  # its dQ side: shared memory asks the same
    (16, 128, "BLOCK_N", "BLOCK_M", (32, 64, 8, 1), (32, 16, 8, 1)),  # 16 x 15: 256 registers, at the bound
    (16, 64, "BLOCK_N", "BLOCK_M", (32, 64, 4, 2), (32, 32, 8, 2)),   # 16 x 15 at d = 64
])
def test_backward_tiles_measured_on_an_h100(cq, block_d, owned, streamed, start, fitted):
    """The tiles the launcher fits from the Hopper table at the kernel sizes measured on an H100: each is the
    fastest of those tried there."""
    tile = mta.conv_plan.fit_backward_tile(mta.tuning.as_config(start), owned, streamed, cq, block_d, 2)
    assert tuple(tile.values()) == fitted


@pytest.mark.parametrize("cq,block_d,dtype,wide", [
    (6, 64, torch.bfloat16, True),     # 128 keys x 6 shifts x 64: 192 registers a thread over 8 warps
    (7, 64, torch.bfloat16, False),    # 8 shifts: the table's tile, queries as rows
    (16, 16, torch.float16, True),     # 16 shifts of 16 columns
    (1, 128, torch.bfloat16, False),   # no keys-as-rows tile for d > 64
    (6, 64, torch.float32, False),     # fp32 keeps its own tiles
])
def test_keys_as_rows_only_where_its_tile_fits_whole(cq, block_d, dtype, wide):
    from mta import tuning
    from mta.conv_plan import fit_backward_tile, keys_as_rows_tile
    tile = keys_as_rows_tile(cq, block_d, dtype, family="hopper")
    assert (tile is not None) == wide
    if wide:
        assert tile == tuning.HOPPER_KEYS_AS_ROWS[64]
        config = tuning.as_config(tile)
        assert fit_backward_tile(config, "BLOCK_N", "BLOCK_M", cq, block_d, dtype.itemsize) == config
    assert keys_as_rows_tile(cq, block_d, dtype, family="other") is None


def test_dq_far_kernel_rule():
    """The plan takes the dq kernel for 128-wide head-dim tiles only (where it is faster than the GEMMs)."""
    def plan(head_dim):
        return mta.conv_plan.plan_conv(torch.bfloat16, head_dim, (6, 11), True, "hopper")
    assert plan(128).dq_far_kernel and plan(96).dq_far_kernel
    assert not plan(64).dq_far_kernel and not plan(256).dq_far_kernel


def test_one_pass_in_the_interpreter():
    """The plan takes two phases for bf16 on Hopper GPUs only (the interpreter has neither)."""
    assert plan_of(rand(1, 2, 64, 128, dtype=torch.float16), rand(2, 6, 11), True).backward == "one_pass"


@pytest.mark.parametrize("head_dim,cq,dtype,family,two", [
    (128, 6, torch.bfloat16, "hopper", True), (96, 4, torch.bfloat16, "hopper", True),
    (128, 3, torch.bfloat16, "hopper", True), (64, 6, torch.bfloat16, "hopper", True),
    (64, 11, torch.bfloat16, "hopper", True), (256, 6, torch.bfloat16, "hopper", True),
    (64, 2, torch.bfloat16, "hopper", False), (128, 1, torch.bfloat16, "hopper", False),
    (128, 6, torch.float16, "hopper", False), (128, 6, torch.float32, "hopper", False),
    (128, 6, torch.bfloat16, "other", False)], ids=str)
def test_the_rule_takes_two_phases_from_three_query_shifts(head_dim, cq, dtype, family, two):
    """bf16 on Hopper with cq >= 3: faster from 3 x 3 on (d = 64 to 256), slower at 1 x 1 and 2 x 9."""
    plan = mta.conv_plan.plan_conv(dtype, head_dim, (cq, 11), True, family)
    assert (plan.backward == "two_phase") is two
