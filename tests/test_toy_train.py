"""The toy task's training engine (mta.course.toy_train) on the CPU: the data a step sees, the learning rate on the
device, undone warm-up steps, checkpoint and resume, deadlines, runs side by side, and data-parallel runs under
torchrun (gloo), each against a plain single-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mta.course import toy, toy_model, toy_task, toy_train

ROOT = Path(__file__).resolve().parents[1]
CPU = toy.PRESETS["cpu"]


def with_steps(cfg, steps):
    return replace(cfg, train=replace(cfg.train, steps=steps))


def subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


#: These tests share a module-scoped fixture: one process runs them all (``--dist loadgroup``).
pytestmark = pytest.mark.xdist_group("test_toy_train")


@pytest.fixture(scope="module")
def straight():
    """Single-process runs, trained once for the tests that compare with them: {(arm, steps): (state, result)}."""
    done = {}

    def get(arm, steps):
        if (arm, steps) not in done:
            trainer = toy.make_trainer(with_steps(CPU, steps), arm, 0)
            result = trainer.train()
            done[arm, steps] = ({k: v.detach().clone() for k, v in trainer.module.state_dict().items()}, result)
        return done[arm, steps]
    return get


def assert_states_equal(got: dict, want: dict, rtol=0.0):
    assert got.keys() == want.keys()
    for name in want:
        if rtol:
            torch.testing.assert_close(got[name].float(), want[name].float(), rtol=rtol, atol=rtol, msg=name)
        else:
            assert torch.equal(got[name], want[name]), name


def test_the_data_depends_on_the_seed_and_the_step_alone():
    cfg = replace(CPU, train=replace(CPU.train, steps=5, batch=4, train_samples=8))
    pool = toy.training_pool(cfg, 0, "cpu")
    assert pool.shape == (8, cfg.task.seq_len) and pool.dtype == torch.uint8
    assert torch.equal(pool, toy.training_pool(cfg, 0, "cpu"))
    assert not torch.equal(pool, toy.training_pool(cfg, 1, "cpu"))
    tokens, _ = toy_task.make_batch(cfg.task, 8, torch.Generator().manual_seed(1000))
    assert torch.equal(pool.long(), tokens)                            # the pool is make_batch's samples
    order = toy_train.batch_order(5, 4, 8, seed=0)
    assert order.shape == (5, 4) and torch.equal(order, toy_train.batch_order(5, 4, 8, seed=0))
    flat = order.flatten().tolist()
    assert sorted(flat[:8]) == sorted(flat[8:16]) == list(range(8))    # each epoch reads every sample once


@pytest.mark.parametrize("schedule,warmup", [("cosine", 3), ("constant", 4), ("constant", 0), ("cosine", 0)])
def test_the_learning_rate_on_the_device_is_the_schedules(schedule, warmup):
    cfg = replace(CPU.train, steps=20, lr=3e-3, warmup=warmup, schedule=schedule)
    for step in range(22):
        got = toy_train.lr_tensor(torch.tensor(step), cfg).item()
        assert got == pytest.approx(toy.lr_at(min(step, cfg.steps), cfg), rel=1e-6)


def test_undone_warm_up_steps_leave_the_run_as_it_was():
    """What a CUDA graph's capture relies on: steps run and then undone leave no trace (the optimizer state they
    create comes back as a fresh optimizer's)."""
    cfg = with_steps(CPU, 2)
    plain = toy.make_trainer(cfg, "plain", 0)
    plain.step_once()
    plain.step_once()
    warmed = toy.make_trainer(cfg, "plain", 0)
    warmed.warm_up(1)
    assert warmed.step_t.item() == 0 and warmed.loss_sum.item() == 0.0
    warmed.step_once()
    warmed.step_once()
    assert_states_equal(warmed.module.state_dict(), plain.module.state_dict())
    assert warmed.loss_sum.item() == plain.loss_sum.item()


def test_a_resumed_run_ends_where_an_uninterrupted_run_ends(tmp_path, straight):
    want_state, want = straight("plain", 8)
    first = toy.train_run(CPU, "plain", 0, checkpoint_dir=tmp_path, stop_at=4, progress=False)
    assert not first["complete"] and first["steps_done"] == 4
    assert toy.checkpoint_path(tmp_path, "plain", 0).exists()
    assert not list(tmp_path.glob("*.tmp"))                              # written whole, then renamed
    record = json.loads(toy.record_path(tmp_path, "plain", 0).read_text())
    assert record["run"]["steps_done"] == 4 and record["config"] == toy.config_dict(CPU)

    trainer = toy.make_trainer(CPU, "plain", 0)
    got = trainer.train(checkpoint=toy.checkpoint_path(tmp_path, "plain", 0), weights=[tmp_path / "final.pt"])
    assert got["complete"] and got["steps_done"] == 8
    assert_states_equal(trainer.module.state_dict(), want_state)
    assert got["curve"] == want["curve"]
    assert got["eval"] == want["eval"]
    model = toy.load_model(CPU, "plain", tmp_path / "final.pt")                     # the final weights, fp16
    assert_states_equal(model.state_dict(), want_state, rtol=1e-3)

    again = toy.train_run(CPU, "plain", 0, checkpoint_dir=tmp_path, progress=False)   # complete: nothing to do
    assert again["eval"] == got["eval"] and again["train_seconds"] == got["train_seconds"]

    with pytest.raises(ValueError, match="another run"):
        toy.train_run(replace(CPU, train=replace(CPU.train, lr=1e-3)), "plain", 0, checkpoint_dir=tmp_path)


