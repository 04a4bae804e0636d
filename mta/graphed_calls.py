"""Calls replayed from CUDA graphs, one graph per call signature.

The MTA backward launches twenty kernels and more, more as N grows (the two-phase backward walks chunks of keys),
and their Python costs a millisecond a call and more: several times the GPU's work at the lengths a model trains at,
and a host busy with launches wherever the GPU's work is longer. A user's loop pays that on every call. Its launches
depend only on the call's signature (shapes, strides, dtypes, flags), so a signature seen before is captured
once into a CUDA graph that reads static copies of the inputs; after that a call is a copy in per dtype of the inputs
(``torch._foreach_copy_``: one launch for all of them), one replay and a copy out per dtype of the outputs: a handful
of launches made from C++, whatever the number of kernels inside.

:meth:`GraphedCalls.run` on a call signature:

1. first call: ``fn(*inputs)``, eagerly (it compiles its kernels and makes its launches);
2. second call: the inputs copied into static tensors of the same layout, ``fn`` run eagerly on them (on a side
   stream: whatever initialises lazily does so outside the capture), then captured on them, which runs nothing;
3. later calls: the inputs copied in, the graph replayed, its outputs copied out (the next replay overwrites them).

A graph is kept per call signature and stream. It holds its call's memory for as long as it is kept: the static
inputs and outputs, and the workspace its kernels use (its own memory pool, where an eager call would hand the
workspace back to PyTorch's cache for the next op). At most :data:`MAX_GRAPHS` graphs are kept, the oldest dropped
first; a signature whose graph was dropped runs eagerly from then on, so that a loop over more signatures than that
pays each capture once, not at every call. :func:`release_graphs` drops every graph, and their memory goes back to
PyTorch's cache; later calls capture again. A capture that runs out of memory leaves its signature eager.

A call runs eagerly, as it would without this, where it cannot be captured: in Triton's interpreter, in
:func:`mta.launch.compile_ahead`'s dry run (which launches nothing), while Triton's launch hooks are installed (a
profiler's hooks see each kernel's launch, never a replay), inside another capture (``torch.cuda.graph``,
``torch.compile(mode="reduce-overhead")``), where an input's layout has no dense copy, where its capture failed
once, or where its graph was dropped.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Callable

import torch

from . import runtime
from .compiled_launches import launch_hooks_installed
from .launch import in_dry_run

#: Graphs kept, by call signature (the oldest dropped first): a model has a few signatures, and each graph holds
#: its call's memory (static inputs and outputs, workspace).
MAX_GRAPHS = 8
#: Signatures remembered as seen once, and as eager: a signature is captured at its second call, never at a one-off
#: one, and once only.
MAX_SEEN = 1024


class GraphedCall:
    """One call signature's CUDA graph: ``graph`` reads ``inputs`` and writes ``outputs`` (static tensors)."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: tuple, outputs: tuple):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs
        self.input_groups = dtype_groups(inputs)
        self.output_groups = dtype_groups(outputs)

    def __call__(self, *inputs) -> tuple:
        """The outputs of the captured call on ``inputs`` (of the signature's layout), as new tensors."""
        for group, static in self.input_groups:
            torch._foreach_copy_(static, [inputs[i] for i in group])
        self.graph.replay()
        outputs = [torch.empty_like(out) for out in self.outputs]
        for group, static in self.output_groups:
            torch._foreach_copy_([outputs[i] for i in group], static)
        return tuple(outputs)


def dtype_groups(tensors: tuple) -> list[tuple[list[int], list[torch.Tensor]]]:
    """``tensors`` by dtype: ``(indices, tensors)`` per dtype, in order of first appearance. A copy of a group is one
    ``torch._foreach_copy_``: one launch for all its tensors, where a copy each costs a launch each."""
    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return [(group, [tensors[i] for i in group]) for group in groups.values()]


