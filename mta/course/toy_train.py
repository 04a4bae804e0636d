"""Training machinery of the toy task (:mod:`mta.course.toy`, which builds the model, the data and the loss and
hands them to :class:`Trainer`): the step and its CUDA graph, checkpoints, data-parallel runs under ``torchrun``,
and runs side by side in their own processes. Nothing here knows the task; this module imports none of the
course's others.

**Data.** A run trains on a pool of samples that stays on its device (``[pool, seq_len]`` uint8, drawn once from
the run's seed) in an order fixed by the seed (:func:`batch_order`, ``[steps, batch]``, a fresh permutation each
epoch). Step ``s`` takes row ``s`` of the order, so the data a step sees depends on nothing but the seed and ``s``,
and a checkpoint's data state is its step.

**The step** (:meth:`Trainer.step_once`): gather the batch from the pool at the device-side step counter, forward
and loss (bf16 autocast on a GPU), backward, gradient clipping, the schedule's learning rate computed on the device
(:func:`lr_tensor`), AdamW, the loss added to a device-side sum, the counter advanced. Nothing in it reads a value
back to the host, so on a GPU it is captured once in a CUDA graph (``torch.cuda.graphs``: warm-up steps on a side
stream, whose effects on parameters, optimizer state and counters are then undone; AdamW with ``capturable=True``
and a tensor learning rate; autocast without its weight cache) and each step is one replay. The loss is read back
only every ``log_every`` steps (the mean since the last read) and the held-out set evaluated every ``eval_every``
steps, both between replays. On the CPU (Triton's interpreter) the same function runs eagerly.

**Checkpoints**: model, optimizer state, step, loss sum, curves and times, every ``checkpoint_every`` steps and
when a run stops, through a temporary file renamed over the old one (a kill leaves the previous checkpoint whole).
A run started again with the same configuration resumes from it and ends where an uninterrupted run ends; one that
is complete only reports (and writes its weights again).

**Data-parallel** (``parallel="ddp"`` or ``"fsdp2"``, under ``torchrun``): each process takes its slice of every
step's batch (``batch / world_size`` columns of the same order row), so the global batch is one process's. DDP
averages the gradients; FSDP2 (``fully_shard`` on each of the model's ``blocks``, then on the model; on a GPU
bf16 parameters for compute and fp32 gradient reduction) reduce-scatters them. Every process evaluates the whole
held-out set with the whole model; only rank 0 writes files. These runs are eager: their step is not captured in a
CUDA graph (collectives inside a captured step are left out, for simplicity). Under FSDP2 on a GPU the parameters,
and so the residual stream, are bf16: close to, not equal to, a single process's run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from .. import runtime

#: Eager steps before the capture, on a side stream (compiling the Triton kernels, creating the optimizer state,
#: settling the allocator); their effects are undone before the capture.
WARMUP_STEPS = 3
#: AdamW's settings, the paper's: betas (0.9, 0.98), eps 1e-8, no weight decay.
BETAS, ADAM_EPS, WEIGHT_DECAY = (0.9, 0.98), 1e-8, 0.0
CHECKPOINT_FORMAT = 1


def autocast(device: torch.device, *, cache_enabled: bool = True):
    """bf16 autocast on a GPU; on the CPU the interpreter's bf16 products are wrong, so fp32 there.
    ``cache_enabled=False`` for a step captured in a CUDA graph (its weight casts then belong to the graph)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=cache_enabled)
    return torch.autocast("cpu", enabled=False)


# ---------------------------------------------------------------------------------------------------------------
# Files


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it: readers see the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_save(obj, path: Path) -> None:
    """``torch.save`` through a temporary file renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_weights(state_dict: dict, path: Path) -> None:
    """A model's ``state_dict`` as fp16."""
    atomic_save({name: t.detach().cpu().half() for name, t in state_dict.items()}, path)


# ---------------------------------------------------------------------------------------------------------------
# Data and schedule


