"""MTA decode rows in PyTorch (:mod:`mta.conv_decode_rows`): what ``mta.conv_decode_attention`` returns where its
split kernel does not fit in shared memory (the ``"rows"`` form of its plan). Against the float64 reference rows,
with caches poisoned past each length, and through ``conv_decode_attention`` where the launch is refused (GPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import mta
import mta.conv_decode
from conftest import ON_GPU, close_in_norm, rand
from mta.conv_decode_rows import conv_decode_rows
from test_conv_decode import TOL, caches, reference


# The widest kernel (32 x 33, more rows of reach than the shortest sequence), N < cq, GQA, 1 x 1, and the head
# blocks: a tiny budget makes every head a block of its own.
@pytest.mark.parametrize("cq,ck,n,lengths,budget", [
    (32, 33, 2, (1, 40, 75), None), (6, 11, 3, (3, 37, 100), None), (1, 1, 1, (1, 37, 300), None),
    (11, 15, 4, (5, 9, 60), 1), (2, 9, 1, (80, 80), None)], ids=str)
def test_rows_against_the_float64_reference(cq, ck, n, lengths, budget):
    lengths = [max(L, n) for L in lengths]
    q, k, v = caches(len(lengths), 4, 2, max(lengths), 24, lengths, torch.float32)
    weight = rand(4, cq, ck, scale=0.2)
    lens = torch.tensor(lengths, dtype=torch.int32, device=q.device)  # as conv_decode_attention passes them
    out = conv_decode_rows(q, k, v, weight, lens, n, 24 ** -0.5,
                           **({} if budget is None else dict(rows_bytes=budget)))
    assert out.shape == (len(lengths), 4, n, 24) and torch.isfinite(out).all()
    assert close_in_norm(out, reference(q, k, v, weight, lengths, n), TOL[torch.float32])


def test_every_sequence_full_when_no_lengths():
    q, k, v = caches(2, 2, 1, 30, 16, (30, 30), torch.float16)
    weight = rand(2, 5, 7, scale=0.2)
    out = conv_decode_rows(q, k, v, weight, None, 3, 0.25)
    assert out.dtype == torch.float16
    ref = torch.cat([mta.conv_attention_reference(*(x[b:b + 1].double() for x in (q, k, v)), weight.double(),
                                                  scale=0.25)[:, :, -3:] for b in range(2)])
    assert close_in_norm(out, ref, TOL[torch.float16])


def test_conv_decode_attention_takes_the_rows_form():
    """The plan's "rows" form through :func:`mta.conv_decode.run_conv_decode` (which runs it where Triton refuses
    the split kernel's launch), the widest kernel, against the float64 rows."""
    lengths = [40, 75]
    q, k, v = caches(2, 4, 2, 75, 24, lengths, torch.float32)
    weight = rand(4, 32, 33, scale=0.2)
    plan = mta.conv_decode.plan_conv_decode(2, 4, 2, 2, 75, 24, torch.float32, (32, 33))
    out = mta.conv_decode.run_conv_decode(dataclasses.replace(plan, form="rows"), q, k, v, weight,
                                          torch.tensor(lengths, dtype=torch.int32, device=q.device), 24 ** -0.5)
    assert close_in_norm(out, reference(q, k, v, weight, lengths, 2), TOL[torch.float32])


@pytest.mark.skipif(not ON_GPU, reason="Triton refuses a launch on a GPU only (the interpreter has no shared memory)")
def test_conv_decode_attention_falls_back_where_the_launch_is_refused():
    """fp32 with the widest kernel at d = 128: the split kernel's tiles pass a GPU's shared memory (an H100's and an
    H200's), so conv_decode_attention returns the unfused rows: against the float64 rows, poisoned caches."""
    lengths = [40, 300]
    q, k, v = caches(2, 4, 2, 300, 128, lengths, torch.float32)
    weight = rand(4, 32, 33, scale=0.2)
    out = mta.conv_decode_attention(q, k, v, weight, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
                                    num_queries=2)
    assert close_in_norm(out, reference(q, k, v, weight, lengths, 2), TOL[torch.float32])
