"""``python -m mta.bench report``: ``docs/performance.md``, rendered from the committed benchmark results.

Every number on the page is read from ``figures/bench_*.json`` (what the benchmarks write, with their provenance);
the words around the numbers are :data:`PREAMBLE`, :data:`FILE_NOTES` and the table titles below.
``tests/test_bench_report.py`` checks that the committed page is what this renders, so it cannot go stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from .conv import HEADLINE_AT
from .harness import REPO_ROOT, Column, measured, ratio, shape_rows
from .host import host_tables
from .model import model_tables

FIGURES = "figures"
OUT = "docs/performance.md"
HELP = "render docs/performance.md from the committed figures/bench_*.json (no GPU needed)"
#: Where the flash and decode tables take their single-length columns (the conv tables: at :data:`HEADLINE_AT`).
FLASH_N = 8192
DECODE_N = 65536
#: The benchmarks in the order the page shows them (a JSON's ``config["benchmark"]``, else its subcommand).
KINDS = ("flash", "conv", "order", "decode", "startup", "host", "model")
TITLES = {"flash": "mta.flash_attention against SDPA",
          "conv": "mta.conv_attention (MTA) against flash attention and the reference",
          "order": "causal tiles launched heaviest first",
          "decode": "one decode step against a KV cache",
          "startup": "the first call in a fresh process",
          "host": "host time per call against SDPA",
          "model": "a whole model in tokens/s: MTA against plain attention"}
#: What a file's provenance does not say about it.
FILE_NOTES = {
    "bench_conv.json": "This run predates the two-phase backward (`mta.conv_two_phase`): its backward is the one-pass "
                       "kernels at every shape.",
    "bench_conv_h200_one_pass.json": "This run predates the two-phase backward (`mta.conv_two_phase`): its backward "
                                     "is the one-pass kernels at every shape. Chapter 05 sets it beside "
                                     "`bench_conv_h200.json`, the same quick run with the two phases.",
}

PREAMBLE = """\
# Performance

This page is generated: `python -m mta.bench report` renders it from the committed benchmark results,
`figures/bench_*.json`, and `tests/test_bench_report.py` fails when it differs from what that command renders. Do
not edit it by hand. Every number below is read from those files; each section names the GPU, the software, the
commit and the command of its run. [decisions.md](decisions.md) lists the design choices that GPU measurements
settled.

## What the benchmarks measure

Each benchmark is a command run on a CUDA GPU (H100 or H200). It checks `mta` against a reference before it times
anything, writes `figures/bench_<name>.json` with its provenance and draws a PNG beside it. Two timings appear.
**GPU time** (the plain `ms`, `us` and TFLOPS columns) is the CUDA-event median of repeated calls, each after an L2
flush and behind a GPU spin that hides the host's launch overhead: what the GPU spends on a call. **Wall time** (the
`wall` columns, in runs that record it) is the time per call of calls back to back with no synchronisation between
them, launch overhead included, as a training or generation loop sees it: where Python and the kernel launches take
longer than the GPU's work (small problems, one decode step), it is the larger of the two.

- `python -m mta.bench flash`: forward and backward TFLOPS of `mta.flash_attention` against PyTorch SDPA's flash
  and cuDNN backends, bf16 and fp16, head dims 64 and 128, causal and not; the tokens per batch and the model width
  stay fixed as the sequence grows. Checked against SDPA.
- `python -m mta.bench conv`: time and peak extra memory of `mta.conv_attention`'s forward and forward+backward
  (bf16, causal) against `mta.flash_attention` (plain attention, no convolution: the floor), SDPA, the materialized
  `mta.conv_attention_reference` where it fits in memory, and `torch.compile` of it (`--no-compile` leaves that
  out). Checked against the reference, the gradients in float64.
- `python -m mta.bench order`: the causal forward of `mta.flash_attention` and the MTA forward kernel (without its
  pre-passes) with their tiles launched heaviest first, as shipped, against the natural order; both orders must
  give the same output to the last bit.
- `python -m mta.bench decode`: one decode step (one new query, bf16) of `mta.decode_attention` and
  `mta.conv_decode_attention` against SDPA and a plain read of the same K and V bytes (TB/s; the read pays its own
  launch and reduction, so a kernel can pass it), every cache position valid. Checked against fp32 references.
- `python -m mta.bench startup`: seconds a user waits on the first call of each public kernel function in a fresh
  Python process, with an empty and with a warm Triton cache.
- `python -m mta.bench host`: the host's time per call of each public function and of the layer's decode step, 20
  calls back to back with no synchronisation between them (mta's and SDPA's loops alternating), beside the GPU work
  per call (CUDA-graph replay) and the launches per call (kernels, memsets and copies), against the same call
  through SDPA in the same run; the ratios the project targets are recorded, pass or missed.
