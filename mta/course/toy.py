"""The MTA paper's toy task, "find the block", and a small decoder to train on it.

**Task** (arXiv 2504.00927, section 3). A sequence holds blocks of ``block_len`` distinct letters separated by
``.``; after ``#`` comes a query of ``query_len`` letters taken from one block, and no other block holds all of
them; the model must then write out that whole block::

    hkbqe.tgfzx.ocmwa.#zx tgfzx        (spaces for reading only)

The loss covers the target block only; the metric is the per-sequence error: with teacher forcing, a sequence is
wrong if the argmax at any of its target positions is wrong. One attention score compares one query with one
key, so a plain head can find the letters of the query but not the block where they occur *together*; MTA's
convolution combines neighbouring query-key matches into one score.

**Model.** Embedding, ``n_layers`` pre-norm blocks (RMSNorm, :class:`mta.MultiTokenAttention`, RMSNorm, MLP),
final RMSNorm, head tied to the embedding. The layers listed in ``mta_layers`` use a ``(2, 9)`` kernel (the
paper's toy setting, identity init), the others plain causal attention (``kernel_size=(1, 1)``).

**Run**::

    python -m mta.course.toy --preset gpu --arm plain mta --seeds 0 1 2 --out figures/toy_find_block.json

trains each (arm, seed) with a progress bar (bf16 autocast on a GPU), evaluates on a fixed held-out set, and
writes JSON (provenance, config, loss curves, errors, times) and a plot next to it; ``--save-weights DIR`` also
keeps each trained model (fp16, read back by :func:`load_model`). ``--preset cpu`` is a tiny
configuration that runs in seconds in Triton's interpreter.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import runtime
from ..checks import check_count
from ..layer import MultiTokenAttention

LETTERS = "abcdefghijklmnopqrstuvwxyz"
DOT, HASH = 26, 27            # token ids of "." and "#"; letters are 0 .. 25
VOCAB = 28


# ---------------------------------------------------------------------------------------------------------------
# The task


@dataclass(frozen=True)
class TaskConfig:
    """Sizes of a "find the block" sample. The paper: 52 blocks of 5 letters of 26, queries of 2 (319 tokens)."""

    num_blocks: int = 16
    block_len: int = 5
    query_len: int = 2
    letters: int = 26

    def __post_init__(self):
        for name in ("num_blocks", "block_len", "query_len", "letters"):  # a float or a bool failed deep in torch
            check_count(name, getattr(self, name))  # ints, at least 1
        if not 1 <= self.query_len <= self.block_len <= self.letters <= 26:
            raise ValueError(f"need 1 <= query_len <= block_len <= letters <= 26, got {self}")
        if self.query_len == self.block_len and self.num_blocks > 1:
            raise ValueError("query_len == block_len leaves no room for other blocks without the query letters")
        if self.letters == self.block_len and self.num_blocks > 1:  # make_batch would redraw them forever
            raise ValueError(f"letters == block_len ({self.letters}) makes every block hold every letter: no block "
                             f"but the target can be without the query letters; use more letters or one block")

    @property
    def seq_len(self) -> int:
        """Tokens per sample: the blocks and their separators, ``#``, the query, the target block."""
        return self.num_blocks * (self.block_len + 1) - 1 + 1 + self.query_len + self.block_len


