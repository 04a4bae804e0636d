"""The toy task ("find the block"): the generator's guarantees, the model, and a tiny training run."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE

from mta.course import toy, toy_model, toy_task


def blocks_of(tokens, task):
    """The sample's blocks (lists of letter ids), its query and its target, parsed back from the tokens."""
    text = toy_task.decode_tokens(tokens)
    body, rest = text.split("#")
    query, target = rest[:task.query_len], rest[task.query_len:]
    return body.split("."), query, target


@pytest.mark.parametrize("task", [toy_task.TaskConfig(), toy_task.TaskConfig(num_blocks=52), toy.PRESETS["cpu"].task,
                                  toy_task.TaskConfig(num_blocks=6, block_len=4, query_len=3, letters=6)])
def test_generator_block_property(task):
    tokens, target = toy_task.make_batch(task, 200, torch.Generator().manual_seed(0))
    assert tokens.shape == (200, task.seq_len) and tokens.dtype == torch.int64
    for row, t in zip(tokens, target):
        blocks, query, answer = blocks_of(row, task)
        assert len(blocks) == task.num_blocks
        assert all(len(b) == task.block_len == len(set(b)) for b in blocks)       # distinct letters per block
        assert all(c in "abcdefghijklmnopqrstuvwxyz"[:task.letters] for b in blocks for c in b)
        assert len(set(query)) == task.query_len and answer == blocks[int(t)]      # the target is that block
        holding = [i for i, b in enumerate(blocks) if set(query) <= set(b)]
        assert holding == [int(t)]                                                # no other block holds the query


