"""The harness every benchmark shares: a :class:`Benchmark` declares shapes, implementations, check, tables and
plot; :func:`run_benchmark` checks, times, rewrites the JSON (with provenance) after every shape, draws the PNG and
prints the tables. A record is a flat dict: the shape's fields, the measurements and, where checked, ``"check"``.
"""

from __future__ import annotations

import datetime
import gc
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Optional, Union

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Provenance that must match for a run to go on from another's partial results.
RESUME_KEYS = ("gpu", "torch", "triton", "git_commit", "mta_source_sha256")


@dataclass(frozen=True)
class Pass:
    """A measured pass and the record keys of its time, peak extra memory (None: not measured) and error; its wall
    time per call goes under :attr:`wall_key`."""

    name: str
    time_key: str
    memory_key: Optional[str] = None
    error_key: str = "error"

    @property
    def wall_key(self) -> str:
        """``fwd_ms`` -> ``fwd_wall_ms``: the key of the pass's wall time per call in a back-to-back loop."""
        stem = self.time_key.removesuffix("ms").rstrip("_")
        return f"{stem}_wall_ms" if stem else "wall_ms"


@dataclass
class Tools:
    """``timer(call, before_each=reset) -> ms`` (the GPU's time), ``memory(call) -> bytes`` and
    ``wall(call, before_each=reset) -> ms`` (the wall time per call in a back-to-back loop; None: not measured;
    tests pass fakes), the device, and ``warn(line)``, which prints without breaking the progress bar."""

    timer: Callable[..., float]
    memory: Optional[Callable[[Callable], int]] = None
    device: object = "cuda"
    warn: Callable[[str], None] = print
    wall: Optional[Callable[..., float]] = None


class Benchmark:
    """Declares the attributes below, ``shapes(quick)`` (frozen ``Shape`` dataclasses with ``label()``),
    ``config(quick, warmup, rep)``, ``tables(data)`` (:func:`render_tables`) and ``plot(data)``; and either
    ``measure_shape(shape, tools) -> records`` or, to compare implementations, ``default_impls() -> {name: fn}``,
    ``inputs(shape, device)``, ``check(name, fn, shape, inputs) -> {"ok", "error", ...}`` for each of ``checked``
    and ``calls(fn, shape, inputs) -> {pass name: (call, reset)}``, ``reset`` (or None) run untimed before each
    call and after the last."""

    name = out = help = quick_help = ""  # subcommand, default JSON path, --help texts (the docstring describes it)
    exit_1 = "a correctness check failed"  # what exit status 1 means, for --help
    timed = True  # takes --warmup and --rep
    options: dict[str, dict] = {}  # own flags: {flag: add_argument's keywords}, each dest a constructor argument
    Shape: type = object
    checked: tuple[str, ...] = ()  # the implementations checked before anything is timed
    passes: tuple[Pass, ...] = ()

    def __init__(self, impls: Optional[dict[str, Callable]] = None):
        self._impls = impls  # tests give their own; None: default_impls()

    def skip(self, impl: str, shape, inputs) -> dict[str, str]:
        """``{pass name: why impl does not run it at shape}``."""
        return {}

    def finish(self, record: dict) -> None:
        """Adds derived fields (rates) to a measured record."""

    def summarize(self, results: list[dict]) -> dict:
        """Extra top-level entries of the JSON."""
        return {}

    def format_check(self, check: dict) -> str:
        return check.get("error") or "failed"

    def failure(self, impl: Optional[str], shape, check: dict) -> str:
        return f"!!! {impl or self.name} FAILS ITS CHECK at {shape.label()}: {self.format_check(check)}"

    def shape_of(self, record: dict):
        return self.Shape(**{f.name: record[f.name] for f in fields(self.Shape)})

    def report(self, data: dict) -> str:
        return render_tables(self.tables(data), self.checked)

    def measure_shape(self, shape, tools: Tools) -> list[dict]:
        """One record per implementation at ``shape``; the checked ones carry their check, made first."""
        impls = self.default_impls() if self._impls is None else self._impls
        inputs = self.inputs(shape, tools.device)
        checks = {name: self.check(name, impls[name], shape, inputs) for name in self.checked if name in impls}
        for name, check in checks.items():
            if not check["ok"]:
                tools.warn(self.failure(name, shape, check))
        records = []
        for name, fn in impls.items():
            skipped = self.skip(name, shape, inputs)
            calls = self.calls(fn, shape, inputs) if len(skipped) < len(self.passes) else {}
            records.append({"impl": name, **asdict(shape), **measure(calls, self.passes, tools, skipped)})
            if name in checks:
                records[-1]["check"] = checks[name]
            self.finish(records[-1])
        del inputs
        release_memory()
        return records