def make_batch(task: TaskConfig, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [batch, seq_len] int64, target_block [batch] int64)``, on the CPU.

    Every block has ``block_len`` distinct letters; the query is ``query_len`` distinct letters of block
    ``target_block`` in random order; any other block that holds all the query letters is redrawn until none does.
    The last ``block_len`` tokens are the target block.
    """
    batch = check_count("batch", batch)
    nb, L, Q = task.num_blocks, task.block_len, task.query_len

    def draw_blocks(n):  # n blocks of L distinct letters: the first L of a random permutation
        return torch.rand(n, task.letters, generator=generator).argsort(-1)[:, :L]

    blocks = draw_blocks(batch * nb).view(batch, nb, L)
    target = torch.randint(nb, (batch,), generator=generator)
    picks = torch.rand(batch, L, generator=generator).argsort(-1)[:, :Q]            # Q distinct slots of the block
    query = blocks[torch.arange(batch), target].gather(1, picks)                     # [batch, Q]
    is_target = torch.arange(nb)[None, :] == target[:, None]
    while True:
        holds_all = (blocks[:, :, :, None] == query[:, None, None, :]).any(2).all(-1)   # [batch, nb]
        bad = holds_all & ~is_target
        if not bad.any():
            break
        blocks[bad] = draw_blocks(int(bad.sum()))
    body = torch.cat([blocks, torch.full((batch, nb, 1), DOT)], dim=2).view(batch, -1)[:, :-1]
    tokens = torch.cat([body, torch.full((batch, 1), HASH), query, blocks[torch.arange(batch), target]], dim=1)
    return tokens, target


def decode_tokens(tokens) -> str:
    """Token ids -> text (letters, ``.`` and ``#``)."""
    return "".join((LETTERS + ".#")[int(t)] for t in tokens)


def target_mask(task: TaskConfig, length: int) -> torch.Tensor:
    """Boolean ``[length]`` over the *next-token* targets ``tokens[:, 1:]``: True on the target block."""
    mask = torch.zeros(length, dtype=torch.bool)
    mask[length - task.block_len:] = True
    return mask


# ---------------------------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class ModelConfig:
    """A small decoder. ``mta_layers``: indices of the layers with an MTA kernel of ``kernel_size``."""

    dim: int = 128
    n_layers: int = 4
    n_heads: int = 2
    mta_layers: tuple = (0, 1, 2, 3)
    kernel_size: tuple = (2, 9)
    rope_theta: float = 1e5
    mlp_ratio: int = 4


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last axis (arXiv 1910.07467), computed in fp32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: ModelConfig, mta: bool):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim)
        self.attn = MultiTokenAttention(cfg.dim, cfg.n_heads, kernel_size=cfg.kernel_size if mta else (1, 1),
                                        rope_theta=cfg.rope_theta)
        self.mlp_norm = RMSNorm(cfg.dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim, bias=False), nn.GELU(),
                                 nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim, bias=False))

    def forward(self, x, cache=None, lengths=None):
        h = self.attn_norm(x)
        if cache is not None and cache.is_empty:
            x = x + self.attn.prefill(h, cache, lengths)          # lengths: a right-padded prompt batch
        else:
            x = x + self.attn(h, cache=cache)
        return x + self.mlp(self.mlp_norm(x))



def check_mta_layers(cfg: "ModelConfig") -> None:
    """ValueError unless every layer index in ``cfg.mta_layers`` is one of the model's layers."""
    bad = [i for i in cfg.mta_layers if not 0 <= i < cfg.n_layers]
    if bad:
        raise ValueError(f"mta_layers {bad} out of range for {cfg.n_layers} layers")


