"""Checkers for chapter 01's exercises (naive attention, memory, traffic).

Each ``check_*`` takes the learner's function, runs it on named cases chosen to
catch the usual mistakes, prints one line and returns a :class:`~mta.course.exercises.Result`.
It never raises.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from ...reference import naive_attention
from . import (CaseFailed, Result, call_on_copies, expect_close, expect_equal, finished_attention, refusing,
               run_cases)

__all__ = ["check_causal_attention", "check_first_n_not_fitting", "check_decode_intensity",
           "check_tiled_traffic", "tiled_traffic_by_simulation"]

F64 = torch.float64


def _randn(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=F64) * scale


# ---------------------------------------------------------------------------------------------
# Exercise 1: causal attention (bottom-right, GQA) with one masked_fill


class _CountMaskedFill(TorchFunctionMode):
    """Counts calls of ``masked_fill`` / ``masked_fill_`` while active."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("masked_fill", "masked_fill_"):
            self.count += 1
        return func(*args, **(kwargs or {}))


def check_causal_attention(causal_attention) -> Result:
    """Exercise 1: ``causal_attention(q, k, v)`` equals ``naive_attention(q, k, v, causal=True)``.

    Cases: square; fewer queries than keys (bottom-right alignment); one query (decoding);
    one query and one key; GQA; a head dimension other than 16 (the scale); large logits;
    and exactly one ``masked_fill`` per call.
    """
    gen = torch.Generator().manual_seed(101)

    def case(B, Hq, Hkv, Nq, Nk, D, scale=1.0):
        def run():
            q = _randn(gen, B, Hq, Nq, D, scale=scale)
            k, v = _randn(gen, B, Hkv, Nk, D, scale=scale), _randn(gen, B, Hkv, Nk, D)
            with refusing(finished_attention()):
                got = call_on_copies(causal_attention, q, k, v)
            want = naive_attention(q, k, v, causal=True)
            expect_close("output", got, want, atol=1e-10, rtol=1e-10)
        return run

    def one_masked_fill():
        q, k, v = _randn(gen, 1, 2, 3, 8), _randn(gen, 1, 2, 5, 8), _randn(gen, 1, 2, 5, 8)
        with _CountMaskedFill() as counter:
            causal_attention(q, k, v)
        if counter.count != 1:
            raise CaseFailed(f"the function called masked_fill {counter.count} times; the exercise asks "
                             "for exactly one (build the whole mask first, then fill once)")

    return run_cases("exercise 1 (causal_attention)", [
        ("Nq = Nk = 8", case(2, 2, 2, 8, 8, 16)),
        ("Nq = 3 < Nk = 8 (bottom-right alignment)", case(2, 2, 2, 3, 8, 16)),
        ("Nq = 1, Nk = 9 (decoding)", case(1, 2, 2, 1, 9, 16)),
        ("Nq = Nk = 1", case(1, 1, 1, 1, 1, 16)),
        ("GQA: 6 query heads share 2 kv heads, Nq = 4, Nk = 7", case(1, 6, 2, 4, 7, 16)),
        ("head dimension d = 40 (scale 1/sqrt(d))", case(1, 2, 1, 5, 6, 40)),
        ("large logits (inputs times 30)", case(1, 2, 2, 5, 6, 16, scale=30.0)),
        ("exactly one masked_fill per call", one_masked_fill),
    ])


# ---------------------------------------------------------------------------------------------
# Exercise 2: when do S and P stop fitting?