def test_a_deadline_stops_the_run_checkpointed(tmp_path):
    result = toy.train_run(CPU, "plain", 0, checkpoint_dir=tmp_path, deadline=time.time() - 1, progress=False)
    assert not result["complete"] and result["steps_done"] == CPU.train.log_every     # at the first loss read
    ckpt = torch.load(toy.checkpoint_path(tmp_path, "plain", 0), weights_only=True)
    assert ckpt["step"] == result["steps_done"]
    results = toy.merge_runs(CPU, ["plain", "mta"], [0], tmp_path, tmp_path / "toy.json")
    assert results["runs"] == [] and results["summary"] == {}
    assert results["incomplete"] == [{"arm": "mta", "seed": 0, "steps_done": 0},
                                     {"arm": "plain", "seed": 0, "steps_done": 1}]


def test_jobs_train_each_run_in_its_own_process_and_merge(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "toy.json"
    args = ["--preset", "cpu", "--arm", "plain", "--seeds", "0", "1", "--steps", "1", "--jobs", "2",
            "--checkpoint-dir", str(ckpt), "--out", str(out), "--save-weights", str(tmp_path / "weights")]
    proc = subprocess.run([sys.executable, "-m", "mta.course.toy", *args], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "plain seed 1: step 1/1" in proc.stdout
    results = json.loads(out.read_text())
    assert [(r["arm"], r["seed"], r["complete"]) for r in results["runs"]] == [("plain", 0, True), ("plain", 1, True)]
    assert results["incomplete"] == [] and results["deviations"] == toy.deviations(with_steps(CPU, 1))
    assert {"gpu", "torch", "triton", "git_commit", "argv"} <= set(results["provenance"])
    assert all((tmp_path / "weights" / f"toy_plain_seed{s}.pt").exists() for s in (0, 1))
    out.unlink()
    merged = toy.main(["--preset", "cpu", "--arm", "plain", "--seeds", "0", "1", "--steps", "1", "--merge-only",
                       "--checkpoint-dir", str(ckpt), "--out", str(out)])
    assert merged["runs"] == results["runs"] and json.loads(out.read_text())["summary"] == results["summary"]


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                    reason="two processes on a GPU machine take a GPU each")
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_a_data_parallel_run_under_torchrun_matches_one_process(parallel, tmp_path, straight):
    """Two processes (gloo), each half of every batch: the parameters of one process on the whole batch."""
    arm, steps = "plain", CPU.train.steps
    want_state, want = straight(arm, steps)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "mta.course.toy", "--preset", "cpu", "--arm", arm, "--seeds", "0", "--steps", str(steps),
           "--parallel", parallel, "--checkpoint-dir", str(tmp_path), "--no-progress"]
    proc = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ckpt = torch.load(toy.checkpoint_path(tmp_path, arm, 0), weights_only=True)
    assert ckpt["step"] == steps
    assert_states_equal(ckpt["model"], want_state, rtol=1e-5)
    run = json.loads(toy.record_path(tmp_path, arm, 0).read_text())["run"]
    assert run["world_size"] == 2 and run["parallel"] == parallel and run["complete"]
    assert run["eval"]["step"] == want["eval"]["step"]
    assert run["eval"]["error"] == want["eval"]["error"]
    assert run["curve"]["loss"] == pytest.approx(want["curve"]["loss"], rel=1e-5)


def test_parallel_without_torchrun_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        toy.main(["--parallel", "ddp", "--steps", "1", "--no-progress"])
    with pytest.raises(RuntimeError, match="torch.distributed"):
        toy.make_trainer(CPU, "plain", 0, parallel="ddp")


@pytest.mark.parametrize("args,message", [(["--jobs", "2"], "--checkpoint-dir"),
                                          (["--merge-only", "--checkpoint-dir", "x"], "--out"),
                                          (["--jobs", "2", "--checkpoint-dir", "x", "--parallel", "ddp"], "exclude")])
def test_cli_refuses_options_that_do_not_go_together(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        toy.main(args + ["--no-progress"])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_paper_preset_is_the_papers_run():
    paper = toy.PAPER_PRESETS["paper"]
    assert paper.task.seq_len == 319
    model = toy_model.ToyDecoder(paper.model)
    assert model.blocks[0].mlp.w1.weight.shape == (768, 256)
    assert all(block.attn.kernel_size == (2, 9) for block in model.blocks)
    assert toy.deviations(paper) == toy.ALWAYS_DEVIATES
    short = toy.deviations(toy.PAPER_PRESETS["paper-short"])
    assert "train.steps: 20000 (paper: 100000)" in short and not any(d.startswith("model.") for d in short)
    w = model.blocks[0].attn.q_proj.weight
    assert w.abs().max() <= 3 * 256 ** -0.5 and abs(w.std().item() - 0.0625) < 0.01   # truncated at 3 sigma
