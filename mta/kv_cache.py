"""The cache a :class:`mta.MultiTokenAttention` layer decodes from: keys, values and, for MTA, queries.

MTA's convolution looks ``cq - 1`` queries back, so a decode step needs the recent queries as well as the keys
and values (``docs/mta-semantics.md``, "Decode"); :func:`mta.conv_decode_attention` reads them from a query cache
as long as the KV cache. Plain attention keeps no queries.

Layout: ``[B, Nmax, H, D]``, the layout the projections produce, so that appending a token is one indexed write
per tensor; the kernels read the ``[B, H, Nmax, D]`` views (:meth:`KVCache.views`) through their strides.
Each sequence has its own length (``lengths``, a CPU int64 tensor: the host decides positions and checks bounds
without a device synchronisation); nothing at or past a sequence's length is ever read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .checks import check_count, is_int_list

#: What the decode kernels read.
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(eq=False)  # compared by identity: a field-wise == of tensors has no single truth value
class KVCache:
    """Keys, values (and queries, for MTA) of one attention layer, for ``B`` sequences of at most ``Nmax`` tokens.

    Attributes:
        k, v: ``[B, Nmax, Hkv, D]``, RoPE already applied to ``k``.
        q: ``[B, Nmax, Hq, D]`` (RoPE applied) for an MTA layer, None for plain attention.
        lengths: ``[B]`` int64 on the CPU, valid positions per sequence.
    """

    k: torch.Tensor
    v: torch.Tensor
    q: Optional[torch.Tensor]
    lengths: torch.Tensor

    @classmethod
    def empty(cls, batch: int, max_len: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
              keep_queries: bool, dtype: torch.dtype = torch.float32, device=None) -> "KVCache":
        """An empty cache (every length 0). ``keep_queries``: also hold the queries (MTA layers). ``dtype``: fp32,
        fp16 or bf16 (what the decode kernels read)."""
        batch, max_len = check_count("batch", batch), check_count("max_len", max_len)
        num_heads, num_kv_heads = check_count("num_heads", num_heads), check_count("num_kv_heads", num_kv_heads)
        head_dim = check_count("head_dim", head_dim)
        if dtype not in CACHE_DTYPES:
            raise TypeError(f"a cache holds fp32, fp16 or bf16 (what the decode kernels read), got dtype={dtype}")

        def buffer(heads):
            return torch.zeros(batch, max_len, heads, head_dim, dtype=dtype, device=device)

        return cls(k=buffer(num_kv_heads), v=buffer(num_kv_heads), q=buffer(num_heads) if keep_queries else None,
                   lengths=torch.zeros(batch, dtype=torch.int64))

    @property
    def batch(self) -> int:
        return self.k.shape[0]

    @property
    def max_len(self) -> int:
        return self.k.shape[1]

    @property
    def is_empty(self) -> bool:
        return bool((self.lengths == 0).all())

    def positions(self, n: int) -> torch.Tensor:
        """``[B, n]`` int64 (CPU): the positions ``lengths[b] + t`` the next ``n`` tokens of each sequence take."""
        return self.lengths[:, None] + torch.arange(n)

    def append(self, q: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``n`` new tokens per sequence at its own positions, then advance ``lengths`` by ``n``.

        Args:
            q: ``[B, n, Hq, D]`` (ignored when the cache keeps no queries); k, v: ``[B, n, Hkv, D]``.
        """
        self._check_tokens(q, k, v)
        n = k.shape[1]
        if int(self.lengths.max()) + n > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions: appending {n} token(s) to a sequence of "
                             f"length {int(self.lengths.max())} does not fit")
        pos = self.positions(n).to(self.k.device)
        rows = torch.arange(self.batch, device=self.k.device)[:, None].expand_as(pos)
        self.k[rows, pos] = k.detach().to(self.k.dtype)  # a cache holds values, not a graph
        self.v[rows, pos] = v.detach().to(self.v.dtype)
        if self.q is not None:
            self.q[rows, pos] = q.detach().to(self.q.dtype)
        self.lengths += n

    def fill(self, q: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor,
             lengths: Optional[torch.Tensor] = None) -> None:
        """Prefill an empty cache with positions ``0 .. N-1`` of a (right-padded) batch; ``lengths`` ``[B]`` says
        how many of them are real per sequence (default: all ``N``). Shapes as in :meth:`append`."""
        if not self.is_empty:
            raise ValueError("prefill needs an empty cache (every length 0)")
        self._check_tokens(q, k, v)
        n = k.shape[1]
        if n > self.max_len:
            raise ValueError(f"a prompt of {n} tokens does not fit a cache of {self.max_len} positions")
        lengths = self.prompt_lengths(lengths, n)
        self.k[:, :n] = k.detach().to(self.k.dtype)  # a cache holds values, not a graph
        self.v[:, :n] = v.detach().to(self.v.dtype)
        if self.q is not None:
            self.q[:, :n] = q.detach().to(self.q.dtype)
        self.lengths.copy_(lengths)

    def prompt_lengths(self, lengths, n: int) -> torch.Tensor:
        """The real lengths of a right-padded prompt batch of ``n`` positions (``None``: all ``n``), checked: a CPU
        int64 tensor ``[B]`` of values in ``1 .. n``."""
        lengths = torch.full((self.batch,), n, dtype=torch.int64) if lengths is None else _int_lengths(lengths)
        if tuple(lengths.shape) != (self.batch,) or int(lengths.min()) < 1 or int(lengths.max()) > n:
            raise ValueError(f"lengths must hold {self.batch} values in 1 .. {n}, got {lengths.tolist()}")
        return lengths

    def _check_tokens(self, q: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor) -> None:
        """Before anything is written: ``k``, ``v`` ``[B, n, Hkv, D]`` and (when queries are kept) ``q``
        ``[B, n, Hq, D]``, with this cache's ``B``, heads and head dim, on its device."""
        for name, x in (("q", q if self.q is not None else None), ("k", k), ("v", v)):
            if x is not None and x.device != self.k.device:  # a write from the meta device would write nothing
                raise ValueError(f"{name} is on {x.device} but the cache is on {self.k.device}")
        if k.dim() != 4 or v.shape != k.shape:
            raise ValueError(f"k and v must be [B, n, Hkv, D] of one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.shape[0] != self.batch:
            raise ValueError(f"got {k.shape[0]} sequences but the cache holds {self.batch}")
        if k.shape[2:] != self.k.shape[2:]:
            raise ValueError(f"k and v have {k.shape[2]} heads of dim {k.shape[3]}, the cache holds "
                             f"{self.k.shape[2]} heads of dim {self.k.shape[3]}")
        if self.q is not None and (q is None or q.shape != (*k.shape[:2], *self.q.shape[2:])):
            raise ValueError(f"this cache keeps the queries: q must be {(*k.shape[:2], *self.q.shape[2:])}, got "
                             f"{None if q is None else tuple(q.shape)}")

    def views(self) -> tuple[Optional[torch.Tensor], torch.Tensor, torch.Tensor]:
        """``(q, k, v)`` as ``[B, H, Nmax, D]`` views (no copy), the layout the decode kernels take."""
        return (None if self.q is None else self.q.transpose(1, 2)), self.k.transpose(1, 2), self.v.transpose(1, 2)


def _int_lengths(lengths) -> torch.Tensor:
    """``lengths`` (an integer tensor, or a list or tuple of ints) as a CPU int64 tensor; floats and bools are refused,
    not rounded."""
    if isinstance(lengths, torch.Tensor):
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
            raise TypeError(f"lengths must be integers, got a {lengths.dtype} tensor")
        return lengths.to("cpu", torch.int64)
    if not is_int_list(lengths):
        raise TypeError(f"lengths must be an integer tensor or a list of ints, got {lengths!r}")
    return torch.tensor(lengths, dtype=torch.int64)


__all__ = ["KVCache"]