def check_first_n_not_fitting(first_n_not_fitting) -> Result:
    """Exercise 2: ``first_n_not_fitting(B, H, itemsize, capacity_bytes)`` is the smallest N
    (``Nq = Nk = N``) with ``2 * B * H * N**2 * itemsize > capacity_bytes``.

    Cases: the chapter's two configurations; a capacity that S and P fill exactly (they still
    fit); a capacity below one N = 1 score pair; a capacity too large for float square roots.
    """

    def sp(B, H, itemsize, N):
        return 2 * B * H * N * N * itemsize

    def case(B, H, itemsize, capacity):
        def run():
            got = first_n_not_fitting(B, H, itemsize, capacity)
            if isinstance(got, float) and got.is_integer():
                got = int(got)
            elif isinstance(got, numbers.Integral) and not isinstance(got, bool):  # a NumPy integer, say
                got = int(got)
            if not isinstance(got, int):
                raise CaseFailed(f"expected an int, got {type(got).__name__} {got!r}")
            if got < 1:
                raise CaseFailed(f"got N = {got}; N counts tokens, so it is at least 1")
            if sp(B, H, itemsize, got) <= capacity:
                raise CaseFailed(f"at N = {got}, S and P take {sp(B, H, itemsize, got)} bytes, which still fit "
                                 f"in {capacity} bytes")
            if got > 1 and sp(B, H, itemsize, got - 1) > capacity:
                raise CaseFailed(f"N = {got} is not the smallest: N = {got - 1} already needs "
                                 f"{sp(B, H, itemsize, got - 1)} > {capacity} bytes")
        return run

    per = 2 * 4 * 8 * 2  # B = 4, H = 8, fp16
    return run_cases("exercise 2 (first_n_not_fitting)", [
        ("B=8, H=32, fp16, 80 GB", case(8, 32, 2, 80 * 10**9)),
        ("B=1, H=16, fp32, 80 GB", case(1, 16, 4, 80 * 10**9)),
        ("capacity exactly equal to S + P at N = 1000 (they fit)", case(4, 8, 2, per * 1000**2)),
        ("capacity smaller than S + P at N = 1", case(4, 8, 2, per - 1)),
        ("capacity of 2 * (2**53 + 1)**2 bytes (float sqrt rounds)", case(1, 1, 1, 2 * (2**53 + 1) ** 2)),
    ])


# ---------------------------------------------------------------------------------------------
# Exercise 3: arithmetic intensity of decoding


def _decode_truth(Hq, Hkv, Nq, Nk, d, itemsize, kv_once_per_group):
    """FLOPs counted by PyTorch on meta tensors; bytes from the tensors the kernel must move."""
    dtype = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}[itemsize]
    fdtype = torch.float32 if dtype == torch.int8 else dtype
    q = torch.empty(1, Hq, Nq, d, dtype=fdtype, device="meta")
    k = torch.empty(1, Hkv, Nk, d, dtype=fdtype, device="meta")
    with FlopCounterMode(display=False) as counter:
        naive_attention(q, k, k)
    flops = counter.get_total_flops()
    kv_heads = Hkv if kv_once_per_group else Hq  # reading K once per query head = Hq copies
    moved = (2 * Hq * Nq * d + 2 * kv_heads * Nk * d) * itemsize
    return flops / moved


def check_decode_intensity(decode_intensity) -> Result:
    """Exercise 3: ``decode_intensity(Hq, Hkv, Nq, Nk, d, itemsize, *, kv_once_per_group)`` in FLOP/byte.

    FLOPs are counted by PyTorch's FlopCounterMode; bytes are Q and O once per query head,
    K and V once per query head (``kv_once_per_group=False``) or once per kv head (True).
    Cases: the chapter's configuration both ways; multi-head (no sharing to gain);
    multi-query (one kv head); 16 queries at once; fp32; a single key.
    """

    def case(Hq, Hkv, Nq, Nk, d, itemsize):
        def run():
            for once in (False, True):
                got = decode_intensity(Hq, Hkv, Nq, Nk, d, itemsize, kv_once_per_group=once)
                want = _decode_truth(Hq, Hkv, Nq, Nk, d, itemsize, once)
                try:
                    ok = math.isclose(float(got), want, rel_tol=1e-9)
                except (TypeError, ValueError):
                    raise CaseFailed(f"kv_once_per_group={once}: expected a number, got {got!r}") from None
                if not ok:
                    raise CaseFailed(f"kv_once_per_group={once}: got {float(got)!r} FLOP/byte, expected {want!r} "
                                     f"(relative error {abs(float(got) - want) / abs(want):.1e}; within 1e-9 "
                                     "passes: compute in Python floats, not float32)")
        return run

    return run_cases("exercise 3 (decode_intensity)", [
        ("Hq=32, Hkv=8, Nq=1, Nk=32768, d=128, bf16", case(32, 8, 1, 32768, 128, 2)),
        ("multi-head: Hq = Hkv = 16", case(16, 16, 1, 4096, 64, 2)),
        ("multi-query: Hkv = 1", case(8, 1, 1, 4096, 128, 2)),
        ("16 queries at once (Nq = 16)", case(32, 8, 16, 2048, 128, 2)),
        ("fp32 (itemsize 4)", case(32, 8, 1, 1000, 96, 4)),
        ("a single key (Nk = 1)", case(4, 2, 1, 1, 64, 2)),
    ])


