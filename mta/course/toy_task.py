"""The MTA paper's toy task, "find the block": its samples, its loss and its metric.

**Task** (arXiv 2504.00927, section 3). A sequence holds blocks of ``block_len`` distinct letters separated by
``.``; after ``#`` comes a query of ``query_len`` letters taken from one block, and no other block holds all of
them; the model must then write out that whole block::

    hkbqe.tgfzx.ocmwa.#zx tgfzx        (spaces for reading only)

The loss covers the target block only; the metric is the per-sequence error: with teacher forcing, a sequence is
wrong if the argmax at any of its target positions is wrong. One attention score compares one query with one
key, so a plain head can find the letters of the query but not the block where they occur *together*; MTA's
convolution combines neighbouring query-key matches into one score.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..checks import check_count

LETTERS = "abcdefghijklmnopqrstuvwxyz"
DOT, HASH = 26, 27            # token ids of "." and "#"; letters are 0 .. 25
VOCAB = 28


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
    """``(tokens [batch, seq_len] int64, target_block [batch] int64)``, on ``generator``'s device.

    Every block has ``block_len`` distinct letters; the query is ``query_len`` distinct letters of block
    ``target_block`` in random order; any other block that holds all the query letters is redrawn until none does.
    The last ``block_len`` tokens are the target block.
    """
    batch = check_count("batch", batch)
    nb, L, Q = task.num_blocks, task.block_len, task.query_len
    device = generator.device

    def draw_blocks(n):  # n blocks of L distinct letters: the first L of a random permutation
        return torch.rand(n, task.letters, generator=generator, device=device).argsort(-1)[:, :L]

    rows = torch.arange(batch, device=device)
    blocks = draw_blocks(batch * nb).view(batch, nb, L)
    target = torch.randint(nb, (batch,), generator=generator, device=device)
    picks = torch.rand(batch, L, generator=generator, device=device).argsort(-1)[:, :Q]   # Q distinct slots
    query = blocks[rows, target].gather(1, picks)                                         # [batch, Q]
    is_target = torch.arange(nb, device=device)[None, :] == target[:, None]
    while True:
        holds_all = (blocks[:, :, :, None] == query[:, None, None, :]).any(2).all(-1)   # [batch, nb]
        bad = holds_all & ~is_target
        if not bad.any():
            break
        blocks[bad] = draw_blocks(int(bad.sum()))
    body = torch.cat([blocks, torch.full((batch, nb, 1), DOT, device=device)], dim=2).view(batch, -1)[:, :-1]
    tokens = torch.cat([body, torch.full((batch, 1), HASH, device=device), query, blocks[rows, target]], dim=1)
    return tokens, target


def decode_tokens(tokens) -> str:
    """Token ids -> text (letters, ``.`` and ``#``)."""
    return "".join((LETTERS + ".#")[int(t)] for t in tokens)


def target_mask(task: TaskConfig, length: int) -> torch.Tensor:
    """Boolean ``[length]`` over the *next-token* targets ``tokens[:, 1:]``: True on the target block."""
    mask = torch.zeros(length, dtype=torch.bool)
    mask[length - task.block_len:] = True
    return mask


def target_loss(logits: torch.Tensor, tokens: torch.Tensor, task: TaskConfig) -> torch.Tensor:
    """Cross-entropy over the target block, the mean over its tokens (``logits`` as in :func:`loss_and_error`)."""
    L = task.block_len
    return F.cross_entropy(logits[:, -L:].reshape(-1, VOCAB), tokens[:, -L:].reshape(-1))


def loss_and_error(logits: torch.Tensor, tokens: torch.Tensor, task: TaskConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy over the target block (mean over its tokens) and the per-sequence error flags ``[B]``.

    ``logits [B, N - 1, VOCAB]`` come from ``tokens[:, :-1]``; position ``t`` predicts ``tokens[:, t + 1]``.
    """
    L = task.block_len
    wrong = (logits[:, -L:].argmax(-1) != tokens[:, -L:]).any(-1)
    return target_loss(logits, tokens, task), wrong


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
