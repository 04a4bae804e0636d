"""Adversarial pass on generation: the decode functions, the layer's KV cache and the toy task, as an ML engineer
building and sampling from models would use them. Each test was checked to fail before its fix."""

from __future__ import annotations

import sys

import pytest
import torch

import mta
from conftest import DEVICE, run_child_case, wide_views

#: fp16 inputs, fp32 accumulation: a few fp16 roundings of values of order 1.
TOL16 = dict(atol=5e-3, rtol=5e-3)


def decode_reference(q, k, v, lengths, weight=None, n_new=1):
    """float64, per sequence: the last ``n_new`` rows of causal MTA (``weight``) or plain attention on its first
    ``L`` positions; ``q`` is the query cache for MTA, the new queries otherwise."""
    rows = []
    for b, n in enumerate(lengths):
        kb, vb = k[b:b + 1, :, :n].double().cpu(), v[b:b + 1, :, :n].double().cpu()
        if weight is None:
            rows.append(mta.naive_attention(q[b:b + 1].double().cpu(), kb, vb, causal=True))
        else:
            out = mta.conv_attention_reference(q[b:b + 1, :, :n].double().cpu(), kb, vb, weight.double().cpu())
            rows.append(out[:, :, n - n_new:])
    return torch.cat(rows)


# --- indices past 2**31 within one sequence ------------------------------------------------------------------


def _wide_case() -> None:
    """Caches whose part for one sequence spans 2**31 elements (a head stride of 2**30 over 3 heads; a position
    stride of 2**29, the ``[B, Nmax, H, D]`` layout of a long cache), built as views of one lazily allocated buffer:
    only the few positions used are ever touched. ``kv_head * stride`` and ``position * stride`` wrapped around
    in int32: reads from before the buffer (a segfault in the interpreter, garbage or a fault on a GPU)."""
    D, L = 16, 5
    view = wide_views(4 * L * D)
    if view is None:
        return
    rnd = torch.Generator(device="cpu").manual_seed(1)

    heads = ((1, 3, L, D), (0, 2 ** 30, D, 1))                   # kv head 2 starts 2**31 elements in
    q = torch.randn(1, 3, 2, D, generator=rnd).half().to(DEVICE)
    k, v = view(*heads, 0), view(*heads, L * D)
    out = mta.decode_attention(q, k, v, cache_seqlens=[L])
    torch.testing.assert_close(out.double().cpu(), decode_reference(q, k, v, [L]), **TOL16)

    heads_kv = k, v
    positions = ((1, 3, L, D), (0, D, 2 ** 29, 1))              # position 4 starts 2**31 elements in
    qc, k, v = view(*positions, 2 * L * D), view(*positions, 3 * D), view(*positions, 6 * D)
    from mta import decode  # plain decode's even deal, forced by its plan: 3 units on 2 SMs
    plan = decode.with_even_deal(decode.plan_decode(1, 3, 3, 2, L, D, torch.float16), sms=2, per_sm=2)
    assert plan.form == "stream" and plan.tiles_per_program > 0
    for keys, values in (heads_kv, (k, v)):  # kv head 2, then position 4, past 2**31 elements
        out = decode.run_decode(plan, q, keys, values, None, D ** -0.5)
        torch.testing.assert_close(out.double().cpu(), decode_reference(q, keys, values, [L]), **TOL16)
    w = 0.3 * torch.randn(3, 3, 5, generator=rnd)
    for n_new in (1, 2):
        out = mta.conv_decode_attention(qc, k, v, w.to(DEVICE), cache_seqlens=[L], num_queries=n_new)
        torch.testing.assert_close(out.double().cpu(), decode_reference(qc, k, v, [L], w, n_new), **TOL16)
    from mta.conv_decode import fold_queries  # the folded queries on their own: rows 3 and 4 of 5
    qf = fold_queries(qc, w.to(DEVICE), torch.tensor([L], dtype=torch.int32, device=DEVICE), 2).double().cpu()
    want = [sum(w[:, a, :, None].double() * qc[0, :, i - 2 + a, None].double().cpu() for a in range(3)) for i in (3, 4)]
    torch.testing.assert_close(qf[0], torch.stack(want, 2), **TOL16)  # [Hq, ck, n, D]
    print("OK")


def test_a_sequence_spanning_2_to_the_31_elements_is_addressed_in_int64():
    # In a child process: the bug read outside the buffer, which can kill the process (or the GPU context).
    run_child_case(__file__, "wide")


# --- the toy task ----------------------------------------------------------------------------------------------


def test_a_task_whose_blocks_all_hold_every_letter_is_refused_not_redrawn_forever():
    from mta.course import toy_task
    with pytest.raises(ValueError, match="letters == block_len"):
        toy_task.TaskConfig(num_blocks=2, block_len=5, query_len=2, letters=5)     # make_batch looped forever
    one = toy_task.TaskConfig(num_blocks=1, block_len=5, query_len=2, letters=5)   # one block: nothing to redraw
    assert toy_task.make_batch(one, 2, torch.Generator().manual_seed(0))[0].shape == (2, one.seq_len)


@pytest.mark.parametrize("kwargs,error", [(dict(num_blocks=2.0), TypeError), (dict(block_len=True), TypeError),
                                          (dict(letters=8.5, block_len=3), TypeError)])
