"""Benchmark of a whole model, in the tokens per second a user sees: :class:`ModelBenchmark`.

The model is :mod:`mta.bench.decoder`'s (12 layers, dim 1024, 16 query and 4 KV heads, RMSNorm, SwiGLU, RoPE, a
32000-token vocabulary, the head tied to the embedding) in three variants of the same weights: ``mta`` (6 x 11 MTA
in layers 2, 6, 10), ``plain_ours`` (plain attention everywhere through mta's kernels: ``kernel_size=(1, 1)``) and
``plain_sdpa`` (plain attention through ``F.scaled_dot_product_attention``).

* Training step: forward, cross-entropy on random tokens, backward, AdamW (fused on CUDA), bf16 autocast over fp32
  parameters, at ``B x N`` = 8 x 2048 and 2 x 8192; ``eager`` and ``reduce_overhead``
  (``torch.compile(model, mode="reduce-overhead", dynamic=False)``, one compiled model per variant for both
  shapes). Tokens/s: ``B N`` over the wall time per step of ``--rep`` steps back to back after ``--warmup``
  (:func:`mta.bench.timing.wall_ms`: one synchronisation, after the last step). ``first_step_s``: the first step
  alone (with ``reduce_overhead``, its compilation).
* Generation: a random 2048-token prompt, then 256 greedy decode steps (argmax on the device), ``B`` = 1 and 8,
  bf16 weights and caches; ``eager`` and ``graphed`` (each decode step of the whole model one CUDA graph:
  ``mta.capture_step`` over mta's caches, :func:`capture_static` over SDPA's). Tokens/s: ``B * 256`` over the wall
  time of the 256 steps (one synchronisation, after the last); the prefill is timed on its own. Each shape runs
  once untimed, then ``--gen-runs`` times; the medians are reported.

The JSON's ``targets`` compare variants as the project's performance targets do (:func:`targets`); a missed target
is reported there and in the tables, never as the exit status.

Duration on an H200 (estimated, not measured): ``--quick`` (4 layers) about 3 minutes, most of it compiling; the
full run about 8 minutes, of which about 5 compiling six times (each variant at two shapes). Where a run must fit a
10-minute limit, split it: ``--part training``, then ``--part generation --resume`` (the second goes on from the
first's JSON). An interrupted run also goes on with ``--resume``.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, Optional

import torch

from .decoder import VARIANTS, Decoder, DecoderConfig, SDPACache, build
from .harness import Benchmark, Tools, describe_error, is_oom, measured, release_memory, shape_rows
from .plots import plot_model

TRAIN_SHAPES = ((8, 2048), (2, 8192))  # (B, N)
TRAIN_MODES = ("eager", "reduce_overhead")
GEN_BATCHES = (1, 8)
GEN_MODES = ("eager", "graphed")
PROMPT_LEN = 2048
NEW_TOKENS = 256
QUICK_LAYERS = 4  # MTA in layer 2: still one layer in four
GEN_RUNS = 3
LEARNING_RATE = 1e-5  # small: random tokens, the weights only need to stay finite while the steps are timed
PARTS = ("all", "training", "generation")

#: ``(id, what, task, numerator (variant, mode), denominator (variant, mode), {N or B: least ratio})``, a
#: measured ratio of tokens/s per shape: the project's performance targets.
TARGETS = (
    ("plain_ours_vs_sdpa_training", "the plain model through mta's kernels over the SDPA model, training, eager",
     "training", ("plain_ours", "eager"), ("plain_sdpa", "eager"), {2048: 0.90, 8192: 0.90}),
    ("mta_vs_plain_training_eager", "the MTA model over the plain model through mta's kernels, training, eager",
     "training", ("mta", "eager"), ("plain_ours", "eager"), {2048: 0.75, 8192: 0.65}),
    ("mta_vs_plain_training_compiled", "the MTA model over the plain model through mta's kernels, training, "
     "reduce_overhead", "training", ("mta", "reduce_overhead"), ("plain_ours", "reduce_overhead"),
     {2048: 0.75, 8192: 0.65}),
    ("mta_vs_plain_generation_graphed", "the MTA model over the plain model through mta's kernels, generation, "
     "graphed", "generation", ("mta", "graphed"), ("plain_ours", "graphed"), {1: 0.85, 8: 0.85}),
    ("mta_graphed_vs_eager_generation", "the MTA model graphed over itself eager, generation", "generation",
     ("mta", "graphed"), ("mta", "eager"), {1: 5.0}),
)


@dataclass(frozen=True)
class ModelShape:
    """One measurement: ``task`` "training" (a step on ``[batch, seq_len]`` tokens) or "generation" (a prompt of
    ``seq_len`` tokens, then ``new_tokens`` decode steps), of ``variant`` (:data:`VARIANTS`) with ``layers``
    layers, run ``mode`` (:data:`TRAIN_MODES`, :data:`GEN_MODES`)."""

    task: str
    variant: str
    mode: str
    batch: int
    seq_len: int
    new_tokens: int
    layers: int

    def label(self) -> str:
        extra = f" +{self.new_tokens}" if self.task == "generation" else ""
        return f"{self.task} {self.variant} {self.mode} B={self.batch} N={self.seq_len}{extra} L={self.layers}"


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# --- the training step ----------------------------------------------------------------------------------------

def training_step(model: Callable, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
                  *, amp_dtype: Optional[torch.dtype] = torch.bfloat16,
                  mark_step: bool = False) -> Callable[[], torch.Tensor]:
    """A call that runs one step: ``model(inputs, targets)`` (the loss) under autocast to ``amp_dtype`` (None: no
    autocast), its backward, ``optimizer.step()`` and ``zero_grad``; it returns the loss without reading it (no
    host synchronisation). ``mark_step``: tell CUDA-graph trees (``reduce-overhead``) a new step begins."""
    def step():
        if mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        autocast = (contextlib.nullcontext() if amp_dtype is None else
                    torch.autocast(inputs.device.type, dtype=amp_dtype))
        with autocast:
            loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return step


def compile_reduce_overhead(model: Decoder) -> Callable:
    """``torch.compile(model, mode="reduce-overhead", dynamic=False)``: a graph per shape, not a dynamic one."""
    return torch.compile(model, mode="reduce-overhead", dynamic=False)


# --- generation -----------------------------------------------------------------------------------------------

StepFn = Callable[[torch.Tensor], torch.Tensor]


def capture_static(step_fn: StepFn, example: torch.Tensor, caches: list[SDPACache]) -> StepFn:
    """``step_fn`` (tokens ``[B, 1]`` -> next tokens, appending to every :class:`SDPACache`) as one CUDA graph: a
    call copies its input into the graph's, replays, and returns the graph's output tensor (overwritten by the next
    call). The caches' lengths live on the device, so the graph advances them itself; the two warm-up calls before
    the capture (on a side stream, as CUDA graphs need) write past the lengths, which are then put back."""
    static_in = example.clone()
    saved = [cache.lengths.clone() for cache in caches]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step_fn(static_in)
    torch.cuda.current_stream().wait_stream(stream)
    for cache, lengths in zip(caches, saved):
        cache.lengths.copy_(lengths)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step_fn(static_in)

    def replay(tokens: torch.Tensor) -> torch.Tensor:
        static_in.copy_(tokens)
        graph.replay()
        return static_out
    replay.graph = graph  # kept alive with the function
    return replay


def capture_ours(step_fn: StepFn, example: torch.Tensor, caches: list) -> StepFn:
    """``mta.capture_step(step_fn, example, caches)``: one CUDA graph per decode step over :class:`mta.KVCache`s."""
    import mta

    if not hasattr(mta, "capture_step"):
        raise RuntimeError("this version of mta has no mta.capture_step (the graphed decode step of mta's layers)")
    return mta.capture_step(step_fn, example, caches)


def capture(model: Decoder, step_fn: StepFn, example: torch.Tensor, caches: list) -> StepFn:
    """The graphed decode step of ``model``: :func:`capture_static` for SDPA's caches, :func:`capture_ours` for
    mta's."""
    return (capture_static if model.variant == "plain_sdpa" else capture_ours)(step_fn, example, caches)


