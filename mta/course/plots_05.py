"""Figures of chapter 05 (the MTA backward), so that the notebook's cells show the idea, not the matplotlib.

* :func:`plot_far_near`: ``dC`` cut into its far and near parts, and where each lands after the convolution's
  transpose;
* :func:`plot_ownership`: which program of which kernel owns which rows of which gradient;
* :func:`measured_ratios`, :func:`plot_model_vs_measured`: the product-count model of the backward against the
  ratios measured on a GPU (``figures/bench_conv_h200_full.json``).
"""

from __future__ import annotations

from typing import Callable

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from ..bench.plots import provenance_line
from .figures import tile_grid_axes

FAR, NEAR, OWN, SKIP, OTHER = "#4C72B0", "#DD8452", "#FFBB78", "#E8E8E8", "white"


def _signed_image(ax, m, title, vmax=None):
    m = np.asarray(m, dtype=float)
    vmax = vmax or max(float(np.abs(m).max()), 1e-30)
    ax.imshow(m, cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_xlabel("key $j$")
    ax.set_ylabel("query $i$")


def _diagonal(ax, n, offset, **style):
    """The line ``i - j = offset`` across an ``n x n`` image."""
    j = np.array([-0.5, n - 0.5])
    ax.plot(j, j + offset, **style)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(n - 0.5, -0.5)


def plot_far_near(dc, far_ds0, near_ds0, E: int, E_past: int):
    """Three panels for one head: ``dC`` with its ``E`` near diagonals framed; the far part after the transposed
    convolution (it lands on past scores only); the near part after it (diagonals ``-E .. E'``, of which the
    pre-convolution mask keeps ``0 .. E'``). Returns the Figure."""
    n = dc.shape[-1]
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.6))
    _signed_image(axes[0], dc, "(a) $dC$: far part below the dashed line,\n"
                               f"near part: the $E = {E}$ diagonals $0 \\leq i - j < E$")
    _diagonal(axes[0], n, 0, color="black", lw=1)
    _diagonal(axes[0], n, E - 0.5, color=NEAR, lw=1.6, ls="--")
    _signed_image(axes[1], far_ds0, "(b) far part, transposed convolution:\nonly past scores ($i \\geq j$): "
                                    "no mask needed")
    _diagonal(axes[1], n, 0, color="black", lw=1)
    _signed_image(axes[2], near_ds0, f"(c) near part, transposed convolution: diagonals\n"
                                     f"$-E .. E' = -{E} .. {E_past}$; the pre-mask drops those above the diagonal")
    _diagonal(axes[2], n, 0, color="black", lw=1)
    _diagonal(axes[2], n, -E - 0.5, color="0.4", lw=1, ls=":")
    _diagonal(axes[2], n, E_past + 0.5, color="0.4", lw=1, ls=":")
    fig.tight_layout()
    return fig


def _tile_grid(ax, n, color_of, title):
    for i in range(n):
        for j in range(n):
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=color_of(i, j), edgecolor="0.45", lw=0.6))
    tile_grid_axes(ax, n)
    ax.set_title(title, fontsize=9, loc="left")


