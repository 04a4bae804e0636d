"""Train the MTA paper's toy task, "find the block", on a small decoder: presets, runs, results file, command line.

The task (samples, loss, metric) is :mod:`mta.course.toy_task`, the model :mod:`mta.course.toy_model` and the
training machinery :mod:`mta.course.toy_train`; this module puts them together into runs and records them.

**Presets** (:data:`PAPER_PRESETS`, :data:`PRESETS`). ``paper`` is the paper's run as its public code
(facebookresearch/RAM, ``projects/mta/toy_task``) configures it: 52 blocks of 5 letters, queries of 2 (319 tokens); width 256, 4 layers, 2 heads, SwiGLU MLP of
768, MTA ``2 x 9`` in every layer; 100k steps of batch 64 from a fixed set of 1M samples, AdamW (0.9, 0.98), no
weight decay, lr 1e-4 constant (the code's "constant" schedule ignores its warmup), gradients clipped at norm 1;
per-sequence error on 1000 held-out samples every 1000 steps. The paper reports 51.6% error for the Transformer
and 0.1% for MTA (3 seeds). ``paper-short`` is that task and model trained for 20,000 steps with lr 1e-3 (500
warmup steps, cosine decay to 1e-4): three seeds per arm side by side fit half an hour of one H200, which the
paper's 100k steps do not (``docs/decisions.md`` has the measured step times). ``gpu`` is the course's smaller
run (16 blocks, width 128), ``cpu`` a tiny one for Triton's interpreter.

What the paper does and these runs cannot (:func:`deviations`, written into the results as ``deviations``):

* no dropout: the paper drops 10% of the attention probabilities in both arms; the fused kernels never
  materialize them, so there is nothing to drop;
* no BOS/EOS tokens: the paper's character tokenizer adds both (321 tokens, the loss also covers EOS);
* the training set is drawn by :func:`mta.course.toy_task.make_batch` (``train_samples`` of them, each epoch in
  a fresh order), not read from the paper's files: blocks within a sample may repeat (about 1 sample in 6000 at 52
  blocks), and the held-out samples are not removed from it (at 52 blocks the chance that one is there is
  negligible);
* bf16 autocast with fp32 weights, where the paper keeps bf16 parameters under FSDP (fp32 reductions);
* and, per preset, every setting that differs from the paper's (``paper-short``: steps and learning rate).

**Run**::

    python -m mta.course.toy --preset paper-short --arm plain mta --seeds 0 1 2 --out figures/toy_find_block_paper.json

trains each (arm, seed) (bf16 autocast on a GPU, each step one CUDA graph replay), evaluates on a fixed held-out
set, and writes JSON (provenance, config, deviations, loss curves, errors, times) and a plot next to it;
``--save-weights DIR`` keeps each trained model (fp16, read back by :func:`load_model`). With ``--checkpoint-dir
DIR`` each run checkpoints there and resumes from there; ``--jobs N`` trains the runs side by side, one process
each; ``--time-limit S`` stops them, checkpointed, at their first loss read after ``S`` seconds (the same command
again goes on); ``--merge-only`` rebuilds ``--out`` from the runs recorded in the checkpoint directory. Under
``torchrun``, ``--parallel ddp`` or ``--parallel fsdp2`` splits each step's batch over the processes.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import numbers
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from .. import runtime
from ..checks import check_count
from .toy_model import ModelConfig, ToyDecoder, check_mta_layers
from .toy_task import TaskConfig, loss_and_error, make_batch, target_loss
from .toy_train import (Trainer, atomic_save, atomic_write_text, autocast, batch_order, init_distributed,
                        rank_and_world, run_processes)


# ---------------------------------------------------------------------------------------------------------------
# Training settings and presets

@dataclass(frozen=True)
class TrainConfig:
    """``schedule``: ``"cosine"`` (linear warmup over ``warmup`` steps, then cosine decay to ``min_lr_ratio * lr``)
    or ``"constant"`` (linear warmup, then ``lr``). ``grad_clip``: the gradients' global norm is clipped to it
    (None: not clipped). ``train_samples``: the size of the training set, drawn once from the run's seed and read
    in a fresh order each epoch (None: ``steps * batch``, every sample seen once)."""

    steps: int = 3000
    batch: int = 64
    lr: float = 1e-3
    warmup: int = 200
    min_lr_ratio: float = 0.1
    eval_samples: int = 512
    eval_every: int = 250
    log_every: int = 25
    schedule: str = "cosine"
    grad_clip: Optional[float] = None
    train_samples: Optional[int] = None

    def __post_init__(self):
        # Checked here, so that the CLI's --lr, --steps and --batch give usage errors, not a traceback from the
        # optimizer (lr=nan or -1) or silent NaN losses (lr=inf).
        for name in ("steps", "batch", "eval_samples", "eval_every", "log_every"):
            check_count(name, getattr(self, name))
        check_count("warmup", self.warmup, minimum=0)
        if self.train_samples is not None:
            check_count("train_samples", self.train_samples)
        for name in ("lr", "min_lr_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, got {value!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite positive number, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        if self.grad_clip is not None and not (isinstance(self.grad_clip, numbers.Real) and self.grad_clip > 0):
            raise ValueError(f"grad_clip must be a positive number or None, got {self.grad_clip!r}")

    @property
    def pool_size(self) -> int:
        """Samples in the training set."""
        return self.train_samples or self.steps * self.batch


@dataclass(frozen=True)
class ToyConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# From the paper's public code (facebookresearch/RAM, projects/mta/toy_task/configs) and the defaults of the
# framework it runs in: warmup 0 because its "constant" schedule ignores the configured warmup; the MLP, the norms'
# eps, the init and the clipping are that framework's defaults.
_PAPER = ToyConfig(TaskConfig(num_blocks=52, block_len=5, query_len=2, letters=26),
                   ModelConfig(dim=256, n_layers=4, n_heads=2, mta_layers=(0, 1, 2, 3), kernel_size=(2, 9),
                               rope_theta=1e5, mlp="swiglu", norm_eps=1e-5, init_std=None),
                   TrainConfig(steps=100_000, batch=64, lr=1e-4, schedule="constant", warmup=0, grad_clip=1.0,
                               train_samples=1_000_000, eval_samples=1000, eval_every=1000, log_every=100))

#: The course's smaller runs: ``gpu``, 16 blocks at width 128; ``cpu``, tiny, seconds in Triton's interpreter
#: (tests, readers).
PRESETS = {
    "gpu": ToyConfig(TaskConfig(num_blocks=16), ModelConfig(dim=128, n_layers=4, n_heads=2),
                     TrainConfig(steps=8000, batch=64, lr=1e-3, warmup=200, eval_samples=1024, eval_every=250)),
    # Triton's interpreter pays per program (batch x heads): one head, four sequences, a few steps.
    "cpu": ToyConfig(TaskConfig(num_blocks=3, block_len=3, query_len=2, letters=8),
                     ModelConfig(dim=32, n_layers=2, n_heads=1, mta_layers=(1,)),
                     TrainConfig(steps=8, batch=4, lr=1e-2, warmup=2, eval_samples=8, eval_every=4, log_every=1)),
}

#: The paper's runs: ``paper`` as the paper trains it (module docstring); ``paper-short``, its task and model in a
#: short run (20,000 steps, lr 1e-3 with 500 warmup steps and cosine decay).
PAPER_PRESETS = {
    "paper": _PAPER,
    "paper-short": replace(_PAPER, train=replace(_PAPER.train, steps=20_000, lr=1e-3, schedule="cosine",
                                                  warmup=500)),
}

#: The paper's results on its find-the-block task, cited, not measured here (arXiv 2504.00927, section 3: the
#: per-sequence error of the ``paper`` setting, mean of 3 seeds): the Transformer 51.6%, MTA 0.1%.
PAPER_ERRORS = {"plain": 0.516, "mta": 0.001}

#: Every preset the command line offers.
ALL_PRESETS = {**PRESETS, **PAPER_PRESETS}

#: What the paper does that no preset can (the module docstring says why).
ALWAYS_DEVIATES = [
    "no dropout: the paper drops 10% of the attention probabilities (both arms); the fused kernels never "
    "materialize them",
    "no BOS/EOS tokens: the paper's character tokenizer adds both (321 tokens; its loss also covers EOS)",
    "training set drawn by mta.course.toy_task.make_batch, not the paper's files: blocks within a sample may repeat "
    "(about 1 sample in 6000 at 52 blocks) and held-out samples are not removed from it",
    "bf16 autocast over fp32 weights; the paper keeps bf16 parameters under FSDP (fp32 reductions)",
]


def deviations(cfg: ToyConfig) -> list[str]:
    """How a run of ``cfg`` differs from the paper's: :data:`ALWAYS_DEVIATES`, then each setting that differs,
    as ``"train.steps: 20000 (paper: 100000)"``."""
    found = list(ALWAYS_DEVIATES)
    skip = {"model": {"mlp_ratio", "ffn_dim", "init_std"}, "train": {"log_every", "train_samples", "min_lr_ratio"}}
    for part in ("task", "model", "train"):
        ours, theirs = getattr(cfg, part), getattr(_PAPER, part)
        found += [f"{part}.{f.name}: {_plain(getattr(ours, f.name))} (paper: {_plain(getattr(theirs, f.name))})"
                  for f in fields(ours) if f.name not in skip.get(part, ())
                  and getattr(ours, f.name) != getattr(theirs, f.name)]
    if cfg.model.hidden_dim != _PAPER.model.hidden_dim:
        found.append(f"model.hidden_dim: {cfg.model.hidden_dim} (paper: {_PAPER.model.hidden_dim})")
    if cfg.model.init_std is not None:
        found.append(f"model.init_std: normal of std {cfg.model.init_std} (paper: truncated normal of std "
                     f"dim ** -0.5)")
    if cfg.train.pool_size != _PAPER.train.pool_size:
        found.append(f"train.train_samples: {cfg.train.pool_size} (paper: {_PAPER.train.pool_size})")
    if cfg.train.schedule == "cosine":
        found.append(f"train.min_lr_ratio: {cfg.train.min_lr_ratio} (the paper's learning rate does not decay)")
    return found


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def model_config_for(cfg: ModelConfig, arm: str) -> ModelConfig:
    """``plain``: no MTA layer; ``mta``: ``cfg`` as it is."""
    if arm not in ("plain", "mta"):
        raise ValueError(f"arm must be 'plain' or 'mta', got {arm!r}")
    return cfg if arm == "mta" else replace(cfg, mta_layers=())


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate of step ``step`` (from 0): linear warmup over ``cfg.warmup`` steps, then constant, or a
    cosine decay to ``min_lr_ratio * lr`` at ``cfg.steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def evaluate(model: nn.Module, tokens: torch.Tensor, task: TaskConfig, batch: int) -> tuple[float, float]:
    """``(mean loss, per-sequence error)`` over ``tokens`` (teacher forcing), in batches."""
    device = next(model.parameters()).device
    losses, wrong = [], []
    for start in range(0, tokens.shape[0], batch):
        chunk = tokens[start:start + batch].to(device)
        with autocast(device):
            logits = model(chunk[:, :-1])
        loss, w = loss_and_error(logits, chunk, task)
        losses.append(loss * chunk.shape[0])
        wrong.append(w)
    return (torch.stack(losses).sum() / tokens.shape[0]).item(), torch.cat(wrong).float().mean().item()


#: Samples drawn per call of :func:`make_batch` while a training set is filled (bounds its temporaries).
POOL_CHUNK = 65536


def training_pool(cfg: ToyConfig, seed: int, device) -> torch.Tensor:
    """The training set of a run from ``seed``: ``[cfg.train.pool_size, seq_len]`` uint8, drawn by
    :func:`make_batch` on ``device`` (a GPU draws a million samples in moments)."""
    generator = torch.Generator(device=torch.device(device)).manual_seed(1000 + seed)
    n = cfg.train.pool_size
    return torch.cat([make_batch(cfg.task, min(POOL_CHUNK, n - start), generator)[0].to(torch.uint8)
                      for start in range(0, n, POOL_CHUNK)])


def make_trainer(cfg: ToyConfig, arm: str, seed: int, *, device=None, graphed: Optional[bool] = None,
                 parallel: Optional[str] = None) -> Trainer:
    """A :class:`mta.course.toy_train.Trainer` of the run (``arm``, ``seed``): the model drawn from ``seed``, the
    training set (:func:`training_pool`) and its order from ``seed``, the loss on the target block, the held-out
    evaluation (:func:`held_out_set`, :func:`evaluate`). ``graphed``, ``parallel``: as the Trainer takes them."""
    device = torch.device(device or runtime.DEVICE)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    tc = cfg.train
    torch.manual_seed(seed)
    model = ToyDecoder(model_config_for(cfg.model, arm)).to(device)
    held_out = held_out_set(cfg)[0].to(device)
    return Trainer(model, tc, pool=training_pool(cfg, seed, device),
                   order=batch_order(tc.steps, tc.batch, tc.pool_size, 2000 + seed),
                   loss=lambda m, tokens: target_loss(m(tokens[:, :-1]), tokens, cfg.task),
                   evaluate=lambda m: evaluate(m, held_out, cfg.task, tc.batch),
                   identity={"config": config_dict(cfg), "arm": arm, "seed": seed}, labels={"arm": arm, "seed": seed},
                   device=device, graphed=graphed, parallel=parallel)


def train_run(cfg: ToyConfig, arm: str, seed: int, *, device=None, progress: bool = True,
              weights: Optional[Path] = None, checkpoint_dir: Optional[Path] = None,
              checkpoint_every: Optional[int] = None, deadline: Optional[float] = None,
              stop_at: Optional[int] = None, graphed: Optional[bool] = None, parallel: Optional[str] = None) -> dict:
    """Train one model from ``seed``; return its curves, errors and times (:meth:`mta.course.toy_train.Trainer.train`).

    The held-out set is the same for every run (its own seed); the training set and its order come from ``seed``.
    With ``weights``, the trained model's ``state_dict`` is saved there (fp16; :func:`load_model` reads it back).
    With ``checkpoint_dir``, the run resumes from its checkpoint there (:func:`checkpoint_path`), saves one every
    ``checkpoint_every`` steps (default: ``eval_every``) and when it stops, and writes its record there
    (:func:`record_path`) and, once complete, its weights (:func:`weights_path`). ``deadline`` (a ``time.time()``)
    or ``stop_at`` (a step) stop it early: the record then says ``"complete": false``. ``graphed``: capture the
    step in a CUDA graph (default: on a GPU, unless ``parallel`` is ``"ddp"`` or ``"fsdp2"``, which need
    ``torch.distributed`` initialized).
    """
    trainer = make_trainer(cfg, arm, seed, device=device, graphed=graphed, parallel=parallel)
    where = None if checkpoint_dir is None else Path(checkpoint_dir)
    return trainer.train(checkpoint=None if where is None else checkpoint_path(where, arm, seed),
                         record=None if where is None else record_path(where, arm, seed),
                         weights=[p for p in (weights, None if where is None else weights_path(where, arm, seed))
                                  if p is not None],
                         checkpoint_every=checkpoint_every, deadline=deadline, stop_at=stop_at,
                         log=(lambda line: print(line, flush=True)) if progress else None)


def held_out_set(cfg: ToyConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed samples every run is evaluated on: :func:`make_batch` of ``cfg.train.eval_samples`` (on the CPU)."""
    return make_batch(cfg.task, cfg.train.eval_samples, torch.Generator().manual_seed(123456))


