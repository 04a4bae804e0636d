"""Figures of chapter 01 (naive attention): the notebook computes, these functions draw.

Each function takes the numbers (or the formulas, as functions) from the notebook,
draws one figure, saves it with :func:`mta.course.figures.save_figure` and returns it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from .figures import save_figure

__all__ = ["plot_causal_masks", "plot_memory_vs_seqlen", "plot_arithmetic_intensity", "plot_roofline"]


def _length_ticks(ax, Ns):
    ax.set_xticks(Ns, [f"{N // 1024}K" if N >= 1024 else str(N) for N in Ns])
    ax.minorticks_off()


def plot_causal_masks(shapes, visible, name="01_causal_masks.png"):
    """One panel per ``(Nq, Nk)``: which keys each query sees; ``visible(Nq, Nk)`` is a bool ``[Nq, Nk]``."""
    fig, axes = plt.subplots(1, len(shapes), figsize=(11, 3.9),
                             gridspec_kw={"width_ratios": [max(nk, 3) for _, nk in shapes]})
    for ax, (nq, nk) in zip(axes, shapes):
        mask = visible(nq, nk).cpu()
        ax.imshow(mask, cmap="Blues", vmin=0, vmax=1.3)
        ax.set_xticks(range(nk))
        ax.set_yticks(range(nq))
        ax.set_xticks([x - 0.5 for x in range(1, nk)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, nq)], minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("key index j")
        ax.set_ylabel("query index i")
        ax.set_title(f"$N_q = {nq}$, $N_k = {nk}$")
        for i in range(nq):
            if not mask[i].any():
                ax.text((nk - 1) / 2, i, "sees no key: O = 0", ha="center", va="center", color="crimson", fontsize=8)
    blues = plt.get_cmap("Blues")
    fig.legend([Patch(fc=blues(1 / 1.3), ec="0.5"), Patch(fc=blues(0.0), ec="0.5")],
               ["visible: $j \\leq i + (N_k - N_q)$", "masked (score set to $-\\infty$)"],
               loc="lower center", ncol=2, frameon=False, bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("Causal masks, bottom-right aligned")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_figure(fig, name)
    return fig


def plot_memory_vs_seqlen(Ns, sp_gb, qkvo_gb, capacity_gb, n_full, name="01_memory_vs_seqlen.png"):
    """Gigabytes of S + P and of Q, K, V, O against N, with one GPU's memory as a line."""
    fig, ax = plt.subplots(figsize=(8.6, 4.5))
    ax.loglog(Ns, sp_gb, "o-", base=2, label="S + P  (fp32 scores)")
    ax.loglog(Ns, qkvo_gb, "s-", base=2, label="Q, K, V, O  (bf16, d = 128)")
    ax.axhline(capacity_gb, color="crimson", linestyle="--", label=f"H100 HBM: {capacity_gb:.0f} GB")
    ax.axvline(n_full, color="gray", linestyle=":", linewidth=1, label=f"S + P exceed it from N = {n_full}")
    ax.set_yscale("log", base=10)
    _length_ticks(ax, Ns)
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("memory (GB, $10^9$ bytes)")
    ax.set_title("Memory of naive attention, B = 1, H = 16")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def plot_arithmetic_intensity(Ns, naive, ideal, tiled, ridge, name="01_arithmetic_intensity.png"):
    """Arithmetic intensity against N.

    Args:
        Ns: sequence lengths.
        naive: ``{d: [intensity per N]}`` for the unfused kernels.
        ideal: intensities of a fused kernel that reads each input once.
        tiled: ``{block_m: [intensity per N]}`` for a kernel that re-reads K and V per query tile.
        ridge: the GPU's ridge point, FLOP/byte.
    """
    fig, ax = plt.subplots(figsize=(9.2, 4.8))
    for (d, values), marker in zip(naive.items(), "os"):
        ax.loglog(Ns, values, marker + "-", base=2, label=f"naive, d = {d}")
    ax.loglog(Ns, ideal, "^-", base=2, color="C2", label="fused, each input read once (ideal)")
    for (block_m, values), color in zip(tiled.items(), ["C4", "C5", "C6", "C7", "C8"]):
        ax.loglog(Ns, values, "--", base=2, color=color, marker=".",
                  label=f"fused, K and V read once per tile of {block_m} queries")
    ax.axhline(ridge, color="crimson", linestyle=":", linewidth=1.2, label=f"H100 ridge point, {ridge:.0f} FLOP/byte")
    ax.set_yscale("log", base=10)
    _length_ticks(ax, Ns)
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("arithmetic intensity (FLOP / byte of HBM traffic)")
    ax.set_title("Attention forward, bf16: FLOPs per byte of HBM traffic")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def plot_roofline(attainable, ridge, points, name="01_roofline.png"):
    """The roofline ``attainable(intensity)`` (FLOP/s) with labelled kernel points.

    Args:
        attainable: FLOP/s reachable at an intensity.
        ridge: the ridge point, FLOP/byte.
        points: list of ``(label, marker, color, [(N, intensity), ...], tag)``; each point is drawn on the
            roof, and tagged with its N when ``tag`` is true (series whose points lie far enough apart).
    """
    xs = sorted([2 ** (e / 4) for e in range(0, 4 * 17 + 1)] + [ridge])  # 1 ... 131072 FLOP/byte
    fig, ax = plt.subplots(figsize=(9.4, 5.0))
    ax.loglog(xs, [attainable(x) / 1e12 for x in xs], "k-", linewidth=2, label="H100 SXM roofline (datasheet)")
    ax.axvline(ridge, color="gray", linestyle=":", linewidth=1)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, 1.5), xytext=(4, 0), textcoords="offset points", color="gray")
    for label, marker, color, series, tag in points:
        I = [i for _, i in series]
        ax.scatter(I, [attainable(i) / 1e12 for i in I], marker=marker, color=color, s=50, zorder=3, label=label,
                   edgecolor="white", linewidth=0.5)
        for N, i in series if tag else []:
            ax.annotate(f"{N // 1024}K", (i, attainable(i) / 1e12), xytext=(0, -13), textcoords="offset points",
                        ha="center", fontsize=7, color=color)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of HBM traffic)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_ylim(1, 2000)
    ax.set_title("Attention forward (bf16) on the H100 roofline")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5)
    fig.tight_layout()
    save_figure(fig, name)
    return fig
