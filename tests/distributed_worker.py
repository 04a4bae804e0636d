"""A small MTA language model trained data-parallel, for ``tests/test_distributed.py``.

The model: token embedding, two pre-norm blocks (RMSNorm, :class:`mta.MultiTokenAttention` with a 2 x 3 kernel,
GQA and RoPE, RMSNorm, MLP), RMSNorm, a linear head; loss: next-token cross-entropy. Sizes are tiny because on
the CPU every kernel runs in Triton's interpreter, whose cost grows with the programs launched (batch x heads).

Run as a script, one process a rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` in the
environment, as ``torchrun`` sets them)::

    python tests/distributed_worker.py OUT_DIR MODE[,MODE...]

Each mode trains a fresh copy of the same model ``STEPS`` AdamW steps on the same global batches, every rank on
its share, then rank 0 writes what the test compares into ``OUT_DIR/results.pt`` (after each mode, so a later
hang keeps what came before). Modes: ``ddp``, ``ddp_compiled``, ``fsdp2``, ``fsdp2_compiled`` (``fully_shard``
on each block and on the model; ``fsdp2`` also writes a distributed checkpoint to ``OUT_DIR/checkpoint`` and the
trained model's logits on :func:`fixed_tokens`), ``fsdp2_bf16`` (bf16 parameters in the forward, fp32 gradient
reduction). A mode that raises records its traceback under ``"error"`` and the next mode runs.
"""

from __future__ import annotations

import gc
import os
import sys
import traceback
from datetime import timedelta

import torch
from torch import nn

VOCAB, DIM, HEADS, KV_HEADS, KERNEL, LAYERS = 16, 32, 2, 1, (2, 3), 2
SEQ, GLOBAL_BATCH, STEPS, LR = 10, 4, 3, 1e-2
#: A collective that waits longer than this raises (a rank that died or went another way), so a test fails.
COLLECTIVE_TIMEOUT_S = 120
#: torch.compile's backend: the default, so the ops around the kernels are generated code too (C++ on the CPU).
COMPILE_BACKEND = "inductor"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        import mta

        self.attn_norm = nn.RMSNorm(DIM)
        self.attn = mta.MultiTokenAttention(DIM, HEADS, num_kv_heads=KV_HEADS, kernel_size=KERNEL, rope_theta=1e4)
        self.mlp_norm = nn.RMSNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    """``tokens [B, N]`` (ints below ``VOCAB``) -> logits ``[B, N, VOCAB]``."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_model(device) -> TinyLM:
    """The same initial model in every process: seeded, and each kernel moved away from the identity so that its
    gradient matters (the identity kernel is plain causal attention)."""
    torch.manual_seed(0)
    model = TinyLM()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.conv_weight.add_(0.3 * torch.randn_like(block.attn.conv_weight))
    return model.to(device)


def batches(device) -> list[torch.Tensor]:
    """``STEPS`` global batches of tokens ``[GLOBAL_BATCH, SEQ + 1]``."""
    g = torch.Generator().manual_seed(1)
    return [torch.randint(VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=g).to(device) for _ in range(STEPS)]


def fixed_tokens(device) -> torch.Tensor:
    """``[2, SEQ]``: the input on which the checkpointed model's outputs are compared."""
    return torch.randint(VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(2)).to(device)


def loss_of(model, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over ``tokens [B, SEQ + 1]``."""
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))


def train(model, params, data: list[torch.Tensor]) -> None:
    """``STEPS`` AdamW steps of ``model`` on ``data`` (one batch a step; each rank gives its own rows)."""
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.1)
    for tokens in data:
        opt.zero_grad(set_to_none=True)
        loss_of(model, tokens).backward()
        opt.step()


def single_process_parameters(device) -> tuple[dict, dict]:
    """The reference: the model trained in one process on the whole global batches. ``(initial, trained)``
    parameters by name."""
    model = make_model(device)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    train(model, model.parameters(), batches(device))
    return initial, {name: p.detach().clone() for name, p in model.named_parameters()}


# --- the ranks -----------------------------------------------------------------------------------------------------


def _shard(model, **policy):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, **policy)
    fully_shard(model, **policy)
    return model


def whole(p: torch.Tensor, world: int) -> torch.Tensor:
    """A parameter on the CPU, whole: an FSDP2 shard (a DTensor sharded on one dim) gathered from every rank.
    Gathered as CPU objects rather than with ``DTensor.full_tensor()``, which crashes the process (segfault) on
    CUDA tensors over gloo."""
    if not hasattr(p, "to_local"):
        return p.cpu().clone()
    import torch.distributed as dist

    (placement,) = p.placements
    parts = [None] * world
    dist.all_gather_object(parts, p.to_local().cpu())
    return torch.cat(parts, dim=placement.dim)


def run_mode(mode: str, rank: int, world: int, device, out_dir: str) -> dict:
    import torch.distributed as dist

    model = make_model(device)
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    data = [tokens[rows] for tokens in batches(device)]
    result = {}
    if mode in ("ddp", "ddp_compiled"):
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device])
    elif mode in ("fsdp2", "fsdp2_compiled"):
        wrapped = _shard(model)
    elif mode == "fsdp2_bf16":
        from torch.distributed.fsdp import MixedPrecisionPolicy

        wrapped = _shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                               reduce_dtype=torch.float32))
    else:
        raise ValueError(f"unknown mode {mode!r}")
    if mode.endswith("_compiled"):
        torch._dynamo.reset()
        wrapped = torch.compile(wrapped, backend=COMPILE_BACKEND)
    train(wrapped, model.parameters(), data)

    # Parameters as they are kept (FSDP2: this rank's fp32 shard), then whole.
    result["dtypes"] = {name: p.dtype for name, p in model.named_parameters()}
    result["grad_dtypes"] = {name: p.grad.dtype for name, p in model.named_parameters() if p.grad is not None}
    result["parameters"] = {name: whole(p.detach(), world) for name, p in model.named_parameters()}
    if mode == "fsdp2":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        dcp.save(get_model_state_dict(model), checkpoint_id=os.path.join(out_dir, "checkpoint"))
        with torch.no_grad():
            result["logits"] = wrapped(fixed_tokens(device)).cpu()
    dist.barrier()
    return result


def main() -> None:
    out_dir, modes = sys.argv[1], sys.argv[2].split(",")
    torch.set_num_threads(1)  # two ranks on a machine of two cores
    import torch.distributed as dist
    from mta import runtime

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = runtime.DEVICE
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    results = {"environment": {"TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
                               "interpret": runtime.INTERPRET, "threads": torch.get_num_threads(),
                               "device": str(device), "world": dist.get_world_size(), "torch": torch.__version__}}
    try:
        for mode in modes:
            try:
                results[mode] = run_mode(mode, rank, world, device, out_dir)
            except Exception:  # noqa: BLE001  (recorded for the test to name; the other modes still run)
                results[mode] = {"error": f"rank {rank}:\n{traceback.format_exc()}"}
                print(results[mode]["error"], file=sys.stderr, flush=True)
            if rank == 0:
                torch.save(results, os.path.join(out_dir, "results.tmp"))
                os.replace(os.path.join(out_dir, "results.tmp"), os.path.join(out_dir, "results.pt"))
    finally:
        gc.collect()  # the wrapped models (in reference cycles, holding the group) go before it, not at exit
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
