"""The skeleton every benchmark shares.

A benchmark is a :class:`Benchmark` subclass that declares its shapes, implementations, correctness check, table
and plot. :func:`run` does the rest, the same way for all: a progress bar over the shapes, the check before
anything is timed (a failure is printed at once and again at the end, and makes the exit status 1), the timing
(:mod:`mta.bench.timing`), the JSON (provenance, config, results; non-finite floats written as null; rewritten
after every shape, so ``--resume`` can go on from an interrupted run) and the PNG next to it.

Records are flat dicts: the shape's fields, the measurements and, where something was checked, ``"check"``: a
dict whose ``"ok"`` says if it passed.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import statistics
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Optional, Union

import torch

#: Provenance fields that must match for a run to go on from another's partial results.
RESUME_KEYS = ("gpu", "torch", "triton", "git_commit", "mta_source_sha256")


@dataclass(frozen=True)
class Pass:
    """One measured pass of every implementation (e.g. forward, forward+backward) and the keys of its time, its
    peak extra memory (None: not measured) and its error."""

    name: str
    time_key: str
    memory_key: Optional[str] = None
    error_key: str = "error"


@dataclass
class Tools:
    """What measuring needs; tests pass fakes. ``timer(fn, before_each=None) -> ms``, ``memory(fn) -> bytes``,
    ``warn(line)`` prints without breaking the progress bar."""

    timer: Callable[..., float]
    memory: Callable[[Callable], int]
    device: object = "cuda"
    warn: Callable[[str], None] = print


class Benchmark:
    """What a benchmark declares: the attributes below, and

    * ``shapes(quick) -> list`` of ``Shape`` (a frozen dataclass with ``label()``),
    * ``config(quick, warmup, rep) -> dict``, ``report(data) -> str`` (the table), ``plot(data) -> Figure``,
    * either ``measure_shape(shape, tools) -> list of records``, or, to compare implementations of one function
      with the default :meth:`measure_shape`: ``default_impls() -> {name: fn}``, ``inputs(shape, device)``,
      ``check(name, fn, shape, inputs) -> {"ok", "error", ...}`` (for each of :attr:`checked`) and
      ``calls(fn, shape, inputs) -> {pass name: (call, reset)}``: ``call()`` runs the pass, ``reset()`` (or
      None) runs before each call and after the last, outside the timed region.
    """

    name = out = help = description = quick_help = ""  # subcommand, default JSON path, --help texts
    exit_1 = "a correctness check failed"  # what exit status 1 means, for --help
    timed = True  # takes --warmup and --rep
    Shape: type = object
    tested: Optional[str] = None  # the implementation under test (its failed checks are crossed out in plots)
    passes: tuple[Pass, ...] = ()

    @property
    def checked(self) -> tuple[str, ...]:
        """The implementations whose output is checked before anything is timed."""
        return (self.tested,) if self.tested else ()

    def __init__(self, impls: Optional[dict[str, Callable]] = None):
        self._impls = impls  # tests give their own; None: default_impls()

    def impls(self) -> dict[str, Callable]:
        return self.default_impls() if self._impls is None else self._impls

    @staticmethod
    def add_args(parser) -> None:
        """Options of this benchmark only (the common ones are added by the command line)."""

    @classmethod
    def from_args(cls, args) -> "Benchmark":
        return cls()

    def skip(self, impl: str, shape, inputs) -> Union[None, str, dict[str, str]]:
        """Why ``impl`` is not run at ``shape``: a reason (no pass runs), ``{pass name: reason}`` (those passes do
        not run) or None (every pass runs)."""
        return None

    def finish(self, record: dict) -> None:
        """Add derived fields (rates) to a measured record."""

    def summarize(self, results: list[dict]) -> dict:
        """Extra top-level JSON entries computed from the results."""
        return {}

    @staticmethod
    def format_check(check: dict) -> str:
        return check.get("error") or "failed"

    def shape_of(self, record: dict):
        return self.Shape(**{f.name: record[f.name] for f in fields(self.Shape)})

    def measure_shape(self, shape, tools: Tools) -> list[dict]:
        """One record per implementation at ``shape``; the checked ones carry their check, made first."""
        impls = self.impls()
        inputs = self.inputs(shape, tools.device)
        checks = {name: self.check(name, impls[name], shape, inputs) for name in self.checked if name in impls}
        for name, check in checks.items():
            if not check["ok"]:
                tools.warn(failure_line(self, name, shape, check))
        records = []
        for name, fn in impls.items():
            record = {"impl": name, **asdict(shape)}
            reason = self.skip(name, shape, inputs)
            skipped = reason if isinstance(reason, dict) else {p.name: reason for p in self.passes} if reason else {}
            calls = self.calls(fn, shape, inputs) if len(skipped) < len(self.passes) else {}
            record.update(measure(calls, self.passes, tools, skipped))
            if name in checks:
                record["check"] = checks[name]
            self.finish(record)
            records.append(record)
        del inputs
        release_memory()
        return records


def measure(calls: dict, passes: tuple[Pass, ...], tools: Tools, skipped: Optional[dict[str, str]] = None) -> dict:
    """Each pass's time (and peak extra memory) in order; the first failure ends the measuring.

    A failure is recorded, not raised: status "oom" or "error", and the error with the warnings raised along
    (SDPA says there why a backend refused). A pass in ``skipped`` (``{pass name: reason}``) is not run: its error
    key holds the reason, and the status is "skipped" unless a pass that ran failed.
    """
    keys = [k for p in passes for k in (p.time_key, p.memory_key, p.error_key) if k]
    m, skipped = {**dict.fromkeys(keys), "status": "ok"}, skipped or {}  # every key the passes fill
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for p in passes:
            if p.name in skipped:
                m[p.error_key] = skipped[p.name]
                continue
            call, reset = calls[p.name]
            seen = len(caught)  # an earlier pass's warnings say nothing about this one
            try:
                m[p.time_key] = tools.timer(call, before_each=reset)
                if p.memory_key:
                    if reset is not None:
                        reset()
                    m[p.memory_key] = int(tools.memory(call))
            except Exception as exc:  # noqa: BLE001  (OOM, an unavailable backend...: recorded, not fatal)
                m["status"] = "oom" if is_oom(exc) else "error"
                m[p.error_key] = describe_error(exc, caught[seen:])
            finally:
                if reset is not None:
                    reset()
            if m["status"] != "ok":
                break
    if m["status"] != "ok":  # outside the except block, so the exception's frames (and tensors) are gone
        release_memory()
    elif skipped:
        m["status"] = "skipped"
    return m


def recorded_call(fn: Callable, *args) -> tuple:
    """``(fn(*args), None)``, or ``(None, error)`` where it raises: the exception and the warnings raised along
    (:func:`describe_error`)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(*args), None
        except Exception as exc:  # noqa: BLE001  (recorded: a failing kernel is a result)
            return None, describe_error(exc, caught)


