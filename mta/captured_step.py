"""``mta.capture_step``: one decode step of a whole model captured in a CUDA graph, replayed token after token.

A decode step runs a few hundred small kernels whose launches, from Python, cost more than the kernels themselves
at short caches. Captured once, the step is one graph launch. The layers' steps can be captured because nothing in
them waits for the host (:meth:`mta.MultiTokenAttention.step`): each cache's lengths live on the device, and its
host-side bound (:attr:`mta.KVCache.length_bound`) is what :class:`CapturedStep` checks and advances before and
after each replay, where the graph itself cannot.

    captured = mta.capture_step(step_fn, example, caches)
    for _ in range(steps):
        logits = captured(tokens)                    # step_fn(tokens), appending to every cache
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .kv_cache import KVCache

#: Eager runs of the step before the capture: the first compiles the Triton kernels and fills the plan caches, the
#: second runs as the capture will (kernels that initialise lazily, cuBLAS's workspace on the capture's stream).
WARMUP_STEPS = 2


class CapturedStep:
    """A decode step captured in a CUDA graph (made by :func:`capture_step`); ``captured(x)`` replays it.

    Attributes:
        graph: the ``torch.cuda.CUDAGraph``.
        input: the static input ``[B, n, ...]`` the graph reads; output: the static output it writes.
        caches: the :class:`mta.KVCache` s the step appends to, ``n`` tokens per sequence each replay.
        limits: per cache, the host bound past which a replay would overflow it (``max_len - n``).
    """

    def __init__(self, graph: torch.cuda.CUDAGraph, static_input: torch.Tensor, static_output: torch.Tensor,
                 caches: list[KVCache]):
        self.graph, self.input, self.output, self.caches = graph, static_input, static_output, caches
        self.n = static_input.shape[1]
        self.limits = [cache.max_len - self.n for cache in caches]  # the longest a sequence may be before a replay

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``step_fn(x)`` for ``x`` of the example's shape, dtype and device, as a fresh tensor (the graph's own
        output is overwritten by the next replay), with ``n`` tokens appended to every cache. ValueError, before
        anything runs, where a cache has no room for them. Nothing here waits for the device."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a tensor like the example, got {type(x).__name__}")
        if x.shape != self.input.shape or x.dtype != self.input.dtype or x.device != self.input.device:
            raise ValueError(f"the step was captured for x of shape {tuple(self.input.shape)}, {self.input.dtype} "
                             f"on {self.input.device}; got {tuple(x.shape)}, {x.dtype} on {x.device}")
        for i, (cache, limit) in enumerate(zip(self.caches, self.limits)):
            bound = cache.length_bound
            if bound is None or bound > limit:  # the plain comparison first: a model has a cache per layer
                try:
                    cache.check_room(self.n)
                except ValueError as error:
                    raise ValueError(f"caches[{i}]: {error}") from None
        self.input.copy_(x)
        self.graph.replay()
        for cache in self.caches:  # check_room made each bound known
            cache.length_bound += self.n
        return self.output.clone()


def capture_step(step_fn: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor,
                 caches: Sequence[KVCache]) -> CapturedStep:
    """Capture ``step_fn``, one decode step of a whole model, in a CUDA graph.

    Args:
        step_fn: ``x -> Tensor``, e.g. embedding, then each layer's ``layer(h, cache=caches[i])`` (or
            ``layer.step``), then the head; it must append ``n = x.shape[1]`` tokens per sequence to each of
            ``caches`` and nothing else with lasting effect, and run under ``torch.no_grad`` (it is called so).
        example: a tensor of the shape, dtype and device of the ``x`` to come (``[B, n, ...]``), on a CUDA device.
        caches: every :class:`mta.KVCache` that ``step_fn`` appends to, prefilled (a step function that calls
            ``layer(h, cache=cache)`` would capture a prefill on an empty cache) and on ``example``'s device.

    Returns:
        A :class:`CapturedStep`: ``captured(x)`` replays the graph on ``x`` and returns a fresh copy of its output.

    ``step_fn`` runs eagerly twice on a side stream first (:data:`WARMUP_STEPS`), each run undone (the lengths and
    host bounds restored; what it wrote lies past the lengths), then once under capture, which runs nothing: every
    cache is left as it was. The capture synchronises with the device (CUDA graphs do); the replays do not. The
    graph reads and writes the caches' own tensors: :meth:`mta.KVCache.reset` empties a cache and keeps them, so a
    captured step serves the next prompt too.

    Raises:
        RuntimeError: without a CUDA device (a CUDA graph needs one; on the CPU call ``step_fn`` itself).
        ValueError: a cache that is empty, on another device, or without room for one more step.
    """
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
    if not isinstance(example, torch.Tensor):
        raise TypeError(f"example must be a tensor like the step's input, got {type(example).__name__}")
    if example.device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"capture_step needs a CUDA device (it captures a CUDA graph), but example is on "
                           f"{example.device}: without one, call step_fn itself")
    if example.dim() < 2 or example.shape[1] < 1:
        raise ValueError(f"example must be [B, n, ...] with n >= 1 new tokens per sequence, got shape "
                         f"{tuple(example.shape)}")
    caches = list(caches)
    n = example.shape[1]
    for i, cache in enumerate(caches):
        if not isinstance(cache, KVCache):
            raise TypeError(f"caches[{i}] must be an mta.KVCache, got {type(cache).__name__}")
        if cache.k.device != example.device:
            raise ValueError(f"caches[{i}] is on {cache.k.device} but example is on {example.device}")
        cache.check_lengths()
        if cache.is_empty:
            raise ValueError(f"caches[{i}] is empty: prefill it before capturing a decode step (a step function "
                             f"that calls layer(x, cache=cache) would capture a prefill)")
        try:
            cache.check_room(n)  # the warm-up runs a real step; this also makes each host bound known
        except ValueError as error:
            raise ValueError(f"caches[{i}]: {error}") from None

    saved = [(cache.lengths.clone(), cache.length_bound) for cache in caches]

    def restore():
        for cache, (lengths, bound) in zip(caches, saved):
            cache.lengths.copy_(lengths)
            cache.length_bound = bound

    static_input = example.detach().clone()
    stream = torch.cuda.Stream(device=example.device)
    stream.wait_stream(torch.cuda.current_stream(example.device))
    try:
        with torch.no_grad():
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_STEPS):
                    out = step_fn(static_input)
                    restore()
                    if not isinstance(out, torch.Tensor):
                        raise TypeError(f"step_fn must return a tensor, got {type(out).__name__}")
            torch.cuda.current_stream(example.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                static_output = step_fn(static_input)
    finally:
        torch.cuda.current_stream(example.device).wait_stream(stream)  # a warm-up that failed may still run there
        restore()  # the capture ran nothing, but left the host bounds unknown
    return CapturedStep(graph, static_input, static_output, caches)


__all__ = ["CapturedStep", "capture_step", "WARMUP_STEPS"]