def load_model(cfg: ToyConfig, arm: str, weights: Path, device=None) -> "ToyDecoder":
    """The model a run saved with ``weights`` (:func:`train_run`), in fp32, in eval mode."""
    model = ToyDecoder(model_config_for(cfg.model, arm))
    model.load_state_dict({name: t.float() for name, t in torch.load(weights, map_location="cpu").items()})
    return model.to(device or runtime.DEVICE).eval()


def weights_path(weights_dir: Path, arm: str, seed: int) -> Path:
    return Path(weights_dir) / f"toy_{arm}_seed{seed}.pt"


def checkpoint_path(checkpoint_dir: Path, arm: str, seed: int) -> Path:
    """A run's checkpoint (model, optimizer, step, curves): ``toy_<arm>_seed<seed>.ckpt``."""
    return Path(checkpoint_dir) / f"toy_{arm}_seed{seed}.ckpt"


def record_path(checkpoint_dir: Path, arm: str, seed: int) -> Path:
    """A run's record (``{"config", "arm", "seed", "run"}``, JSON): ``toy_<arm>_seed<seed>.json``."""
    return Path(checkpoint_dir) / f"toy_{arm}_seed{seed}.json"


# ---------------------------------------------------------------------------------------------------------------
# Results file


def config_dict(cfg: ToyConfig) -> dict:
    return json.loads(json.dumps(asdict(cfg)))       # tuples become lists, as in the file


