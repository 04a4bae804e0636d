"""The conv benchmark on the CPU: shapes, the reference's memory fit (its live N x N matrices counted
op by op), the measuring loop with fake timers over both passes (OOM, skips of one pass or all,
failed checks of the output and of the gradients), ratios and the headline, the tables, the figure,
resuming, the command line."""

from __future__ import annotations

import json
import pathlib
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mta.bench import conv as cb
from mta.bench import flash as fb
from mta.bench.timing import WALL_TIMING
from mta.bench import harness, plots
from mta.course.figures import FIGURES_DIR
from mta.reference import conv_attention_reference, naive_attention

ROOT = pathlib.Path(__file__).resolve().parents[1]
GIB = 2 ** 30


# --- shapes ----------------------------------------------------------------------------------


def test_full_shape_list_matches_the_spec():
    shapes = cb.conv_shapes()
    keys = {(s.batch, s.heads, s.kv_heads, s.head_dim, s.cq, s.ck, s.seq_len) for s in shapes}
    expected = {(1, h, h, d, cq, ck, n) for (h, d) in ((8, 64), (16, 128)) for (cq, ck) in ((6, 11), (11, 11))
                for n in (1024, 2048, 4096, 8192, 16384)}
    assert keys == expected and len(shapes) == len(expected) == 20
    assert {s.dtype for s in shapes} == {"bfloat16"} and all(s.causal for s in shapes)
    # Grouped by (configuration, kernel), N increasing, so the progress bar and table read in order.
    assert [s.seq_len for s in shapes[:5]] == [1024, 2048, 4096, 8192, 16384]
    groups = [(s.heads, s.cq) for s in shapes]
    assert len(set(groups)) == 4 and groups == sorted(groups, key=groups.index)


def test_quick_shapes():
    quick = cb.conv_shapes(quick=True)
    assert set(quick) < set(cb.conv_shapes())
    assert {(s.heads, s.head_dim, s.cq, s.ck, s.seq_len) for s in quick} == \
        {(h, d, 6, 11, n) for (h, d) in ((8, 64), (16, 128)) for n in (2048, 8192)}
    # The headline's shape (N=8192, 6x11, both configurations) is in the quick set.
    assert sum(s.seq_len == 8192 and (s.cq, s.ck) == (6, 11) for s in quick) == 2


def test_random_inputs_are_bf16_activations_and_per_head_fp32_weights():
    shape = cb.ConvShape("bfloat16", 1, 4, 2, 16, 6, 11, 32)
    q, k, v, w = cb.random_inputs(shape, "cpu")
    assert q.shape == (1, 4, 32, 16) and k.shape == v.shape == (1, 2, 32, 16)
    assert q.dtype == k.dtype == v.dtype == torch.bfloat16 and not q.requires_grad
    assert w.shape == (4, 6, 11) and w.dtype == torch.float32
    assert (w != 0).all() and 0.1 < w.std().item() < 0.3
    assert not torch.equal(w[0], w[1])  # a different kernel per head


# --- the reference's memory fit --------------------------------------------------------------


def test_reference_estimate_is_six_fp32_n_by_n_matrices_and_eight_with_the_backward():
    assert cb.reference_bytes_estimate(1, 8, 8192) == 6 * 8 * 8192 * 8192 * 4
    assert cb.reference_bytes_estimate(2, 16, 1024) == 2 * cb.reference_bytes_estimate(1, 16, 1024)
    assert cb.reference_bytes_estimate(1, 8, 8192, cb.REFERENCE_LIVE_MATRICES_BACKWARD) == 8 * 8 * 8192 * 8192 * 4