class ToyDecoder(nn.Module):
    """``tokens [B, N]`` -> logits ``[B, N, VOCAB]`` (fp32).

    With ``caches`` (one :class:`mta.KVCache` per layer, :meth:`new_caches`): empty caches are prefilled with
    ``tokens`` (a right-padded batch whose real lengths are ``lengths``, default all ``N``); otherwise ``tokens``
    are the next 1 to 16 tokens of every sequence, decoded at each sequence's own position."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        check_mta_layers(cfg)
        self.cfg = cfg
        self.embed = nn.Embedding(VOCAB, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, i in cfg.mta_layers) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        for module in self.modules():       # small normal init (the MTA kernels keep their identity init)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens, caches=None, lengths=None):
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i], lengths)
        return (self.norm(x) @ self.embed.weight.to(x.dtype).T).float()     # tied head

    def new_caches(self, batch: int, max_len: int, dtype=None):
        return [block.attn.new_cache(batch, max_len, dtype=dtype) for block in self.blocks]


# ---------------------------------------------------------------------------------------------------------------
# Training


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 3000
    batch: int = 64
    lr: float = 1e-3
    warmup: int = 200
    min_lr_ratio: float = 0.1
    eval_samples: int = 512
    eval_every: int = 250
    log_every: int = 25

    def __post_init__(self):
        # Checked here, so that the CLI's --lr, --steps and --batch give usage errors, not a traceback from the
        # optimizer (lr=nan or -1) or silent NaN losses (lr=inf).
        for name in ("steps", "batch", "eval_samples", "eval_every", "log_every"):
            check_count(name, getattr(self, name))
        check_count("warmup", self.warmup, minimum=0)
        for name in ("lr", "min_lr_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, got {value!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite positive number, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclass(frozen=True)
class ToyConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


#: ``gpu``: one H100 trains a run in 3 to 4 minutes (``figures/toy_find_block.json``: 173-240 s);
#: ``cpu``: tiny, seconds in Triton's interpreter (tests, readers).
PRESETS = {
    "gpu": ToyConfig(TaskConfig(num_blocks=16), ModelConfig(dim=128, n_layers=4, n_heads=2),
                     TrainConfig(steps=8000, batch=64, lr=1e-3, warmup=200, eval_samples=1024, eval_every=250)),
    # Triton's interpreter pays per program (batch x heads): one head, four sequences, a few steps.
    "cpu": ToyConfig(TaskConfig(num_blocks=3, block_len=3, query_len=2, letters=8),
                     ModelConfig(dim=32, n_layers=2, n_heads=1, mta_layers=(1,)),
                     TrainConfig(steps=8, batch=4, lr=1e-2, warmup=2, eval_samples=8, eval_every=4, log_every=1)),
}


def model_config_for(cfg: ModelConfig, arm: str) -> ModelConfig:
    """``plain``: no MTA layer; ``mta``: ``cfg`` as it is."""
    if arm not in ("plain", "mta"):
        raise ValueError(f"arm must be 'plain' or 'mta', got {arm!r}")
    return cfg if arm == "mta" else replace(cfg, mta_layers=())


def loss_and_error(logits: torch.Tensor, tokens: torch.Tensor, task: TaskConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy over the target block (mean over its tokens) and the per-sequence error flags ``[B]``.

    ``logits [B, N - 1, VOCAB]`` come from ``tokens[:, :-1]``; position ``t`` predicts ``tokens[:, t + 1]``.
    """
    L = task.block_len
    pred, want = logits[:, -L:], tokens[:, -L:]
    loss = F.cross_entropy(pred.reshape(-1, VOCAB), want.reshape(-1))
    wrong = (pred.argmax(-1) != want).any(-1)
    return loss, wrong


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def _autocast(device: torch.device):
    # bf16 on a GPU; on the CPU the interpreter's bf16 products are wrong, so fp32 there.
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def evaluate(model: nn.Module, tokens: torch.Tensor, task: TaskConfig, batch: int) -> tuple[float, float]:
    """``(mean loss, per-sequence error)`` over ``tokens`` (teacher forcing), in batches."""
    device = next(model.parameters()).device
    losses, wrong = [], []
    for start in range(0, tokens.shape[0], batch):
        chunk = tokens[start:start + batch].to(device)
        with _autocast(device):
            logits = model(chunk[:, :-1])
        loss, w = loss_and_error(logits, chunk, task)
        losses.append(loss.item() * chunk.shape[0])
        wrong.append(w.cpu())
    return sum(losses) / tokens.shape[0], torch.cat(wrong).float().mean().item()


def train_run(cfg: ToyConfig, arm: str, seed: int, *, device=None, progress: bool = True,
              weights: Optional[Path] = None) -> dict:
    """Train one model from ``seed`` on fresh batches; return its curves, final error and times.

    The held-out set is the same for every run (its own seed); training batches come from ``seed``. With
    ``weights``, the trained model's ``state_dict`` is saved there (fp16; :func:`load_model` reads it back).
    """
    device = torch.device(device or runtime.DEVICE)
    torch.manual_seed(seed)
    model = ToyDecoder(model_config_for(cfg.model, arm)).to(device)
    tc = cfg.train
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=(0.9, 0.98), weight_decay=0.0)
    data_gen = torch.Generator().manual_seed(1000 + seed)
    held_out, _ = held_out_set(cfg)
    curve = {"step": [], "loss": []}
    evals = {"step": [], "loss": [], "error": []}
    train_seconds = eval_seconds = 0.0
    bar = _progress(tc.steps, f"{arm} seed {seed}", progress)
    for step in range(tc.steps):
        if step % tc.eval_every == 0:
            eval_seconds += _timed(lambda: _record_eval(model, held_out, cfg, evals, step), device)
        tokens, _ = make_batch(cfg.task, tc.batch, data_gen)
        tokens = tokens.to(device)
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        with _autocast(device):
            logits = model(tokens[:, :-1])
        loss, _ = loss_and_error(logits, tokens, cfg.task)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % tc.log_every == 0 or step == tc.steps - 1:
            curve["step"].append(step)
            curve["loss"].append(loss.item())                 # .item() synchronises: the time stays honest
            bar.set_postfix(loss=f"{curve['loss'][-1]:.3f}")
        elif device.type == "cuda":
            torch.cuda.synchronize(device)
        train_seconds += time.perf_counter() - start
        bar.update(1)
    eval_seconds += _timed(lambda: _record_eval(model, held_out, cfg, evals, tc.steps), device)
    bar.set_postfix(loss=f"{curve['loss'][-1]:.3f}", error=f"{evals['error'][-1]:.3f}")
    bar.close()
    if weights is not None:
        Path(weights).parent.mkdir(parents=True, exist_ok=True)
        torch.save({name: t.detach().cpu().half() for name, t in model.state_dict().items()}, weights)
    return {"arm": arm, "seed": seed, "curve": curve, "eval": evals, "final_error": evals["error"][-1],
            "final_loss": evals["loss"][-1], "train_seconds": train_seconds, "eval_seconds": eval_seconds,
            "parameters": sum(p.numel() for p in model.parameters())}