def run_all(cfg: ToyConfig, arms, seeds, out: Optional[Path] = None, *, progress: bool = True,
            weights_dir: Optional[Path] = None, checkpoint_dir: Optional[Path] = None,
            checkpoint_every: Optional[int] = None, deadline: Optional[float] = None,
            graphed: Optional[bool] = None, parallel: Optional[str] = None) -> dict:
    """Train every (arm, seed), one after the other, and return the results; with ``out``, write JSON after each
    run (runs of the same configuration already in the file are kept unless repeated) and a plot next to it; with
    ``weights_dir``, save each trained model there (:func:`weights_path`). ``checkpoint_dir``,
    ``checkpoint_every``, ``deadline``, ``graphed``, ``parallel``: as in :func:`train_run`; runs stopped by the
    deadline are listed under ``"incomplete"``, not in ``"runs"``. Under ``torch.distributed`` every process
    trains and only rank 0 writes."""
    # Each (arm, seed) once: a repeated seed (--seeds 0 0 1) trained the same run again and weighed it twice in
    # the summary's mean.
    arms, seeds = list(dict.fromkeys(arms)), list(dict.fromkeys(seeds))
    results = new_results(cfg, out, arms, seeds)
    writer = out is not None and _is_rank0()
    for arm in arms:
        for seed in seeds:
            weights = None if weights_dir is None else weights_path(weights_dir, arm, seed)
            run = train_run(cfg, arm, seed, progress=progress, weights=weights, checkpoint_dir=checkpoint_dir,
                            checkpoint_every=checkpoint_every, deadline=deadline, graphed=graphed,
                            parallel=parallel)
            add_run(results, run)
            if writer:
                write_results(results, Path(out))
    return results


