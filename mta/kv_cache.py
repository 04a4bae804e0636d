"""The cache a :class:`mta.MultiTokenAttention` layer decodes from: keys, values and, for MTA, queries.

MTA's convolution looks ``cq - 1`` queries back, so a decode step needs the recent queries as well as the keys
and values (``docs/mta-semantics.md``, "Decode"); :func:`mta.conv_decode_attention` reads them from a query cache
as long as the KV cache. Plain attention keeps no queries.

Layout: ``[B, Nmax, H, D]``, the layout the projections produce, so that appending a token is one indexed write
per tensor; the kernels read the ``[B, H, Nmax, D]`` views (:meth:`KVCache.views`) through their strides.

Each sequence has its own length, ``lengths``, an int32 tensor on the cache's device: positions are computed and
tokens written there, so that a step never waits for the host nor the host for the device, and a step can be
captured in a CUDA graph (:func:`mta.capture_step`) or compiled whole. The host keeps what it needs to check bounds
without reading them: ``length_bound``, an upper bound of the longest length (exact unless a prompt's lengths were
given on the device), kept by :meth:`KVCache.fill` and :meth:`KVCache.append`. Nothing at or past a sequence's
length is ever read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .checks import check_count, is_int_list

#: What the decode kernels read.
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def building_graph(device: torch.device) -> bool:
    """True while ``torch.compile`` traces, or while a CUDA graph is captured on ``device``'s current stream: the
    Python that runs now runs once for what the device then runs many times, so it may neither read nor keep
    host-side facts about the cache (the bound checks move to :class:`mta.CapturedStep`, before each replay)."""
    # is_compiling() first: while tracing, the capture query is never reached (it is not traceable).
    return torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def _mark_static(*tensors: Optional[torch.Tensor]) -> None:
    """Tell ``torch.compile``'s CUDA graphs (``mode="reduce-overhead"``) that these tensors keep their address from
    call to call, so a compiled step may write into them in place: without it, inductor skips CUDA graphs for a
    graph that mutates its inputs. Imported here, for CUDA caches only: ``torch._dynamo`` takes a second to import."""
    from torch._dynamo import mark_static_address
    for t in tensors:
        if t is not None:
            mark_static_address(t)


@dataclass(eq=False)  # compared by identity: a field-wise == of tensors has no single truth value
class KVCache:
    """Keys, values (and queries, for MTA) of one attention layer, for ``B`` sequences of at most ``Nmax`` tokens.

    Attributes:
        k, v: ``[B, Nmax, Hkv, D]``, RoPE already applied to ``k``.
        q: ``[B, Nmax, Hq, D]`` (RoPE applied) for an MTA layer, None for plain attention.
        lengths: ``[B]`` int32 on the cache's device, valid positions per sequence.
        length_bound: host-side upper bound of ``max(lengths)`` (0: the cache is empty), what the bound checks read;
            None where the host cannot know it, after steps inside ``torch.compile`` or a CUDA graph capture run
            by hand (the next eager call that needs it reads the lengths back: one synchronisation). Left out when
            a cache is built by hand, it is read from ``lengths``.
        row_starts: ``[B, 1]`` int64, ``b * Nmax``: where sequence ``b`` starts in the flattened buffers.

    A step writes into these tensors in place, so a CUDA graph that captured one keeps working on them:
    :meth:`reset` empties the cache and keeps them.
    """

    k: torch.Tensor
    v: torch.Tensor
    q: Optional[torch.Tensor]
    lengths: torch.Tensor
    length_bound: Optional[int] = None
    row_starts: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        device = self.k.device
        self.row_starts = torch.arange(self.batch, device=device, dtype=torch.int64)[:, None] * self.max_len
        if self.length_bound is None:
            self.length_bound = int(self.lengths.max()) if self.lengths.numel() else 0
        if device.type == "cuda":
            _mark_static(self.k, self.v, self.q, self.lengths, self.row_starts)

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
                   lengths=torch.zeros(batch, dtype=torch.int32, device=device), length_bound=0)

    @property
    def batch(self) -> int:
        return self.k.shape[0]

    @property
    def max_len(self) -> int:
        return self.k.shape[1]

    @property
    def is_empty(self) -> bool:
        """Every length is 0: a host-side fact (no synchronisation)."""
        return self.length_bound == 0

    def clone(self) -> "KVCache":
        """A copy with buffers of its own (the host bound too)."""
        return KVCache(k=self.k.clone(), v=self.v.clone(), q=None if self.q is None else self.q.clone(),
                       lengths=self.lengths.clone(), length_bound=self.length_bound)

    def reset(self) -> None:
        """Empty the cache (every length 0), keeping its tensors: a captured step still reads and writes them."""
        self.lengths.zero_()
        self.length_bound = 0

    def sync_length_bound(self) -> int:
        """Read the lengths back (one synchronisation with the device) and make :attr:`length_bound` exact."""
        self.length_bound = int(self.lengths.max())
        return self.length_bound

    def check_lengths(self) -> None:
        """The lengths live on the cache's device (ValueError otherwise): a step computes positions from them
        there, and inside a CUDA graph a host tensor could not be read at all."""
        if self.lengths.device != self.k.device:
            raise ValueError(f"cache.lengths is on {self.lengths.device} but the cache is on {self.k.device}: a cache "
                             f"keeps its lengths on its own device (KVCache.empty puts them there)")

    def check_room(self, n: int) -> None:
        """ValueError unless every sequence has room for ``n`` more tokens, from the host-side bound (read back
        first where it is unknown). Skipped while a graph is built (:func:`building_graph`): a graph cannot check a
        host fact at each replay, and its writes past the end are clamped instead."""
        if building_graph(self.k.device):
            return
        bound = self.sync_length_bound() if self.length_bound is None else self.length_bound
        if bound + n > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions: appending {n} token(s) to sequences of up "
                             f"to {bound} tokens does not fit")

    def positions(self, n: int) -> torch.Tensor:
        """``[B, n]`` int32 on the cache's device: the positions ``lengths[b] + t`` the next ``n`` tokens of each
        sequence take."""
        return self.lengths[:, None] + torch.arange(n, device=self.lengths.device, dtype=self.lengths.dtype)

    def write(self, q: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        """Write ``n`` tokens per sequence at ``positions`` ``[B, n]`` (:meth:`positions`), on the device, lengths
        unchanged: what the caller checked (:meth:`check_room`, shapes as in :meth:`append`) is not checked again.
        While a graph is built the positions are clamped to the buffers (an overflow the host did not refuse
        writes nothing outside them)."""
        if building_graph(self.k.device):
            positions = positions.clamp(max=self.max_len - 1)
        index = (self.row_starts + positions).flatten()                 # [B n] rows of the flattened buffers
        for buffer, new in ((self.k, k), (self.v, v), (self.q, q)):
            if buffer is not None:  # a cache holds values, not a graph
                buffer.view(-1, *buffer.shape[2:]).index_copy_(0, index, new.detach().flatten(0, 1).to(buffer.dtype))

    def advance(self, n: int) -> None:
        """Every length grows by ``n`` (on the device), and the host bound with it; while a graph is built the
        host bound becomes unknown (None): the graph's replays advance the lengths without the host."""
        self.lengths += n
        if building_graph(self.k.device):
            self.length_bound = None
        elif self.length_bound is not None:
            self.length_bound += n

    def append(self, q: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``n`` new tokens per sequence at its own positions, then advance ``lengths`` by ``n``.

        Args:
            q: ``[B, n, Hq, D]`` (ignored when the cache keeps no queries); k, v: ``[B, n, Hkv, D]``.
        """
        self._check_tokens(q, k, v)
        n = k.shape[1]
        self.check_room(n)
        self.write(q, k, v, self.positions(n))
        self.advance(n)

    def fill(self, q: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor, lengths=None) -> None:
        """Prefill an empty cache with positions ``0 .. N-1`` of a (right-padded) batch; ``lengths`` ``[B]`` says
        how many of them are real per sequence (default: all ``N``; see :meth:`prompt_lengths`). Shapes as in
        :meth:`append`."""
        if not self.is_empty:
            raise ValueError("prefill needs an empty cache (every length 0)")
        self._check_tokens(q, k, v)
        n = k.shape[1]
        if n > self.max_len:
            raise ValueError(f"a prompt of {n} tokens does not fit a cache of {self.max_len} positions")
        lengths = None if lengths is None else self.prompt_lengths(lengths, n)
        for buffer, new in ((self.k, k), (self.v, v), (self.q, q)):
            if buffer is not None:
                buffer[:, :n] = new.detach().to(buffer.dtype)  # a cache holds values, not a graph
        if lengths is None:
            self.lengths.fill_(n)
            bound = n
        elif isinstance(lengths, list):
            # Non-blocking: a copy from pageable host memory is staged at once and never waits for the device.
            self.lengths.copy_(torch.tensor(lengths, dtype=self.lengths.dtype), non_blocking=True)
            bound = max(lengths)
        else:
            self.lengths.copy_(lengths)
            bound = n
        self.length_bound = None if building_graph(self.k.device) else bound

    def prompt_lengths(self, lengths, n: int):
        """The real lengths of a right-padded prompt batch of ``n`` positions. On the host (None: all ``n``; a list
        or tuple of ints; a CPU integer tensor): checked, a list of ``B`` ints in ``1 .. n``. A tensor on the
        cache's device: its values are not read (that would synchronise) but clamped to ``1 .. n`` on the device,
        and the host then bounds every length by ``n``."""
        if lengths is None:
            return [n] * self.batch
        if isinstance(lengths, torch.Tensor):
            if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
                raise TypeError(f"lengths must be integers, got a {lengths.dtype} tensor")
            if lengths.device.type != "cpu" and lengths.device != self.k.device:
                raise ValueError(f"lengths is on {lengths.device} but the cache is on {self.k.device}")
            if tuple(lengths.shape) != (self.batch,):
                raise ValueError(f"lengths must hold {self.batch} values, got shape {tuple(lengths.shape)}")
            if lengths.device.type != "cpu":
                return lengths.clamp(1, n)
            lengths = lengths.tolist()
        elif not is_int_list(lengths):
            raise TypeError(f"lengths must be an integer tensor or a list of ints, got {lengths!r}")
        lengths = [int(x) for x in lengths]
        if len(lengths) != self.batch or not all(1 <= x <= n for x in lengths):
            raise ValueError(f"lengths must hold {self.batch} values in 1 .. {n}, got {lengths}")
        return lengths

    def _check_tokens(self, q: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor) -> None:
        """Before anything is written: ``k``, ``v`` ``[B, n, Hkv, D]`` and (when queries are kept) ``q``
        ``[B, n, Hq, D]``, with this cache's ``B``, heads and head dim, on its device (its lengths too)."""
        self.check_lengths()
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


__all__ = ["CACHE_DTYPES", "KVCache", "building_graph"]