@torch.no_grad()
def materialized_forward(model: "ToyDecoder", tokens: torch.Tensor) -> tuple[torch.Tensor, list]:
    """The model on ``tokens [B, N]`` with every attention materialized: ``(logits [B, N, VOCAB], maps)``, where
    ``maps`` holds, per layer, what its heads attend to, ``[B, H, N, N]`` fp32 probabilities
    (:meth:`mta.MultiTokenAttention.attention_probabilities` on the layer's normalized input). Each layer's output
    is the materialized ``P @ v``, not the kernels': the same values up to rounding, and quick on a CPU, where the
    kernels run in Triton's interpreter. For inspecting a model at small ``N``."""
    x, maps = model.embed(tokens), []
    for block in model.blocks:
        probs, attn_out = block.attn.attention_probabilities(block.attn_norm(x), with_output=True)
        maps.append(probs)
        x = x + attn_out
        x = x + block.mlp(block.mlp_norm(x))
    return (model.norm(x) @ model.embed.weight.to(x.dtype).T).float(), maps


def attention_maps(model: "ToyDecoder", tokens: torch.Tensor) -> list:
    """Per layer, what its heads attend to on ``tokens [B, N]``: ``[B, H, N, N]`` (:func:`materialized_forward`)."""
    return materialized_forward(model, tokens)[1]


def position_errors(logits: torch.Tensor, tokens: torch.Tensor, task: TaskConfig) -> torch.Tensor:
    """``[block_len]``: the fraction of samples whose target letter ``p`` is mispredicted (teacher forcing;
    ``logits`` from ``tokens[:, :-1]`` as in :func:`loss_and_error`)."""
    L = task.block_len
    return (logits[:, -L:].argmax(-1) != tokens[:, -L:]).float().mean(0).cpu()


def target_rows(task: TaskConfig, seq_len: int) -> range:
    """The query rows that predict the target block's letters (the last query letter's row and the target's
    rows but its last): ``seq_len - block_len - 1 .. seq_len - 2``."""
    return range(seq_len - task.block_len - 1, seq_len - 1)


def block_span(task: TaskConfig, block: int) -> range:
    """The key positions of block ``block``'s letters."""
    start = block * (task.block_len + 1)
    return range(start, start + task.block_len)


def attention_on_target(maps: list, target: torch.Tensor, task: TaskConfig) -> torch.Tensor:
    """``[layers, H, block_len]``: the mean attention mass that each row predicting a target letter
    (:func:`target_rows`) puts on the target block's letters in the context (:func:`block_span`), over the
    samples of ``maps`` (:func:`attention_maps` on whole samples whose target blocks are ``target [B]``)."""
    B, _, N, _ = maps[0].shape
    rows = target_rows(task, N)
    keys = torch.zeros(B, N, dtype=torch.bool)
    for b, t in enumerate(target.tolist()):
        span = block_span(task, t)
        keys[b, span.start:span.stop] = True
    keys = keys.to(maps[0].device)[:, None, None, :]                   # [B, 1, 1, N]
    return torch.stack([(p[:, :, rows.start:rows.stop] * keys).sum(-1).mean(0) for p in maps]).cpu()


