"""The launch order of the attention kernels: a permutation of the grid, heaviest tiles first."""

import pytest
import torch
import triton
import triton.language as tl

from mta import runtime
from mta.bench.launch_order import with_natural_order
from mta.launch_order import heaviest_first


@triton.jit
def _record_kernel(OUT, HEAVY_LAST: tl.constexpr):
    tile, pid_bh = heaviest_first(HEAVY_LAST)
    pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)  # the position in the launch order
    tl.store(OUT + 2 * pid, tile)
    tl.store(OUT + 2 * pid + 1, pid_bh)


@pytest.mark.parametrize("heavy_last", [True, False])
@pytest.mark.parametrize("num_tiles, num_bh", [(1, 1), (5, 3), (4, 1), (1, 6)])
def test_heaviest_first(num_tiles, num_bh, heavy_last):
    out = torch.full((num_tiles * num_bh, 2), -1, dtype=torch.int32, device=runtime.DEVICE)
    _record_kernel[(num_tiles, num_bh)](out, HEAVY_LAST=heavy_last)
    order = [tuple(row) for row in out.cpu().tolist()]
    # every (tile, head) exactly once
    assert sorted(order) == [(t, bh) for t in range(num_tiles) for bh in range(num_bh)]
    # tile-major: each head's heaviest tile before any head's next one
    heavy = num_tiles - 1 if heavy_last else 0
    step = -1 if heavy_last else 1
    assert order == [(heavy + step * r, bh) for r in range(num_tiles) for bh in range(num_bh)]


def test_the_benchmark_twin_numbers_tiles_the_natural_way():
    """``mta.bench order`` times each kernel against this twin: the same function, ``heaviest_first`` rebound."""
    twin = with_natural_order(_record_kernel)
    out = torch.full((6, 2), -1, dtype=torch.int32, device=runtime.DEVICE)
    twin[(3, 2)](out, HEAVY_LAST=True)
    assert [tuple(row) for row in out.cpu().tolist()] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
