"""Figures of chapter 04 (the MTA forward), so that the notebook's cells show the idea, not the matplotlib.

* :func:`plot_find_the_block`: the toy "find the block" task, scores and probabilities with and without MTA;
* :func:`plot_halo_tiles`: overlapping halo tiles and the halo of one loaded tile;
* :func:`plot_recompute_overhead`: the recomputation factor of halo tiles against the tile size;
* :func:`plot_tile_grid`: the kind of each (query tile, key tile) of the fused kernel;
* :func:`plot_cost_model`: the product-count model of the fused kernel against flash attention;
* :func:`plot_bench_with_model`: the committed GPU benchmark, with a row comparing the measured conv/flash time
  ratio with the model.
"""

from __future__ import annotations

from typing import Callable, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Rectangle

from ..bench import plots as bench_plots

SKIP_C, FOLD_C, DIAG_C = "#EEEEEE", "#4C72B0", "#DD8452"


def plot_find_the_block(S, C, P_plain, P_mta, context: str, question: str, block_len: int, answer_block: int):
    """Four strips over the keys: the scores and the convolved scores of the question tokens, then the last
    query's attention probabilities, plain and MTA. Tensors are float64 ``[rows, N]`` (``-inf``: masked)."""
    N = len(context) + len(question)
    n_blocks = len(context) // block_len
    fig, axes = plt.subplots(4, 1, figsize=(11, 6.2), sharex=True,
                             gridspec_kw=dict(height_ratios=[2, 2, 1, 1], hspace=0.45))
    q_labels = [f"q: {c}?" for c in question]
    panels = [(S[-2:], q_labels, "Blues", "(a) scores $S = QK^T$ of the two question tokens: one letter each"),
              (C[-2:], q_labels, "Blues", "(b) after the $2\\times5$ convolution: the last row adds both questions "
                                          "over 5 keys"),
              (P_plain[-1:], ["plain"], "Reds", "(c) attention probabilities of the last query, plain attention"),
              (P_mta[-1:], ["MTA"], "Reds", "(d) attention probabilities of the last query, MTA")]
    for ax, (data, ylabels, cmap, title) in zip(axes, panels):
        arr = data.numpy().astype(float)
        ax.imshow(np.ma.masked_where(~np.isfinite(arr), arr), cmap=cmap, vmin=0, vmax=1.0 if cmap == "Reds" else 8.0,
                  aspect="auto", interpolation="nearest")
        ax.set_facecolor("0.85")                                  # masked (future) entries show grey
        if cmap == "Blues":
            for (r, c), val in np.ndenumerate(arr):
                if np.isfinite(val) and val != 0:
                    ax.text(c, r, f"{val:.0f}", ha="center", va="center", fontsize=7,
                            color="white" if val > 5 else "black")
        ax.set_yticks(range(len(ylabels)), ylabels, fontsize=8)
        for b in range(1, n_blocks + 1):
            ax.axvline(block_len * b - 0.5, color="black", lw=0.8)
        ax.add_patch(Rectangle((block_len * answer_block - 0.5, -0.5), block_len, data.shape[0], fill=False,
                               edgecolor="#C44E52", lw=2))
        ax.set_title(title, loc="left", fontsize=9)
    axes[-1].set_xticks(range(N), list(context) + [f"{c}?" for c in question], fontsize=8)
    axes[-1].set_xlabel(f"key (its letter); red frame: block {answer_block}, the only block holding every "
                        "asked-for letter")
    return fig