def batch_order(steps: int, batch: int, pool_size: int, seed: int) -> torch.Tensor:
    """``[steps, batch]`` int32 on the CPU: the pool rows of each step's batch, a fresh permutation of the pool
    each epoch, drawn from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    need, epochs, drawn = steps * batch, [], 0
    while drawn < need:
        epochs.append(torch.randperm(pool_size, generator=generator, dtype=torch.int32))
        drawn += pool_size
    return torch.cat(epochs)[:need].view(steps, batch)


def lr_tensor(step: torch.Tensor, train) -> torch.Tensor:
    """The learning rate of the 0-dim ``step`` tensor, computed where it lives (fp32): linear warmup over
    ``train.warmup`` steps, then ``train.lr`` (``schedule == "constant"``) or a cosine decay to
    ``min_lr_ratio * lr`` at ``train.steps`` (``"cosine"``); ``train`` is a :class:`mta.course.toy.TrainConfig`."""
    s = step.to(torch.float32)
    lr = torch.clamp((s + 1) / train.warmup, max=1.0) * train.lr if train.warmup else torch.full_like(s, train.lr)
    if train.schedule == "cosine":
        t = ((s - train.warmup) / max(1, train.steps - train.warmup)).clamp(0, 1)
        decay = train.lr * (train.min_lr_ratio + (1 - train.min_lr_ratio) * 0.5 * (1 + torch.cos(torch.pi * t)))
        lr = torch.where(s < train.warmup, lr, decay)
    return lr


# ---------------------------------------------------------------------------------------------------------------
# Processes


def init_distributed() -> None:
    """``torch.distributed`` from torchrun's environment: NCCL on the local rank's GPU, gloo on the CPU."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError("--parallel needs the processes of torchrun (RANK and WORLD_SIZE are not set): "
                           "torchrun --nproc_per_node N -m mta.course.toy --parallel ddp ...")
    if runtime.DEVICE.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if runtime.DEVICE.type == "cuda" else "gloo")