@torch.no_grad()
def generate(model: Decoder, prompt: torch.Tensor, new_tokens: int,
             capture_fn: Optional[Callable[[Decoder, StepFn, torch.Tensor, list], StepFn]] = None) -> dict:
    """Greedy generation of ``new_tokens`` decode steps after ``prompt [B, P]``, caches of ``P + new_tokens``
    positions in the model's dtype; with ``capture_fn(model, step_fn, example, caches)`` the decode steps run
    through what it returns (a CUDA graph).

    Returns ``tokens [B, new_tokens + 1]`` (the prefill's next token, then each step's), ``prefill_ms``,
    ``capture_ms`` (None without ``capture_fn``) and ``decode_ms``, the wall time of the decode steps back to back
    with one synchronisation after the last.
    """
    B, P = prompt.shape
    device = prompt.device
    caches = model.new_caches(B, P + new_tokens, dtype=model.embed.weight.dtype, device=device)
    tokens = torch.empty(B, new_tokens + 1, dtype=torch.int64, device=device)
    synchronize(device)
    start = time.perf_counter()
    token = model.prefill(prompt, caches).argmax(-1, keepdim=True)
    synchronize(device)
    prefilled = time.perf_counter()
    tokens[:, :1] = token
    step = functools.partial(model.next_tokens, caches=caches)
    if capture_fn is not None:
        step = capture_fn(model, step, token, caches)
        synchronize(device)
    captured = time.perf_counter()
    for i in range(1, new_tokens + 1):
        token = step(token)
        tokens[:, i:i + 1] = token  # a graph's output is overwritten by its next replay
    synchronize(device)
    done = time.perf_counter()
    return {"tokens": tokens, "prefill_ms": (prefilled - start) * 1e3,
            "capture_ms": (captured - prefilled) * 1e3 if capture_fn is not None else None,
            "decode_ms": (done - captured) * 1e3}


