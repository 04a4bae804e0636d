"""On a GPU: the toy task's training step captured in a CUDA graph replays what eager steps compute, a graphed run
that stops and resumes ends where an uninterrupted one ends, one-process DDP and FSDP2 runs under torchrun (NCCL)
train, and the step time of the paper's model (printed: ``pytest -s``), for planning the paper's runs."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mta import runtime
from mta.course import toy, toy_model, toy_task

pytestmark = pytest.mark.skipif(runtime.INTERPRET or not runtime.HAS_CUDA, reason="CUDA graphs need a GPU")

ROOT = Path(__file__).resolve().parents[1]
# The paper's kind of model and optimizer (SwiGLU, truncated-normal init, clipping, a schedule that moves), small.
SMALL = toy.ToyConfig(toy_task.TaskConfig(num_blocks=8),
                      toy_model.ModelConfig(dim=64, n_layers=2, n_heads=2, mta_layers=(1,), mlp="swiglu",
                                            init_std=None),
                      toy.TrainConfig(steps=6, batch=8, lr=1e-3, warmup=2, schedule="cosine", grad_clip=1.0,
                                      eval_samples=16, eval_every=3, log_every=1))


def params_of(trainer):
    return {name: p.detach().float().clone() for name, p in trainer.module.named_parameters()}


def assert_params_close(got, want, rtol, atol):
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=rtol, atol=atol, msg=name)


@pytest.mark.parametrize("arm", ["mta", "plain"])
def test_graphed_steps_replay_the_eager_steps(arm):
    graphed = toy.make_trainer(SMALL, arm, 0, graphed=True)
    eager = toy.make_trainer(SMALL, arm, 0, graphed=False)
    assert_params_close(params_of(graphed), params_of(eager), 0, 0)
    g = graphed.train(stop_at=3)
    e = eager.train(stop_at=3)
    assert graphed.graph is not None and eager.graph is None
    assert g["steps_done"] == e["steps_done"] == 3 and graphed.step_t.item() == 3
    print(f"\n{arm}: losses graphed {g['curve']['loss']}, eager {e['curve']['loss']}")
    assert all(math.isfinite(x) for x in g["curve"]["loss"])
    torch.testing.assert_close(g["curve"]["loss"], e["curve"]["loss"], rtol=1e-3, atol=1e-4)
    assert_params_close(params_of(graphed), params_of(eager), 1e-3, 1e-5)
    moved = [name for name, p in params_of(graphed).items() if not torch.equal(p, params_of(eager)[name])]
    print(f"{arm}: parameters not bitwise equal to eager: {len(moved)} of {len(params_of(eager))}")
    for trainer in (graphed, eager):                     # AdamW counted three steps, not the undone warm-up ones
        assert all(int(trainer.opt.state[p]["step"]) == 3 for p in trainer.params)


def test_a_graphed_run_resumes_where_an_uninterrupted_one_ends(tmp_path):
    straight = toy.make_trainer(SMALL, "mta", 1)
    whole = straight.train()
    first = toy.make_trainer(SMALL, "mta", 1)
    first.train(checkpoint=tmp_path / "run.ckpt", stop_at=2)
    second = toy.make_trainer(SMALL, "mta", 1)
    resumed = second.train(checkpoint=tmp_path / "run.ckpt")
    assert straight.graph is not None and second.graph is not None and resumed["complete"]
    assert_params_close(params_of(second), params_of(straight), 1e-4, 1e-6)
    torch.testing.assert_close(resumed["curve"]["loss"], whole["curve"]["loss"], rtol=1e-4, atol=1e-5)
    assert resumed["eval"]["step"] == whole["eval"]["step"]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_a_one_process_data_parallel_run_trains_under_torchrun(parallel, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m",
           "mta.course.toy", "--preset", "cpu", "--arm", "mta", "--seeds", "0", "--parallel", parallel,
           "--checkpoint-dir", str(tmp_path), "--out", str(tmp_path / "toy.json")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json
    run = json.loads((tmp_path / "toy.json").read_text())["runs"][0]
    assert run["parallel"] == parallel and run["complete"] and not run["graphed"]
    assert all(math.isfinite(x) for x in run["curve"]["loss"])


@pytest.mark.parametrize("arm", ["plain", "mta"])
def test_the_paper_models_step_time(arm):
    """Not a check of speed: prints the graphed and eager step times of the paper's model (batch 64, 319 tokens),
    which set how many steps of six runs fit a GPU budget."""
    paper = toy.PAPER_PRESETS["paper-short"]
    cfg = replace(paper, train=replace(paper.train, steps=64, train_samples=4096))
    trainer = toy.make_trainer(cfg, arm, 0)
    start = time.perf_counter()
    trainer.capture()
    capture_s = time.perf_counter() - start
    times = {}
    for name, run, n in (("graphed", trainer.graph.replay, 40), ("eager", trainer.step_once, 10)):
        run()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            run()
        torch.cuda.synchronize()
        times[name] = 1000 * (time.perf_counter() - start) / n
    print(f"\npaper model, {arm}: {times['graphed']:.2f} ms per graphed step, {times['eager']:.2f} ms per eager "
          f"step (warm-up and capture {capture_s:.1f} s); {torch.cuda.get_device_name()}")
    assert math.isfinite(trainer.loss_sum.item())
