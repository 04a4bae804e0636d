"""Figures from benchmark JSON, no GPU needed: the benchmarks draw their PNGs with these and notebooks plot the
committed results. Flash, conv and decode share :func:`impl_grid`; their rows of GPU time (launch overhead hidden)
come first, then, where a run measured it, wall time per call in a back-to-back loop (:func:`wall_rows`), and
:func:`gpu_and_wall_table` sets the two side by side as text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional, Union

#: How each implementation is drawn in every figure, so colours mean the same thing everywhere.
IMPL_STYLES = {
    "mta": {"label": "mta (Triton)", "color": "C3", "marker": "o"},
    "mta_conv": {"label": "mta.conv_attention", "color": "C3", "marker": "o"},
    "conv_reference": {"label": "reference (materialized)", "color": "C4", "marker": "v"},
    "conv_reference_compiled": {"label": "reference, torch.compile", "color": "C5", "marker": "P",
                                "linestyle": "--"},
    "mta_flash": {"label": "mta.flash_attention (no conv)", "color": "C1", "marker": "D", "linestyle": ":"},
    "sdpa_flash": {"label": "SDPA flash", "color": "C0", "marker": "s"},
    "sdpa_cudnn": {"label": "SDPA cuDNN", "color": "C2", "marker": "^"},
    "sdpa": {"label": "SDPA (no conv)", "color": "C0", "marker": "s", "linestyle": ":"},  # decode restyles it
}
#: The decode figure's styles, replacing those of :data:`IMPL_STYLES`.
DECODE_STYLES = {
    "mta_decode": {"label": "mta.decode_attention", "color": "C3", "marker": "o"},
    "mta_conv_decode": {"label": "mta.conv_decode_attention (6x11)", "color": "C1", "marker": "D"},
    "sdpa": {"label": "SDPA (default backend)", "color": "C0", "marker": "s"},
    "mta_flash": {"label": "mta.flash_attention", "color": "C2", "marker": "^", "linestyle": ":"},
    "conv_reference": {"label": "MTA reference (materialized)", "color": "C4", "marker": "v"},
    "read": {"label": "plain read of K and V (reference)", "color": "k", "marker": "", "linestyle": "--"},
}
MIB = 2.0 ** -20
#: How figures, tables and chapters name the two timings (:mod:`mta.bench.timing`).
GPU_TIME = "GPU time (launch overhead hidden)"
WALL_TIME = "wall time per call (back-to-back, as a loop sees it)"


def load_results(source: Union[str, Path, dict]) -> dict:
    """A benchmark's ``{"provenance", "config", "results"}``, from a JSON path or an already loaded dict."""
    data = source if isinstance(source, dict) else json.loads(Path(source).read_text())
    missing = {"provenance", "config", "results"} - set(data)
    if missing:
        raise ValueError(f"not a benchmark result: missing {sorted(missing)}")
    return data


def select(results: list[dict], **where) -> list[dict]:
    """The records whose fields equal every ``where`` item."""
    return [r for r in results if all(r.get(k) == v for k, v in where.items())]


def _provenance_pieces(prov: dict) -> tuple[list[str], Optional[str]]:
    """``[GPU, "torch x", "triton y"]`` and the commit's first 8 hex digits (``+dirty`` where the run had uncommitted
    changes), None where the provenance names no commit."""
    commit = prov.get("git_commit")
    commit = commit[:8] + ("+dirty" if prov.get("git_dirty") else "") if commit else None
    return [prov.get("gpu", "?"), f"torch {prov.get('torch', '?')}", f"triton {prov.get('triton', '?')}"], commit


def provenance_line(prov: dict) -> str:
    """``GPU · torch x · triton y · commit`` for a figure title."""
    pieces, commit = _provenance_pieces(prov)
    return " · ".join([*pieces, commit or "commit ?"])


def measured_on(data: dict) -> str:
    """``measured on GPU · torch x · triton y · mta commit c · YYYY-MM-DD``: one line saying where and from which code
    a loaded benchmark JSON's numbers come, for a chapter to print beside them ("commit unknown" where the
    provenance names none; no date where it has no time)."""
    prov = data["provenance"]
    pieces, commit = _provenance_pieces(prov)
    date = (prov.get("utc_time") or "")[:10]
    return "measured on " + " · ".join([*pieces, f"mta commit {commit}" if commit else "commit unknown"]
                                       + ([date] if date else []))