def rank_and_world() -> tuple[int, int]:
    """``(rank, world size)`` of ``torch.distributed``; ``(0, 1)`` without it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def run_processes(commands: Sequence[Sequence[str]], jobs: int) -> list[int]:
    """Run each ``python <command>`` in its own process, ``jobs`` at a time (output to ours); return their exit
    statuses in the order of ``commands``. Interrupted, it terminates the processes it started."""
    pending, running, codes = list(enumerate(commands)), {}, [None] * len(commands)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                index, command = pending.pop(0)
                running[index] = subprocess.Popen([sys.executable, *command])
            for index, proc in list(running.items()):
                if proc.poll() is not None:
                    codes[index] = proc.returncode
                    del running[index]
            time.sleep(0.2)
    finally:
        for proc in running.values():
            proc.terminate()
    return codes


# ---------------------------------------------------------------------------------------------------------------
# The trainer


class Trainer:
    """One run: a model, its AdamW, its data, and the step.

    Args:
        model: the module, on ``device``; under ``parallel="fsdp2"`` each of its ``blocks`` is sharded, then it.
        train: the settings (:class:`mta.course.toy.TrainConfig`: steps, batch, lr, schedule, warmup, grad_clip,
            eval_every, log_every).
        pool: ``[pool, seq_len]`` integer samples on ``device``.
        order: ``[steps, batch]`` pool rows of each step (:func:`batch_order`), the global batch.
        loss: ``loss(model, tokens [b, seq_len] int64) -> scalar``, run under :func:`autocast`.
        evaluate: ``evaluate(model) -> (loss, error)`` on the held-out set, the model in eval mode.
        identity: what a checkpoint must match to be resumed (the configuration, arm, seed: JSON values).
        labels: put into :meth:`result` (arm, seed).
        device: default ``mta.runtime.DEVICE`` (the current GPU).
        graphed: capture the step in a CUDA graph; default on a GPU without ``parallel``.
        parallel: None, ``"ddp"`` or ``"fsdp2"`` (needs ``torch.distributed`` initialized: :func:`init_distributed`).
    """

    def __init__(self, model: nn.Module, train, *, pool: torch.Tensor, order: torch.Tensor,
                 loss: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                 evaluate: Callable[[nn.Module], tuple[float, float]], identity: dict, labels: Optional[dict] = None,
                 device=None, graphed: Optional[bool] = None, parallel: Optional[str] = None):
        if parallel not in (None, "ddp", "fsdp2"):
            raise ValueError(f"parallel must be None, 'ddp' or 'fsdp2', got {parallel!r}")
        import torch.distributed as dist
        if parallel is not None and not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"parallel={parallel!r} needs torch.distributed initialized (run under torchrun)")
        device = torch.device(device or runtime.DEVICE)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        cuda = device.type == "cuda"
        graphed = (cuda and parallel is None) if graphed is None else bool(graphed)
        if graphed and (not cuda or parallel is not None):
            raise ValueError("a CUDA graph needs a GPU and one process (parallel=None)")
        self.train_cfg, self.parallel, self.device, self.graphed = train, parallel, device, graphed
        self.identity, self.labels = identity, dict(labels or {})
        self.rank, self.world = rank_and_world() if parallel is not None else (0, 1)
        if train.batch % self.world:
            raise ValueError(f"the batch ({train.batch}) must split evenly over the {self.world} processes")
        if tuple(order.shape) != (train.steps, train.batch):
            raise ValueError(f"order must be [steps, batch] = [{train.steps}, {train.batch}], got {tuple(order.shape)}")

        self.module = model
        self.model = self._wrap(model)
        self.params = list(self.model.parameters())
        self.loss_fn, self.evaluate_fn = loss, evaluate
        self.step_t = torch.zeros((), dtype=torch.int64, device=device)      # the step the next call runs
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=device)  # training loss since the last read
        self.lr = lr_tensor(self.step_t, train)
        self.lr_changes = not (train.schedule == "constant" and train.warmup == 0)
        # A tensor lr: the schedule writes it on the device (capturable=True keeps AdamW's step count there too).
        # Data-parallel runs keep to AdamW's plain per-tensor loop, the one the CPU tests run under FSDP2 too.
        capturable = cuda and parallel is None
        self.opt = torch.optim.AdamW(self.params, lr=self.lr, betas=BETAS, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY,
                                     capturable=capturable, foreach=None if capturable else False)
        self.pool = pool
        b = train.batch // self.world
        self.order = order[:, self.rank * b:(self.rank + 1) * b].contiguous().to(device)

        self.step = 0            # host copy of step_t
        self.last_log = 0        # the step at which the loss was last read
        self.graph = None
        self.record = {"curve": {"step": [], "loss": []}, "eval": {"step": [], "loss": [], "error": []},
                       "train_seconds": 0.0, "eval_seconds": 0.0, "setup_seconds": 0.0}

    def _wrap(self, module: nn.Module) -> nn.Module:
        if self.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            return DistributedDataParallel(module, device_ids=[self.device.index] if self.device.type == "cuda"
                                           else None)
        if self.parallel == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            mesh = init_device_mesh(self.device.type, (self.world,))
            policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                      if self.device.type == "cuda" else MixedPrecisionPolicy())
            for block in getattr(module, "blocks", ()):
                fully_shard(block, mesh=mesh, mp_policy=policy)
            fully_shard(module, mesh=mesh, mp_policy=policy)
        return module

    # --- the step ---------------------------------------------------------------------------------------------

    def step_once(self) -> None:
        """One training step, entirely on the device (what the CUDA graph holds)."""
        train = self.train_cfg
        row = self.order.index_select(0, self.step_t.clamp(max=self.order.shape[0] - 1).view(1)).view(-1)
        tokens = self.pool.index_select(0, row).long()                                 # [b, seq_len]
        self.opt.zero_grad(set_to_none=True)   # in a capture: the backward writes fresh gradients each replay
        with autocast(self.device, cache_enabled=False):
            loss = self.loss_fn(self.model, tokens)
        loss.backward()
        if train.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, train.grad_clip)
        if self.lr_changes:
            self.lr.copy_(lr_tensor(self.step_t, train))
        self.opt.step()
        with torch.no_grad():
            self.loss_sum.add_(loss.detach())
            self.step_t.add_(1)

    def warm_up(self, steps: int, stream=None) -> None:
        """Run ``steps`` steps (on ``stream`` if given), then put parameters, optimizer state, step, loss sum and
        learning rate back as they were: a fresh optimizer's state comes back as zeros, what AdamW starts from."""
        with torch.no_grad():
            snapshot = {"params": [p.detach().clone() for p in self.params],
                        "state": [{k: v.clone() for k, v in self.opt.state[p].items() if torch.is_tensor(v)}
                                  if p in self.opt.state else None for p in self.params],
                        "counters": [t.clone() for t in (self.step_t, self.loss_sum, self.lr)]}
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            for _ in range(steps):
                self.step_once()
        if stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
        with torch.no_grad():
            for p, saved in zip(self.params, snapshot["params"]):
                p.copy_(saved)
            for p, saved in zip(self.params, snapshot["state"]):
                for key, value in self.opt.state[p].items():
                    if torch.is_tensor(value):
                        value.copy_(saved[key]) if saved is not None else value.zero_()
            for t, saved in zip((self.step_t, self.loss_sum, self.lr), snapshot["counters"]):
                t.copy_(saved)

    def capture(self) -> None:
        """Capture :meth:`step_once` in a CUDA graph, after :data:`WARMUP_STEPS` undone warm-up steps."""
        self.warm_up(WARMUP_STEPS, torch.cuda.Stream(self.device))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step_once()
        self.graph = graph

    def _run_step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.step_once()

    # --- reading back -----------------------------------------------------------------------------------------

    def _all_sum(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the processes (every process must call this)."""
        if self.world > 1:
            import torch.distributed as dist
            value = value.clone()
            dist.all_reduce(value)
        return value

    def _read_loss(self) -> None:
        """The mean training loss since the last read (over the processes' slices too), into the curve."""
        n = self.step - self.last_log
        value = self._all_sum(self.loss_sum).item() / self.world / n
        self.loss_sum.zero_()
        self.last_log = self.step
        self.record["curve"]["step"].append(self.step)
        self.record["curve"]["loss"].append(value)

    def _agree(self, flag: bool) -> bool:
        """``flag`` of any process (so that every process stops at the same step)."""
        if self.world == 1:
            return flag
        import torch.distributed as dist
        t = torch.tensor(float(flag), device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def evaluate(self) -> tuple[float, float]:
        """``(loss, error)`` on the held-out set (every process: the whole set, the whole model)."""
        self.module.eval()
        try:
            return self.evaluate_fn(self.module)
        finally:
            self.module.train()

    # --- checkpoints ------------------------------------------------------------------------------------------

    def state_dicts(self) -> tuple[dict, dict]:
        """Full (unsharded) model and optimizer state dicts; under FSDP2 every process must call this, and only
        rank 0's are filled."""
        if self.parallel == "fsdp2":
            from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                                 get_optimizer_state_dict)
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return (get_model_state_dict(self.model, options=options),
                    get_optimizer_state_dict(self.model, self.opt, options=options))
        return self.module.state_dict(), self.opt.state_dict()

    def save_checkpoint(self, path: Path) -> None:
        """Write the run's state to ``path`` (rank 0; every process must call this)."""
        model_sd, opt_sd = self.state_dicts()
        loss_sum = self._all_sum(self.loss_sum).item()      # the processes' sums since the last read, together
        if self.rank == 0:
            atomic_save({"format": CHECKPOINT_FORMAT, **self.identity, "step": self.step,
                         "last_log": self.last_log, "loss_sum": loss_sum, "data_step": self.step,
                         "model": model_sd, "optimizer": opt_sd, "record": self.record}, path)

    def load_checkpoint(self, path: Path) -> None:
        """Resume from ``path`` (ValueError if it holds another run: ``identity`` differs)."""
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        if ckpt.get("format") != CHECKPOINT_FORMAT or any(ckpt.get(k) != v for k, v in self.identity.items()):
            raise ValueError(f"{path} holds another run (configuration, arm or seed differ): give another "
                             f"--checkpoint-dir, or remove it to start over")
        if self.parallel == "fsdp2":
            from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                                 set_optimizer_state_dict)
            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(self.model, ckpt["model"], options=options)
            set_optimizer_state_dict(self.model, self.opt, ckpt["optimizer"], options=options)
        else:
            self.module.load_state_dict(ckpt["model"])
            self.opt.load_state_dict(ckpt["optimizer"])
        for group in self.opt.param_groups:   # loading replaced the tensor the schedule writes
            group["lr"] = self.lr
        self.step, self.last_log = ckpt["step"], ckpt["last_log"]
        self.step_t.fill_(self.step)
        self.lr.copy_(lr_tensor(self.step_t, self.train_cfg))
        self.loss_sum.fill_(ckpt["loss_sum"] / self.world)     # read back as the sum over the processes
        self.record = ckpt["record"]

    # --- the run ----------------------------------------------------------------------------------------------

    def result(self) -> dict:
        """The run's record: curves, held-out evaluations, final error and loss, times."""
        rec, steps, done = self.record, self.train_cfg.steps, self.step
        return {**self.labels, "curve": rec["curve"], "eval": rec["eval"],
                "final_error": rec["eval"]["error"][-1] if rec["eval"]["error"] else None,
                "final_loss": rec["eval"]["loss"][-1] if rec["eval"]["loss"] else None,
                "train_seconds": rec["train_seconds"], "eval_seconds": rec["eval_seconds"],
                "setup_seconds": rec["setup_seconds"],
                "ms_per_step": 1000 * rec["train_seconds"] / done if done else None,
                "parameters": sum(p.numel() for p in self.module.parameters()),
                "steps_done": done, "complete": done >= steps and rec["eval"]["step"][-1:] == [steps],
                "graphed": self.graphed, "parallel": self.parallel, "world_size": self.world}

    def train(self, *, checkpoint: Optional[Path] = None, record: Optional[Path] = None,
              weights: Sequence[Path] = (), checkpoint_every: Optional[int] = None, deadline: Optional[float] = None,
              stop_at: Optional[int] = None, log: Optional[Callable[[str], None]] = None) -> dict:
        """Train to ``train.steps``, resuming from ``checkpoint`` if that file exists; return :meth:`result`.

        ``checkpoint``: written every ``checkpoint_every`` steps (default ``eval_every``), when the run stops and
        when it is complete. ``record``: a JSON file of ``identity`` and :meth:`result`, written with each
        checkpoint. ``weights``: where the complete model goes (fp16). ``stop_at`` (a step) and ``deadline`` (a
        ``time.time()``, looked at whenever the loss is read) stop the run early, checkpointed. ``log``: one short
        line per evaluation (rank 0).
        """
        train = self.train_cfg
        start = time.perf_counter()
        log = log if self.rank == 0 else None
        label = " ".join(f"{k} {v}" if k != "arm" else str(v) for k, v in self.labels.items())
        if checkpoint is not None and Path(checkpoint).exists():
            self.load_checkpoint(checkpoint)
        resumed_at = self.step
        every = checkpoint_every or train.eval_every
        end = train.steps if stop_at is None else min(stop_at, train.steps)
        if self.graph is None and self.graphed and self.step < end:
            self.capture()
        self.record["setup_seconds"] += time.perf_counter() - start
        if log:
            how = "one CUDA graph replay per step" if self.graph is not None else "eager steps"
            where = f", {self.world} processes ({self.parallel})" if self.parallel else ""
            log(f"{label}: {'resuming at step ' + str(self.step) if self.step else 'starting'} ({how}{where})")

        segment, base_train, paused = time.perf_counter(), self.record["train_seconds"], 0.0

        def sync():
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        def note_times():
            sync()
            self.record["train_seconds"] = base_train + time.perf_counter() - segment - paused

        def evaluate_now():
            nonlocal paused
            t = time.perf_counter()
            sync()
            loss, error = self.evaluate()
            for key, value in (("step", self.step), ("loss", loss), ("error", error)):
                self.record["eval"][key].append(value)
            spent = time.perf_counter() - t
            self.record["eval_seconds"] += spent
            paused += spent
            if log:
                curve = self.record["curve"]["loss"]
                train_loss = f"  train loss {curve[-1]:.3f}" if curve else ""  # none before the first step
                log(f"{label}: step {self.step}/{train.steps}{train_loss}  held-out loss "
                    f"{loss:.3f} error {error:.3f}  ({time.perf_counter() - start:.0f} s)")

        def save():
            nonlocal paused
            note_times()
            t = time.perf_counter()
            self.save_checkpoint(checkpoint)
            self._write_record(record)
            paused += time.perf_counter() - t

        stopped = False
        while self.step < end:
            if self.step % train.eval_every == 0 and self.record["eval"]["step"][-1:] != [self.step]:
                evaluate_now()
            self._run_step()
            self.step += 1
            if self.step % train.log_every == 0 or self.step == train.steps:
                self._read_loss()
                stopped = deadline is not None and self._agree(time.time() >= deadline)
            if checkpoint is not None and self.step < train.steps and (self.step % every == 0 or stopped or
                                                                      self.step == end):
                save()
            if stopped:
                break
        if self.step >= train.steps and self.record["eval"]["step"][-1:] != [train.steps]:
            evaluate_now()
        if self.step > resumed_at:
            note_times()
            if checkpoint is not None and self.step >= train.steps:
                self.save_checkpoint(checkpoint)
        result = self.result()
        if result["complete"] and weights:
            model_sd = self.state_dicts()[0]
            for path in weights if self.rank == 0 else ():
                save_weights(model_sd, path)
        self._write_record(record)
        if log and not result["complete"]:
            log(f"{label}: stopped at step {self.step} of {train.steps} (checkpointed)")
        return result

    def _write_record(self, path: Optional[Path]) -> None:
        if path is not None and self.rank == 0:
            atomic_write_text(path, json.dumps({**self.identity, "run": self.result()}) + "\n")