def held_out_set(cfg: ToyConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed samples every run is evaluated on: :func:`make_batch` of ``cfg.train.eval_samples``."""
    return make_batch(cfg.task, cfg.train.eval_samples, torch.Generator().manual_seed(123456))


def load_model(cfg: ToyConfig, arm: str, weights: Path, device=None) -> "ToyDecoder":
    """The model a run saved with ``weights`` (:func:`train_run`), in fp32, in eval mode."""
    model = ToyDecoder(model_config_for(cfg.model, arm))
    model.load_state_dict({name: t.float() for name, t in torch.load(weights, map_location="cpu").items()})
    return model.to(device or runtime.DEVICE).eval()


def weights_path(weights_dir: Path, arm: str, seed: int) -> Path:
    return Path(weights_dir) / f"toy_{arm}_seed{seed}.pt"


def _record_eval(model, held_out, cfg, evals, step):
    model.eval()
    loss, error = evaluate(model, held_out, cfg.task, cfg.train.batch)
    model.train()
    evals["step"].append(step)
    evals["loss"].append(loss)
    evals["error"].append(error)


def _timed(fn, device) -> float:
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=not enabled, leave=True)


# ---------------------------------------------------------------------------------------------------------------
# Results file


def config_dict(cfg: ToyConfig) -> dict:
    return json.loads(json.dumps(asdict(cfg)))       # tuples become lists, as in the file


def run_all(cfg: ToyConfig, arms, seeds, out: Optional[Path] = None, *, progress: bool = True,
            weights_dir: Optional[Path] = None) -> dict:
    """Train every (arm, seed) and return the results; with ``out``, write JSON after each run (runs of the same
    configuration already in the file are kept unless repeated) and a plot next to it; with ``weights_dir``,
    save each trained model there (:func:`weights_path`)."""
    from ..bench.harness import provenance

    # Each (arm, seed) once: a repeated seed (--seeds 0 0 1) trained the same run again and weighed it twice in
    # the summary's mean.
    arms, seeds = list(dict.fromkeys(arms)), list(dict.fromkeys(seeds))
    results = {"provenance": provenance(), "config": config_dict(cfg), "seq_len": cfg.task.seq_len, "runs": []}
    if out is not None and Path(out).exists():
        old = json.loads(Path(out).read_text())
        if old.get("config") == results["config"]:
            results["runs"] = [r for r in old["runs"] if not (r["arm"] in arms and r["seed"] in seeds)]
    for arm in arms:
        for seed in seeds:
            weights = None if weights_dir is None else weights_path(weights_dir, arm, seed)
            results["runs"].append(train_run(cfg, arm, seed, progress=progress, weights=weights))
            results["runs"].sort(key=lambda r: (r["arm"], r["seed"]))
            results["seeds"] = sorted({r["seed"] for r in results["runs"]})
            results["summary"] = summarize(results["runs"])
            if out is not None:
                write_results(results, Path(out))
    return results


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
    import matplotlib
    matplotlib.use("Agg")
    from .plots_07 import plot_toy_runs

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    fig = plot_toy_runs(results)
    fig.savefig(out.with_suffix(".png"), dpi=110, bbox_inches="tight", metadata={"Software": None})


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {value}")
    return value


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m mta.course.toy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu" if runtime.HAS_CUDA else "cpu")
    parser.add_argument("--arm", nargs="+", choices=["plain", "mta"], default=["plain", "mta"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=_positive_int, help="training steps (default: the preset's)")
    parser.add_argument("--batch", type=_positive_int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--num-blocks", type=_positive_int, help="blocks per sample (the paper: 52)")
    parser.add_argument("--mta-layers", nargs="*", type=int, help="layers with an MTA kernel (default: the preset's)")
    parser.add_argument("--out", type=Path, help="JSON to write (a PNG plot goes next to it)")
    parser.add_argument("--save-weights", type=Path, metavar="DIR",
                        help="save each trained model there (fp16 state_dict, toy_<arm>_seed<seed>.pt)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    cfg = PRESETS[args.preset]
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
    if args.save_weights is not None and args.save_weights.exists() and not args.save_weights.is_dir():
        parser.error(f"--save-weights {args.save_weights} is a file: give a directory")
    print(f"find the block: {cfg.task.seq_len} tokens per sample, {runtime.describe()}")
    results = run_all(cfg, args.arm, args.seeds, args.out, progress=not args.no_progress,
                      weights_dir=args.save_weights)
    for arm, s in results["summary"].items():
        print(f"{arm}: final per-sequence error {s['mean_final_error']:.3f} over seeds {s['seeds']} "
              f"({s['mean_train_seconds']:.0f} s of training per run)")
    return results


if __name__ == "__main__":
    main()