def seq_len_label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def seq_len_axis(ax, seq_lens: list[int]) -> None:
    """A log-2 x axis with one tick per sequence length, labelled ``1k``, ``2k``..."""
    import matplotlib.pyplot as plt

    ax.set_xscale("log", base=2)
    ax.set_xticks(seq_lens, [seq_len_label(n) for n in seq_lens])
    ax.xaxis.set_minor_locator(plt.NullLocator())


def titled(fig, title: str, data: dict, bottom: float):
    """``fig`` with ``title`` and the provenance line above it, laid out above ``bottom`` (the legend's room)."""
    fig.suptitle(f"{title}\n{provenance_line(data['provenance'])}", fontsize=10)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def impl_grid(records: list[dict], column_keys: tuple[str, ...], column_title: Callable[..., str], rows: list[tuple],
              tested: str, failed_label: str, *, log: bool, restyle: Optional[dict] = None):
    """Panels against sequence length, a column per value of ``column_keys`` (titled ``column_title(*value)``), a
    row per ``(key, title, y label, scale)``; a line per implementation, ``tested``'s failed checks crossed out.
    Log-log (non-positive values left out), or linear y from 0 shared by the row. ``restyle``: ``{impl: style
    items}`` replacing those of :data:`IMPL_STYLES`."""
    import matplotlib.pyplot as plt

    columns = sorted({tuple(r[k] for k in column_keys) for r in records})
    seq_lens = sorted({r["seq_len"] for r in records})
    present = dict.fromkeys(r["impl"] for r in records)
    impls = [i for i in IMPL_STYLES if i in present] + [i for i in present if i not in IMPL_STYLES]
    fig, axes = plt.subplots(len(rows), len(columns), squeeze=False, sharex=True, sharey="row",
                             figsize=(3.4 * len(columns), 2.8 * len(rows)))
    for col, value in enumerate(columns):
        where = dict(zip(column_keys, value))
        for row, (key, row_title, ylabel, scale) in enumerate(rows):
            ax = axes[row][col]
            for impl in impls:
                line = _points(select(records, impl=impl, **where), key, scale, positive=log)
                style = {**IMPL_STYLES.get(impl, {"label": impl, "color": "C7", "marker": "."}),
                         **(restyle or {}).get(impl, {})}
                if line:
                    ax.plot(*zip(*line), **style)
            failed = _points(select(records, impl=tested, **where), key, scale, positive=log, only_failed_checks=True)
            if failed:
                ax.plot(*zip(*failed), linestyle="none", marker="x", markersize=12, color="red", label=failed_label)
            seq_len_axis(ax, seq_lens)
            if log:
                ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both" if log else "major")
            ax.set_title(f"{row_title}, {column_title(*value)}", fontsize=9)
            if row == len(rows) - 1:
                ax.set_xlabel("sequence length N")
            if col == 0:
                ax.set_ylabel(ylabel)
    if not log:  # once per row after all its columns are drawn: a limit set earlier would freeze the shared axis
        for row, (key, _, _, scale) in enumerate(rows):
            axes[row][0].set_ylim(0, 1.08 * max((r[key] * scale for r in records if r.get(key) is not None),
                                                default=1.0))
    handles, labels = _unique_legend(axes)
    one_row = len(labels) <= 4
    fig.legend(handles, labels, loc="lower center", ncol=len(labels) if one_row else 3,
               bbox_to_anchor=(0.5, (-0.02 if one_row else -0.04) * 2 / len(rows)), frameon=False)
    return fig


def wall_rows(records: list[dict], rows: list[tuple]) -> list[tuple]:
    """The rows of wall time per call in a back-to-back loop (GPU time is the spin-timed rows above them), where the
    run measured them."""
    return [row for row in rows if any(r.get(row[0]) is not None for r in records)]


