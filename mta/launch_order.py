"""Which tile a program works on: the heaviest tiles launch first.

The GPU starts programs in the order of their linear id (axis 0 fastest) and
gives a free SM the next one. Under a causal mask the tiles are unequal: the
last query tile visits every key tile, the first only the keys up to its diagonal. Numbered the
natural way (all tiles of head 0, then head 1, ...), the last wave is a mix
of long and short programs and the SMs that drew short ones sit idle while the
long ones finish. Numbered tile-major with the longest tiles first (every
head's last query tile, then every head's second-to-last, ...), the short
programs come last and fill the gaps: longest-processing-time-first scheduling.
Appendix 03b (``notebooks/03b_launch_order.ipynb``) measures what it buys for the causal forward
kernels; for the non-causal and backward launches it is applied but not measured.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def heaviest_first(HEAVY_LAST: tl.constexpr):
    """``(tile, pid_bh)`` for a ``(num_tiles, num_bh)`` grid, numbered so that heavy tiles start first.

    ``HEAVY_LAST``: the last tile along axis 0 has the most work (causal query
    tiles: forward, dQ); otherwise the first (causal key tiles: dK, dV). The map
    is a permutation of the grid: every ``(tile, pid_bh)`` is visited once.
    """
    num_tiles = tl.num_programs(0)
    num_bh = tl.num_programs(1)
    pid = tl.program_id(0) + tl.program_id(1) * num_tiles  # the launch order: axis 0 fastest
    rank = pid // num_bh  # tile-major: every head's heaviest tile, then every head's next one, ...
    if HEAVY_LAST:
        tile = num_tiles - 1 - rank
    else:
        tile = rank
    return tile, pid % num_bh
