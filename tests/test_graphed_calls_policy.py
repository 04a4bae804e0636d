"""When :class:`mta.graphed_calls.GraphedCalls` replays, captures or runs eagerly (on any machine: the capture is a
stand-in that records its calls and returns a replay that says so)."""

from __future__ import annotations

from mta.graphed_calls import GraphedCalls


class StandIn:
    """A capture that records the signatures it captures; its graphs return ``("replayed", x)``."""

    def __init__(self):
        self.captured = []

    def __call__(self, fn, inputs):
        self.captured.append(inputs[0])
        return fn(*inputs), lambda *x: ("replayed", *x)


def call(graphs: GraphedCalls, signature: str):
    """A call of ``signature`` whose eager run returns ``("eager", signature)``."""
    return graphs.replay_or_capture(signature, lambda x: ("eager", x), (signature,))


def test_a_signature_is_captured_at_its_second_call_and_replayed_after():
    capture = StandIn()
    graphs = GraphedCalls(capture=capture)
    assert [call(graphs, "a") for _ in range(4)] == [("eager", "a")] * 2 + [("replayed", "a")] * 2
    assert capture.captured == ["a"] and len(graphs) == 1


def test_a_dropped_graph_leaves_its_signature_eager_for_good():
    capture = StandIn()
    graphs = GraphedCalls(size=2, capture=capture)
    for _ in range(4):  # three signatures in turn, two graphs kept
        results = [call(graphs, s) for s in "abc"]
    assert results == [("eager", "a"), ("replayed", "b"), ("replayed", "c")]
    assert capture.captured == ["a", "b", "c"] and len(graphs) == 2


def test_a_failed_capture_leaves_its_signature_eager():
    captured = []

    def failing(fn, inputs):
        captured.append(inputs[0])
        return fn(*inputs), None
    graphs = GraphedCalls(capture=failing)
    assert [call(graphs, "a") for _ in range(4)] == [("eager", "a")] * 4
    assert captured == ["a"] and len(graphs) == 0


def test_cleared_graphs_are_captured_again():
    capture = StandIn()
    graphs = GraphedCalls(size=1, capture=capture)
    for s in "abab":
        call(graphs, s)
    graphs.clear()
    assert [call(graphs, s) for s in "aaa"] == [("eager", "a")] * 2 + [("replayed", "a")]
    assert capture.captured == ["a", "b", "a"] and len(graphs) == 1