def describe_error(exc: BaseException, caught=()) -> str:
    """One line: the exception and the warnings raised with it."""
    lines = [f"{type(exc).__name__}: {str(exc).strip()}"] + [str(w.message).strip() for w in caught]
    return " | ".join(" ".join(line.split()) for line in lines)[:600]


def is_oom(exc: Optional[BaseException]) -> bool:
    """True for a CUDA out-of-memory error, also when another exception wraps it (torch.compile does)."""
    while exc is not None:
        if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def release_memory() -> None:
    """Drop unreachable tensors (an exception's frames hold some) and return cached blocks to the GPU."""
    if torch.cuda.is_available():  # nothing to return on the CPU (the tests), and gc.collect is slow
        gc.collect()
        torch.cuda.empty_cache()


def cuda_free_bytes() -> int:
    """Free memory of the current CUDA device, after returning PyTorch's cached blocks to it."""
    release_memory()
    return torch.cuda.mem_get_info()[0]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref|| / ||ref||`` in fp32 on the tensors' device; inf if x is not finite."""
    x, ref = x.detach().float(), ref.detach().float()
    if not torch.isfinite(x).all():
        return math.inf
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def failure_line(bench: Benchmark, impl: Optional[str], shape, check: dict) -> str:
    return f"!!! {impl or bench.name} FAILS ITS CHECK at {shape.label()}: {bench.format_check(check)}"


