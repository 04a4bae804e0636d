"""A small decoder for the toy task (:mod:`mta.course.toy_task`), and its attention materialized for inspection.

**Model.** Embedding, ``n_layers`` pre-norm blocks (RMSNorm, :class:`mta.MultiTokenAttention`, RMSNorm, MLP),
final RMSNorm, head tied to the embedding. The layers listed in ``mta_layers`` use a ``(2, 9)`` kernel (the
paper's toy setting, identity init), the others plain causal attention (``kernel_size=(1, 1)``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_count
from ..layer import MultiTokenAttention
from .toy_task import VOCAB, TaskConfig, block_span, target_rows


@dataclass(frozen=True)
class ModelConfig:
    """A small decoder. ``mta_layers``: indices of the layers with an MTA kernel of ``kernel_size``.

    ``mlp``: ``"gelu"`` (``dim -> ffn_dim -> dim``, ``ffn_dim`` default ``mlp_ratio * dim``) or ``"swiglu"`` (the
    paper's, ``w2(silu(w1 x) * w3 x)``, ``ffn_dim`` default ``8 dim / 3`` rounded up to a multiple of 256: 768 at
    width 256). ``init_std``: a number, every projection and the embedding drawn from ``N(0, init_std)``; None, the
    paper's: truncated normals (at 3 sigma) of std ``dim ** -0.5``, ``ffn_dim ** -0.5`` for the MLP's output.
    """

    dim: int = 128
    n_layers: int = 4
    n_heads: int = 2
    mta_layers: tuple = (0, 1, 2, 3)
    kernel_size: tuple = (2, 9)
    rope_theta: float = 1e5
    mlp_ratio: int = 4
    mlp: str = "gelu"
    ffn_dim: Optional[int] = None
    norm_eps: float = 1e-5
    init_std: Optional[float] = 0.02

    def __post_init__(self):
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"mlp must be 'gelu' or 'swiglu', got {self.mlp!r}")
        if self.ffn_dim is not None:
            check_count("ffn_dim", self.ffn_dim)
        if self.init_std is not None and not (isinstance(self.init_std, numbers.Real) and self.init_std > 0):
            raise ValueError(f"init_std must be a positive number or None, got {self.init_std!r}")

    @property
    def hidden_dim(self) -> int:
        """The MLP's hidden width."""
        if self.ffn_dim is not None:
            return self.ffn_dim
        if self.mlp == "gelu":
            return self.mlp_ratio * self.dim
        return 256 * math.ceil(int(8 * self.dim / 3) / 256)


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last axis (arXiv 1910.07467), computed in fp32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)`` (arXiv 2002.05202), bias-free: ``[..., dim] -> [..., dim]``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: ModelConfig, mta: bool):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = MultiTokenAttention(cfg.dim, cfg.n_heads, kernel_size=cfg.kernel_size if mta else (1, 1),
                                        rope_theta=cfg.rope_theta)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        if cfg.mlp == "swiglu":
            self.mlp = SwiGLU(cfg.dim, cfg.hidden_dim)
        else:   # an nn.Sequential, so that saved models keep their parameter names (mlp.0, mlp.2)
            self.mlp = nn.Sequential(nn.Linear(cfg.dim, cfg.hidden_dim, bias=False), nn.GELU(),
                                     nn.Linear(cfg.hidden_dim, cfg.dim, bias=False))

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
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.reset_weights()

    @torch.no_grad()
    def reset_weights(self) -> None:
        """Draw the projections and the embedding as ``cfg.init_std`` says (the MTA kernels keep their identity
        init, the norms their ones)."""
        std = self.cfg.init_std
        out_std = self.cfg.dim ** -0.5 if std is None else std
        for name, module in self.named_modules():
            if not isinstance(module, (nn.Linear, nn.Embedding)):
                continue
            if std is not None:
                nn.init.normal_(module.weight, std=std)
                continue
            s = self.cfg.hidden_dim ** -0.5 if name.endswith("mlp.w2") or name.endswith("mlp.2") else out_std
            nn.init.trunc_normal_(module.weight, std=s, a=-3 * s, b=3 * s)

    def forward(self, tokens, caches=None, lengths=None):
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i], lengths)
        return (self.norm(x) @ self.embed.weight.to(x.dtype).T).float()     # tied head

    def new_caches(self, batch: int, max_len: int, dtype=None):
        return [block.attn.new_cache(batch, max_len, dtype=dtype) for block in self.blocks]


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