def test_task_sizes_must_be_ints(kwargs, error):
    from mta.course import toy_task
    with pytest.raises(error, match=next(iter(kwargs))):
        toy_task.TaskConfig(**kwargs)


@pytest.mark.parametrize("batch,error", [(0, ValueError), (-1, ValueError), (2.0, TypeError)])
def test_make_batch_names_a_bad_batch(batch, error):
    from mta.course import toy_task
    with pytest.raises(error, match="batch"):
        toy_task.make_batch(toy_task.TaskConfig(), batch, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("lr", ["nan", "inf", "-1", "0"])
def test_cli_refuses_a_bad_learning_rate_with_a_usage_error(lr, capsys):
    from mta.course import toy
    with pytest.raises(SystemExit) as exit_:      # lr=inf trained to NaN losses; nan and -1 raised in AdamW
        toy.main(["--lr", lr, "--steps", "1", "--arm", "plain", "--no-progress"])
    assert exit_.value.code == 2 and "lr must be a finite positive number" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs,error", [(dict(eval_every=0), ValueError), (dict(steps=0), ValueError),
                                          (dict(warmup=-1), ValueError), (dict(min_lr_ratio=2.0), ValueError),
                                          (dict(log_every=1.5), TypeError)])
def test_train_config_names_a_bad_value(kwargs, error):
    from mta.course import toy
    with pytest.raises(error, match=next(iter(kwargs))):   # eval_every=0 divided by zero in train_run
        toy.TrainConfig(**kwargs)


def test_a_repeated_arm_or_seed_is_trained_and_counted_once(monkeypatch):
    from mta.course import toy
    calls = []

    def fake_run(cfg, arm, seed, **kwargs):
        calls.append((arm, seed))
        return {"arm": arm, "seed": seed, "final_error": float(seed), "train_seconds": 1.0}

    monkeypatch.setattr(toy, "train_run", fake_run)
    results = toy.run_all(toy.PRESETS["cpu"], ["mta", "mta"], [0, 0, 1], progress=False)
    assert calls == [("mta", 0), ("mta", 1)]           # was 6 runs, and a mean error of 1/3 instead of 1/2
    assert results["summary"]["mta"]["seeds"] == [0, 1] and results["summary"]["mta"]["mean_final_error"] == 0.5


# --- the layer -------------------------------------------------------------------------------------------------


def test_a_layer_takes_numpy_ints_for_its_kernel_size_as_for_its_other_sizes():
    np = pytest.importorskip("numpy")
    layer = mta.MultiTokenAttention(np.int64(16), np.int64(2), kernel_size=(np.int64(2), np.int32(3)))
    assert layer.kernel_size == (2, 3) and all(type(s) is int for s in layer.kernel_size)
    assert not mta.MultiTokenAttention(16, 2, kernel_size=(np.int64(1), np.int64(1))).is_mta
    for bad in [(2.0, 3), (True, 3)]:
        with pytest.raises(TypeError, match="kernel_size must be two ints"):
            mta.MultiTokenAttention(16, 2, kernel_size=bad)


@pytest.mark.parametrize("flag", ["--out", "--save-weights"])
def test_cli_refuses_an_output_path_of_the_wrong_kind_before_training(flag, tmp_path, capsys, monkeypatch):
    from mta.course import toy
    monkeypatch.setattr(toy, "train_run", lambda *a, **k: pytest.fail("trained before the path was checked"))
    path = tmp_path                               # a directory for the JSON file
    if flag == "--save-weights":                  # a file for the weights' directory
        path = tmp_path / "a_file"
        path.touch()
    with pytest.raises(SystemExit) as exit_:     # was IsADirectoryError / NotADirectoryError after the first run
        toy.main([flag, str(path), "--steps", "1", "--arm", "plain", "--no-progress"])
    assert exit_.value.code == 2 and flag in capsys.readouterr().err


def _random_layer(kernel_size):
    layer = mta.MultiTokenAttention(16, 2, kernel_size=kernel_size, rope_theta=1e4).to(DEVICE)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.4)
    return layer


@pytest.mark.parametrize("kernel_size", [(3, 5), (1, 1)])
def test_non_finite_padding_of_a_prompt_batch_stays_out_of_its_real_rows(kernel_size):
    """``prefill(x, cache, lengths)``: rows before a sequence's end never see its padding, whatever it holds. The
    kernels give the later keys probability 0, but 0 * NaN is NaN in ``P @ V``: NaN or inf padding reached them."""
    layer = _random_layer(kernel_size)
    x = torch.randn(2, 7, 16, device=DEVICE)
    padded = x.clone()
    padded[0, 3:], padded[1, 5:] = float("nan"), float("inf")
    cache = layer.new_cache(2, 8)
    with torch.no_grad():
        out = layer.prefill(padded, cache, lengths=[3, 5])
        step = layer(x[:, 6:7], cache=cache)                    # token 6 at positions 3 and 5
        for b, n in enumerate((3, 5)):
            want = layer(torch.cat([x[b:b + 1, :n], x[b:b + 1, 6:7]], 1))
            torch.testing.assert_close(out[b, :n], want[0, :n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step[b], want[0, n:], atol=1e-5, rtol=1e-5)


if __name__ == "__main__" and sys.argv[1:] == ["wide"]:
    _wide_case()