class GraphedCalls:
    """CUDA graphs of one function, by call signature (:meth:`run`)."""

    def __init__(self, size: int = MAX_GRAPHS, capture: Callable | None = None):
        self.size = size
        self.capture = capture or capture_graph  # (fn, inputs) -> (outputs, GraphedCall or None)
        self._graphs: OrderedDict = OrderedDict()  # signature -> GraphedCall, the most recently replayed last
        self._eager: OrderedDict = OrderedDict()  # signatures that run eagerly: their capture failed or was dropped
        self._seen: OrderedDict = OrderedDict()  # signatures called once
        ALL_GRAPHED_CALLS.add(self)

    def __len__(self) -> int:
        """Signatures with a captured graph."""
        return len(self._graphs)

    def clear(self) -> None:
        """Drop every graph and every signature seen: the next call of any signature runs eagerly."""
        self._graphs.clear()
        self._eager.clear()
        self._seen.clear()

    def run(self, signature, fn: Callable[..., tuple], *inputs: torch.Tensor) -> tuple:
        """``fn(*inputs)``, a tuple of tensors, from the graph kept for ``signature`` where there is one (see the
        module docstring for when one is made). ``signature`` must hold everything ``fn``'s launches depend on but
        the inputs' addresses, their layouts included; ``fn`` must write only tensors it allocates."""
        if (runtime.INTERPRET or in_dry_run() or torch.cuda.is_current_stream_capturing()
                or launch_hooks_installed()):
            return fn(*inputs)  # a dry run only compiles; a profiler's launch hooks see launches, not replays
        # A graph per stream (a graph's static buffers serve one replay at a time) and per autocast state (a
        # product inside may follow it).
        signature = (signature, current_raw_stream(inputs[0].device.index), torch.is_autocast_enabled("cuda"))
        return self.replay_or_capture(signature, fn, inputs)

    def replay_or_capture(self, signature, fn: Callable[..., tuple], inputs: tuple) -> tuple:
        """What :meth:`run` does with a call that can be captured: replay its graph, else run ``fn`` eagerly (a first
        call, or a signature kept eager), else capture it (a second call)."""
        graphed = self._graphs.get(signature)
        if graphed is not None:
            self._graphs.move_to_end(signature)
            return graphed(*inputs)
        if signature in self._eager:
            return fn(*inputs)
        if signature not in self._seen:
            remember(self._seen, signature)
            return fn(*inputs)
        del self._seen[signature]
        outputs, graphed = self.capture(fn, inputs)
        if graphed is None:
            remember(self._eager, signature)
        else:
            self._graphs[signature] = graphed
            if len(self._graphs) > self.size:
                # Captured once only: a loop over more signatures than graphs would otherwise capture at every call.
                remember(self._eager, self._graphs.popitem(last=False)[0])
        return outputs


def remember(signatures: OrderedDict, signature) -> None:
    """Add ``signature`` to ``signatures``, forgetting the oldest past :data:`MAX_SEEN`."""
    signatures[signature] = None
    if len(signatures) > MAX_SEEN:
        signatures.popitem(last=False)


#: Every :class:`GraphedCalls` alive (:func:`release_graphs`).
ALL_GRAPHED_CALLS: "weakref.WeakSet[GraphedCalls]" = weakref.WeakSet()


def release_graphs() -> None:
    """Drop every CUDA graph kept for MTA calls, and with them the memory they hold (static inputs and
    outputs, their kernels' workspace): for a program that needs that memory back, and for a measurement of a
    call's own working memory. Later calls capture their graphs again, at each signature's second call."""
    for graphed_calls in list(ALL_GRAPHED_CALLS):
        graphed_calls.clear()


#: Why each failed capture failed (for tests).
CAPTURE_ERRORS: list = []


def current_raw_stream(device_index: int) -> int:
    """The address of GPU ``device_index``'s current stream."""
    return torch._C._cuda_getCurrentRawStream(device_index)


def capture_graph(fn: Callable[..., tuple], inputs: tuple) -> tuple[tuple, GraphedCall | None]:
    """``(fn(*inputs), graphed)``: ``fn`` run eagerly on static copies of ``inputs``, then captured on them;
    ``graphed`` None where an input has no dense copy of its layout, the copies do not fit in memory or the capture
    fails (the outputs are then an eager run's)."""
    device = inputs[0].device
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device=device)
    side.wait_stream(current)
    try:
        static, outputs = run_on_static_copies(fn, inputs, side)
    except torch.cuda.OutOfMemoryError:  # no room for a graph's copies: this signature stays eager
        static = outputs = None
    finally:
        current.wait_stream(side)
    if static is None:
        return fn(*inputs), None
    for t in (*static, *outputs):  # made on the side stream, used on the current one
        t.record_stream(current)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                captured = fn(*static)
            finally:
                graph.capture_end()
    except RuntimeError as error:  # something in fn cannot be captured (or its pool does not fit): it stays eager
        CAPTURE_ERRORS.append(repr(error))
        return outputs, None
    finally:
        current.wait_stream(side)
    return outputs, GraphedCall(graph, static, captured)


def run_on_static_copies(fn: Callable[..., tuple], inputs: tuple, side: torch.cuda.Stream) -> tuple:
    """``(static, fn(*static))`` on ``side``, ``static`` dense copies of ``inputs`` of the same layout; ``(None,
    None)`` where ``empty_like`` does not keep an input's layout. Everything here is allocated on the side
    stream: outside any pool that the caller's stream allocates from (torch.compile's CUDA graphs warm up inside
    theirs), and so outside their bookkeeping."""
    with torch.cuda.stream(side):
        static = tuple(torch.empty_like(x) for x in inputs)
        if any(s.stride() != x.stride() for s, x in zip(static, inputs)):
            return None, None
        for s, x in zip(static, inputs):
            s.copy_(x)
        return static, fn(*static)


__all__ = ["GraphedCall", "GraphedCalls", "MAX_GRAPHS", "capture_graph", "release_graphs"]
