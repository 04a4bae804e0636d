"""Data-parallel training of a model with ``mta.MultiTokenAttention`` layers (2 x 3 kernel, GQA, RoPE), two
processes on the gloo backend: DDP and FSDP2 (``fully_shard``), eager and under ``torch.compile``, give the
parameters of one process trained on the whole global batch, the kernel ``conv_weight`` included; a distributed
checkpoint of the FSDP2 model loads into a model in a process with no process group.

One start of the two ranks (``tests/distributed_worker.py``) trains every mode; this process trains the
single-process reference meanwhile. A mode that raised fails its own test with the rank's traceback; a test of
parameters names each one that differs."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest
import torch

import distributed_worker as worker
from conftest import DEVICE, ON_GPU, mta

WORLD = 2
MODES = ("ddp", "ddp_compiled", "fsdp2", "fsdp2_compiled") + (("fsdp2_bf16",) if ON_GPU else ())
#: The ranks' whole run, every mode; past it they are killed and every test here fails with their output.
RUN_TIMEOUT_S = 420
#: Compiled against eager training: inductor's fused code rounds otherwise, and AdamW's normalised step can turn
#: that on a gradient element near zero into a few 1e-6 on its parameter.
COMPILED_TOL = dict(rtol=1e-4, atol=1e-5)
#: fp32 training in one process against two: the same arithmetic summed in another order. On a GPU as loose as
#: compiled: cuBLAS chooses its algorithm by shape (a batch of 2 against 4), so rounding differs there too.
TOL = COMPILED_TOL if ON_GPU else dict(rtol=1e-5, atol=1e-6)
#: bf16 parameters in the forward and backward against fp32 training: each parameter's update points the same way
#: (cosine of the two updates). Not elementwise: AdamW's first steps are about ``LR`` times the gradient's sign,
#: so an element whose gradient is near zero may move ``LR`` one way in fp32 and the other in bf16.
BF16_MIN_COSINE = 0.9
KERNELS = [f"blocks.{i}.attn.conv_weight" for i in range(worker.LAYERS)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: These tests share a module-scoped fixture: one process runs them all (``--dist loadgroup``).
pytestmark = pytest.mark.xdist_group("test_distributed")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Start the two ranks on every mode, train the single-process reference while they run, wait for them.
    ``{"results": rank 0's results.pt, "initial", "reference": parameters by name, "out": the ranks' folder,
    "logs": their output}``."""
    out = tmp_path_factory.mktemp("distributed")
    root = str(pathlib.Path(__file__).resolve().parents[1])  # mta importable without an install
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(WORLD),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    if not torch.cuda.is_available():
        env.pop("TRITON_INTERPRET", None)  # each rank's import of mta.runtime sets it; the ranks report it
    logs = [out / f"rank{rank}.log" for rank in range(WORLD)]
    procs = []
    for rank, log in enumerate(logs):
        with open(log, "w") as f:
            procs.append(subprocess.Popen([sys.executable, worker.__file__, str(out), ",".join(MODES)],
                                          env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                          stdout=f, stderr=subprocess.STDOUT))
    deadline, timed_out = time.monotonic() + RUN_TIMEOUT_S, False
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the ranks have the other cores
        initial, reference = worker.single_process_parameters(DEVICE)
        for proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:  # also when the reference raised
        torch.set_num_threads(threads)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = "\n".join(f"--- rank {rank} (exit code {proc.returncode}):\n{log.read_text()[-4000:]}"
                       for rank, (proc, log) in enumerate(zip(procs, logs)))
    if timed_out:
        pytest.fail(f"the ranks ran past {RUN_TIMEOUT_S} s and were killed\n{output}")
    if not (out / "results.pt").exists():
        pytest.fail(f"rank 0 wrote no results\n{output}")
    results = torch.load(out / "results.pt", weights_only=False)
    return {"results": results, "initial": initial, "reference": reference, "out": out, "logs": output}


def mode_result(runs, mode: str) -> dict:
    result = runs["results"].get(mode)
    if result is None:
        pytest.fail(f"{mode}: no result (the ranks stopped before it)\n{runs['logs']}")
    if "error" in result:
        pytest.fail(f"{mode} raised:\n{result['error']}")
    return result


def assert_same_parameters(got: dict, want: dict, what: str, **tol) -> None:
    """Every parameter of ``got`` close to ``want``'s; the message names each one that is not."""
    assert got.keys() == want.keys(), f"{what}: parameter names differ: {sorted(got.keys() ^ want.keys())}"
    wrong = []
    for name, value in want.items():
        try:
            torch.testing.assert_close(got[name].cpu(), value.cpu(), **tol)
        except AssertionError as e:
            wrong.append(f"{name}: {str(e).splitlines()[-2:]}")
    assert not wrong, f"{what}: {len(wrong)} of {len(want)} parameters differ:\n" + "\n".join(wrong)