def gpu_and_wall_table(results: list[dict], keys: tuple[tuple[str, str], ...], impls: dict[str, str],
                       passes: tuple[tuple[str, str, str], ...], scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    """GPU time beside wall time per call, as text: a row per shape (records equal in ``keys``, each ``(header,
    record key)``) and pass (``(label, GPU-time key, wall-time key)``; a "pass" column only where there are
    several), for each implementation of ``impls`` (``{impl: label}``) a "GPU" and a "wall" column: its times
    times ``scale`` in ``fmt``, a dash where it has none."""
    from .harness import format_table, measured, shape_rows

    shapes = shape_rows([r for r in results if r.get("impl") in impls], tuple(key for _, key in keys))
    rows = [{**shape, "pass": label, "gpu": gpu, "wall": wall} for shape in shapes for label, gpu, wall in passes]

    def time(impl: str, which: str) -> Callable[[dict], object]:
        return lambda row: measured(impl, row[which], scale)(row)
    columns = [(header, "{}", key) for header, key in keys] + ([("pass", "", "pass")] if len(passes) > 1 else [])
    columns += [(f"{label} {which}", fmt, time(impl, which)) for impl, label in impls.items()
                for which in ("gpu", "wall")]
    return format_table([(h.replace(" gpu", " GPU"), f, v) for h, f, v in columns], rows)


def plot_flash(source: Union[str, Path, dict], dtype: str = "bfloat16"):
    """TFLOPS (GPU time) against sequence length: rows forward, backward, then the wall times per call where measured;
    columns (head dim, causal)."""
    data = load_results(source)
    records = select(data["results"], dtype=dtype)
    if not records:
        raise ValueError(f"no flash results for dtype {dtype!r}")
    rows = [("fwd_tflops", "forward", "TFLOPS (GPU time)", 1.0), ("bwd_tflops", "backward", "TFLOPS (GPU time)", 1.0)]
    rows += wall_rows(records, [("fwd_wall_ms", "forward wall time", "wall ms per call", 1.0),
                                ("fwd_bwd_wall_ms", "fwd+bwd wall time", "wall ms per call", 1.0)])
    fig = impl_grid(records, ("head_dim", "causal"), lambda d, c: f"d={d}, {'causal' if c else 'non-causal'}", rows,
                    "mta", "mta check failed", log=False)
    cfg = data["config"]
    return titled(fig, f"Flash attention, {dtype}, {cfg['total_tokens']} tokens per batch, model width "
                       f"{cfg['model_dim']}", data, bottom=0.05)


def plot_conv(source: Union[str, Path, dict]):
    """Time and peak extra memory against sequence length, log-log: rows forward time and memory, forward+backward
    time and memory; columns (configuration, kernel); a skipped, OOM or failed point left out."""
    data = load_results(source)
    records = [r for r in data["results"] if "cq" in r and "ck" in r]
    if not records:
        raise ValueError("no conv results (records with cq and ck)")
    rows = [("fwd_ms", "forward time", "forward GPU time (ms)", 1.0),
            ("peak_extra_bytes", "peak extra memory", "peak extra memory (MiB)", MIB),
            ("fwd_bwd_ms", "fwd+bwd time", "fwd+bwd GPU time (ms)", 1.0),
            ("fwd_bwd_peak_extra_bytes", "fwd+bwd memory", "fwd+bwd peak memory (MiB)", MIB)]
    rows += wall_rows(records, [("fwd_wall_ms", "forward wall time", "wall ms per call", 1.0),
                                ("fwd_bwd_wall_ms", "fwd+bwd wall time", "wall ms per call", 1.0)])
    plain = {impl: {"label": f"{IMPL_STYLES[impl]['label']} (no conv)", "linestyle": ":"}
             for impl in ("sdpa_flash", "sdpa_cudnn")}
    fig = impl_grid(records, ("batch", "heads", "kv_heads", "head_dim", "cq", "ck"), lambda b, h, hkv, d, cq, ck:
                    f"B={b} H={h}" + (f" Hkv={hkv}" if hkv != h else "") + f" D={d}, {cq}x{ck}", rows, "mta_conv",
                    "mta.conv_attention check failed", log=True, restyle=plain)
    cfg = data["config"]
    return titled(fig, f"MTA conv attention forward and forward+backward, {cfg['dtype']}"
                       f"{', causal' if cfg['causal'] else ''}; missing points: reference skipped or out of memory",
                  data, bottom=0.16 / len(rows))


def plot_decode(source: Union[str, Path, dict]):
    """Time (us) and TB/s against cache length, log-log: a column per (batch, configuration), a line per
    implementation, the plain read dashed; mta_decode's failed checks crossed out."""
    data = load_results(source)
    rows = [("us", "time", "GPU time per step (us)", 1.0),
            ("tbps", "bandwidth", "TB/s (K, V bytes / GPU time)", 1.0)]
    rows += wall_rows(data["results"], [("wall_ms", "wall time", "wall time per step (us)", 1e3)])
    fig = impl_grid(data["results"], ("batch", "heads", "kv_heads", "head_dim"),
                    lambda b, h, hkv, d: f"B={b} Hq={h} Hkv={hkv} D={d}", rows, "mta_decode",
                    "mta.decode_attention check failed", log=True, restyle=DECODE_STYLES)
    return titled(fig, f"Decode step, {data['config']['dtype']}, one new query; missing points: reference skipped",
                  data, bottom=0.08)


def plot_launch_order(source: Union[str, Path, dict], model: Optional[dict] = None):
    """Measured ``natural / heaviest-first`` time against sequence length (solid): a panel per kernel, a colour per
    (heads, head dim); with ``model`` (``{(kernel, heads, head_dim, seq_len): gain}``, chapter 03b's list-scheduling
    model) its gain dashed beside each line. The legend sits below the panels, clear of the data."""
    import matplotlib.pyplot as plt

    data = load_results(source)
    kernels = list(dict.fromkeys(r["kernel"] for r in data["results"]))
    titles = {"flash": "mta.flash_attention forward", "conv": "mta.conv_attention kernel (6x11)"}
    fig, axes = plt.subplots(1, len(kernels), squeeze=False, sharey=True, figsize=(4.2 * len(kernels), 3.6))
    for ax, kernel in zip(axes[0], kernels):
        records = select(data["results"], kernel=kernel)
        for i, (h, d) in enumerate(sorted({(r["heads"], r["head_dim"]) for r in records})):
            line = _points(select(records, heads=h, head_dim=d), "speedup")
            ax.plot(*zip(*line), marker="o", color=f"C{i}", label=f"measured, B=1 H={h} D={d}")
            if model is not None:
                ax.plot([n for n, _ in line], [model[(kernel, h, d, n)] for n, _ in line], marker="x", ls="--",
                        color=f"C{i}", alpha=0.7, label=f"model, B=1 H={h} D={d}")
        ax.axhline(1.0, color="0.5", linewidth=0.8)
        seq_len_axis(ax, sorted({r["seq_len"] for r in data["results"]}))
        ax.grid(alpha=0.3)
        ax.set_title(titles.get(kernel, kernel), fontsize=9)
        ax.set_xlabel("sequence length N")
    axes[0][0].set_ylabel("natural time / heaviest-first time")
    handles, labels = _unique_legend(axes)
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    return titled(fig, "Causal tiles launched heaviest first, bf16", data, bottom=0.065 * (1 + (len(labels) + 1) // 2))


def plot_startup(source: Union[str, Path, dict]):
    """Seconds of the first call in a fresh process, log axis: a panel per head dim, a group of bars per (case,
    dtype), a bar for an empty and a warm Triton cache (none for a failed probe, marked "failed"); a dot for the
    second call (steady state)."""
    import matplotlib.pyplot as plt

    data = load_results(source)
    results = data["results"]
    head_dims = sorted({r["head_dim"] for r in results})
    groups = list(dict.fromkeys((r["case"], r["dtype"]) for r in results))
    labels = data["config"]["cases"]
    runs = (("empty_cache", "empty cache", "C3"), ("warm_cache", "warm cache", "C0"))
    fig, axes = plt.subplots(len(head_dims), 1, squeeze=False, sharey=True,
                             figsize=(max(5.5, 1.25 * len(groups)), 3.2 * len(head_dims)))
    for ax, d in zip(axes[:, 0], head_dims):
        for x, (case, dtype) in enumerate(groups):
            found = select(results, case=case, dtype=dtype, head_dim=d)
            r = found[0] if found else {}
            for i, (key, label, color) in enumerate(runs):
                seconds = r.get(key, {}).get("first_call_s")
                if seconds is not None:
                    ax.bar(x + (i - 0.5) * 0.38, seconds, width=0.38, color=color, label=label)
            second = r.get("warm_cache", {}).get("second_call_s")
            if second is not None:
                ax.plot([x], [second], linestyle="none", marker="o", color="k", markersize=4,
                        label="second call (steady state)")
            if r and not r["check"]["ok"]:
                ax.annotate("failed", (x, 0.5), xycoords=("data", "axes fraction"), ha="center", color="red")
        ax.set_yscale("log")
        # "conv_attention\nforward+backward\n(6x11)": one word a line, so neighbouring labels do not run together
        names = [labels.get(case, case).replace(" ", "\n") for case, _ in groups]
        ax.set_xticks(range(len(groups)), [f"{n}\n{dt}" for n, (_, dt) in zip(names, groups)], fontsize=7)
        ax.grid(alpha=0.3, axis="y", which="both")
        ax.set_ylabel("seconds")
        ax.set_title(f"head dim {d}", fontsize=9)
    handles, names = _unique_legend(axes)
    fig.legend(handles, names, loc="lower center", ncol=len(names), bbox_to_anchor=(0.5, -0.02), frameon=False)
    shape = data["config"]["shape"]
    return titled(fig, f"First call in a fresh process, B={shape['batch']} Hq={shape['heads']} "
                       f"Hkv={shape['kv_heads']} N={shape['seq_len']}", data, bottom=0.04)


#: The model benchmark's variants.
MODEL_STYLES = {
    "mta": {"label": "MTA model (mta kernels)", "color": "C3"},
    "plain_ours": {"label": "plain model, mta kernels", "color": "C1"},
    "plain_sdpa": {"label": "plain model, SDPA", "color": "C0"},
}


def plot_model(source: Union[str, Path, dict]):
    """Tokens/s of the model benchmark as bars: a panel per training shape (top row) and per generation batch
    (bottom row), a group of bars per mode, a bar per variant (none where the run failed, marked "x")."""
    import matplotlib.pyplot as plt

    data = load_results(source)
    results = data["results"]
    panels = []  # (task, where, title) a row per task present
    for task, keys in (("training", ("batch", "seq_len")), ("generation", ("batch",))):
        found = sorted({tuple(r[k] for k in keys) for r in results if r["task"] == task}, key=lambda x: x[::-1])
        if found:
            panels.append([(task, dict(zip(keys, f)), f"{task}, " + " ".join(f"{'B' if k == 'batch' else 'N'}={v}"
                                                                              for k, v in zip(keys, f)))
                           for f in found])
    if not panels:
        raise ValueError("no model results")
    columns = max(len(row) for row in panels)
    fig, axes = plt.subplots(len(panels), columns, squeeze=False, figsize=(3.6 * columns, 3.2 * len(panels)))
    variants = [v for v in MODEL_STYLES if any(r["variant"] == v for r in results)]
    width = 0.8 / max(len(variants), 1)
    for row, row_panels in enumerate(panels):
        for col in range(columns):
            ax = axes[row][col]
            if col >= len(row_panels):
                ax.set_visible(False)
                continue
            task, where, title = row_panels[col]
            records = select(results, task=task, **where)
            modes = list(dict.fromkeys(r["mode"] for r in records))
            for i, variant in enumerate(variants):
                for x, mode in enumerate(modes):
                    found = select(records, variant=variant, mode=mode)
                    rate = found[0].get("tokens_per_s") if found else None
                    at = x + (i - (len(variants) - 1) / 2) * width
                    if rate:
                        ax.bar(at, rate, width=width, **MODEL_STYLES[variant])
                        ax.annotate(f"{rate:,.0f}", (at, rate), ha="center", va="bottom", fontsize=6, rotation=90)
                    elif found:
                        ax.annotate("x", (at, 0), ha="center", va="bottom", color="red")
            ax.set_xticks(range(len(modes)), [m.replace("_", "-") for m in modes])
            ax.set_ylim(0, 1.25 * max((r.get("tokens_per_s") or 0 for r in records), default=1) or 1)
            ax.grid(alpha=0.3, axis="y")
            ax.set_title(title, fontsize=9)
            if col == 0:
                ax.set_ylabel("tokens/s")
    handles, labels = _unique_legend(axes)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.02), frameon=False)
    model = data["config"]["model"]
    return titled(fig, f"A {model['layers']}-layer decoder (dim {model['dim']}) in tokens/s: training step "
                       "(tokens / step time) and generation (new tokens / decode time)", data,
                  bottom=0.06 / len(panels) * 2)


#: The host benchmark's two sides.
HOST_STYLES = {
    "mta": {"label": "mta: CPU time per call", "color": "C3"},
    "sdpa": {"label": "SDPA, same call (the step: same layer on SDPA): CPU time per call", "color": "C0"},
}


def plot_host(source: Union[str, Path, dict]):
    """CPU time per call of the host benchmark as horizontal bars on a log axis, a pair per case (mta, SDPA; "x"
    where a side failed), the GPU work per call marked on each bar, and the ratio of CPU times beside each pair
    (green where it meets its target, red where it misses)."""
    import matplotlib.pyplot as plt

    data = load_results(source)
    results = data["results"]
    cases = list(dict.fromkeys(r["case"] for r in results))
    if not cases:
        raise ValueError("no host results")
    verdicts = {t["case"]: t for t in data.get("targets") or []}
    fig, ax = plt.subplots(figsize=(10, 1.8 + 0.45 * len(cases)))
    height = 0.8 / len(HOST_STYLES)
    times = [r[k] for r in results for k in ("cpu_us", "gpu_us") if r.get(k)]
    low, high = (min(times), max(times)) if times else (1.0, 10.0)
    for i, impl in enumerate(HOST_STYLES):
        for y, case in enumerate(cases):
            found = select(results, case=case, impl=impl)
            at = y + (i - (len(HOST_STYLES) - 1) / 2) * height
            cpu = found[0].get("cpu_us") if found else None
            gpu = found[0].get("gpu_us") if found else None
            if cpu:
                ax.barh(at, cpu - low / 2, height=height, left=low / 2, **HOST_STYLES[impl])
            elif found:
                ax.annotate("x", (low / 2, at), ha="left", va="center", color="red")
            if gpu:
                ax.plot([gpu], [at], linestyle="", marker="|", markersize=9, markeredgewidth=2, color="k",
                        label="GPU work per call (CUDA-graph replay)")
    for y, case in enumerate(cases):
        verdict = verdicts.get(case, {})
        if verdict.get("measured") is not None:
            ax.annotate(f"{verdict['measured']:.2f}x (at most {verdict['at_most']:g}x)", (high * 1.5, y),
                        va="center", fontsize=7, color={True: "green", False: "red"}.get(verdict.get("ok"), "k"))
    ax.set_xscale("log")
    ax.set_xlim(low / 2, high * 8)
    ax.set_yticks(range(len(cases)), cases, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("microseconds per call")
    ax.grid(alpha=0.3, axis="x", which="both")
    handles, labels = _unique_legend([[ax]])
    fig.legend(handles, labels, loc="lower center", ncol=3, bbox_to_anchor=(0.5, 0), frameon=False, fontsize=8)
    cfg = data["config"]
    return titled(fig, f"Host time per call, {cfg.get('calls', '?')} calls back to back (median of "
                       f"{cfg.get('repeats', '?')} loops, mta's and SDPA's alternating), {cfg.get('dtype', '?')}:\n"
                       "mta against SDPA; ratio: mta's CPU time over SDPA's", data,
                  bottom=0.35 / (1.8 + 0.45 * len(cases)))


def _points(records: list[dict], key: str, scale: float = 1.0, positive: bool = False,
            only_failed_checks: bool = False) -> list[tuple[int, float]]:
    """``(seq_len, value * scale)`` sorted, without missing values, with ``positive`` those a log axis cannot
    show, with ``only_failed_checks`` the records whose check passed."""
    kept = [r for r in records if r.get(key) is not None and (r[key] > 0 or not positive)
            and not (only_failed_checks and (r.get("check") or {}).get("ok", True))]
    return sorted((r["seq_len"], r[key] * scale) for r in kept)


def _unique_legend(axes) -> tuple[list, list[str]]:
    """Every labelled artist of the figure once, in first-seen order."""
    seen: dict[str, object] = {}
    for ax in (a for row in axes for a in row):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)