# --- reporting -------------------------------------------------------------------------------

def by_shape(results: list[dict], keys: tuple[str, ...]) -> dict[tuple, dict[str, dict]]:
    """``{(record[k] for k in keys): {impl: record}}`` in the order of the results."""
    table: dict[tuple, dict[str, dict]] = {}
    for r in results:
        table.setdefault(tuple(r[k] for k in keys), {})[r["impl"]] = r
    return table


def check_failed(records: dict[str, dict], impls) -> bool:
    """Whether one of ``impls`` in ``{impl: record}`` failed its check (a record without one did not)."""
    checks = [records.get(name, {}).get("check") for name in impls]
    return any(check is not None and not check.get("ok") for check in checks)


def ratio(records: dict[str, dict], a: str, b: str, key: str) -> Optional[float]:
    """``records[a][key] / records[b][key]``, None where either is missing or not positive."""
    x, y = records.get(a, {}).get(key), records.get(b, {}).get(key)
    return x / y if x is not None and y is not None and x > 0 and y > 0 else None


def median_ratios(results: list[dict], keys: tuple[str, ...], ratios: dict[str, tuple[str, str, str]],
                  min_seq_len: int) -> list[dict]:
    """Per group of shapes equal in ``keys`` (all but ``seq_len``): its fields, ``min_seq_len`` and the median over
    its N >= ``min_seq_len`` of each ratio ``{name: (a, b, key)}`` (:func:`ratio`; None if there is none)."""
    groups: dict[tuple, list[dict[str, dict]]] = {}
    for key, records in by_shape(results, (*keys, "seq_len")).items():
        if key[-1] >= min_seq_len:
            groups.setdefault(key[:-1], []).append(records)
    summary = []
    for group, rows in groups.items():
        entry = {**dict(zip(keys, group)), "min_seq_len": min_seq_len}
        for name, (a, b, key) in ratios.items():
            values = [x for x in (ratio(row, a, b, key) for row in rows) if x is not None]
            entry[name] = statistics.median(values) if values else None
        summary.append(entry)
    return summary