# --- targets and tables ---------------------------------------------------------------------------------------

def tokens_per_s(results: list[dict], task: str, variant: str, mode: str, at: int) -> Optional[float]:
    """The measured tokens/s of ``variant`` run ``mode`` at ``at`` (N for training, B for generation), or None."""
    key = "seq_len" if task == "training" else "batch"
    found = [r.get("tokens_per_s") for r in results
             if (r["task"], r["variant"], r["mode"], r[key]) == (task, variant, mode, at)]
    return found[0] if found and found[0] else None


def targets(results: list[dict]) -> list[dict]:
    """Each of :data:`TARGETS` at each of its shapes: the measured ratio of tokens/s (None where a side is missing),
    the least ratio that meets it and ``ok`` (None where not measured)."""
    entries = []
    for target_id, what, task, (va, ma), (vb, mb), least in TARGETS:
        for at, threshold in least.items():
            a, b = tokens_per_s(results, task, va, ma, at), tokens_per_s(results, task, vb, mb, at)
            value = a / b if a and b else None
            entries.append({"target": target_id, "what": what, "at": f"{'N' if task == 'training' else 'B'}={at}",
                            "measured": value, "threshold": threshold,
                            "ok": None if value is None else value >= threshold})
    return entries


def model_tables(data: dict) -> list[tuple]:
    """Tokens/s and ms per step of each variant, training then generation, and the targets; for the command's
    output and ``docs/performance.md``."""
    results = [{**r, "impl": r["variant"]} for r in data["results"]]
    names = {"mta": "MTA", "plain_ours": "plain", "plain_sdpa": "SDPA"}

    def rate(variant):
        return (f"{names[variant]} tok/s", "{:,.0f}", measured(variant, "tokens_per_s", why=True))

    def ms(variant):
        return (f"{names[variant]} ms", "{:.2f}", measured(variant, "ms_per_step"))

    def over(a, b):
        def value(row):
            x, y = (row["records"].get(v, {}).get("tokens_per_s") for v in (a, b))
            return x / y if x and y else None
        return value
    training = shape_rows([r for r in results if r["task"] == "training"], ("mode", "batch", "seq_len"))
    generation = shape_rows([r for r in results if r["task"] == "generation"], ("mode", "batch", "seq_len"))
    shape = [("mode", "", "mode"), ("B", "{}", "batch"), ("N", "{}", "seq_len")]
    train_cols = shape + [rate(v) for v in VARIANTS] + [ms(v) for v in VARIANTS] + [
        ("MTA / plain", "{:.2f}", over("mta", "plain_ours")),
        ("plain / SDPA", "{:.2f}", over("plain_ours", "plain_sdpa"))]
    gen_cols = shape[:2] + [rate(v) for v in VARIANTS] + [ms(v) for v in VARIANTS] + [
        (f"{names[v]} prefill ms", "{:.1f}", measured(v, "prefill_ms")) for v in VARIANTS] + [
        ("MTA / plain", "{:.2f}", over("mta", "plain_ours"))]
    result = {True: "pass", False: "MISSED", None: "-"}
    target_cols = [("target", "", "what"), ("at", "", "at"), ("measured", "{:.2f}", "measured"),
                   ("at least", "{:.2f}", "threshold"), ("", "", lambda row: result[row["ok"]])]
    cfg = data["config"]
    model = cfg["model"]
    about = (f"{model['layers']} layers, dim {model['dim']}, {model['heads']}/{model['kv_heads']} heads, MTA "
             f"{'x'.join(map(str, model['kernel_size']))} in layers {', '.join(map(str, cfg['mta_layers']))}")
    tables = []
    if training:
        amp = cfg["training"]["autocast"]
        tables.append((f"Training step ({about}; {f'{amp} autocast' if amp else 'float32'}, AdamW): tokens/s and "
                       "ms per step; MTA: the MTA model, plain: plain attention through mta's kernels, SDPA: through "
                       "PyTorch SDPA:", train_cols, training))
    if generation:
        gen = cfg["generation"]
        tables.append((f"Generation ({about}; {gen['dtype']}): a {gen['prompt_len']}-token prompt, then "
                       f"{gen['new_tokens']} greedy decode steps: tokens/s and ms per step of the decode steps, and "
                       "the prefill:", gen_cols, generation))
    tables.append(("Targets: the measured ratio of tokens/s and the least that meets each:", target_cols,
                   data.get("targets") or []))
    return tables