def measure(calls: dict, passes: tuple[Pass, ...], tools: Tools, skipped: Optional[dict[str, str]] = None) -> dict:
    """Each pass's time (and peak extra memory) in order, until the first failure: recorded, not raised, as status
    "oom" or "error" and the error with the warnings raised along (SDPA says there why a backend refused). A pass
    in ``skipped`` (``{name: reason}``) has the reason as its error; the status is then "skipped" if nothing failed.
    """
    keys = [k for p in passes for k in (p.time_key, p.wall_key if tools.wall else None, p.memory_key, p.error_key)
            if k]
    m, skipped = {**dict.fromkeys(keys), "status": "ok"}, skipped or {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for p in passes:
            if p.name in skipped:
                m[p.error_key] = skipped[p.name]
                continue
            call, reset = calls[p.name]
            clear = reset or (lambda: None)
            seen = len(caught)  # an earlier pass's warnings say nothing about this one
            try:
                m[p.time_key] = tools.timer(call, before_each=reset)
                if tools.wall is not None:
                    clear()
                    m[p.wall_key] = tools.wall(call, before_each=reset)
                if p.memory_key:
                    clear()
                    m[p.memory_key] = int(tools.memory(call))
            except Exception as exc:  # noqa: BLE001  (OOM, an unavailable backend...: recorded, not fatal)
                m["status"] = "oom" if is_oom(exc) else "error"
                m[p.error_key] = describe_error(exc, caught[seen:])
            finally:
                clear()
            if m["status"] != "ok":
                break
    if m["status"] != "ok":  # outside the except block, so the exception's frames (and tensors) are gone
        release_memory()
    elif skipped:
        m["status"] = "skipped"
    return m


def recorded_call(fn: Callable) -> tuple:
    """``(fn(), None)``, or ``(None, error)`` where it raises (:func:`describe_error`)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(), None
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
    """Free memory of the current CUDA device, PyTorch's cached blocks returned first."""
    release_memory()
    return torch.cuda.mem_get_info()[0]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref|| / ||ref||`` in fp32 on the tensors' device; inf if x is not finite."""
    x, ref = x.detach().float(), ref.detach().float()
    if not torch.isfinite(x).all():
        return math.inf
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# --- results and tables ----------------------------------------------------------------------

def shape_rows(results: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """A row per shape (records equal in ``keys``), in the results' order: its fields and ``"records"``,
    ``{impl: record}``."""
    rows: dict[tuple, dict] = {}
    for r in results:
        key = tuple(r[k] for k in keys)
        rows.setdefault(key, {**dict(zip(keys, key)), "records": {}})["records"][r["impl"]] = r
    return list(rows.values())


def ratio(records: dict[str, dict], a: str, b: str, key: str) -> Optional[float]:
    """``records[a][key] / records[b][key]``, None where either is missing or not positive."""
    x, y = records.get(a, {}).get(key), records.get(b, {}).get(key)
    return x / y if x is not None and y is not None and x > 0 and y > 0 else None


def measured(impl: str, key: str, scale: float = 1.0, why: bool = False) -> Callable[[dict], object]:
    """A column of :func:`shape_rows`: ``impl``'s ``key`` times ``scale``; where it is missing None or, with
    ``why``, the record's reason: "skip", "oom" or "err"."""
    def value(row):
        record = row["records"].get(impl, {})
        if record.get(key) is not None:
            return record[key] * scale
        return {"skipped": "skip", "oom": "oom", "error": "err"}.get(record.get("status")) if why else None
    return value


def median_ratios(results: list[dict], keys: tuple[str, ...], ratios: dict[str, tuple[str, str, str]],
                  min_seq_len: int) -> list[dict]:
    """Per group of shapes equal in ``keys`` (all but ``seq_len``): its fields, ``min_seq_len`` and the median over
    its N >= ``min_seq_len`` of each ratio ``{name: (a, b, key)}`` (:func:`ratio`; None if there is none)."""
    groups: dict[tuple, list[dict[str, dict]]] = {}
    for row in shape_rows(results, (*keys, "seq_len")):
        if row["seq_len"] >= min_seq_len:
            groups.setdefault(tuple(row[k] for k in keys), []).append(row["records"])
    summary = []
    for group, rows in groups.items():
        entry = {**dict(zip(keys, group)), "min_seq_len": min_seq_len}
        for name, (a, b, key) in ratios.items():
            values = [x for x in (ratio(row, a, b, key) for row in rows) if x is not None]
            entry[name] = statistics.median(values) if values else None
        summary.append(entry)
    return summary


Column = tuple[str, str, Union[str, Callable[[dict], object]]]


def format_table(columns: list[Column], rows: list[dict]) -> str:
    """``rows`` under a header and a rule, each column as wide as its widest cell. A column is ``(header, format,
    value)``: ``value`` a row's key or a function of the row, giving a number (formatted, e.g. ``"{:.3f}"``), a
    string (as it is) or None (a dash). Columns with the format "" are text, left-aligned; the others right."""
    def cell(row, fmt, value):
        x = row.get(value) if isinstance(value, str) else value(row)
        return "-" if x is None else x if isinstance(x, str) else fmt.format(x) if fmt else str(x)
    cells = [[h for h, _, _ in columns]] + [[cell(row, f, v) for _, f, v in columns] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = [" ".join(c.rjust(w) if f else c.ljust(w) for c, w, (_, f, _) in zip(row, widths, columns)).rstrip()
             for row in cells]
    return "\n".join([lines[0], "-" * max(map(len, lines)), *lines[1:]])


def render_tables(tables: list[tuple[str, list[Column], list[dict]]], checked=()) -> str:
    """Each ``(title, columns, rows)`` under its title; a row whose check failed, or at a shape (:func:`shape_rows`)
    the check of one of ``checked``, ends in "!"."""
    def failed(row):
        checks = [row.get("check"), *(row.get("records", {}).get(name, {}).get("check") for name in checked)]
        return any(check is not None and not check.get("ok") for check in checks)
    mark = ("", "", lambda row: "!" if failed(row) else "")
    return "\n\n".join(f"{title}\n{format_table([*columns, mark], rows)}" for title, columns, rows in tables)


def json_safe(x):
    """``x`` with non-finite floats replaced by None, so the JSON stays standard."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


# --- provenance: which code on which machine produced a result (None where a tool is absent) ----

def _run(cmd: list[str], cwd: Optional[Path] = None) -> Optional[str]:
    """stdout of ``cmd`` stripped, or None if it is missing, fails or hangs."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_info(root: Path = REPO_ROOT) -> dict:
    """Commit of the checkout and whether ``mta/`` differs from it, None without git. ``MTA_GIT_COMMIT``, when set,
    names the commit instead (dirty unknown): a copy of the tree on a rented GPU machine may have a stale ``.git``."""
    if os.environ.get("MTA_GIT_COMMIT"):
        return {"git_commit": os.environ["MTA_GIT_COMMIT"], "git_dirty": None}
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = _run(["git", "status", "--porcelain", "--", "mta"], cwd=root)
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def source_hash(root: Path = REPO_ROOT) -> str:
    """sha256 over ``mta/**/*.py`` (paths and contents): identifies the code even without git."""
    digest = hashlib.sha256()
    for path in sorted((root / "mta").rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def provenance() -> dict:
    """GPU ("cpu" without CUDA), versions, commit, source hash, time and argv."""
    has_cuda = torch.cuda.is_available()
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if has_cuda else None
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:  # e.g. installed as pytorch-triton
        triton = None
    return {
        "gpu": torch.cuda.get_device_name() if has_cuda else "cpu",
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability())) if has_cuda else None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver": driver.splitlines()[0].strip() if driver else None,  # one line per GPU; they share a driver
        "torch": torch.__version__,
        "triton": triton,
        "python": platform.python_version(),
        **git_info(),
        "mta_source_sha256": source_hash(),
        "utc_time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
    }


# --- the run ---------------------------------------------------------------------------------

def run_shapes(bench: Benchmark, shapes: list, tools: Tools, *, done: Optional[list[dict]] = None,
               after_each: Optional[Callable[[list[dict]], None]] = None, progress: bool = True) -> list[dict]:
    """Measure every shape not already in ``done``, with a progress bar; ``after_each(results)`` after each."""
    from tqdm.auto import tqdm

    results = list(done or [])
    measured_shapes = {bench.shape_of(r) for r in results}
    bar = tqdm([s for s in shapes if s not in measured_shapes], desc=bench.name, unit="shape", disable=not progress)
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
    """Measure, write ``out`` and the PNG, print the tables and every failed check; exit status 1 if one failed."""
    torch.manual_seed(0)
    prov, cfg = provenance(), bench.config(quick, warmup, rep)
    done = resumable_results(out, prov, cfg) if resume and out.exists() else []
    if done:
        print(f"resuming from {out}: {len({bench.shape_of(r) for r in done})} shapes already measured")
    results = run_shapes(bench, bench.shapes(quick), tools, done=done, progress=progress,
                         after_each=lambda r: write_results(out, bench, prov, cfg, r, complete=False))
    data = write_results(out, bench, prov, cfg, results, complete=True)
    png = out.with_suffix(".png")
    try:
        import matplotlib.pyplot as plt

        fig = bench.plot(data)
        try:  # as mta.course.figures.save_figure writes (no timestamp, so reruns diff cleanly)
            fig.savefig(png, dpi=110, bbox_inches="tight", metadata={"Software": None})
        finally:
            plt.close(fig)
        wrote = f"wrote {out} and {png}"
    except Exception as exc:  # noqa: BLE001  (the numbers are safe in the JSON; the figure can be redrawn)
        wrote = f"wrote {out}; the figure failed ({describe_error(exc)}), redraw it with mta.bench.plots"
    print(bench.report(data))
    print(f"\n{wrote}")
    failed = [r for r in data["results"] if "check" in r and not r["check"]["ok"]]
    for r in failed:
        print(bench.failure(r.get("impl"), bench.shape_of(r), r["check"]))
    return 1 if failed else 0