# ---------------------------------------------------------------------------------------------
# Exercise 4: HBM traffic of a tiled kernel, causal and not


def tiled_traffic_by_simulation(N, d, itemsize, block_m, block_n, causal):
    """Bytes a tiled forward kernel moves for one head, counted load by load.

    One program per tile of ``block_m`` query rows: it reads its Q rows, walks the key blocks
    of ``block_n`` keys from the start (with ``causal``, it stops after the block holding its
    last visible key, ``j <= i``), loads the K and V rows of each block that exist (a masked
    tail loads only the rows below N), and writes its O rows.
    """
    rows = 0
    for m_start in range(0, N, block_m):
        m_end = min(m_start + block_m, N)
        rows += 2 * (m_end - m_start)  # Q read, O written
        for n_start in range(0, N, block_n):
            if causal and n_start > m_end - 1:
                break  # every key of this block lies in the future of every row of the tile
            rows += 2 * (min(n_start + block_n, N) - n_start)  # K and V rows loaded
    return rows * d * itemsize


def check_tiled_traffic(tiled_traffic) -> Result:
    """Exercise 4: ``tiled_traffic(N, d, itemsize, block_m, block_n, *, causal)`` in bytes.

    Compared with a load-by-load count (:func:`tiled_traffic_by_simulation`). Cases: N a
    multiple of both tiles; N not a multiple of BLOCK_M; N smaller than a tile; N = 1; causal
    with equal tiles; causal with BLOCK_N larger and smaller than BLOCK_M; causal with a
    ragged N.
    """

    def case(N, d, itemsize, block_m, block_n, causal):
        def run():
            got = tiled_traffic(N, d, itemsize, block_m, block_n, causal=causal)
            want = tiled_traffic_by_simulation(N, d, itemsize, block_m, block_n, causal)
            try:
                got_value = float(got)
            except (TypeError, ValueError):
                raise CaseFailed(f"expected a number of bytes, got {got!r}") from None
            expect_equal("bytes", got_value, float(want))
        return run

    return run_cases("exercise 4 (tiled_traffic)", [
        ("not causal, N = 1024, BLOCK_M = BLOCK_N = 128", case(1024, 128, 2, 128, 128, False)),
        ("not causal, N = 1000 (not a multiple of BLOCK_M = 128)", case(1000, 128, 2, 128, 64, False)),
        ("not causal, N = 50 < BLOCK_M = 64", case(50, 64, 2, 64, 64, False)),
        ("not causal, N = 1", case(1, 64, 4, 64, 32, False)),
        ("causal, N = 1024, BLOCK_M = BLOCK_N = 128", case(1024, 128, 2, 128, 128, True)),
        ("causal, N = 1024, BLOCK_M = 64 < BLOCK_N = 128", case(1024, 128, 2, 64, 128, True)),
        ("causal, N = 1024, BLOCK_M = 128 > BLOCK_N = 32", case(1024, 128, 2, 128, 32, True)),
        ("causal, N = 1000, BLOCK_M = 128, BLOCK_N = 96", case(1000, 64, 2, 128, 96, True)),
        ("causal, N = 1", case(1, 64, 2, 128, 64, True)),
    ])