def plot_ownership(n_tiles: int = 6, query_tile: int = 4, key_tile: int = 1, row_tiles: int = 5):
    """Who owns what in the MTA backward (causal, square tiles). (a) a dQ-side program walks along its query
    tile's row and writes ``Gq`` for its rows; (b) a dK/dV-side program walks down its key tile's column and writes
    ``dV`` and ``U`` for its keys; (c) the row-tile passes: each program writes its rows of ``G``, ``dq``, ``dk``
    and one ``dW`` partial, and the partials are summed in a fixed order. Returns the Figure."""
    fig, axes = plt.subplots(1, 3, figsize=(14.5, 5.0), gridspec_kw=dict(width_ratios=[1, 1, 1.05]))
    n = n_tiles

    def dq_color(i, j):
        return SKIP if j > i else (OWN if i == query_tile else OTHER)

    def dkdv_color(i, j):
        return SKIP if j > i else (OWN if j == key_tile else OTHER)

    _tile_grid(axes[0], n, dq_color, f"(a) conv_dq_kernel, program of query tile {query_tile}:\nwalks along "
               f"its row, writes $G_q$ of its rows once")
    _tile_grid(axes[1], n, dkdv_color, f"(b) conv_dkdv_kernel, program of key tile {key_tile}:\nwalks down its "
               f"column, writes $dV$, $U$ of its keys once")
    for ax in axes[:2]:
        for t in range(n):                      # the diagonal tiles: dC kept only on the far entries there
            for jt in (t - 1, t):
                if jt >= 0:
                    ax.add_patch(Rectangle((jt, t), 1, 1, fill=False, hatch="///", edgecolor=NEAR, lw=0))
    axes[0].annotate("", xy=(query_tile + 0.95, query_tile + 0.8), xytext=(0.05, query_tile + 0.8),
                     arrowprops=dict(arrowstyle="->", lw=1.5))
    axes[1].annotate("", xy=(key_tile + 0.8, n - 0.05), xytext=(key_tile + 0.8, key_tile + 0.05),
                     arrowprops=dict(arrowstyle="->", lw=1.5))

    ax = axes[2]
    ax.set_xlim(0, 10)
    ax.set_ylim(row_tiles + 1.6, -0.6)
    ax.axis("off")
    for t in range(row_tiles):
        ax.add_patch(Rectangle((0.2, t + 0.1), 3.2, 0.8, facecolor=OWN, edgecolor="0.4"))
        ax.text(1.8, t + 0.5, f"rows of tile {t}", ha="center", va="center", fontsize=8)
        ax.add_patch(Rectangle((4.6, t + 0.2), 1.6, 0.6, facecolor="#C9D7EA", edgecolor="0.4"))
        ax.text(5.4, t + 0.5, f"$dW_{{{t}}}$", ha="center", va="center", fontsize=9)
        ax.add_patch(FancyArrowPatch((3.45, t + 0.5), (4.55, t + 0.5), arrowstyle="->", mutation_scale=10))
    ax.add_patch(FancyArrowPatch((6.3, 0.5), (6.3, row_tiles - 0.5), arrowstyle="-", lw=1.2))
    ax.add_patch(FancyArrowPatch((6.3, row_tiles - 0.5), (7.4, row_tiles - 0.5), arrowstyle="->",
                                 mutation_scale=12))
    ax.text(6.45, (row_tiles - 1) / 2, "sum in order\n$t = 0, 1, \\dots$", fontsize=8, va="center")
    ax.add_patch(Rectangle((7.5, row_tiles - 0.85), 1.8, 0.7, facecolor="#8FB0D9", edgecolor="0.3"))
    ax.text(8.4, row_tiles - 0.5, "$dW$", ha="center", va="center", fontsize=10)
    ax.text(0.2, row_tiles + 0.55, "conv_near_kernel, conv_dq_fold_kernel, conv_dk_fold_kernel:\none program per "
            "row tile writes its rows of $G$, $dq$, $dk$\nand its partials of $dW$ (near and far); torch.sum adds them",
            fontsize=8.5, va="top")
    ax.set_title("(c) the row-tile passes and the fixed-order reduction", fontsize=9, loc="left")
    fig.legend([Patch(color=OWN), Patch(facecolor=OTHER, edgecolor="0.45"), Patch(color=SKIP),
                Patch(facecolor="white", hatch="///", edgecolor=NEAR)],
               ["owned / visited by this program", "other programs", "skipped (future)",
                "diagonal tiles: far entries of $dC$ only"], loc="lower center", ncol=4, frameon=False, fontsize=8.5,
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def measured_ratios(bench: dict) -> list[dict]:
    """Per benchmarked shape: ``fwd_bwd`` = mta.conv_attention's forward+backward time over mta.flash_attention's,
    and ``bwd`` = the same for (forward+backward - forward), the backward's share. Shapes where a time is
    missing are left out."""
    by_shape = {}
    for r in bench["results"]:
        key = (r["head_dim"], r["cq"], r["ck"], r["seq_len"])
        by_shape.setdefault(key, {})[r["impl"]] = r
    rows = []
    for (d, cq, ck, n), recs in sorted(by_shape.items()):
        conv, flash = recs.get("mta_conv"), recs.get("mta_flash")
        times = [x and x.get(k) for x in (conv, flash) for k in ("fwd_ms", "fwd_bwd_ms")]
        if None in times:
            continue
        c_f, c_fb, f_f, f_fb = times
        rows.append(dict(head_dim=d, cq=cq, ck=ck, seq_len=n, fwd_bwd=c_fb / f_fb, bwd=(c_fb - c_f) / (f_fb - f_f)))
    return rows


def plot_model_vs_measured(bench: dict, model: Callable[[int], dict], label: str = "two-phase"):
    """One panel per (head dim, kernel) in the benchmark: the measured ratios of :func:`measured_ratios` against
    the sequence length, and the model's (``model(cq)`` returns ``{"fwd_bwd": ..., "bwd": ...}``) as flat lines;
    ``label`` names the backward the model counts. Returns the Figure."""
    rows = measured_ratios(bench)
    panels = sorted({(r["head_dim"], r["cq"], r["ck"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), sharey=True, squeeze=False)
    for ax, (d, cq, ck) in zip(axes[0], panels):
        pts = [r for r in rows if (r["head_dim"], r["cq"], r["ck"]) == (d, cq, ck)]
        ns = [r["seq_len"] for r in pts]
        m = model(cq)
        for key, color, label in (("fwd_bwd", "C3", "forward+backward"), ("bwd", "C0", "backward")):
            ax.plot(ns, [r[key] for r in pts], "o-", color=color, label=f"measured, {label}")
            ax.axhline(m[key], color=color, ls="--", lw=1, label=f"model, {label}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.set_title(f"d = {d}, kernel {cq} x {ck}", fontsize=9)
        ax.set_xlabel("sequence length N")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("mta.conv_attention / mta.flash_attention")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, frameon=False, fontsize=8, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(f"MTA backward against flash attention: {label} product-count model (dashed) and measured GPU-time "
                 "ratio\n"
                 + provenance_line(bench["provenance"]), fontsize=9.5)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