- `python -m mta.bench model`: tokens/s of a 12-layer decoder with MTA (6 x 11) in every fourth layer against the
  same model with plain attention through `mta`'s kernels and through SDPA: a training step (forward, backward,
  AdamW, bf16 autocast) eager and under `torch.compile(mode="reduce-overhead")`, and greedy generation eager and
  CUDA-graphed. Wall time of steps back to back, as a training or generation loop sees it; no check of its own
  (the layers are those the other benchmarks check). The ratios the project targets are recorded, pass or missed.

`--quick` runs a reduced set of shapes, `--out` writes elsewhere, `--resume` goes on from an interrupted run; after
a run, `python -m mta.bench report` brings this page up to date.
"""


def load(figures: Path) -> dict[str, dict]:
    """``{file name: its JSON}`` for every ``bench_*.json`` in ``figures``, sorted by name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(Path(figures).glob("bench_*.json"))}


def kind_of(data: dict) -> str:
    """The benchmark that wrote ``data``: its config's ``benchmark``, else the subcommand of its command line."""
    return data["config"].get("benchmark") or data["provenance"]["argv"][1]


def render(files: dict[str, dict]) -> str:
    """The whole page: :data:`PREAMBLE`, then a section per file (by :data:`KINDS`, then by name)."""
    order = sorted(files, key=lambda name: (KINDS.index(kind_of(files[name])), name))
    return PREAMBLE + "".join(f"\n{section(name, files[name])}" for name in order)


def section(name: str, data: dict) -> str:
    """A file's heading, provenance and tables."""
    kind = kind_of(data)
    parts = [f"## `{FIGURES}/{name}`: {TITLES[kind]}", provenance(data)]
    if name in FILE_NOTES:
        parts.append(FILE_NOTES[name])
    parts += [f"{title}\n\n{markdown_table(columns, rows)}" for title, columns, rows in TABLES[kind](data)]
    return "\n\n".join(parts) + "\n"


def provenance(data: dict) -> str:
    """GPU, software, commit, date and command of a run, and how many of its checks passed."""
    p = data["provenance"]
    commit = f"`{p['git_commit'][:10]}`" if p.get("git_commit") else "unknown"
    if p.get("git_dirty"):
        commit += " with uncommitted changes to `mta/`"
    command = " ".join(["python -m mta.bench", *(p.get("argv") or [])[1:]])
    checks = [r["check"]["ok"] for r in data["results"] if r.get("check")]
    lines = [f"GPU: {p['gpu']} (CUDA {p.get('cuda')}, driver {p.get('driver')})",
             f"software: torch {p.get('torch')}, Triton {p.get('triton')}, Python {p.get('python')}",
             f"code: commit {commit} (source sha256 `{p.get('mta_source_sha256', '?')[:12]}`)",
             f"run: {p.get('utc_time')}, `{command}`" + ("" if data.get("complete", True) else ", incomplete"),
             f"checks: {sum(checks)} of {len(checks)} passed"]
    return "\n".join(f"- {line}" for line in lines)


