"""Figures of chapter 03 (FlashAttention-2 in Triton) and its appendix 03b (launch order), so that the notebooks'
cells show the idea, not the matplotlib.

* :func:`plot_forward_grid`: one program per query tile, sweeping the key tiles;
* :func:`plot_tile_stages`, :func:`plot_tile_fractions`: causal key tiles skipped, full or masked;
* :func:`plot_backward_ownership`: which tiles a dK/dV program and a dQ program visit;
* :func:`plot_schedules` (03b): programs on SMs, in two launch orders, coloured by query tile, with a colourbar;
* :func:`plot_bench_launch_order` (03b): measured gain of heaviest-first against the model's, from
  ``figures/bench_launch_order.json``: the benchmark's own figure (:func:`mta.bench.plots.plot_launch_order`)
  with the model's lines.

Stage codes: :data:`SKIPPED`, :data:`FULL`, :data:`MASKED`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from ..bench.plots import plot_launch_order as plot_bench_launch_order  # noqa: F401  (03b's name for it)
from ..bench.plots import seq_len_label
from .figures import tile_grid_axes

SKIPPED, FULL, MASKED = 0, 1, 2
STAGE_COLORS = {SKIPPED: "#E8E8E8", FULL: "#4C72B0", MASKED: "#DD8452"}
STAGE_LABELS = {FULL: "full: loaded, no mask", MASKED: "masked: loaded, masked body", SKIPPED: "skipped: never loaded"}
PROGRAM_COLORS = ["#AEC7E8", "#FFBB78", "#98DF8A", "#FF9896"]


def _tile(ax, x, y, color, text="", fontsize=9, lw=0.8, w=1, h=1):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", lw=lw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def plot_forward_grid(n_qt: int = 4, n_kt: int = 6, prog: int = 2):
    """The forward grid: each row of score tiles is one program; program ``prog`` sweeps its key tiles in order."""
    fig, ax = plt.subplots(figsize=(9, 4.6))
    for j in range(n_kt):
        _tile(ax, j, -1.5, "0.85", f"$K_{j}^\\top$")
    for i in range(n_qt):
        color = PROGRAM_COLORS[i % len(PROGRAM_COLORS)]
        _tile(ax, -1.5, i, color, f"$Q_{i}$")
        _tile(ax, n_kt + 0.5, i, color, f"$O_{i}$")
        for j in range(n_kt):
            mine = i == prog
            _tile(ax, j, i, color if mine else "white", f"step {j + 1}" if mine else "", fontsize=8,
                  lw=1.4 if mine else 0.6)
    ax.annotate("", xy=(n_kt - 0.05, prog + 0.88), xytext=(0.05, prog + 0.88),
                arrowprops=dict(arrowstyle="->", lw=1.6, color="black"))
    ax.text(n_kt / 2, -1.75, "key tiles (with $V_J$), streamed by every program", ha="center", va="bottom", fontsize=9)
    ax.text(-1.0, n_qt + 0.2, "query tiles,\none per program", ha="center", va="top", fontsize=8.5)
    ax.text(n_kt + 1.0, n_qt + 0.2, "output tiles,\nwritten once", ha="center", va="top", fontsize=8.5)
    ax.text(n_kt / 2, n_qt + 1.1, f"program pid_m = {prog}: holds $Q_{prog}$ and $(m, \\ell, \\mathbf{{acc}})$ on chip,\n"
            "visits the key tiles in order; other rows are other programs", ha="center", va="top", fontsize=9)
    ax.set_xlim(-1.8, n_kt + 1.8)
    ax.set_ylim(n_qt + 2.1, -2.1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("the forward grid: one program per query tile (and per batch x head)", fontsize=10)
    return fig


def plot_tile_stages(panels, block_m: int, block_n: int):
    """``panels``: ``[(n_q, n_k, stages)]`` with ``stages [query tiles, key tiles]`` of stage codes. One panel each,
    tiles drawn at their true size (the last ones cut by the lengths), the diagonal ``j = i + n_k - n_q`` in black."""
    fig, axes = plt.subplots(1, len(panels), figsize=(14, 4.6),
                             gridspec_kw=dict(width_ratios=[n_k for _, n_k, _ in panels]))
    for ax, (n_q, n_k, stages) in zip(axes, panels):
        for i in range(stages.shape[0]):
            for j in range(stages.shape[1]):
                w, h = min(block_n, n_k - j * block_n), min(block_m, n_q - i * block_m)
                ax.add_patch(Rectangle((j * block_n, i * block_m), w, h, facecolor=STAGE_COLORS[int(stages[i, j])],
                                       edgecolor="white", lw=1.2))
        diag = n_k - n_q
        ax.plot([max(diag, 0), n_k], [max(-diag, 0), n_q], color="black", lw=1.5)
        counts = ", ".join(f"{name} {int((stages == code).sum())}"
                           for name, code in (("full", FULL), ("masked", MASKED), ("skipped", SKIPPED)))
        ax.set_title(f"$N_q$ = {n_q}, $N_k$ = {n_k}\n{counts}", fontsize=10)
        ax.set_xlim(0, n_k)
        ax.set_ylim(n_q, 0)
        ax.set_aspect("equal")
        ax.set_xlabel("key index $j$")
    axes[0].set_ylabel("query index $i$")
    fig.legend([Patch(color=STAGE_COLORS[c]) for c in (FULL, MASKED, SKIPPED)],
               [STAGE_LABELS[c] for c in (FULL, MASKED, SKIPPED)],
               loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle(f"causal key tiles per query tile, BLOCK_M = {block_m}, BLOCK_N = {block_n} "
                 "(the kernel's full_stop / masked_stop)", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def plot_tile_fractions(Ns, fractions: dict, block_m: int, block_n: int):
    """Stacked fractions of full, masked and skipped tiles against ``N`` (``fractions[code]``: one value per N)."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    codes = (FULL, MASKED, SKIPPED)
    ax.stackplot(Ns, *[fractions[c] for c in codes], colors=[STAGE_COLORS[c] for c in codes],
                 labels=["full", "masked", "skipped"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ns, [seq_len_label(n) for n in Ns])
    ax.minorticks_off()
    ax.set_xlim(Ns[0], Ns[-1])
    ax.set_ylim(0, 1)
    ax.set_xlabel("sequence length $N$ ($N_q = N_k$)")
    ax.set_ylabel("fraction of tiles")
    ax.set_title(f"causal attention: what happens to each tile (BLOCK_M = {block_m}, BLOCK_N = {block_n})",
                 fontsize=10)
    ax.legend(loc="upper right", fontsize=9, framealpha=1)
    fig.tight_layout()
    return fig


def plot_backward_ownership(n: int = 6, dkdv_tile: int = 2, dq_tile: int = 4):
    """Causal square grid of ``n x n`` tiles: the tiles the dK/dV program of key tile ``dkdv_tile`` visits (down
    its column) and those the dQ program of query tile ``dq_tile`` visits (along its row), numbered in order."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    for ax, (kind, pick) in zip(axes, (("dkdv", dkdv_tile), ("dq", dq_tile))):
        for i in range(n):
            for j in range(n):
                hidden = j > i
                mine = (j == pick) if kind == "dkdv" else (i == pick)
                color = "#E8E8E8" if hidden else ("#FFBB78" if mine else "white")
                strong = mine and not hidden
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=color, edgecolor="0.4", lw=1.4 if strong else 0.6,
                                       zorder=2 if strong else 1))
                if strong:
                    step = i - pick + 1 if kind == "dkdv" else j + 1
                    ax.text(j + 0.5, i + 0.5, str(step), ha="center", va="center", fontsize=10, zorder=3)
        if kind == "dkdv":
            ax.annotate("", xy=(pick + 0.85, n - 0.05), xytext=(pick + 0.85, pick + 0.05),
                        arrowprops=dict(arrowstyle="->", lw=1.5), zorder=3)
            ax.set_title(f"flash_dkdv_kernel: the program of key tile {pick}\nloads $K_{pick}, V_{pick}$ once, walks "
                         f"down the query tiles,\nwrites $dK_{pick}, dV_{pick}$ once", fontsize=9)
        else:
            ax.annotate("", xy=(pick + 0.95, pick + 0.85), xytext=(0.05, pick + 0.85),
                        arrowprops=dict(arrowstyle="->", lw=1.5), zorder=3)
            ax.set_title(f"flash_dq_kernel: the program of query tile {pick}\nloads $Q_{pick}, dO_{pick}$, lse, $D$ "
                         f"once, walks along the key tiles,\nwrites $dQ_{pick}$ once", fontsize=9)
        tile_grid_axes(ax, n)
    fig.legend([Patch(color="#FFBB78"), Patch(facecolor="white", edgecolor="0.4"), Patch(color="#E8E8E8")],
               ["visited by this program (in order)", "visited by other programs", "skipped (causal)"],
               loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def plot_schedules(panels, ideal: float, num_tiles: int, sms: int, title: str):
    """``panels``: ``[(name, runs, makespan)]`` with ``runs = [(sm, start, end, tile)]``. One bar per program on its
    SM, coloured by query tile, a colourbar for the tile, and the ideal finish time (work / SMs) as a dashed line."""
    cmap, norm = plt.cm.viridis, Normalize(0, num_tiles - 1)
    fig, axes = plt.subplots(1, len(panels), figsize=(13.5, 4.4), sharey=True)
    for ax, (name, runs, makespan) in zip(axes, panels):
        for sm, start, end, tile in runs:
            ax.barh(sm, end - start, left=start, height=1.0, color=cmap(norm(tile)), edgecolor="white", linewidth=0.2)
        ax.axvline(ideal, color="red", lw=1.2, ls="--")
        ax.set_title(f"{name}: last program ends at {makespan / ideal:.2f} x ideal", fontsize=10)
        ax.set_xlabel("time (key tiles)")
    axes[0].set_ylabel("SM")
    axes[0].set_ylim(sms, -1)
    fig.legend([Line2D([], [], color="red", lw=1.2, ls="--")], ["ideal: all work / SMs"], loc="lower center",
               frameon=False, bbox_to_anchor=(0.45, -0.01))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 0.93, 1))
    cax = fig.add_axes((0.945, 0.2, 0.012, 0.65))
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax, label="query tile (0: first rows, fewest key tiles)")
    return fig