def plot_halo_tiles(N: int, T: int, cq: int, ck: int, shown=((1, 1), (1, 2), (2, 1))):
    """Left: the output tiles of an ``N x N`` score matrix and three loaded ``T x T`` tiles with the outputs they
    keep. Right: one loaded tile, its halo and the kernel's footprint at two corners of the kept region."""
    pq, pk = cq - 1, (ck - 1) // 2
    Tr, Tc = T - pq, T - 2 * pk
    colors = ["#4C72B0", "#DD8452", "#55A868"]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12.5, 5.8), gridspec_kw=dict(width_ratios=[1.15, 1]))
    ax0.add_patch(Rectangle((0, 0), N, N, facecolor="0.97", edgecolor="black", lw=1))
    for i_eff in range(0, N, Tr):
        for j_eff in range(0, N, Tc):
            ax0.add_patch(Rectangle((j_eff, i_eff), min(Tc, N - j_eff), min(Tr, N - i_eff), fill=False,
                                    edgecolor="0.6", lw=0.6))
    for (ti, tj), col in zip(shown, colors):
        i_eff, j_eff = ti * Tr, tj * Tc
        ax0.add_patch(Rectangle((j_eff, i_eff), Tc, Tr, facecolor=col, alpha=0.35, edgecolor="none"))
        ax0.add_patch(Rectangle((j_eff - pk, i_eff - pq), T, T, fill=False, edgecolor=col, lw=2.2))
        ax0.text(j_eff + Tc / 2, i_eff + Tr / 2, f"tile ({ti},{tj})", ha="center", va="center", fontsize=9)
    ax0.set(xlim=(-3, N + 3), ylim=(N + 3, -3), aspect="equal", xlabel="key j", ylabel="query i")
    ax0.set_title(f"{N} x {N} scores, T = {T}, kernel {cq}x{ck}: strides {Tr} (rows) x {Tc} (keys)\n"
                  "frames: loaded T x T tiles; filled: the outputs each one keeps", fontsize=9, loc="left")
    cells = np.zeros((T, T))
    cells[pq:, pk:T - pk] = 1
    ax1.imshow(cells, cmap=ListedColormap(["#E5E5E5", "#9DB7DB"]), extent=(-0.5, T - 0.5, T - 0.5, -0.5))
    for x in np.arange(-0.5, T, 1):
        ax1.axhline(x, color="white", lw=0.5)
        ax1.axvline(x, color="white", lw=0.5)
    for (r, c), col in (((pq, pk), "#C44E52"), ((T - 1, T - 1 - pk), "#8172B2")):
        ax1.add_patch(Rectangle((c - pk - 0.5, r - pq - 0.5), ck, cq, fill=False, edgecolor=col, lw=2.4, zorder=3))
        ax1.plot(c, r, marker="o", color=col, markersize=7, zorder=4)
    ax1.annotate(f"{pq} halo rows\n(queries above)", xy=(T / 2, pq / 2 - 0.5), ha="center", va="center", fontsize=9)
    ax1.text(-0.9, T / 2 + 1, f"{pk} halo keys", rotation=90, ha="right", va="center", fontsize=9)
    ax1.text(T - 0.1, T / 2 + 1, f"{pk} halo keys", rotation=270, ha="left", va="center", fontsize=9)
    ax1.set_xticks([])
    ax1.set_yticks([])
    ax1.set_title(f"one loaded tile: the blue {Tr} x {Tc} part is kept\n"
                  "circles: an output; frame: the scores its kernel reads", fontsize=9, loc="left")
    return fig