def test_generator_is_seeded_and_spreads_the_target():
    task = toy_task.TaskConfig(num_blocks=8)
    a, ta = toy_task.make_batch(task, 64, torch.Generator().manual_seed(3))
    b, tb = toy_task.make_batch(task, 64, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and torch.equal(ta, tb)
    assert len(set(ta.tolist())) > 4


def test_bad_task_configs():
    with pytest.raises(ValueError):
        toy_task.TaskConfig(block_len=5, query_len=6)
    with pytest.raises(ValueError):
        toy_task.TaskConfig(letters=30)


def test_loss_and_error_count_whole_sequences():
    task = toy_task.TaskConfig(num_blocks=2, block_len=3, query_len=2, letters=5)
    tokens, _ = toy_task.make_batch(task, 3, torch.Generator().manual_seed(0))
    logits = torch.full((3, task.seq_len - 1, toy_task.VOCAB), -10.0)
    logits.scatter_(2, tokens[:, 1:, None], 10.0)                  # perfect predictions
    logits[1, -2] = 0.0
    logits[1, -2, (int(tokens[1, -2]) + 1) % 5] = 10.0            # one wrong target token in sequence 1
    loss, wrong = toy_task.loss_and_error(logits, tokens, task)
    assert wrong.tolist() == [False, True, False]
    assert loss.item() > 0


def test_model_layers_and_decoding_match_the_forward():
    cfg = toy_model.ModelConfig(dim=32, n_layers=2, n_heads=2, mta_layers=(1,), kernel_size=(2, 3))
    model = toy_model.ToyDecoder(cfg).to(DEVICE)
    assert model.blocks[0].attn.conv_weight is None and model.blocks[1].attn.kernel_size == (2, 3)
    for p in model.parameters():      # larger weights than the init, so that the check means something
        torch.nn.init.normal_(p, std=0.3) if p.dim() > 1 else None
    tokens = torch.randint(toy_task.VOCAB, (2, 10), device=DEVICE)
    with torch.no_grad():
        full = model(tokens)
        caches = model.new_caches(2, 10)
        rows = [model(tokens[:, :6], caches)]
        for t in range(6, 10):
            rows.append(model(tokens[:, t:t + 1], caches))
    torch.testing.assert_close(torch.cat(rows, 1), full, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="out of range"):
        toy_model.ToyDecoder(toy_model.ModelConfig(n_layers=2, mta_layers=(2,)))


def test_tiny_training_run_reduces_the_loss(tmp_path):
    cfg = toy.PRESETS["cpu"]
    out = tmp_path / "toy.json"
    results = toy.run_all(cfg, ["mta"], [0], out, progress=False, weights_dir=tmp_path / "weights")
    run = results["runs"][0]
    assert run["curve"]["loss"][-1] < 0.9 * run["curve"]["loss"][0]
    assert run["eval"]["loss"][-1] < run["eval"]["loss"][0]
    saved = json.loads(out.read_text())
    assert saved["config"]["model"]["mta_layers"] == [1] and saved["seeds"] == [0]
    assert {"gpu", "torch", "git_commit", "argv"} <= set(saved["provenance"])
    assert set(run) >= {"final_error", "train_seconds", "curve", "eval"}
    assert out.with_suffix(".png").exists()


def test_saved_weights_load_back_into_the_same_model(tmp_path):
    """A run's saved weights (fp16) reload into a model whose held-out error is the run's final error."""
    cfg = toy.PRESETS["cpu"]
    results = toy.run_all(cfg, ["mta"], [1], progress=False, weights_dir=tmp_path)
    model = toy.load_model(cfg, "mta", toy.weights_path(tmp_path, "mta", 1))
    held_out, _ = toy.held_out_set(cfg)
    loss, error = toy.evaluate(model, held_out, cfg.task, cfg.train.batch)
    assert error == results["runs"][0]["final_error"]
    assert abs(loss - results["runs"][0]["final_loss"]) < 0.05 * results["runs"][0]["final_loss"]


def test_attention_maps_are_the_layers_probabilities():
    """Each layer's map is causal, sums to 1 per row, times v gives the layer's attention output (the kernels),
    and the maps carried with the materialized P @ v are those of the model's own forward."""
    torch.manual_seed(0)
    cfg = toy.PRESETS["cpu"]
    model = toy_model.ToyDecoder(cfg.model).to(DEVICE).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 3:                      # random MTA kernels: not the identity
                p.add_(0.3 * torch.randn_like(p))
    tokens, _ = toy_task.make_batch(cfg.task, 2, torch.Generator().manual_seed(5))
    tokens = tokens.to(DEVICE)
    maps = toy_model.attention_maps(model, tokens)
    assert len(maps) == cfg.model.n_layers
    x = model.embed(tokens)
    with torch.no_grad():
        for block, p in zip(model.blocks, maps):
            B, N = tokens.shape
            assert p.shape == (B, cfg.model.n_heads, N, N)
            assert torch.allclose(p.sum(-1), torch.ones(B, cfg.model.n_heads, N, device=p.device), atol=1e-5)
            assert (p.triu(1) == 0).all()
            h = block.attn_norm(x)
            q, k, v = block.attn._project(h, torch.arange(N, device=h.device))
            o = block.attn._attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            torch.testing.assert_close(p @ v.transpose(1, 2).float(), o.float(), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(block.attn.attention_probabilities(h), p, rtol=1e-4, atol=1e-5)
            x = block(x)                          # the kernels' residual stream


def test_materialized_forward_gives_the_models_logits_and_position_errors():
    torch.manual_seed(1)
    cfg = toy.PRESETS["cpu"]
    model = toy_model.ToyDecoder(cfg.model).to(DEVICE).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 3:
                p.add_(0.3 * torch.randn_like(p))
            elif p.dim() == 2:
                p.normal_(std=0.3)
    tokens, _ = toy_task.make_batch(cfg.task, 3, torch.Generator().manual_seed(9))
    tokens = tokens.to(DEVICE)
    logits, maps = toy_model.materialized_forward(model, tokens[:, :-1])
    with torch.no_grad():
        torch.testing.assert_close(logits, model(tokens[:, :-1]), rtol=1e-4, atol=1e-4)
    assert len(maps) == cfg.model.n_layers
    L = cfg.task.block_len
    perfect = F.one_hot(tokens[:, 1:], toy_task.VOCAB).float()            # teacher forcing, every letter right
    assert torch.equal(toy_task.position_errors(perfect, tokens, cfg.task), torch.zeros(L))
    perfect[0, -L + 1] = F.one_hot((tokens[0, -L + 2] + 1) % 26, toy_task.VOCAB)   # sample 0, target letter 1 wrong
    expected = torch.zeros(L)
    expected[1] = 1 / 3
    torch.testing.assert_close(toy_task.position_errors(perfect, tokens, cfg.task), expected)


def test_attention_on_target_measures_the_target_blocks_share():
    cfg = toy.PRESETS["gpu"]
    task = cfg.task
    tokens, target = toy_task.make_batch(task, 3, torch.Generator().manual_seed(2))
    B, N = tokens.shape
    rows = toy_task.target_rows(task, N)
    assert len(rows) == task.block_len and rows.stop == N - 1
    assert (tokens[:, rows.start - task.query_len] == toy_task.HASH).all()   # the first row reads the last query letter
    on, off = torch.zeros(B, 2, N, N), torch.zeros(B, 2, N, N)
    for b, t in enumerate(target.tolist()):
        span = toy_task.block_span(task, t)
        assert torch.equal(tokens[b, span.start:span.stop], tokens[b, N - task.block_len:])   # the block's letters
        on[b, :, :, span.start + 2] = 1.0                     # all mass on one of the target's letters
        off[b, :, :, toy_task.block_span(task, (t + 1) % task.num_blocks).start] = 1.0
    on[:, 1, rows.start] = 0.0                                 # head 1: one of the five rows elsewhere
    share = toy_model.attention_on_target([on, off], target, task)
    assert share.shape == (2, 2, task.block_len)
    expected = torch.zeros(2, 2, task.block_len)
    expected[0] = 1.0
    expected[0, 1, 0] = 0.0
    torch.testing.assert_close(share, expected)


def test_layer_attention_figure_has_a_panel_per_model_and_layer():
    import matplotlib
    matplotlib.use("Agg")
    from mta.course import plots_07
    cfg = toy.PRESETS["cpu"]
    tokens, target = toy_task.make_batch(cfg.task, 1, torch.Generator().manual_seed(5))
    model = toy_model.ToyDecoder(cfg.model).to(DEVICE).eval()
    maps = [m[0].cpu() for m in toy_model.attention_maps(model, tokens.to(DEVICE))]
    N, L = tokens.shape[1], cfg.task.block_len
    start = int(target[0]) * (L + 1)
    fig = plots_07.plot_layer_attention(toy_task.decode_tokens(tokens[0]), {"MTA": maps, "plain": maps},
                                        range(N - L - 1, N - 1), range(start, start + L))
    assert len(fig.axes) == 2 * cfg.model.n_layers
    assert all(len(ax.patches) == cfg.model.n_heads for ax in fig.axes)   # the target block, outlined per head


def test_target_attention_figure_has_a_bar_per_layer_head_and_model():
    import matplotlib
    matplotlib.use("Agg")
    from mta.course import plots_07
    shares = {"plain": torch.rand(4, 2, 5), "mta": torch.rand(4, 2, 5)}
    fig = plots_07.plot_target_attention(shares)
    left, right = fig.axes
    assert len(left.patches) == len(right.patches) == 2 * 4 * 2
    heights = sorted(p.get_height() for p in left.patches)
    expected = sorted(torch.cat([shares["plain"][:, :, 0].flatten(), shares["mta"][:, :, 0].flatten()]).tolist())
    assert heights == pytest.approx(expected)


@pytest.mark.parametrize("args", [["--steps", "0"], ["--batch", "0"], ["--num-blocks", "-1"],
                                  ["--arm", "mta", "--mta-layers", "5"]])
def test_cli_refuses_bad_values_with_a_usage_error(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        toy.main(args + ["--no-progress"])
    assert exit_.value.code == 2 and "error:" in capsys.readouterr().err
