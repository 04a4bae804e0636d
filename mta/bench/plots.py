"""Figures from benchmark JSON files, no GPU needed: the benchmarks draw their PNGs with these functions, and
notebooks call them to plot the committed results. One ``plot_<name>`` per benchmark (the decode benchmark's is
:func:`mta.bench.decode.plot_decode`), on shared helpers (loading, filtering, line styles, the grid, titles).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional, Union

#: How each implementation is drawn in every figure, so colours mean the same thing everywhere.
IMPL_STYLES = {
    "mta": {"label": "mta (Triton)", "color": "C3", "marker": "o"},
    # The conv benchmark: mta.conv_attention against the materialized reference and plain attention.
    "mta_conv": {"label": "mta.conv_attention", "color": "C3", "marker": "o"},
    "conv_reference": {"label": "reference (materialized)", "color": "C4", "marker": "v"},
    "conv_reference_compiled": {"label": "reference, torch.compile", "color": "C5", "marker": "P",
                                "linestyle": "--"},
    "mta_flash": {"label": "mta.flash_attention (no conv)", "color": "C1", "marker": "D", "linestyle": ":"},
    # SDPA's backends (the flash benchmark's baselines; plain attention in the conv benchmark's).
    "sdpa_flash": {"label": "SDPA flash", "color": "C0", "marker": "s"},
    "sdpa_cudnn": {"label": "SDPA cuDNN", "color": "C2", "marker": "^"},
    "sdpa": {"label": "SDPA (no conv)", "color": "C0", "marker": "s", "linestyle": ":"},  # older conv runs
}


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


def impl_style(impl: str) -> dict:
    """Line style for ``impl``; an unknown one gets a neutral style and its own name."""
    return IMPL_STYLES.get(impl, {"label": impl, "color": "C7", "marker": "."})


def ordered_impls(results: list[dict]) -> list[str]:
    """Implementations in the records, the known ones first, in :data:`IMPL_STYLES` order."""
    present = list(dict.fromkeys(r["impl"] for r in results))
    return [i for i in IMPL_STYLES if i in present] + [i for i in present if i not in IMPL_STYLES]


def provenance_line(prov: dict) -> str:
    """``GPU · torch x · triton y · commit`` for a figure title."""
    commit = prov.get("git_commit")
    commit = "commit ?" if not commit else commit[:8] + ("+dirty" if prov.get("git_dirty") else "")
    return f"{prov.get('gpu', '?')} · torch {prov.get('torch', '?')} · triton {prov.get('triton', '?')} · {commit}"


def seq_len_label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def seq_len_axis(ax, seq_lens: list[int]) -> None:
    """A log-2 x axis with one tick per sequence length, labelled ``1k``, ``2k``..."""
    import matplotlib.pyplot as plt

    ax.set_xscale("log", base=2)
    ax.set_xticks(seq_lens, [seq_len_label(n) for n in seq_lens])
    ax.xaxis.set_minor_locator(plt.NullLocator())


def grid_columns(records: list[dict], keys: tuple[str, ...], title: Callable[..., str]) -> list[tuple[str, dict]]:
    """One column of :func:`impl_grid` per distinct value of ``keys`` in the records, sorted: ``(title(*value),
    {key: value})``."""
    values = sorted({tuple(r[k] for k in keys) for r in records})
    return [(title(*v), dict(zip(keys, v))) for v in values]


def titled(fig, title: str, data: dict, bottom: float):
    """``fig`` with ``title`` and the provenance line above it, laid out above ``bottom`` (the legend's room)."""
    fig.suptitle(f"{title}\n{provenance_line(data['provenance'])}", fontsize=10)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def impl_grid(records: list[dict], columns: list[tuple[str, dict]], rows: list[tuple], tested: str,
              failed_label: str, *, log: bool, ax_size: tuple, restyle: Optional[dict] = None):
    """A grid of panels against sequence length, one line per implementation, ``tested``'s failed checks crossed
    out in red. ``columns``: ``(title, fields the records match)`` (:func:`grid_columns`); ``rows``: ``(key, title,
    y label, scale)``. Log-log (non-positive values left out), or linear y from 0 shared by the row. ``restyle``:
    ``{impl: style items}`` that replace :func:`impl_style`'s in this figure."""
    import matplotlib.pyplot as plt

    seq_lens = sorted({r["seq_len"] for r in records})
    fig, axes = plt.subplots(len(rows), len(columns), squeeze=False, sharex=True, sharey="row",
                             figsize=(ax_size[0] * len(columns), ax_size[1] * len(rows)))
    for col, (col_title, where) in enumerate(columns):
        for row, (key, row_title, ylabel, scale) in enumerate(rows):
            ax = axes[row][col]
            for impl in ordered_impls(records):
                line = _points(select(records, impl=impl, **where), key, scale, positive=log)
                if line:
                    ax.plot(*zip(*line), **{**impl_style(impl), **(restyle or {}).get(impl, {})})
            failed = _points(select(records, impl=tested, **where), key, scale, positive=log, only_failed_checks=True)
            if failed:
                ax.plot(*zip(*failed), linestyle="none", marker="x", markersize=12, color="red", label=failed_label)
            seq_len_axis(ax, seq_lens)
            if log:
                ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both" if log else "major")
            ax.set_title(f"{row_title}, {col_title}", fontsize=9)
            if row == len(rows) - 1:
                ax.set_xlabel("sequence length N")
            if col == 0:
                ax.set_ylabel(ylabel)
    for row, (key, _, _, scale) in enumerate(rows):
        # Set once per row, after all columns are drawn: the row shares its y axis, and
        # a limit set while drawing would freeze it before the later columns' data exist.
        values = [r[key] * scale for r in records if r.get(key) is not None]
        if not log:
            axes[row][0].set_ylim(0, 1.08 * max(values, default=1.0))
    handles, labels = _unique_legend(axes)
    one_row = len(labels) <= 4
    fig.legend(handles, labels, loc="lower center", ncol=len(labels) if one_row else 3,
               bbox_to_anchor=(0.5, (-0.02 if one_row else -0.04) * 2 / len(rows)), frameon=False)
    return fig


def plot_flash(source: Union[str, Path, dict], dtype: str = "bfloat16", *, ax_size: tuple = (3.4, 2.8)):
    """TFLOPS against sequence length from the flash benchmark: rows forward, backward; columns (head dim,
    causal); one line per implementation. Returns the Figure (nothing is written)."""
    data = load_results(source)
    records = select(data["results"], dtype=dtype)
    if not records:
        raise ValueError(f"no flash results for dtype {dtype!r}")
    columns = grid_columns(records, ("head_dim", "causal"), lambda d, c: f"d={d}, {'causal' if c else 'non-causal'}")
    rows = [("fwd_tflops", "forward", "TFLOPS", 1.0), ("bwd_tflops", "backward", "TFLOPS", 1.0)]
    fig = impl_grid(records, columns, rows, "mta", "mta check failed", log=False, ax_size=ax_size)
    cfg = data["config"]
    workload = f"{cfg.get('total_tokens', '?')} tokens per batch, model width {cfg.get('model_dim', '?')}"
    return titled(fig, f"Flash attention, {dtype}, {workload}", data, bottom=0.05)


def plot_conv(source: Union[str, Path, dict], *, ax_size: tuple = (3.4, 2.8)):
    """Time and peak extra memory against sequence length from the conv benchmark, log-log. Rows: forward time
    (ms) and memory (MiB), and where the results have them (not in older runs) forward+backward time and memory;
    columns: (configuration, kernel); one line per implementation, a point that was skipped, ran out of memory or
    failed left out."""
    data = load_results(source)
    records = [r for r in data["results"] if "cq" in r and "ck" in r]
    if not records:
        raise ValueError("no conv results (records with cq and ck)")
    columns = grid_columns(records, ("batch", "heads", "kv_heads", "head_dim", "cq", "ck"), lambda b, h, hkv, d, cq, ck:
                           f"B={b} H={h}" + (f" Hkv={hkv}" if hkv != h else "") + f" D={d}, {cq}x{ck}")
    rows = [("fwd_ms", "forward time", "forward time (ms)", 1.0),
            ("peak_extra_bytes", "peak extra memory", "peak extra memory (MiB)", 2.0 ** -20)]
    backward = any(r.get("fwd_bwd_ms") is not None for r in records)
    if backward:
        rows += [("fwd_bwd_ms", "fwd+bwd time", "fwd+bwd time (ms)", 1.0),
                 ("fwd_bwd_peak_extra_bytes", "fwd+bwd memory", "fwd+bwd peak memory (MiB)", 2.0 ** -20)]
    plain = {impl: {"label": f"{IMPL_STYLES[impl]['label']} (no conv)", "linestyle": ":"}
             for impl in ("sdpa_flash", "sdpa_cudnn")}
    fig = impl_grid(records, columns, rows, "mta_conv", "mta.conv_attention check failed", log=True,
                    ax_size=ax_size, restyle=plain)
    cfg = data["config"]
    dtype = cfg.get("dtype") or records[0].get("dtype", "?")
    causal = cfg.get("causal", records[0].get("causal"))
    passes = "forward and forward+backward" if backward else "forward"
    return titled(fig, f"MTA conv attention {passes}, {dtype}{', causal' if causal else ''}; missing points: "
                       "reference skipped or out of memory", data, bottom=0.16 / len(rows))


def plot_launch_order(source: Union[str, Path, dict], *, ax_size: tuple = (3.4, 2.8)):
    """Speedup of heaviest-first tile numbering over the natural one against sequence length: one panel per kernel
    (flash forward, MTA forward), one line per (heads, head dim)."""
    import matplotlib.pyplot as plt

    data = load_results(source)
    kernels = list(dict.fromkeys(r["kernel"] for r in data["results"]))
    titles = {"flash": "mta.flash_attention forward", "conv": "mta.conv_attention kernel (6x11)"}
    seq_lens = sorted({r["seq_len"] for r in data["results"]})
    fig, axes = plt.subplots(1, len(kernels), squeeze=False, sharey=True,
                             figsize=(ax_size[0] * len(kernels), ax_size[1]))
    for ax, kernel in zip(axes[0], kernels):
        records = select(data["results"], kernel=kernel)
        for i, shape in enumerate(sorted({(r["heads"], r["head_dim"]) for r in records})):
            line = _points(select(records, heads=shape[0], head_dim=shape[1]), "speedup")
            ax.plot(*zip(*line), marker="o", color=f"C{i}", label=f"B=1 H={shape[0]} D={shape[1]}")
        ax.axhline(1.0, color="0.5", linewidth=0.8)
        seq_len_axis(ax, seq_lens)
        ax.grid(alpha=0.3)
        ax.set_title(titles.get(kernel, kernel), fontsize=9)
        ax.set_xlabel("sequence length N")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("natural time / heaviest-first time")
    return titled(fig, "Causal tiles launched heaviest first, bf16", data, bottom=0)


def plot_startup(source: Union[str, Path, dict], *, ax_size: tuple = (5.5, 3.2)):
    """Seconds of the first call in a fresh process, log axis: one panel per head dim, one group of bars per
    (case, dtype), a bar for an empty and for a warm Triton cache (none for a failed probe, marked "failed"); a
    dot marks the second call (steady state)."""
    import matplotlib.pyplot as plt

    data = load_results(source)
    results = data["results"]
    head_dims = sorted({r["head_dim"] for r in results})
    groups = list(dict.fromkeys((r["case"], r["dtype"]) for r in results))
    labels = data["config"].get("cases", {})
    runs = (("empty_cache", "empty cache", "C3"), ("warm_cache", "warm cache", "C0"))
    fig, axes = plt.subplots(len(head_dims), 1, squeeze=False, sharey=True,
                             figsize=(max(ax_size[0], 1.25 * len(groups)), ax_size[1] * len(head_dims)))
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
            if r and not r.get("check", {}).get("ok", True):
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
    shape = data["config"].get("shape", {})
    return titled(fig, f"First call in a fresh process, B={shape.get('batch', '?')} Hq={shape.get('heads', '?')} "
                       f"Hkv={shape.get('kv_heads', '?')} N={shape.get('seq_len', '?')}", data, bottom=0.04)


def _points(records: list[dict], key: str, scale: float = 1.0, positive: bool = False,
            only_failed_checks: bool = False) -> list[tuple[int, float]]:
    """``(seq_len, value * scale)`` pairs sorted by seq_len, skipping missing values and, with ``positive``,
    those a log axis cannot show; with ``only_failed_checks``, only the records whose check failed."""
    points = []
    for r in records:
        value, check = r.get(key), r.get("check")
        if value is None or (positive and value <= 0) or (only_failed_checks and (check or {}).get("ok", True)):
            continue
        points.append((r["seq_len"], value * scale))
    return sorted(points)


def _unique_legend(axes) -> tuple[list, list[str]]:
    """Every labelled artist of the figure once, in first-seen order."""
    seen: dict[str, object] = {}
    for ax in (a for row in axes for a in row):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)