# --- the benchmark --------------------------------------------------------------------------------------------

class ModelBenchmark(Benchmark):
    """Tokens/s of a 12-layer decoder (dim 1024, 16/4 heads, RMSNorm, SwiGLU, RoPE, tied 32000-token head) with MTA
    6x11 in every fourth layer, against the same model with plain attention through mta's kernels and through
    PyTorch SDPA: a training step (fwd, bwd, AdamW; bf16 autocast; 8x2048 and 2x8192) eager and
    torch.compile(mode="reduce-overhead"), and greedy generation (2048-token prompt, 256 new tokens, B 1 and 8)
    eager and CUDA-graphed. Records the ratios the project targets (pass or missed) without failing on them.
    --rep and --warmup count training steps. The full run takes about 8 minutes on an H200; to stay under a
    10-minute limit, run --part training, then --part generation --resume."""

    name, out = "model", "figures/bench_model.json"
    help = "a whole model's training step and generation in tokens/s: MTA vs plain attention (mta kernels, SDPA)"
    quick_help = "4 layers instead of 12"
    exit_1 = "is not used (a missed target is reported in the JSON and the tables)"
    options = {"--part": dict(dest="part", choices=PARTS, default="all",
                              help="measure only training or only generation (default all); the JSON's config does "
                                   "not name the part, so --part generation --resume adds to a training run's JSON"),
               "--gen-runs": dict(dest="gen_runs", type=int, default=GEN_RUNS,
                                  help=f"timed generations per shape, after an untimed one; the median is reported "
                                       f"(default {GEN_RUNS})")}
    Shape, plot = ModelShape, staticmethod(plot_model)

    def __init__(self, part: str = "all", gen_runs: int = GEN_RUNS, *, base: DecoderConfig = DecoderConfig(),
                 train_shapes=TRAIN_SHAPES, gen_batches=GEN_BATCHES, prompt_len: int = PROMPT_LEN,
                 new_tokens: int = NEW_TOKENS, amp_dtype: Optional[torch.dtype] = torch.bfloat16,
                 gen_dtype: Optional[torch.dtype] = torch.bfloat16,
                 compile_fn: Callable[[Decoder], Callable] = compile_reduce_overhead,
                 capture_fn: Callable = capture, seed: int = 0):
        """The defaults are the benchmark; tests shrink the model (``base``, whose ``layers`` the full run uses)
        and the shapes, run in fp32 (``amp_dtype``, ``gen_dtype`` None) and replace the compiler and the capture."""
        super().__init__()
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, got {part!r}")
        if gen_runs < 1:
            raise ValueError(f"gen_runs must be at least 1, got {gen_runs}")
        self.part, self.gen_runs, self.base = part, gen_runs, base
        self.train_shapes, self.gen_batches = tuple(train_shapes), tuple(gen_batches)
        self.prompt_len, self.new_tokens = prompt_len, new_tokens
        self.amp_dtype, self.gen_dtype, self.seed = amp_dtype, gen_dtype, seed
        self.compile_fn, self.capture_fn = compile_fn, capture_fn
        self._key = None  # (variant, layers, device) of the models below
        self._train = self._optimizer = self._compiled = self._gen = None

    def layers(self, quick: bool) -> int:
        return min(QUICK_LAYERS, self.base.layers) if quick else self.base.layers

    def model_config(self, layers: int) -> DecoderConfig:
        return replace(self.base, layers=layers)

    def shapes(self, quick: bool) -> list[ModelShape]:
        layers, shapes = self.layers(quick), []
        for variant in VARIANTS:
            if self.part in ("all", "training"):
                shapes += [ModelShape("training", variant, mode, b, n, 0, layers)
                           for mode in TRAIN_MODES for b, n in self.train_shapes]
            if self.part in ("all", "generation"):
                shapes += [ModelShape("generation", variant, mode, b, self.prompt_len, self.new_tokens, layers)
                           for b in self.gen_batches for mode in GEN_MODES]
        return shapes

    def config(self, quick, warmup, rep):
        model = self.model_config(self.layers(quick))
        amp = str(self.amp_dtype).removeprefix("torch.") if self.amp_dtype else None
        gen_dtype = str(self.gen_dtype).removeprefix("torch.") if self.gen_dtype else "float32"
        return {
            "benchmark": "model", "quick": quick, "model": asdict(model),
            "mta_layers": list(model.mta_layer_indices()), "parameters": model.parameters(), "tied_head": True,
            "variants": {"mta": f"MultiTokenAttention kernel_size={model.kernel_size} in mta_layers, (1, 1) "
                                "elsewhere",
                         "plain_ours": "MultiTokenAttention kernel_size=(1, 1) in every layer (mta's flash and "
                                       "decode kernels)",
                         "plain_sdpa": "SDPAAttention in every layer: F.scaled_dot_product_attention, is_causal and "
                                       "enable_gqa; decode over a static cache with a length mask"},
            "training": {"shapes": [list(s) for s in self.train_shapes], "modes": list(TRAIN_MODES),
                         "compile": "torch.compile(model, mode='reduce-overhead', dynamic=False), one per variant",
                         "autocast": amp, "optimizer": f"torch.optim.AdamW(lr={LEARNING_RATE}), fused on CUDA",
                         "loss": "cross-entropy of the tied head's logits on uniformly random tokens",
                         "warmup": warmup, "rep": rep,
                         "timing": "wall time per step of rep steps back to back after warmup steps, one "
                                   "synchronize after the last (host work and launch overhead included); "
                                   "first_step_s: the first step alone (compilation included)"},
            "generation": {"prompt_len": self.prompt_len, "new_tokens": self.new_tokens,
                           "batches": list(self.gen_batches), "modes": list(GEN_MODES), "dtype": gen_dtype,
                           "decoding": "greedy, argmax on the device", "runs": self.gen_runs,
                           "graphed": "mta.capture_step (mta's caches), torch.cuda.CUDAGraph (SDPA's static cache)",
                           "timing": "wall time of the new_tokens decode steps back to back, one synchronize after "
                                     "the last; the prefill timed alone; the median of runs after one untimed"},
        }

    def summarize(self, results):
        return {"targets": targets(results)}

    def tables(self, data):
        return model_tables(data)

    # --- measuring ---

    def _models_for(self, shape: ModelShape, device) -> DecoderConfig:
        """Drop the models of another variant (and the compiler's caches with the compiled one)."""
        key = (shape.variant, shape.layers, str(device))
        if key != self._key:
            compiled = self._compiled is not None
            self._train = self._optimizer = self._compiled = self._gen = None
            if compiled:
                torch.compiler.reset()
            release_memory()
            self._key = key
        return self.model_config(shape.layers)

    def measure_shape(self, shape: ModelShape, tools: Tools) -> list[dict]:
        record = {**asdict(shape), "tokens_per_s": None, "ms_per_step": None, "status": "ok", "error": None}
        try:
            measure = self.measure_training if shape.task == "training" else self.measure_generation
            record.update(measure(shape, tools))
        except Exception as exc:  # noqa: BLE001  (an OOM or a failing compile is a result)
            record["status"] = "oom" if is_oom(exc) else "error"
            record["error"] = describe_error(exc)
        if record["status"] != "ok":  # outside the except block: the exception's frames are gone
            tools.warn(f"!!! {shape.label()}: {record['error']}")
            release_memory()
        return [record]

    def measure_training(self, shape: ModelShape, tools: Tools) -> dict:
        device = torch.device(tools.device)
        config = self._models_for(shape, device)
        if self._train is None:
            self._train = build(config, shape.variant, seed=self.seed, device=device)
            self._optimizer = torch.optim.AdamW(self._train.parameters(), lr=LEARNING_RATE,
                                                fused=device.type == "cuda")
        compiled = shape.mode == "reduce_overhead"
        if compiled and self._compiled is None:
            self._compiled = self.compile_fn(self._train)
        generator = torch.Generator(device).manual_seed(self.seed)
        inputs, targets_ = (torch.randint(config.vocab, (shape.batch, shape.seq_len), device=device,
                                          generator=generator) for _ in range(2))
        step = training_step(self._compiled if compiled else self._train, self._optimizer, inputs, targets_,
                             amp_dtype=self.amp_dtype, mark_step=compiled)
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        first = time.perf_counter() - start
        ms = tools.wall(step)
        return {"ms_per_step": ms, "tokens_per_s": shape.batch * shape.seq_len / (ms / 1e3), "first_step_s": first}

    def measure_generation(self, shape: ModelShape, tools: Tools) -> dict:
        device = torch.device(tools.device)
        config = self._models_for(shape, device)
        if self._gen is None:
            self._gen = build(config, shape.variant, seed=self.seed, device=device, dtype=self.gen_dtype).eval()
        generator = torch.Generator(device).manual_seed(self.seed)
        prompt = torch.randint(config.vocab, (shape.batch, shape.seq_len), device=device, generator=generator)
        capture_fn = self.capture_fn if shape.mode == "graphed" else None
        runs = [generate(self._gen, prompt, shape.new_tokens, capture_fn) for _ in range(1 + self.gen_runs)][1:]
        decode_ms = statistics.median(r["decode_ms"] for r in runs)
        out = {"ms_per_step": decode_ms / shape.new_tokens, "decode_ms": decode_ms,
               "tokens_per_s": shape.batch * shape.new_tokens / (decode_ms / 1e3),
               "prefill_ms": statistics.median(r["prefill_ms"] for r in runs),
               "decode_ms_runs": [r["decode_ms"] for r in runs]}
        if capture_fn is not None:
            out["capture_ms"] = statistics.median(r["capture_ms"] for r in runs)
        return out