class LiveStorages(TorchDispatchMode):
    """The peak bytes of the storages that ops made inside the mode and that are still alive (what a caching
    allocator's peak counts, less the kernels' own workspaces): PyTorch keeps a storage's Python object as long
    as the storage lives, so a finalizer on it sees the storage freed."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.seen = set()

    def _freed(self, key, nbytes):
        self.live -= nbytes
        self.seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            storage = t.untyped_storage() if isinstance(t, torch.Tensor) else None
            if storage is not None and storage._cdata not in self.seen:
                self.seen.add(storage._cdata)
                self.live += storage.nbytes()
                weakref.finalize(storage, self._freed, storage._cdata, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out


def live_matrices(fn, batch, heads, seq_len):
    """The peak of ``fn()`` in fp32 ``[B, H, N, N]`` matrices, op by op."""
    with LiveStorages() as mode:
        fn()
    return mode.peak / (batch * heads * seq_len * seq_len * 4)


@pytest.mark.parametrize("cq, ck", [(6, 11), (11, 11)])
def test_the_matrix_counts_bound_what_the_reference_keeps_alive(cq, ck):
    """The reference's forward, and its forward+backward with every input requiring grad, counted op by op on
    the CPU: the backward keeps more N x N matrices alive (padded scores and softmax saved, then dP and dC),
    and each count is under its bound with room for what ops cannot show (cuDNN workspaces, logsumexp's
    temporary)."""
    shape = cb.ConvShape("bfloat16", 1, 4, 4, 16, cq, ck, 256)
    q, k, v, w = cb.random_inputs(shape, "cpu")
    dout = torch.randn_like(q)
    forward = live_matrices(lambda: conv_attention_reference(q, k, v, w, causal=True), 1, 4, 256)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, w)]
    both = live_matrices(lambda: conv_attention_reference(*leaves, causal=True).backward(dout), 1, 4, 256)
    assert all(t.grad is not None for t in leaves)
    assert 3 <= forward < 3.5 and 4 <= both < 4.6, (forward, both)  # the counts the constants' comments give
    assert forward * 1.5 < cb.REFERENCE_LIVE_MATRICES and both * 1.5 < cb.REFERENCE_LIVE_MATRICES_BACKWARD


@pytest.mark.parametrize("free_gib", [79, 139])
def test_memory_fit_skips_big_n_only(free_gib):
    """On an H100 (79 GiB free) or an H200 (139 GiB): what runs and what is skipped."""
    fits = {(s.heads, s.seq_len): cb.reference_fit(s, free_gib * GIB) for s in cb.conv_shapes()}
    for (heads, n), fit in fits.items():
        expected = 6 * heads * n * n * 4 <= 0.6 * free_gib * GIB
        assert fit["fits"] is expected and fit["estimate_bytes"] == 6 * heads * n * n * 4
        assert (fit["reason"] is None) == expected
    # Up to N=8192 the reference always fits (H=16, D=128: 6 x 4 GiB = 24 GiB).
    assert all(fit["fits"] for (h, n), fit in fits.items() if n <= 8192)
    # At N=16384, H=16 needs 96 GiB: skipped on both, with the numbers in the reason.
    big = fits[(16, 16384)]
    assert not big["fits"] and "96.0 GiB" in big["reason"] and f"{free_gib:.1f} GiB free" in big["reason"]
    # H=8 at N=16384 (48 GiB) fits only on the H200.
    assert fits[(8, 16384)]["fits"] is (free_gib == 139)
    # The correctness check on a slice of heads: how many heads of the reference fit.
    assert big["heads_that_fit"] == int(0.6 * free_gib * GIB // (6 * 16384 * 16384 * 4))
    assert 1 <= big["heads_that_fit"] < 16


@pytest.mark.parametrize("free_gib", [79, 139])
def test_memory_fit_of_each_pass_and_of_the_gradient_check(free_gib):
    """Eight matrices for the forward+backward: on these GPUs the same shapes run as for the forward; the
    float64 gradient check (16 fp32-sized matrices) takes a slice of heads from N=8192 on."""
    for s in cb.conv_shapes():
        fits = cb.reference_fits(s, free_gib * GIB)
        m = s.heads * s.seq_len ** 2 * 4
        assert fits["fwd"] == cb.reference_fit(s, free_gib * GIB)
        assert fits["fwd_bwd"]["estimate_bytes"] == 8 * m and fits["grad"]["estimate_bytes"] == 16 * m
        assert fits["fwd_bwd"]["fits"] is (8 * m <= 0.6 * free_gib * GIB) is fits["fwd"]["fits"]
        assert fits["grad"]["heads_that_fit"] >= 1
        if not fits["fwd_bwd"]["fits"]:
            assert fits["fwd_bwd"]["reason"].startswith("not run: the reference's forward+backward needs")
    small = cb.reference_fits(cb.ConvShape("bfloat16", 1, 16, 16, 128, 6, 11, 8192), 79 * GIB)
    assert small["fwd_bwd"]["fits"] and small["grad"]["heads_that_fit"] == int(0.6 * 79 * GIB // (16 * 8192 ** 2 * 4))


def test_the_check_takes_leading_heads_in_whole_gqa_groups():
    ran = []
    for heads, kv_heads, wanted in ((16, 16, 5), (8, 2, 5), (8, 2, 3)):
        shape = cb.ConvShape("float32", 1, heads, kv_heads, 8, 3, 5, 16)
        assert cb._on_leading_heads(shape, wanted, lambda hq, hkv: ran.append((hq, hkv)), "reference", []) is None
    assert ran == [(5, 5), (4, 1), (3, 1)]  # groups of 4: one whole group; part of the first, all on kv head 0
    notes = []
    assert cb._on_leading_heads(shape, 0, None, "reference", notes) == \
        "no reference fits in memory, not even on one head"
    assert notes == []


def test_oom_is_recognized_also_when_wrapped():
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
    assert harness.is_oom(oom)
    try:
        try:
            raise oom
        except Exception as inner:
            raise RuntimeError("backend compiler failed") from inner
    except RuntimeError as wrapped:
        assert harness.is_oom(wrapped)
    assert not harness.is_oom(RuntimeError("No available kernel"))


# --- the measuring loop, on the CPU with fake timers ------------------------------------------

FWD_MS = {"mta_conv": 2.0, "mta_flash": 1.0, "sdpa_flash": 0.5, "sdpa_cudnn": 0.4, "conv_reference": 80.0,
          "conv_reference_compiled": 40.0}
PEAK = {"mta_conv": 1000, "mta_flash": 500, "sdpa_flash": 400, "sdpa_cudnn": 300, "conv_reference": 100_000,
        "conv_reference_compiled": 60_000}
#: The forward+backward's numbers: those of the forward times a factor of each implementation's.
FWD_BWD_MS = {name: ms * (3 + i) for i, (name, ms) in enumerate(FWD_MS.items())}
FWD_BWD_PEAK = {name: b * (2 + i) for i, (name, b) in enumerate(PEAK.items())}


class FakeGPU:
    """A timer and a memory probe that run the call, as real ones would (errors surface there; the
    timer runs ``before_each`` first), and report the numbers of the implementation that ran last
    (see :func:`measured`)."""

    current_ms = current_bytes = None

    def timer(self, fn, before_each=None):
        if before_each is not None:
            before_each()
        fn()
        return self.current_ms

    def memory(self, fn):
        fn()
        return self.current_bytes


GPU = FakeGPU()


def measured(name, fn):
    """``fn`` wrapped so that the fake timer and memory probe report ``name``'s numbers, those of the
    forward+backward when the inputs require grad."""
    def impl(q, k, v, weight, causal):
        backward = q.requires_grad
        GPU.current_ms = (FWD_BWD_MS if backward else FWD_MS)[name]
        GPU.current_bytes = (FWD_BWD_PEAK if backward else PEAK)[name]
        return fn(q, k, v, weight, causal)
    return impl


def exact(q, k, v, weight, causal):
    return conv_attention_reference(q, k, v, weight, causal=causal)


def wrong(q, k, v, weight, causal):
    return conv_attention_reference(q, k, v, weight.flip(-1), causal=causal)  # a mirrored kernel: a plausible bug


def doubled_backward(q, k, v, weight, causal):
    out = exact(q, k, v, weight, causal)
    return 2 * out - out.detach()  # the right output, every gradient twice too large


def no_weight_grad(q, k, v, weight, causal):
    return exact(q, k, v, weight.detach(), causal)  # a backward that forgets dweight


def plain(q, k, v, weight, causal):
    """Plain attention (GQA too), ignores the weight."""
    return naive_attention(q, k, v, causal=causal)


def out_of_memory(q, k, v, weight, causal):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 GiB")


class OutOfMemoryInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out):
        return out.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 GiB")


def backward_out_of_memory(q, k, v, weight, causal):
    return OutOfMemoryInBackward.apply(exact(q, k, v, weight, causal))


def compile_failure(q, k, v, weight, causal):
    raise RuntimeError("BackendCompilerFailed: inductor raised")


def impls(**override):
    base = {"mta_conv": exact, "mta_flash": plain, "sdpa_flash": plain, "sdpa_cudnn": plain, "conv_reference": exact,
            "conv_reference_compiled": exact}
    base.update(override)
    return {name: measured(name, fn) for name, fn in base.items()}


TINY = [cb.ConvShape("float32", 1, 4, 2, 8, 3, 5, n) for n in (16, 24)]
PLENTY = 10 * GIB


TOOLS = harness.Tools(timer=GPU.timer, memory=GPU.memory, device="cpu", warn=print)


def bench(impl_dict, free=PLENTY):
    return cb.ConvBenchmark(impls=impl_dict, free_memory=lambda: free)


def run_tiny(impl_dict, shapes=TINY, free=PLENTY):
    torch.manual_seed(0)
    return harness.run_shapes(bench(impl_dict, free), shapes, TOOLS, progress=False)


def test_records_carry_both_passes_and_a_passing_check_of_output_and_gradients():
    results = run_tiny(impls())
    assert len(results) == 6 * len(TINY)
    for r in results:
        assert r["status"] == "ok" and r["error"] is None and r["bwd_error"] is None
        assert r["fwd_ms"] == FWD_MS[r["impl"]] and r["peak_extra_bytes"] == PEAK[r["impl"]]
        assert r["fwd_bwd_ms"] == FWD_BWD_MS[r["impl"]] and r["fwd_bwd_peak_extra_bytes"] == FWD_BWD_PEAK[r["impl"]]
        assert ("check" in r) == (r["impl"] == "mta_conv")
    for r in plots.select(results, impl="mta_conv"):
        check = r["check"]
        assert check["ok"] and check["rel_err"] < 1e-6 and check["heads_checked"] == 4, check
        assert "all heads" in check["reference"] and check["reference_fit"]["fits"]
        assert set(check["grad_rel_err"]) == {"dq", "dk", "dv", "dweight"} and check["grad_heads_checked"] == 4
        assert all(e < 1e-5 for e in check["grad_rel_err"].values()), check  # fp32 against float64
        assert check["grad_tolerance"] == 1e-3 and "float64" in check["grad_reference"]
        assert "grad rel err dq" in cb.format_check(check)
    json.dumps(harness.json_safe(results), allow_nan=False)


def test_the_forward_runs_without_grad_and_the_backward_on_cleared_leaves():
    seen = []

    def spy(q, k, v, weight, causal):
        tensors = (q, k, v, weight)
        seen.append(([t.requires_grad for t in tensors], [t.grad is None for t in tensors]))
        return exact(q, k, v, weight, causal)

    conv = bench({"mta_conv": spy})
    inputs = conv.inputs(TINY[0], "cpu")
    calls = conv.calls(spy, TINY[0], inputs)
    assert list(calls) == ["fwd", "fwd_bwd"] and calls["fwd"][1] is None
    calls["fwd"][0]()
    call, reset = calls["fwd_bwd"]
    call()
    call()  # without the reset the gradients from the first call are still there
    reset()
    call()
    assert seen == [([False] * 4, [True] * 4), ([True] * 4, [True] * 4), ([True] * 4, [False] * 4),
                    ([True] * 4, [True] * 4)]
    assert not any(t.requires_grad for t in inputs[:5])  # the leaves share the inputs' memory, not their flag


@pytest.mark.parametrize("bad, wrong_grads", [(doubled_backward, {"dq", "dk", "dv", "dweight"}),
                                              (no_weight_grad, {"dweight"})])
def test_a_wrong_gradient_fails_the_check(bad, wrong_grads, capsys):
    results = run_tiny(impls(mta_conv=bad), shapes=TINY[:1])
    check = results[0]["check"]
    assert check["rel_err"] < 1e-6 and not check["ok"]  # the output is right
    assert {name for name, e in check["grad_rel_err"].items() if e > 0.5} == wrong_grads, check
    assert all(e < 1e-5 for name, e in check["grad_rel_err"].items() if name not in wrong_grads)
    assert capsys.readouterr().out.count("!!! mta_conv FAILS ITS CHECK") == 1
    assert cb.format_table(results).splitlines()[-1].endswith(" !")  # in the forward+backward table too


def tables(text):
    """The rows of each table of :func:`cb.format_table` (after its title, header and rule)."""
    return [block.splitlines()[3:] for block in text.split("\n\n")]


def test_a_wrong_kernel_fails_its_check_and_is_reported(capsys):
    results = run_tiny(impls(mta_conv=wrong))
    checks = [r["check"] for r in results if r["impl"] == "mta_conv"]
    assert [c["ok"] for c in checks] == [False, False] and all(c["rel_err"] > 0.05 for c in checks)
    assert all(c["grad_rel_err"]["dweight"] > 0.05 for c in checks)  # the mirrored kernel's gradient is wrong too
    assert capsys.readouterr().out.count("!!! mta_conv FAILS ITS CHECK") == 2
    forward, backward = tables(cb.format_table(results))
    assert len(forward) == len(backward) == 2 and all(line.endswith(" !") for line in forward + backward)


def test_a_crashing_kernel_fails_its_check_with_the_error():
    results = run_tiny(impls(mta_conv=compile_failure), shapes=TINY[:1])
    check = results[0]["check"]
    assert check["ok"] is False and check["rel_err"] is None and "BackendCompilerFailed" in check["error"]
    assert check["grad_rel_err"] is None and "forward+backward raised RuntimeError" in check["error"]


def test_an_oom_is_recorded_and_the_run_goes_on():
    results = run_tiny(impls(conv_reference=out_of_memory))
    assert len(results) == 6 * len(TINY)  # the second shape is measured too
    for shape in TINY:
        by_impl = {r["impl"]: r for r in plots.select(results, seq_len=shape.seq_len)}
        dead = by_impl["conv_reference"]
        assert dead["status"] == "oom" and "out of memory" in dead["error"]
        assert dead["fwd_ms"] is dead["peak_extra_bytes"] is dead["fwd_bwd_ms"] is dead["bwd_error"] is None
        after = by_impl["conv_reference_compiled"]  # measured after the OOM
        assert after["status"] == "ok" and after["fwd_ms"] == FWD_MS["conv_reference_compiled"]
        assert by_impl["mta_conv"]["check"]["ok"]  # the check uses the real reference, not the timed one


def test_an_oom_in_the_backward_keeps_the_forward():
    results = run_tiny(impls(conv_reference_compiled=backward_out_of_memory), shapes=TINY[:1])
    (dead,) = plots.select(results, impl="conv_reference_compiled")
    assert dead["status"] == "oom" and dead["error"] is None and "128.00 GiB" in dead["bwd_error"]
    assert dead["fwd_ms"] == FWD_MS["conv_reference_compiled"] and dead["fwd_bwd_ms"] is None
    row = tables(cb.format_table(results))[1][0]
    assert row.count("oom") == 2  # its fwd+bwd time and memory


def sdpa_with(backend):
    """SDPA restricted to one backend, as the conv benchmark times it (the weight ignored)."""
    return cb.ignoring_weight(fb.sdpa_with(backend))


def test_a_refusing_sdpa_backend_is_recorded_not_fatal():
    """The real SDPA implementations on the CPU: the flash backend runs both passes, cuDNN refuses."""
    results = run_tiny(impls(sdpa_flash=sdpa_with("FLASH_ATTENTION"), sdpa_cudnn=sdpa_with("CUDNN_ATTENTION")),
                       shapes=TINY[:1])
    by_impl = {r["impl"]: r for r in results}
    assert by_impl["sdpa_flash"]["status"] == "ok" and by_impl["sdpa_flash"]["fwd_bwd_ms"] == FWD_BWD_MS["sdpa_flash"]
    refused = by_impl["sdpa_cudnn"]
    assert refused["status"] == "error" and "RuntimeError" in refused["error"] and refused["fwd_ms"] is None
    assert all(r["status"] == "ok" for r in results if r["impl"] != "sdpa_cudnn")
    assert [n.__name__ for n in (sdpa_with("FLASH_ATTENTION"), sdpa_with("CUDNN_ATTENTION"))] == \
        ["sdpa_flash", "sdpa_cudnn"]
    assert list(cb.default_impls(compile_reference=False)) == [n for n in cb.IMPLS if n != "conv_reference_compiled"]


def test_a_compile_failure_is_recorded_not_fatal():
    results = run_tiny(impls(conv_reference_compiled=compile_failure))
    failed = plots.select(results, impl="conv_reference_compiled")
    assert len(failed) == 2 and all(r["status"] == "error" and "BackendCompilerFailed" in r["error"] for r in failed)
    assert all(r["status"] == "ok" for r in results if r["impl"] != "conv_reference_compiled")


def test_a_reference_that_does_not_fit_is_skipped_and_the_check_uses_a_slice():
    per_head = cb.reference_bytes_estimate(1, 1, 24)
    free = int(3.2 * per_head / 0.6)  # room for 3 of the 4 heads at N=24: 2 keep the GQA groups whole
    results = run_tiny(impls(), shapes=TINY[1:], free=free)
    by_impl = {r["impl"]: r for r in results}
    for name in cb.REFERENCE_IMPLS:
        assert by_impl[name]["status"] == "skipped" and by_impl[name]["fwd_ms"] is by_impl[name]["fwd_bwd_ms"] is None
        assert "not run: the reference needs" in by_impl[name]["error"]
        assert "not run: the reference's forward+backward needs" in by_impl[name]["bwd_error"]
    assert by_impl["mta_flash"]["status"] == "ok"
    check = by_impl["mta_conv"]["check"]
    assert check["ok"] and check["heads_checked"] == 2 and "float32 inputs, query heads 0..1 of 4" in check["reference"]
    assert check["grad_heads_checked"] == 1  # room for 1.2 heads of the float64 forward+backward (16 matrices)
    # The tables say why the reference is missing.
    for rows in tables(cb.format_table(results)):
        assert rows[0].count("skip") == 4  # time and memory of both references


def test_the_harness_skips_single_passes():
    tools = harness.Tools(timer=lambda fn, before_each=None: fn() or 1.5, memory=lambda fn: fn() or 7)
    ran = []
    calls = {p.name: ((lambda name=p.name: ran.append(name)), None) for p in cb.PASSES}
    m = harness.measure(calls, cb.PASSES, tools, {"fwd_bwd": "not run: too big"})
    assert ran == ["fwd", "fwd"]  # timed, then its memory measured
    assert m == {"fwd_ms": 1.5, "peak_extra_bytes": 7, "error": None, "fwd_bwd_ms": None,
                 "fwd_bwd_peak_extra_bytes": None, "bwd_error": "not run: too big", "status": "skipped"}
    ran.clear()
    m = harness.measure(calls, cb.PASSES, tools, {"fwd": "not run: a", "fwd_bwd": "not run: b"})
    assert ran == [] and m["status"] == "skipped" and (m["error"], m["bwd_error"]) == ("not run: a", "not run: b")
    m = harness.measure({"fwd": (out_of_memory_call, None)}, cb.PASSES, tools, {"fwd_bwd": "not run: too big"})
    assert m["status"] == "oom" and "out of memory" in m["error"]  # a failure says more than a skip
    m = harness.measure(calls, cb.PASSES, tools)
    assert m["status"] == "ok" and ran == ["fwd", "fwd", "fwd_bwd", "fwd_bwd"]


def out_of_memory_call():
    raise torch.cuda.OutOfMemoryError("CUDA out of memory.")


def test_a_reference_whose_backward_does_not_fit_runs_its_forward_only():
    estimate = cb.reference_bytes_estimate(1, 4, 24)
    free = int(1.1 * estimate / 0.6)  # the forward's 6 matrices fit, the forward+backward's 8 do not
    results = run_tiny(impls(), shapes=TINY[1:], free=free)
    by_impl = {r["impl"]: r for r in results}
    for name in cb.REFERENCE_IMPLS:
        r = by_impl[name]
        assert r["status"] == "skipped" and r["error"] is None
        assert r["fwd_ms"] == FWD_MS[name] and r["peak_extra_bytes"] == PEAK[name]  # the forward was measured
        assert r["fwd_bwd_ms"] is r["fwd_bwd_peak_extra_bytes"] is None
        assert r["bwd_error"].startswith("not run: the reference's forward+backward needs")
    assert all(r["status"] == "ok" and r["fwd_bwd_ms"] for r in results if r["impl"] not in cb.REFERENCE_IMPLS)
    # The float64 gradient check fits one head (1.1 * 6 / 16 of the 4): part of a GQA group, whose dk and dv
    # hold that head's share only, and they match.
    check = by_impl["mta_conv"]["check"]
    assert check["ok"] and check["heads_checked"] == 4 and check["grad_heads_checked"] == 1, check
    forward, backward = tables(cb.format_table(results))
    assert forward[0].count("skip") == 0 and backward[0].count("skip") == 4
    assert cb.shape_ratios(results)[0]["reference_over_conv_time"] == pytest.approx(80.0 / 2.0)
    assert cb.shape_ratios(results)[0]["reference_over_conv_fwd_bwd_time"] is None


def test_a_slice_gradient_check_still_catches_a_wrong_gradient():
    free = int(1.1 * cb.reference_bytes_estimate(1, 4, 24) / 0.6)
    (record,) = [r for r in run_tiny(impls(mta_conv=doubled_backward), shapes=TINY[1:], free=free)
                 if r["impl"] == "mta_conv"]
    check = record["check"]
    assert not check["ok"] and check["grad_heads_checked"] == 1 and min(check["grad_rel_err"].values()) > 0.5


def test_a_slice_check_still_catches_a_wrong_kernel():
    free = int(1.5 * cb.reference_bytes_estimate(1, 1, 24) / 0.6)
    (record,) = [r for r in run_tiny(impls(mta_conv=wrong), shapes=TINY[1:], free=free) if r["impl"] == "mta_conv"]
    assert not record["check"]["ok"] and record["check"]["heads_checked"] == 1


def test_a_failing_reference_fails_the_check_with_its_error():
    """One attempt each, on the heads the memory estimate allows: a reference that raises (a conv2d too large for
    cuDNN, an OOM) fails the check with the failure noted; fewer heads are not tried."""
    calls = []

    def failing_reference(q, k, v, weight, causal):
        calls.append((q.shape[1], q.dtype))
        if q.dtype == torch.float64:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")

    shape = cb.ConvShape("float16", 1, 4, 2, 8, 3, 5, 16)
    q, k, v, w = cb.random_inputs(shape, "cpu")
    fits = cb.reference_fits(shape, PLENTY)
    check = cb.check_against_reference(exact, q, k, v, w, torch.randn_like(q), shape, fits, reference=failing_reference)
    assert calls == [(4, torch.float16), (4, torch.float64)]  # all heads, in the inputs' dtype, then in float64
    assert not check["ok"] and check["rel_err"] is check["grad_rel_err"] is None
    assert check["notes"] == ["reference on 4 heads raised RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED",
                              "float64 reference for the gradients on 4 heads ran out of memory"]
    assert check["error"] == (f"no reference could run: {check['notes'][0]}; "
                              f"no float64 reference for the gradients could run: {check['notes'][1]}")
    assert "CUDNN_STATUS_NOT_SUPPORTED" in cb.format_check(check)


def test_a_failing_gradient_reference_keeps_the_output_s_check():
    def no_float64(q, k, v, weight, causal):
        if q.dtype == torch.float64:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        return conv_attention_reference(q, k, v, weight, causal=causal)

    shape = TINY[0]
    q, k, v, w = cb.random_inputs(shape, "cpu")
    dout = torch.randn_like(q)
    check = cb.check_against_reference(exact, q, k, v, w, dout, shape, cb.reference_fits(shape, PLENTY),
                                       reference=no_float64)
    assert check["rel_err"] < 1e-6 and check["heads_checked"] == 4 and check["grad_rel_err"] is None
    assert not check["ok"] and "out of memory" in check["error"] and len(check["notes"]) == 1
    no_room = {**cb.reference_fits(shape, PLENTY), "grad": cb.reference_fit(shape, 0)}
    nothing = cb.check_against_reference(exact, q, k, v, w, dout, shape, no_room)
    assert not nothing["ok"] and nothing["rel_err"] < 1e-6 and nothing["notes"] == []
    assert nothing["error"] == "no float64 reference for the gradients fits in memory, not even on one head"


def test_a_check_without_any_reference_fails():
    shape = TINY[0]
    q, k, v, w = cb.random_inputs(shape, "cpu")
    check = cb.check_against_reference(exact, q, k, v, w, torch.randn_like(q), shape, cb.reference_fits(shape, 0))
    assert not check["ok"] and check["rel_err"] is None and check["grad_rel_err"] is None
    assert check["error"] == ("no reference fits in memory, not even on one head; "
                              "no float64 reference for the gradients fits in memory, not even on one head")


# --- ratios, bars, table from synthetic results ----------------------------------------------


def synthetic_results(conv_ms=3.0, flash_ms=1.0, ref_ms=90.0, conv_bytes=10 ** 6, ref_bytes=10 ** 8, check_ok=True,
                      skip_reference_at=()):
    """Both configurations, 6x11 and 11x11, N in {2048, 8192, 16384}; the given numbers at every point.

    The forward+backward takes 4x the forward's time (the reference 5x) and 3x its memory (the reference 2x)."""
    results = []
    for heads, d in ((8, 64), (16, 128)):
        for cq, ck in ((6, 11), (11, 11)):
            for n in (2048, 8192, 16384):
                shape = {"dtype": "bfloat16", "batch": 1, "heads": heads, "kv_heads": heads, "head_dim": d,
                         "cq": cq, "ck": ck, "seq_len": n, "causal": True}
                sdpa = {"sdpa_flash": (flash_ms / 2, 4 * 10 ** 5), "sdpa_cudnn": (flash_ms / 3, 3 * 10 ** 5)}
                numbers = {"mta_conv": (conv_ms, conv_bytes), "mta_flash": (flash_ms, 5 * 10 ** 5),
                           **sdpa,
                           "conv_reference": (ref_ms, ref_bytes),
                           "conv_reference_compiled": (ref_ms / 2, ref_bytes // 2)}
                for impl, (ms, nbytes) in numbers.items():
                    r = {"impl": impl, **shape, "fwd_ms": ms * n / 8192, "peak_extra_bytes": nbytes, "status": "ok",
                         "error": None}
                    slower, bigger = (5, 2) if impl in cb.REFERENCE_IMPLS else (4, 3)
                    r.update(fwd_bwd_ms=slower * r["fwd_ms"], fwd_bwd_peak_extra_bytes=bigger * nbytes, bwd_error=None)
                    if impl in cb.REFERENCE_IMPLS and (heads, n) in skip_reference_at:
                        r.update(fwd_ms=None, peak_extra_bytes=None, status="skipped", error="not run: ...",
                                 fwd_bwd_ms=None, fwd_bwd_peak_extra_bytes=None, bwd_error="not run: ...")
                    if impl == "mta_conv":
                        r["check"] = {"ok": check_ok, "rel_err": 3e-3 if check_ok else 0.5, "tolerance": 2e-2,
                                      "reference": "conv_attention_reference", "error": None, "notes": [],
                                      "grad_rel_err": {"dq": 1e-2, "dk": 2e-2, "dv": 5e-3, "dweight": 4e-3},
                                      "grad_tolerance": 5e-2, "grad_heads_checked": heads}
                    results.append(r)
    prov = {"gpu": "NVIDIA H200", "torch": "2.x", "triton": "3.x", "git_commit": "cd" * 20, "git_dirty": False}
    return {"provenance": prov, "config": {"benchmark": "conv", "dtype": "bfloat16", "causal": True},
            "results": results}


def test_shape_ratios():
    rows = cb.shape_ratios(synthetic_results()["results"])
    assert len(rows) == 12
    for row in rows:
        assert row["conv_over_flash_time"] == pytest.approx(3.0)
        assert row["conv_over_sdpa_flash_time"] == pytest.approx(6.0)
        assert row["conv_over_sdpa_cudnn_time"] == pytest.approx(9.0)
        assert row["reference_over_conv_time"] == pytest.approx(30.0)
        assert row["reference_compiled_over_conv_time"] == pytest.approx(15.0)
        assert row["conv_over_reference_memory"] == pytest.approx(0.01)
        assert row["conv_over_reference_compiled_memory"] == pytest.approx(0.02)
        assert row["conv_over_flash_fwd_bwd_time"] == pytest.approx(3.0)
        assert row["conv_over_sdpa_cudnn_fwd_bwd_time"] == pytest.approx(9.0)
        assert row["reference_over_conv_fwd_bwd_time"] == pytest.approx(30.0 * 5 / 4)
        assert row["reference_compiled_over_conv_fwd_bwd_time"] == pytest.approx(15.0 * 5 / 4)
        assert row["conv_over_reference_fwd_bwd_memory"] == pytest.approx(0.01 * 3 / 2)
        assert row["conv_over_reference_compiled_fwd_bwd_memory"] == pytest.approx(0.02 * 3 / 2)
        assert row["check_ok"] is True


def test_headline_ratios_carry_the_numbers_they_are_made_of():
    data = synthetic_results(conv_ms=3.0, flash_ms=1.0, ref_ms=90.0, conv_bytes=10 ** 6, ref_bytes=10 ** 8)
    entries = cb.headline_ratios(data)
    assert entries == cb.headline_ratios(data["results"])  # the loaded JSON or its results
    assert [(e["heads"], e["head_dim"], e["seq_len"], e["cq"], e["ck"]) for e in entries] == \
        [(8, 64, 8192, 6, 11), (16, 128, 8192, 6, 11)]
    for e in entries:
        assert e["conv_over_flash_time"] == pytest.approx(3.0)
        assert (e["mta_conv_fwd_ms"], e["mta_flash_fwd_ms"], e["conv_reference_fwd_ms"]) == (3.0, 1.0, 90.0)
        assert e["reference_over_conv_time"] == pytest.approx(30.0)
        assert e["conv_over_reference_memory"] == pytest.approx(0.01)
        assert (e["mta_conv_peak_extra_bytes"], e["conv_reference_peak_extra_bytes"]) == (10 ** 6, 10 ** 8)
        assert e["check_ok"] is True
        # The forward+backward's ratios are those of the numbers recorded beside them.
        assert (e["mta_conv_fwd_bwd_ms"], e["mta_flash_fwd_bwd_ms"], e["conv_reference_fwd_bwd_ms"]) == \
            (12.0, 4.0, 450.0)
        assert e["conv_over_flash_fwd_bwd_time"] == pytest.approx(e["mta_conv_fwd_bwd_ms"] / e["mta_flash_fwd_bwd_ms"])
        assert e["reference_over_conv_fwd_bwd_time"] == pytest.approx(450.0 / 12.0)
        assert (e["mta_conv_fwd_bwd_peak_extra_bytes"], e["conv_reference_fwd_bwd_peak_extra_bytes"]) == \
            (3 * 10 ** 6, 2 * 10 ** 8)
        assert e["conv_over_reference_fwd_bwd_memory"] == pytest.approx(0.015)
    (other,) = cb.headline_ratios(data, seq_len=2048, kernel=(11, 11))[:1]
    assert (other["seq_len"], other["cq"]) == (2048, 11) and other["mta_conv_fwd_ms"] == pytest.approx(0.75)
    assert cb.headline_ratios(data, seq_len=4096) == []


def test_headline_without_a_side_or_with_a_failed_check():
    entries = cb.headline_ratios(synthetic_results(skip_reference_at=[(16, 8192)], check_ok=False))
    small, big = entries
    assert small["reference_over_conv_time"] == pytest.approx(30.0) and small["check_ok"] is False
    assert big["reference_over_conv_time"] is big["conv_over_reference_memory"] is None
    assert big["reference_over_conv_fwd_bwd_time"] is big["conv_over_reference_fwd_bwd_memory"] is None
    assert big["conv_reference_fwd_ms"] is None and big["conv_over_flash_time"] == pytest.approx(3.0)
    text = cb.format_headline(synthetic_results(skip_reference_at=[(16, 8192)], check_ok=False))
    headline = headline_rows(text)
    assert list(headline) == ["forward at N=8192, kernel 6x11", "forward+backward at N=8192, kernel 6x11"]
    forward, both = headline.values()
    assert [[row[k] for k in ("B", "H", "Hkv", "D")] for row in forward + both] == \
        [["1", "8", "8", "64"], ["1", "16", "16", "128"]] * 2
    small = forward[0]  # each ratio with the numbers it is made of
    assert (small["conv/flash"], small["conv ms"], small["flash ms"]) == ("3.00x", "3.000", "1.000")
    assert (small["ref/conv"], small["ref ms"]) == ("30.0x", "90.000")
    assert (small["mem c/ref"], small["conv MiB"], small["ref MiB"]) == \
        ("1.00%", f"{10 ** 6 / 2 ** 20:.1f}", f"{10 ** 8 / 2 ** 20:.1f}")
    small = both[0]
    assert (small["conv/flash"], small["conv ms"], small["flash ms"]) == ("3.00x", "12.000", "4.000")
    assert (small["ref/conv"], small["ref ms"]) == ("37.5x", "450.000")
    assert (small["mem c/ref"], small["conv MiB"], small["ref MiB"]) == \
        ("1.50%", f"{3 * 10 ** 6 / 2 ** 20:.1f}", f"{2 * 10 ** 8 / 2 ** 20:.1f}")
    for big, conv_ms in ((forward[1], "3.000"), (both[1], "12.000")):  # the reference skipped at H=16
        assert big["ref/conv"] == big["mem c/ref"] == "-" and big["ref ms"] == big["ref MiB"] == "skip"
        assert big["conv ms"] == conv_ms
    assert all(row["check"] == "!" for row in forward + both)  # mta_conv failed its check
    assert "PASS" not in text and "FAIL" not in text  # measured ratios, no targets
    assert headline_rows(cb.format_headline([])) == {title: [] for title in headline}  # no results there


HEADLINE_HEADERS = ["B", "H", "Hkv", "D", "conv ms", "flash ms", "ref ms", "conv MiB", "flash MiB", "ref MiB",
                    "conv/flash", "ref/conv", "mem c/ref"]


def headline_rows(text):
    """``{title: [{header: cell}]}`` of :func:`cb.format_headline`'s tables, a failed check's "!" as "check"."""
    tables = {}
    for block in text.split("\n\n"):
        title, header, rule, *rows = block.splitlines()
        assert header.split() == " ".join(HEADLINE_HEADERS).split() and set(rule) == {"-"}
        tables[title] = [dict(zip(HEADLINE_HEADERS + ["check"], row.split())) for row in rows]
    return tables


def test_tables_have_one_row_per_shape_with_times_memory_and_ratios():
    results = synthetic_results(skip_reference_at=[(16, 16384)])["results"]
    text = cb.format_table(results)
    forward, backward = tables(text)
    assert len(forward) == len(backward) == 12
    headers = [block.splitlines()[1].split() for block in text.split("\n\n")]
    assert headers[0] == headers[1][:-2] + ["rel", "err"] and headers[1][-2:] == ["grad", "err"]
    assert headers[0][6:12] == ["conv", "ms", "flash", "ms", "sdpa.fa", "ms"]
    row = next(line for line in forward if line.startswith("1 16  16 128") and " 6x11  8192 " in line)
    assert "3.000" in row and "90.000" in row and "45.000" in row  # mta_conv, ref, ref.c times at N=8192
    assert "3.00x" in row and "30.0x" in row and "15.0x" in row and "1.00%" in row and "3.0e-03" in row
    assert f"{10 ** 8 / 2 ** 20:.1f}" in row  # the reference's memory in MiB
    row = next(line for line in backward if line.startswith("1 16  16 128") and " 6x11  8192 " in line)
    assert "12.000" in row and "450.000" in row and "225.000" in row  # mta_conv, ref, ref.c fwd+bwd times
    assert "3.00x" in row and "37.5x" in row and "18.8x" in row and "1.50%" in row
    assert row.endswith("2.0e-02")  # the largest gradient error (dk)
    assert f"{2 * 10 ** 8 / 2 ** 20:.1f}" in row
    for rows in (forward, backward):
        skipped = next(line for line in rows if line.startswith("1 16  16 128") and " 6x11 16384 " in line)
        assert skipped.count("skip") == 4 and "30.0x" not in skipped and "37.5x" not in skipped


# --- figure ----------------------------------------------------------------------------------


def files_under(*dirs):
    return {p for d in dirs if d.exists() for p in d.rglob("*")}


def test_plot_conv_draws_time_and_memory_log_log_and_writes_nothing(tmp_path, monkeypatch):
    """Rows: forward time and memory, forward+backward time and memory."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    data = synthetic_results(skip_reference_at=[(16, 16384)])
    path = tmp_path / "bench_conv.json"
    path.write_text(json.dumps(data))
    before = files_under(FIGURES_DIR, tmp_path)
    fig = plots.plot_conv(path)  # from the committed JSON (a dict works too: see the next test)
    try:
        assert files_under(FIGURES_DIR, tmp_path) == before
        axes = fig.axes
        assert len(axes) == 4 * 4  # rows (time, memory) per pass x columns (config, kernel)
        assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in axes)
        titles = [ax.get_title() for ax in axes]
        assert titles[0] == "forward time, B=1 H=8 D=64, 6x11"
        assert titles[7] == "peak extra memory, B=1 H=16 D=128, 11x11"
        plain = {"SDPA flash (no conv)", "SDPA cuDNN (no conv)"}
        lines = {line.get_label(): line for line in axes[0].get_lines()}
        assert set(lines) == {"mta.conv_attention", "reference (materialized)", "reference, torch.compile",
                              "mta.flash_attention (no conv)", *plain}
        assert all(lines[label].get_linestyle() == ":" for label in plain)
        assert list(lines["mta.conv_attention"].get_xdata()) == [2048, 8192, 16384]
        assert list(lines["mta.conv_attention"].get_ydata()) == pytest.approx([0.75, 3.0, 6.0])
        # Memory in MiB; the skipped reference points (H=16, N=16384) are left out.
        mem = {line.get_label(): line for line in axes[6].get_lines()}  # memory, H=16, 6x11
        assert list(mem["reference (materialized)"].get_xdata()) == [2048, 8192]
        assert list(mem["reference (materialized)"].get_ydata()) == pytest.approx([10 ** 8 / 2 ** 20] * 2)
        suptitle = fig._suptitle.get_text()
        assert "NVIDIA H200" in suptitle and "cdcdcdcd" in suptitle
        assert "forward and forward+backward" in suptitle
        assert titles[8] == "fwd+bwd time, B=1 H=8 D=64, 6x11"
        assert titles[-1] == "fwd+bwd memory, B=1 H=16 D=128, 11x11"
        both = {line.get_label(): line for line in axes[8].get_lines()}
        assert list(both["mta.conv_attention"].get_ydata()) == pytest.approx([3.0, 12.0, 24.0])
        mem = {line.get_label(): line for line in axes[14].get_lines()}  # fwd+bwd memory, H=16, 6x11
        assert list(mem["reference (materialized)"].get_ydata()) == pytest.approx([2 * 10 ** 8 / 2 ** 20] * 2)
    finally:
        plt.close(fig)


def test_plot_conv_crosses_out_failed_checks_and_rejects_other_results():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plots.plot_conv(synthetic_results(check_ok=False))
    try:
        crosses = [line for line in fig.axes[0].get_lines() if line.get_label() == "mta.conv_attention check failed"]
        assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [2048, 8192, 16384]
    finally:
        plt.close(fig)
    flash_like = {"provenance": {}, "config": {}, "results": [{"impl": "mta", "seq_len": 1024, "fwd_tflops": 1.0}]}
    with pytest.raises(ValueError, match="no conv results"):
        plots.plot_conv(flash_like)


def test_config_describes_the_run():
    full, quick = cb.ConvBenchmark().config(False, 10, 30), cb.ConvBenchmark().config(True, 5, 7)
    assert full["kernels"] == [[6, 11], [11, 11]] and quick["kernels"] == [[6, 11]]
    assert full["seq_lens"] == [1024, 2048, 4096, 8192, 16384] and quick["seq_lens"] == [2048, 8192]
    assert full["configurations"] == [{"batch": 1, "heads": 8, "kv_heads": 8, "head_dim": 64},
                                      {"batch": 1, "heads": 16, "kv_heads": 16, "head_dim": 128}]
    assert full["tolerance"] == 2e-2 and full["dtype"] == "bfloat16" and full["causal"] is True
    assert full["grad_tolerance"] == 5e-2 and set(full["passes"]) == {"fwd", "fwd_bwd"}
    assert full["reference_fit"]["live_fp32_matrices"] == {"fwd": 6, "fwd_bwd": 8}
    assert (full["warmup"], full["rep"], quick["rep"]) == (10, 30, 7) and "launch_lead" in full
    assert full["impls"] == ["mta_conv", "mta_flash", "sdpa_flash", "sdpa_cudnn", "conv_reference",
                             "conv_reference_compiled"]
    assert "conv_reference_compiled" not in cb.ConvBenchmark(compile_reference=False).config(False, 10, 30)["impls"]
    json.dumps(full, allow_nan=False)


# --- command line ----------------------------------------------------------------------------


def test_cli_parses_conv():
    from mta.bench.__main__ import build_parser, repo_path
    args = build_parser().parse_args(["conv"])
    assert args.benchmark == "conv" and not args.quick and args.compile_reference
    assert repo_path(args.out) == ROOT / "figures" / "bench_conv.json"
    args = build_parser().parse_args(["conv", "--quick", "--no-compile", "--out", "x.json", "--rep", "5"])
    assert args.quick and not args.compile_reference and args.rep == 5 and repo_path(args.out) == ROOT / "x.json"


# --- resuming an interrupted run -------------------------------------------------------------


def test_an_interrupted_run_resumes_without_measuring_again(tmp_path):
    out = tmp_path / "bench.json"
    conv = bench(impls())
    prov, cfg = {"gpu": "fake", "git_commit": "abc"}, conv.config(True, 1, 1)
    saved = []
    first = harness.run_shapes(conv, TINY[:1], TOOLS, progress=False, after_each=lambda r: saved.append(
        harness.write_results(out, conv, prov, cfg, r, complete=False)))
    assert len(saved) == 1 and not json.loads(out.read_text())["complete"]
    assert saved[0]["shapes"] == harness.json_safe(cb.shape_ratios(first))
    done = harness.resumable_results(out, prov, cfg)
    assert done == harness.json_safe(first)
    calls = []
    counting = {name: (lambda f: lambda *a, **kw: calls.append(1) or f(*a, **kw))(fn)
                for name, fn in impls().items()}
    results = harness.run_shapes(bench(counting), TINY, TOOLS, progress=False, done=done)
    assert len(harness.shape_rows(results, cb.SHAPE_KEYS)) == len(TINY) and results[:len(done)] == done
    assert all(r["seq_len"] == TINY[1].seq_len for r in results[len(done):])  # only the missing shape ran
    assert calls


def test_resume_refuses_results_of_other_code_or_config(tmp_path):
    out = tmp_path / "bench.json"
    prov, cfg = {"gpu": "fake", "git_commit": "abc"}, cb.ConvBenchmark().config(True, 1, 1)
    harness.write_results(out, bench(impls()), prov, cfg, [], complete=False)
    with pytest.raises(ValueError, match="git_commit"):
        harness.resumable_results(out, {**prov, "git_commit": "def"}, cfg)
    with pytest.raises(ValueError, match="configuration"):
        harness.resumable_results(out, prov, cb.ConvBenchmark().config(False, 1, 1))


class TinyConv(cb.ConvBenchmark):
    def shapes(self, quick):
        return TINY


def test_a_whole_run_resumes_and_exits_1_on_a_failed_check(tmp_path, capsys):
    out = tmp_path / "bench_conv.json"
    good = TinyConv(impls=impls(), free_memory=lambda: PLENTY)
    assert harness.run_benchmark(good, TOOLS, out=out, quick=True, progress=False) == 0
    data = json.loads(out.read_text())
    assert data["complete"] and len(data["results"]) == 6 * len(TINY) and "bars" not in data
    assert out.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "conv ms" in printed and "forward+backward (grad err" in printed
    headline = "\n\n".join(printed.split("\n\n")[2:4])  # after the two pass tables: no shape at N=8192, 6x11
    assert headline_rows(headline) == {f"{p} at N=8192, kernel 6x11": [] for p in ("forward", "forward+backward")}
    # Resuming a complete run measures nothing again, and a wrong kernel fails every shape.
    assert harness.run_benchmark(good, TOOLS, out=out, quick=True, resume=True, progress=False) == 0
    assert "2 shapes already measured" in capsys.readouterr().out
    wrong_one = TinyConv(impls=impls(mta_conv=wrong), free_memory=lambda: PLENTY)
    assert harness.run_benchmark(wrong_one, TOOLS, out=out, quick=True, progress=False) == 1
    assert capsys.readouterr().out.count("!!! mta_conv FAILS ITS CHECK at float32 B=1 H=4 Hkv=2") == 2 * len(TINY)


def test_cli_resume_flag():
    from mta.bench.__main__ import build_parser
    assert build_parser().parse_args(["conv", "--resume"]).resume
    assert not build_parser().parse_args(["conv"]).resume


# --- the committed results -------------------------------------------------------------------


#: ``timing`` in the configuration of runs made with a fixed spin before each call (no ``launch_lead``).
FIXED_SPIN_TIMING = ("median over rep of per-call CUDA event times; 256 MB L2 flush and a ~1 ms GPU spin "
                     "(so launch overhead is not timed) before each call")


def test_committed_results_are_a_complete_checked_gpu_run():
    """figures/bench_conv.json, which chapter 04 plots: a real run of this configuration (both passes), every
    shape checked, its stored ratios those the code computes, and chapter 04's tables and figure drawn from it."""
    data = plots.load_results(FIGURES_DIR / "bench_conv.json")
    prov = data["provenance"]
    assert prov["gpu"] != "cpu" and prov["git_commit"] and prov["mta_source_sha256"]
    assert all("fwd_bwd_ms" in r for r in data["results"])
    saved = data["config"]
    compiled = "conv_reference_compiled" in saved["impls"]  # --no-compile leaves torch.compile of the reference out
    bench = cb.ConvBenchmark(compile_reference=compiled)
    expected = harness.json_safe(bench.config(False, saved["warmup"], saved["rep"]))
    if "launch_lead" not in saved:  # a run from before the spin was sized by the call's launch time
        del expected["launch_lead"]
        expected["timing"] = FIXED_SPIN_TIMING
    if not any(key.endswith("wall_ms") for r in data["results"] for key in r):  # a run from before wall times
        expected["timing"] = expected["timing"].replace(WALL_TIMING, "")
    assert data["complete"] and saved == expected
    assert {tuple(row[k] for k in cb.SHAPE_KEYS) for row in harness.shape_rows(data["results"], cb.SHAPE_KEYS)} == \
        {tuple(getattr(s, k) for k in cb.SHAPE_KEYS) for s in cb.conv_shapes()}
    assert all(r["check"]["ok"] for r in data["results"] if r["impl"] == cb.TESTED_IMPL)
    recomputed = harness.json_safe(cb.shape_ratios(data["results"]))
    assert data["shapes"] == recomputed
    assert len(cb.format_table(data["results"]).splitlines()) == 3 + 20 + 1 + 3 + 20
    assert [e["head_dim"] for e in cb.headline_ratios(data)] == [64, 128]
    assert all(e["conv_over_flash_time"] and e["reference_over_conv_time"] for e in cb.headline_ratios(data))
    assert all(e["conv_over_flash_fwd_bwd_time"] and e["reference_over_conv_fwd_bwd_time"]
               for e in cb.headline_ratios(data))
    assert [len(rows) for rows in headline_rows(cb.format_headline(data)).values()] == [2, 2]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plots.plot_conv(data)
    try:
        assert len(fig.axes) == 4 * 4
    finally:
        plt.close(fig)