def assert_same_updates(got: dict, want: dict, initial: dict, what: str, min_cosine: float) -> None:
    """Every parameter's update ``got - initial`` in the direction of ``want - initial`` (cosine at least
    ``min_cosine``); the message names each one that is not."""
    wrong = []
    for name, value in want.items():
        start = initial[name].cpu().double()
        a, b = got[name].cpu().double() - start, value.cpu().double() - start
        cosine = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
        if not cosine >= min_cosine:
            wrong.append(f"{name}: cosine {cosine:.3f}")
    assert not wrong, f"{what}: {len(wrong)} of {len(want)} parameters moved elsewhere:\n" + "\n".join(wrong)


def assert_kernels_trained(parameters: dict, initial: dict, what: str) -> None:
    for name in KERNELS:
        moved = (parameters[name].cpu() - initial[name].cpu()).abs().max().item()
        assert moved > 1e-3, f"{what}: {name} moved only {moved:.1e} from its initial value in training"


def test_the_ranks_run_as_asked(runs):
    env = runs["results"]["environment"]
    assert env["world"] == WORLD
    assert env["threads"] == 1
    if not ON_GPU:
        assert env["TRITON_INTERPRET"] == "1" and env["interpret"], env
    # Training starts from kernels away from the identity (plain causal attention), and moves them.
    identity = mta.layer.identity_kernel(worker.HEADS, *worker.KERNEL)
    for name in KERNELS:
        assert (runs["initial"][name].cpu() - identity).abs().max() > 0.1, name
    assert_kernels_trained(runs["reference"], runs["initial"], "single-process training")


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_data_parallel_training_matches_one_process(runs, mode):
    result = mode_result(runs, mode)
    assert all(dtype == torch.float32 for dtype in result["dtypes"].values()), result["dtypes"]
    assert_same_parameters(result["parameters"], runs["reference"], f"{mode} against one process", **TOL)
    assert_kernels_trained(result["parameters"], runs["initial"], mode)


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_compiled_data_parallel_training_matches_eager(runs, mode):
    eager = mode_result(runs, mode)
    compiled = mode_result(runs, f"{mode}_compiled")
    assert_same_parameters(compiled["parameters"], eager["parameters"],
                           f"{mode} under torch.compile(backend={worker.COMPILE_BACKEND!r}) against eager",
                           **COMPILED_TOL)
    assert_kernels_trained(compiled["parameters"], runs["initial"], f"{mode}_compiled")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # dcp.load in one process: asked
def test_fsdp2_checkpoint_loads_in_one_process(runs):
    """``dcp.save`` of the sharded state dict by the two ranks; ``dcp.load`` here, with no process group, into a
    plain model, which then gives the distributed model's logits."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    result = mode_result(runs, "fsdp2")
    assert not (dist.is_available() and dist.is_initialized())
    model = worker.make_model(DEVICE)
    state = model.state_dict()
    dcp.load(state, checkpoint_id=str(runs["out"] / "checkpoint"))
    model.load_state_dict(state)
    assert_same_parameters(dict(model.named_parameters()), result["parameters"], "the loaded checkpoint",
                           rtol=0, atol=0)
    with torch.no_grad():
        logits = model(worker.fixed_tokens(DEVICE)).cpu()
    torch.testing.assert_close(logits, result["logits"], **TOL,
                               msg=lambda m: f"logits of the loaded checkpoint against the FSDP2 model's: {m}")


@pytest.mark.skipif(not ON_GPU, reason="bf16 parameters need CUDA (bf16 tl.dot is wrong in Triton's interpreter)")
def test_fsdp2_bf16_mixed_precision_keeps_the_kernel_fp32(runs):
    """``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the parameters kept (each rank's shard)
    and their gradients stay fp32, ``conv_weight`` included, and training lands near fp32 training."""
    result = mode_result(runs, "fsdp2_bf16")
    for name in KERNELS:
        assert result["dtypes"][name] == torch.float32 and result["grad_dtypes"][name] == torch.float32, name
    assert all(dtype == torch.float32 for dtype in result["dtypes"].values()), result["dtypes"]
    assert_same_updates(result["parameters"], runs["reference"], runs["initial"],
                        "fsdp2_bf16 against fp32 in one process", BF16_MIN_COSINE)
    assert_kernels_trained(result["parameters"], runs["initial"], "fsdp2_bf16")