def new_results(cfg: ToyConfig, out: Optional[Path], arms, seeds) -> dict:
    """The results of ``cfg`` before any of ``arms x seeds`` is added: provenance, config, deviations, and the runs
    of the same configuration already in ``out`` (but those of ``arms x seeds``)."""
    from ..bench.harness import provenance

    results = {"provenance": provenance(), "config": config_dict(cfg), "deviations": deviations(cfg),
               "seq_len": cfg.task.seq_len, "runs": [], "incomplete": []}
    if out is not None and Path(out).exists():
        old = json.loads(Path(out).read_text())
        if old.get("config") == results["config"]:
            results["runs"] = [r for r in old["runs"] if not (r["arm"] in arms and r["seed"] in seeds)]
    return results


def add_run(results: dict, run: dict) -> None:
    """Put ``run`` (a :func:`train_run` record) into ``results``: under ``"runs"`` when complete, else under
    ``"incomplete"``; the seeds and the summary follow."""
    key = (run["arm"], run["seed"])
    results["runs"] = [r for r in results["runs"] if (r["arm"], r["seed"]) != key]
    results["incomplete"] = [r for r in results.get("incomplete", []) if (r["arm"], r["seed"]) != key]
    if run.get("complete", True):
        results["runs"].append(run)
        results["runs"].sort(key=lambda r: (r["arm"], r["seed"]))
    else:
        results["incomplete"].append({"arm": run["arm"], "seed": run["seed"], "steps_done": run.get("steps_done")})
        results["incomplete"].sort(key=lambda r: (r["arm"], r["seed"]))
    results["seeds"] = sorted({r["seed"] for r in results["runs"]})
    results["summary"] = summarize(results["runs"])