def plot_recompute_overhead(overhead: Callable[[int, int, int], float], kernels: Sequence[tuple[int, int]]):
    """``overhead(T, cq, ck)`` against the tile size ``T``, one line per kernel, log-log."""
    fig, ax = plt.subplots(figsize=(7.5, 4.3))
    for (cq, ck), col in zip(kernels, ["#4C72B0", "#DD8452", "#C44E52", "#55A868"]):
        Ts = np.arange(max(16, ck + 1), 257)
        ax.plot(Ts, [overhead(T, cq, ck) for T in Ts], color=col, label=f"kernel {cq} x {ck}")
    ax.axhline(1.0, color="0.5", ls="--", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([16, 32, 64, 128, 256], ["16", "32", "64", "128", "256"])
    ax.set_yticks([1, 1.25, 1.5, 2, 3, 5, 10, 20], ["1", "1.25", "1.5", "2", "3", "5", "10", "20"])
    ax.set_xlabel("loaded tile size T (queries = keys)")
    ax.set_ylabel("scores computed / scores needed")
    ax.set_title("halo tiles: recomputation factor $\\frac{T}{T-(c_q-1)}\\cdot\\frac{T}{T-(c_k-1)}$", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    return fig


def plot_tile_grid(grids: Sequence[tuple[int, int, np.ndarray]], E: int, kernel_label: str):
    """One panel per ``(N, tile, kinds)``: the kind of each (query tile, key tile), with the diagonal ``j = i``
    and the line ``i - j = E``. ``kinds`` uses 0 skipped, 1 folded, 2 diagonal."""
    fig, axes = plt.subplots(1, len(grids), figsize=(6 * len(grids), 5.8), squeeze=False)
    for ax, (N, T, kinds) in zip(axes[0], grids):
        counts = {name: int((kinds == kind).sum()) for name, kind in (("folded", 1), ("diagonal", 2), ("skipped", 0))}
        ax.imshow(kinds, cmap=ListedColormap([SKIP_C, FOLD_C, DIAG_C]), vmin=0, vmax=2,
                  extent=(0, kinds.shape[1] * T, kinds.shape[0] * T, 0), interpolation="nearest")
        for x in range(0, N + 1, T):
            ax.axhline(x, color="white", lw=0.6)
            ax.axvline(x, color="white", lw=0.6)
        ax.plot([0, N], [0, N], color="black", lw=1, label="diagonal $j = i$")
        ax.plot([0, N - E], [E, N], color="#C44E52", lw=1.2, ls="--", label=f"$i - j = E = {E}$")
        ax.set(xlim=(0, N), ylim=(N, 0), xlabel="key j", ylabel="query i")
        ax.set_title(f"N = {N}, tiles {T} x {T}: " + ", ".join(f"{v} {k}" for k, v in counts.items()), fontsize=9)
    handles = [Patch(color=FOLD_C, label="folded: cq products of depth d"),
               Patch(color=DIAG_C, label="diagonal: folded, diagonals put in, causal mask"),
               Patch(color=SKIP_C, label="skipped (future)")]
    axes[0][-1].legend(handles=handles + axes[0][-1].get_legend_handles_labels()[0], fontsize=8, loc="upper right")
    fig.suptitle(f"causal MTA, kernel {kernel_label}: the kind of each (query tile, key tile), from the kernel's "
                 "key_tile_bounds", fontsize=11)
    return fig


def plot_cost_model(Ns: Sequence[int], series: dict[tuple[int, int], tuple[list, list]], tile: tuple[int, int]):
    """``series[(cq, ck)] = (kernel-only ratios, kernel + pre-pass ratios)`` against ``Ns``: the modelled
    multiply-adds of the fused kernel over flash attention's (the head dimension cancels)."""
    fig, ax = plt.subplots(figsize=(7.8, 4.5))
    for ((cq, ck), (kernel_only, with_pre)), col in zip(series.items(), ["#4C72B0", "#C44E52", "#55A868"]):
        ax.plot(Ns, kernel_only, "o-", color=col, label=f"{cq} x {ck}: fused kernel")
        ax.plot(Ns, with_pre, "--", color=col, alpha=0.8, label=f"{cq} x {ck}: kernel + pre-passes")
        ax.axhline((cq + 1) / 2, color=col, ls=":", lw=0.8)
        ax.text(Ns[-1], (cq + 1) / 2 * 1.03, f"(cq + 1) / 2 = {(cq + 1) / 2:g}", fontsize=8, color=col, ha="right")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"sequence length N (causal, tiles {tile[0]} x {tile[1]})")
    ax.set_ylabel("modelled multiply-adds / flash attention's")
    ax.set_title("MODEL, not a measurement: matrix-product work of MTA vs flash attention", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def plot_bench_with_model(bench: dict, rows: list[dict], extra_height: float = 3.2):
    """:func:`mta.bench.plots.plot_conv`'s grid of the committed benchmark, with one more row at the bottom: per
    (head dim, kernel) the measured forward conv/flash time ratio against sequence length, and the model's.
    ``rows``: dicts with ``head_dim, cq, ck, seq_len, model, measured``. The model is drawn once per kernel where
    it is the same for every head dim."""
    fig = bench_plots.plot_conv(bench)
    width, height = fig.get_size_inches()
    total = height + extra_height
    for ax in fig.axes:                                           # shift the grid up, keep its size in inches
        box = ax.get_position()
        ax.set_position([box.x0, (box.y0 * height + extra_height) / total, box.width, box.height * height / total])
    for legend in fig.legends:
        x, y = legend.get_bbox_to_anchor().transformed(fig.transFigure.inverted()).p0
        legend.set_bbox_to_anchor((x, (y * height + extra_height) / total), transform=fig.transFigure)
    fig.set_size_inches(width, total)
    groups = sorted({(r["head_dim"], r["cq"], r["ck"]) for r in rows})
    grid_axes = [ax for ax in fig.axes if ax.get_title()]
    left = min(ax.get_position().x0 for ax in grid_axes)
    right = max(ax.get_position().x1 for ax in grid_axes)
    ax = fig.add_axes([left, 0.35 / total, right - left, (extra_height - 1.1) / total])
    colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860"]
    for (d, cq, ck), col in zip(groups, colors):
        pts = sorted((r["seq_len"], r["measured"]) for r in rows if (r["head_dim"], r["cq"], r["ck"]) == (d, cq, ck))
        ax.plot(*zip(*pts), "o-", color=col, label=f"measured, d = {d}, {cq}x{ck}")
    for (cq, ck), dash in zip(sorted({(c, k) for _, c, k in groups}), ["--", "-.", ":"]):
        per_d = {}                                                # the model's line per head dim; one if they agree
        for r in sorted(rows, key=lambda r: r["seq_len"]):
            if (r["cq"], r["ck"]) == (cq, ck):
                per_d.setdefault(r["head_dim"], []).append((r["seq_len"], r["model"]))
        lines = list(per_d.items())
        if all(line == lines[0][1] for _, line in lines):
            lines = [(None, lines[0][1])]
        for d, line in lines:
            ax.plot(*zip(*line), dash, color="0.3", label=f"model, {cq}x{ck}" + ("" if d is None else f", d = {d}"))
    seq_lens = sorted({r["seq_len"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(seq_lens, [bench_plots.seq_len_label(n) for n in seq_lens])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("conv / flash forward GPU time")
    ax.set_title("the headline ratio: measured forward GPU time of mta.conv_attention over mta.flash_attention, and "
                 "the product-count model of section 4", fontsize=9)
    ax.set_ylim(0, 1.35 * max(max(r["measured"], r["model"]) for r in rows))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    return fig