def text_table(columns: list[tuple[str, str]], rows: list[list]) -> str:
    """``rows`` under a header and a rule, each column as wide as its widest cell. ``columns``: ``(header,
    format)``, e.g. ``("ms", "{:.3f}")``. A cell is a number (formatted), a string (as it is) or None (a dash);
    columns with the format "" are text, left-aligned, the others right-aligned."""
    def text(x, fmt: str) -> str:
        return "-" if x is None else x if isinstance(x, str) else fmt.format(x)
    cells = [[h for h, _ in columns]] + [[text(x, f) for x, (_, f) in zip(row, columns)] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = [" ".join(c.rjust(w) if f else c.ljust(w) for c, w, (_, f) in zip(row, widths, columns)).rstrip()
             for row in cells]
    return "\n".join([lines[0], "-" * max(map(len, lines)), *lines[1:]])


def json_safe(x):
    """``x`` with non-finite floats replaced by None, so the JSON stays standard."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def save_png(fig, path: Path) -> Path:
    """Write ``fig`` as :func:`mta.figures.save_figure` does (no timestamp, so reruns diff cleanly); close it."""
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    finally:
        plt.close(fig)
    return path


# --- the run ---------------------------------------------------------------------------------

def run_shapes(bench: Benchmark, shapes: list, tools: Tools, *, done: Optional[list[dict]] = None,
               after_each: Optional[Callable[[list[dict]], None]] = None, progress: bool = True) -> list[dict]:
    """Measure every shape not already in ``done``, with a progress bar; ``after_each(results)`` after each."""
    from tqdm.auto import tqdm

    results = list(done or [])
    measured = {bench.shape_of(r) for r in results}
    bar = tqdm([s for s in shapes if s not in measured], desc=bench.name, unit="shape", disable=not progress)
    for shape in bar:
        bar.set_postfix_str(shape.label())
        results.extend(bench.measure_shape(shape, tools))
        if after_each is not None:
            after_each(results)
    return results


def write_results(out: Path, bench: Benchmark, prov: dict, cfg: dict, results: list[dict], complete: bool) -> dict:
    """Write the JSON (``complete``: False while shapes are still to run) and return what was written."""
    data = json_safe({"provenance": prov, "config": cfg, "complete": complete, "results": results,
                      **bench.summarize(results)})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    return data


def resumable_results(path: Path, prov: dict, cfg: dict) -> list[dict]:
    """The results in ``path`` of an interrupted run of the same benchmark, code and machine; else ValueError."""
    saved = json.loads(path.read_text())
    if saved.get("config") != json_safe(cfg):
        raise ValueError(f"cannot resume from {path}: it was run with another configuration")
    diff = [k for k in RESUME_KEYS if saved.get("provenance", {}).get(k) != prov.get(k)]
    if diff:
        raise ValueError(f"cannot resume from {path}: {', '.join(diff)} differ from this run's")
    return saved.get("results", [])


def run_benchmark(bench: Benchmark, tools: Tools, *, out: Path, quick: bool = False, warmup: int = 10,
                  rep: int = 30, resume: bool = False, progress: bool = True) -> int:
    """Measure, write ``out`` and the PNG beside it, print the table and every failed check; the exit status:
    0, or 1 if a check failed."""
    from .provenance import provenance

    torch.manual_seed(0)
    prov, cfg = provenance(), bench.config(quick, warmup, rep)
    done = resumable_results(out, prov, cfg) if resume and out.exists() else []
    if done:
        print(f"resuming from {out}: {len({bench.shape_of(r) for r in done})} shapes already measured")
    results = run_shapes(bench, bench.shapes(quick), tools, done=done, progress=progress,
                         after_each=lambda r: write_results(out, bench, prov, cfg, r, complete=False))
    data = write_results(out, bench, prov, cfg, results, complete=True)
    try:
        wrote = f"wrote {out} and {save_png(bench.plot(data), out.with_suffix('.png'))}"
    except Exception as exc:  # noqa: BLE001  (the numbers are safe in the JSON; the figure can be redrawn)
        wrote = f"wrote {out}; the figure failed ({describe_error(exc)}), redraw it with mta.bench.plots"
    print(bench.report(data))
    print(f"\n{wrote}")
    failed = [r for r in data["results"] if "check" in r and not r["check"]["ok"]]  # a record without one: no failure
    for r in failed:
        print(failure_line(bench, r.get("impl"), bench.shape_of(r), r["check"]))
    return 1 if failed else 0


def run(bench: Benchmark, *, out: Path, quick: bool = False, warmup: int = 10, rep: int = 30,
        resume: bool = False) -> int:
    """:func:`run_benchmark` on the current CUDA GPU, timed by :mod:`mta.bench.timing`."""
    from tqdm.auto import tqdm

    from .timing import peak_extra_memory_bytes, require_cuda, time_ms

    device = require_cuda(f"the {bench.name} benchmark")
    tools = Tools(timer=functools.partial(time_ms, warmup=warmup, rep=rep), memory=peak_extra_memory_bytes,
                  device=device, warn=tqdm.write)
    return run_benchmark(bench, tools, out=out, quick=quick, warmup=warmup, rep=rep, resume=resume)