def summarize(runs: list) -> dict:
    """Per arm: the seeds, the mean final error and the mean training time."""
    summary = {}
    for arm in sorted({r["arm"] for r in runs}):
        mine = [r for r in runs if r["arm"] == arm]
        summary[arm] = {"seeds": [r["seed"] for r in mine],
                        "final_errors": [r["final_error"] for r in mine],
                        "mean_final_error": sum(r["final_error"] for r in mine) / len(mine),
                        "mean_train_seconds": sum(r["train_seconds"] for r in mine) / len(mine)}
    return summary


def write_results(results: dict, out: Path) -> None:
    """``out`` (JSON, written whole or not at all) and, when it holds runs, a plot next to it (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    from .plots_07 import plot_toy_runs

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(results, indent=1) + "\n")
    if results["runs"]:
        fig = plot_toy_runs(results)
        fig.savefig(out.with_suffix(".png"), dpi=110, bbox_inches="tight", metadata={"Software": None})
        import matplotlib.pyplot as plt
        plt.close(fig)


def _is_rank0() -> bool:
    return rank_and_world()[0] == 0


def merge_runs(cfg: ToyConfig, arms, seeds, checkpoint_dir: Path, out: Optional[Path] = None,
               weights_dir: Optional[Path] = None) -> dict:
    """The results of ``arms x seeds`` from their records in ``checkpoint_dir`` (:func:`record_path`; a run
    without one is listed as incomplete at step 0), written to ``out`` if given; each complete run's weights are
    copied into ``weights_dir`` if given."""
    results = new_results(cfg, out, arms, seeds)
    for arm in arms:
        for seed in seeds:
            path = record_path(checkpoint_dir, arm, seed)
            if not path.exists():
                add_run(results, {"arm": arm, "seed": seed, "complete": False, "steps_done": 0})
                continue
            record = json.loads(path.read_text())
            if record["config"] != results["config"]:
                raise ValueError(f"{path} holds a run of another configuration")
            add_run(results, record["run"])
            saved = weights_path(checkpoint_dir, arm, seed)
            if weights_dir is not None and record["run"]["complete"] and saved.exists():
                target = weights_path(weights_dir, arm, seed)
                if not target.exists() or target.resolve() != saved.resolve():
                    atomic_save(torch.load(saved, map_location="cpu", weights_only=True), target)
    if out is not None:
        write_results(results, Path(out))
    return results


def run_jobs(cfg: ToyConfig, arms, seeds, args, deadline: Optional[float]) -> dict:
    """Train each (arm, seed) in its own process (``python -m mta.course.toy --worker``, the options of ``args``),
    ``args.jobs`` at a time, then :func:`merge_runs`. The results are written even when a process fails; then
    SystemExit(1)."""
    pairs = [(arm, seed) for arm in arms for seed in seeds]
    Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    codes = run_processes([["-m", "mta.course.toy", *_worker_argv(args, arm, seed, deadline)] for arm, seed in pairs],
                          args.jobs)
    results = merge_runs(cfg, arms, seeds, args.checkpoint_dir, args.out, args.save_weights)
    failed = [(pair, code) for pair, code in zip(pairs, codes) if code]
    for (arm, seed), code in failed:
        print(f"{arm} seed {seed}: its process failed (exit status {code}); its output is above", flush=True)
    if failed:
        raise SystemExit(1)
    return results


def _worker_argv(args, arm: str, seed: int, deadline: Optional[float]) -> list[str]:
    argv = ["--preset", args.preset, "--arm", arm, "--seeds", str(seed), "--checkpoint-dir",
            str(args.checkpoint_dir), "--worker"]
    for flag, value in (("--steps", args.steps), ("--batch", args.batch), ("--lr", args.lr),
                        ("--num-blocks", args.num_blocks), ("--checkpoint-every", args.checkpoint_every),
                        ("--save-weights", args.save_weights), ("--deadline", deadline)):
        if value is not None:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    if args.mta_layers is not None:
        argv += ["--mta-layers", *map(str, args.mta_layers)]
    return argv + ["--eager"] * args.eager + ["--no-progress"] * args.no_progress


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m mta.course.toy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(ALL_PRESETS), default="gpu" if runtime.HAS_CUDA else "cpu")
    parser.add_argument("--arm", nargs="+", choices=["plain", "mta"], default=["plain", "mta"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=_positive_int, help="training steps (default: the preset's)")
    parser.add_argument("--batch", type=_positive_int, help="global batch (split over the processes of --parallel)")
    parser.add_argument("--lr", type=float)
    parser.add_argument("--num-blocks", type=_positive_int, help="blocks per sample (the paper: 52)")
    parser.add_argument("--mta-layers", nargs="*", type=int, help="layers with an MTA kernel (default: the preset's)")
    parser.add_argument("--out", type=Path, help="JSON to write (a PNG plot goes next to it)")
    parser.add_argument("--save-weights", type=Path, metavar="DIR",
                        help="save each trained model there (fp16 state_dict, toy_<arm>_seed<seed>.pt)")
    parser.add_argument("--checkpoint-dir", type=Path, metavar="DIR",
                        help="checkpoint each run there and resume it from there; each run's record and final "
                             "weights go there too")
    parser.add_argument("--checkpoint-every", type=_positive_int, metavar="K",
                        help="steps between checkpoints (default: the preset's eval_every)")
    parser.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                        help="train N runs side by side, one process each (needs --checkpoint-dir)")
    parser.add_argument("--time-limit", type=_positive_float, metavar="SECONDS",
                        help="stop every run, checkpointed, at its first loss read after this much wall time; "
                             "the same command again goes on")
    parser.add_argument("--merge-only", action="store_true",
                        help="train nothing: rebuild --out from the runs recorded in --checkpoint-dir")
    parser.add_argument("--parallel", choices=["none", "ddp", "fsdp2"], default="none",
                        help="under torchrun: split each step's batch over the processes (DDP or FSDP2)")
    parser.add_argument("--eager", action="store_true", help="no CUDA graph: launch every step's kernels from Python")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)      # one run of a --jobs launch
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)             # time.time() to stop at
    args = parser.parse_args(argv)
    cfg = ALL_PRESETS[args.preset]
    train = {k: v for k, v in (("steps", args.steps), ("batch", args.batch), ("lr", args.lr)) if v is not None}
    try:  # the configs check themselves: a bad value is a usage error, not a traceback
        cfg = replace(cfg, train=replace(cfg.train, **train))
        if args.num_blocks is not None:
            cfg = replace(cfg, task=replace(cfg.task, num_blocks=args.num_blocks))
        if args.mta_layers is not None:
            cfg = replace(cfg, model=replace(cfg.model, mta_layers=tuple(args.mta_layers)))
            check_mta_layers(cfg.model)
    except ValueError as error:
        parser.error(str(error))
    # Checked before training, not when the first run's results are written.
    if args.out is not None and args.out.is_dir():
        parser.error(f"--out {args.out} is a directory: give the JSON file to write")
    for flag, path in (("--save-weights", args.save_weights), ("--checkpoint-dir", args.checkpoint_dir)):
        if path is not None and path.exists() and not path.is_dir():
            parser.error(f"{flag} {path} is a file: give a directory")
    if (args.jobs > 1 or args.merge_only) and args.checkpoint_dir is None:
        parser.error("--jobs and --merge-only need --checkpoint-dir (each run's record is kept there)")
    if args.merge_only and args.out is None:
        parser.error("--merge-only needs --out")
    parallel = None if args.parallel == "none" else args.parallel
    if parallel is not None and args.jobs > 1:
        parser.error("--parallel and --jobs exclude each other: a --parallel run uses every process of torchrun")

    arms, seeds = list(dict.fromkeys(args.arm)), list(dict.fromkeys(args.seeds))
    deadline = args.deadline if args.deadline is not None else (
        None if args.time_limit is None else time.time() + args.time_limit)
    graphed = False if args.eager else None
    rank0 = True
    if args.merge_only:
        results = merge_runs(cfg, arms, seeds, args.checkpoint_dir, args.out, args.save_weights)
    elif args.jobs > 1:
        print(f"find the block: {cfg.task.seq_len} tokens per sample, {runtime.describe()}; "
              f"{len(arms) * len(seeds)} runs, {args.jobs} at a time", flush=True)
        results = run_jobs(cfg, arms, seeds, args, deadline)
    else:
        if parallel is not None:
            init_distributed()
        rank0 = _is_rank0()  # read while the process group lives: the summary below comes after it is gone
        if rank0 and not args.worker:
            print(f"find the block: {cfg.task.seq_len} tokens per sample, {runtime.describe()}", flush=True)
        try:
            results = run_all(cfg, arms, seeds, args.out, progress=not args.no_progress,
                              weights_dir=args.save_weights, checkpoint_dir=args.checkpoint_dir,
                              checkpoint_every=args.checkpoint_every, deadline=deadline, graphed=graphed,
                              parallel=parallel)
            if parallel is not None:
                # A run's wrapped model outlives it as cyclic garbage (a list of the frames that built it), and a
                # DDP reducer holds the process group: left to the interpreter's exit, gloo's threads can abort
                # the process after a finished run (SIGABRT). Collected here, while everything is alive.
                gc.collect()
                torch.distributed.barrier()  # every rank past its last collective before the group is torn down
        finally:
            if parallel is not None:
                torch.distributed.destroy_process_group()
    if rank0 and not args.worker:
        for arm, s in results["summary"].items():
            print(f"{arm}: final per-sequence error {s['mean_final_error']:.3f} over seeds {s['seeds']} "
                  f"({s['mean_train_seconds']:.0f} s of training per run)")
        for r in results.get("incomplete", []):
            print(f"{r['arm']} seed {r['seed']}: stopped at step {r['steps_done']} of {cfg.train.steps}; "
                  f"the same command goes on from its checkpoint")
    return results


if __name__ == "__main__":
    main()