def markdown_table(columns: list[Column], rows: list[dict]) -> str:
    """``rows`` as a Markdown table. A column is ``(header, format, value)`` as in
    :func:`mta.bench.harness.format_table`: ``value`` a row's key or a function of the row, giving a number
    (formatted), a string (as it is) or None (a dash); format "" columns are text, left-aligned."""
    def cell(row, fmt, value):
        x = row.get(value) if isinstance(value, str) else value(row)
        return "-" if x is None else x if isinstance(x, str) else fmt.format(x) if fmt else str(x)
    lines = [[h for h, _, _ in columns], [("---:" if f else ":---") for _, f, _ in columns]]
    lines += [[cell(row, f, v) for _, f, v in columns] for row in rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


Table = tuple[str, list[Column], list[dict]]


def at_length(results: list[dict], n: int) -> tuple[int, list[dict]]:
    """``(n, the results at n)``, or those at the longest sequence where none is at ``n``."""
    if not any(r["seq_len"] == n for r in results):
        n = max(r["seq_len"] for r in results)
    return n, [r for r in results if r["seq_len"] == n]


def has_wall(results: list[dict]) -> bool:
    """Whether a run recorded wall time per call (``wall_ms``, ``fwd_wall_ms``...) beside its GPU time."""
    return any(key.endswith("wall_ms") and value is not None for r in results for key, value in r.items())


def flash_tables(data: dict) -> list[Table]:
    """TFLOPS of each implementation at :data:`FLASH_N`; where the run has them, milliseconds per call there, GPU
    time beside wall time; mta's median ratios to the baselines (the summary)."""
    impls = {"mta": "mta", "sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN"}
    group = [("dtype", "", "dtype"), ("d", "{}", "head_dim"),
             ("mask", "", lambda r: "causal" if r["causal"] else "none")]
    n, results = at_length(data["results"], FLASH_N)
    rates = group + [(f"{label} {p}", "{:.0f}", measured(impl, f"{p}_tflops", why=True))
                     for p in ("fwd", "bwd") for impl, label in impls.items()]
    ratios = group + [(f"{p} vs {label}", "{:.2f}", f"{p}_vs_{impl}")
                      for impl, label in list(impls.items())[1:] for p in ("fwd", "bwd")]
    cfg, summary = data["config"], data.get("summary") or []
    since = summary[0]["min_seq_len"] if summary else None
    shapes = shape_rows(results, ("dtype", "head_dim", "causal", "seq_len"))
    tables = [(f"TFLOPS at N = {n} ({cfg['total_tokens']} tokens a batch, model width {cfg['model_dim']}; GPU "
               "time):", rates, shapes)]
    if has_wall(results):
        rows = [{**shape, "pass": name, "time": key} for shape in shapes
                for name, key in (("forward", "fwd_ms"), ("forward+backward", "fwd_bwd_ms"))]
        times = group + [("pass", "", "pass")] + [
            (f"{label} {which}ms", "{:.3f}", lambda row, impl=impl, wall=wall: measured(
                impl, row["time"].replace("_ms", "_wall_ms") if wall else row["time"], why=True)(row))
            for impl, label in impls.items() for which, wall in (("", False), ("wall ", True))]
        tables.append((f"Milliseconds per call at N = {n}: GPU time (ms) beside wall time per call (wall ms):",
                       times, rows))
    return tables + [(f"mta's TFLOPS over the baseline's: the median over N >= {since} (above 1: mta is faster):",
                      ratios, summary)]


#: The conv benchmark's passes: (name, time key, memory key).
CONV_PASSES = (("forward", "fwd_ms", "peak_extra_bytes"),
               ("forward+backward", "fwd_bwd_ms", "fwd_bwd_peak_extra_bytes"))


def conv_tables(data: dict) -> list[Table]:
    """At the headline length, per configuration, kernel and pass: the times of MTA, flash attention and the
    reference, and MTA's ratios to them (time, peak extra memory)."""
    n, results = at_length(data["results"], HEADLINE_AT[0])
    rows = [{**shape, "pass": name, "time": t, "memory": m}
            for shape in shape_rows(results, ("batch", "heads", "kv_heads", "head_dim", "cq", "ck"))
            for name, t, m in CONV_PASSES]

    def ms(impl: str, wall: bool = False) -> Callable[[dict], object]:
        return lambda row: measured(impl, row["time"].replace("_ms", "_wall_ms") if wall else row["time"],
                                    why=True)(row)

    def over(a: str, b: str, which: str) -> Callable[[dict], Optional[float]]:
        return lambda row: ratio(row["records"], a, b, row[which])
    wall = has_wall(results)
    times = [(f"{label} {which}ms", fmt, ms(impl, which == "wall "))
             for impl, label, fmt in (("mta_conv", "MTA", "{:.3f}"), ("mta_flash", "flash", "{:.3f}"),
                                      ("conv_reference", "reference", "{:.1f}"))
             for which in ("", "wall ")[:1 + wall]]
    columns = [("d", "{}", "head_dim"), ("heads", "{}", "heads"), ("kernel", "", lambda r: f"{r['cq']}x{r['ck']}"),
               ("pass", "", "pass"), *times,
               ("MTA / flash", "{:.2f}x", over("mta_conv", "mta_flash", "time")),
               ("reference / MTA", "{:.1f}x", over("conv_reference", "mta_conv", "time")),
               ("MTA memory / reference's", "{:.2%}", over("mta_conv", "conv_reference", "memory"))]
    cfg = data["config"]
    return [(f"N = {n}, {cfg['dtype']}{', causal' if cfg['causal'] else ''}, batch 1. MTA: mta.conv_attention; "
             "flash: mta.flash_attention (no convolution); reference: the materialized conv_attention_reference "
             "(skip: it does not fit in memory); memory: peak extra bytes of a call; ms: GPU time"
             + (", wall ms: wall time per call" if wall else "") + "; the ratios are of GPU times:", columns, rows)]


def order_tables(data: dict) -> list[Table]:
    """Natural-order time over heaviest-first time, a row per (kernel, heads, head dim), a column per length."""
    lengths = sorted({r["seq_len"] for r in data["results"]})
    rows: dict[tuple, dict] = {}
    for r in data["results"]:
        rows.setdefault((r["kernel"], r["heads"], r["head_dim"]), dict(r))[r["seq_len"]] = r["speedup"]
    columns = [("kernel", "", "kernel"), ("heads", "{}", "heads"), ("d", "{}", "head_dim")]
    columns += [(f"N = {n}", "{:.2f}x", lambda row, n=n: row.get(n)) for n in lengths]
    return [(f"Natural-order time / heaviest-first time, {data['config']['dtype']}, batch 1 (above 1: heaviest first "
             "is faster):", columns, list(rows.values()))]


def decode_tables(data: dict) -> list[Table]:
    """Microseconds and TB/s at :data:`DECODE_N`; the summary's medians."""
    config = [("batch", "{}", "batch"), ("Hq", "{}", "heads"), ("Hkv", "{}", "kv_heads"), ("d", "{}", "head_dim")]
    n, results = at_length(data["results"], DECODE_N)
    names = {"mta_decode": "decode", "sdpa": "SDPA", "mta_conv_decode": "MTA decode"}
    wall = has_wall(results)
    columns = config + [(f"{label} {which}us", "{:.1f}", measured(impl, key, scale))
                        for impl, label in names.items()
                        for which, key, scale in (("", "us", 1.0), ("wall ", "wall_ms", 1e3))[:1 + wall]]
    columns += [(f"{label} TB/s", "{:.2f}", measured(impl, "tbps"))
                for impl, label in (("mta_decode", "decode"), ("mta_conv_decode", "MTA decode"), ("read", "read"))]
    summary = data.get("summary") or []
    since = summary[0]["min_seq_len"] if summary else None
    medians = config + [("decode / read TB/s", "{:.2f}", "decode_of_read_tbps"),
                        ("MTA decode / read TB/s", "{:.2f}", "conv_decode_of_read_tbps"),
                        ("SDPA time / decode time", "{:.3f}", "sdpa_over_decode_time")]
    kernel = "x".join(map(str, data["config"]["kernel"]))
    return [(f"A step against {n} cache positions; decode: mta.decode_attention, MTA decode: "
             f"mta.conv_decode_attention ({kernel}), read: a plain read of K and V; us and TB/s: GPU time"
             + (", wall us: wall time per call" if wall else "") + ":",
             columns, shape_rows(results, ("batch", "heads", "kv_heads", "head_dim", "seq_len"))),
            (f"Medians over N >= {since}, of GPU times (SDPA time / decode time above 1: mta.decode_attention is "
             "faster):",
             medians, summary)]


def startup_tables(data: dict) -> list[Table]:
    """First-call seconds with an empty / a warm Triton cache, a row per case, a column per (dtype, head dim)."""
    labels = data["config"]["cases"]
    variants = list(dict.fromkeys((r["dtype"], r["head_dim"]) for r in data["results"]))
    rows: dict[str, dict] = {}
    for r in data["results"]:
        empty, warm = (r[run].get("first_call_s") for run in ("empty_cache", "warm_cache"))
        rows.setdefault(r["case"], {"case": labels.get(r["case"], r["case"])})[r["dtype"], r["head_dim"]] = (
            "failed" if empty is None or warm is None else f"{empty:.2f} / {warm:.2f}")
    columns = [("case", "", "case")] + [(f"{dtype} d={d}", "", lambda row, v=(dtype, d): row.get(v))
                                        for dtype, d in variants]
    shape = data["config"]["shape"]
    return [(f"Seconds of the first call, empty Triton cache / warm cache (batch {shape['batch']}, "
             f"{shape['heads']} query heads, {shape['kv_heads']} kv heads, N = {shape['seq_len']}):",
             columns, list(rows.values()))]


TABLES: dict[str, Callable[[dict], list[Table]]] = {
    "flash": flash_tables, "conv": conv_tables, "order": order_tables, "decode": decode_tables,
    "startup": startup_tables, "host": host_tables, "model": model_tables}


def main(out: Path = REPO_ROOT / OUT, figures: Path = REPO_ROOT / FIGURES, check: bool = False) -> int:
    """Write the page to ``out``, or with ``check`` only compare: exit status 1 where ``out`` differs."""
    files = load(figures)
    page = render(files)
    if check:
        same = out.exists() and out.read_text() == page
        print(f"{out} is {'up to date' if same else 'stale: run python -m mta.bench report'}")
        return 0 if same else 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    print(f"wrote {out} from {len(files)} benchmark files")
    return 0
