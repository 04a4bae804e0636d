"""Figures of chapter 02 (online softmax): the notebook computes, these functions draw.

Each function takes the numbers from the notebook, draws one figure, saves it with
:func:`mta.course.figures.save_figure` and returns it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from .figures import save_figure
from ..online_softmax import merge_states

__all__ = ["plot_running_max_and_sum", "plot_merge_tree", "plot_error_vs_block_size"]

BLOCK_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
NAMES = "ABCDEFGHIJKLMNOP"


def plot_running_max_and_sum(scores, steps, BLOCK, l_direct, name="02_running_max_and_sum.png"):
    """Three panels: the scores by block, the running max, the running normalizer (carry + block sum).

    ``steps`` holds one dict per block with ``start, m_old, m_new, alpha, l_old, carried, block_sum, l_new``.
    """
    colors = BLOCK_COLORS
    n_blocks = len(steps)
    fig, axes = plt.subplots(3, 1, figsize=(9, 8.5), sharex=True, gridspec_kw=dict(height_ratios=[1.2, 1, 1.3]))

    # (a) the scores, block by block
    ax = axes[0]
    for i, st in enumerate(steps):
        idx = torch.arange(st["start"], st["start"] + BLOCK)
        ax.bar(idx.tolist(), scores[idx].tolist(), color=colors[i], width=0.8)
        j = st["start"] + int(scores[idx].argmax())
        ax.plot([j], [scores[j].item()], marker="*", color="black", markersize=11)
        ax.text(st["start"] + BLOCK / 2 - 0.5, 4.6, f"block {i}", ha="center", fontsize=10, color=colors[i])
    ax.set_ylim(-3, 5.3)
    ax.set_ylabel("score $s_j$")
    ax.set_title(f"(a) one row of {len(scores)} scores, read in blocks of {BLOCK} (star: each block's max)",
                 loc="left", fontsize=10)

    # (b) the running max after each block
    ax = axes[1]
    for i, st in enumerate(steps):
        lo, hi = st["start"] - 0.5, st["start"] + BLOCK - 0.5
        ax.hlines(st["m_new"], lo, hi, color=colors[i], linewidth=3)
        ax.text((lo + hi) / 2, st["m_new"] + 0.25, f"m = {st['m_new']:.2f}", ha="center", fontsize=9)
        if i > 0 and st["m_new"] > st["m_old"]:
            ax.annotate("", xy=(lo, st["m_new"]), xytext=(lo, st["m_old"]),
                        arrowprops=dict(arrowstyle="->", color="black", lw=1.2))
            ax.text(lo + 0.3, (st["m_old"] + st["m_new"]) / 2, "max grows", fontsize=8, va="center")
    ax.set_ylim(1.0, 4.9)
    ax.set_ylabel("running max $m$")
    ax.set_title("(b) running max after each block", loc="left", fontsize=10)

    # (c) the running normalizer after each block: rescaled carry + this block's sum
    ax = axes[2]
    for i, st in enumerate(steps):
        center = st["start"] + BLOCK / 2 - 0.5
        ax.bar(center, st["carried"], width=BLOCK - 0.6, color="0.65", edgecolor="black", linewidth=0.6)
        ax.bar(center, st["block_sum"], bottom=st["carried"], width=BLOCK - 0.6, color=colors[i],
               edgecolor="black", linewidth=0.6)
        if i == 0:
            label = "start: $m=-\\infty$, $\\ell=0$"
        else:
            label = f"$\\alpha = e^{{{st['m_old']:.2f} - {st['m_new']:.2f}}}$ = {st['alpha']:.3f}"
            # the old normalizer (hollow circle) and where the rescale moves it
            ax.plot([center - 2.2], [st["l_old"]], marker="o", mfc="white", mec="black", markersize=7)
            if st["alpha"] < 1:
                ax.annotate("", xy=(center - 2.2, st["carried"]), xytext=(center - 2.2, st["l_old"]),
                            arrowprops=dict(arrowstyle="->", color="black", lw=1.2))
        ax.text(center, 3.05, label, ha="center", fontsize=9)
    ax.axhline(l_direct, color="black", linestyle=":", linewidth=1)
    ax.set_ylim(0, 3.5)
    ax.set_ylabel("running normalizer $\\ell$")
    ax.set_xlabel("key index $j$")
    ax.set_title("(c) running normalizer after each block", loc="left", fontsize=10)
    legend_items = [
        plt.Rectangle((0, 0), 1, 1, fc="0.65", ec="black", lw=0.6),
        plt.Rectangle((0, 0), 1, 1, fc=colors[1], ec="black", lw=0.6),
        plt.Line2D([], [], marker="o", mfc="white", mec="black", linestyle="none"),
        plt.Line2D([], [], color="black", linestyle=":"),
    ]
    ax.legend(legend_items, ["old $\\ell$ times $\\alpha$", "this block: $\\sum e^{s_j - m_{new}}$",
                             "old $\\ell$ before rescaling", "direct $\\sum_j e^{s_j - \\max s}$"],
              loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, fontsize=8, frameon=False)

    for ax in axes:
        for b in range(1, n_blocks):
            ax.axvline(b * BLOCK - 0.5, color="0.4", linestyle="--", linewidth=0.8)
        ax.set_xlim(-0.8, len(scores) - 0.2)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def plot_merge_tree(pieces, leaf_states, tree, n_keys, root_equals_direct, name="02_merge_tree.png"):
    """The key axis cut into pieces (top) and the tree in which their states were merged (bottom).

    ``tree`` is a leaf index or a pair of trees; each node is labelled with its state's m and l.
    """
    n_pieces = len(pieces)
    names, piece_colors = NAMES, plt.cm.tab10.colors

    def layout(tree, internal, pos, counter):
        # Leaves get x = 0, 1, 2, ... in visiting order; an internal node sits above its children.
        if isinstance(tree, int):
            pos[tree] = (counter[0], 0)
            counter[0] += 1
            return pos[tree], leaf_states[tree]
        (xa, ya), sa = layout(tree[0], internal, pos, counter)
        (xb, yb), sb = layout(tree[1], internal, pos, counter)
        node, st = ((xa + xb) / 2, max(ya, yb) + 1), merge_states(sa, sb)
        internal.append((node, (xa, ya), (xb, yb), st))
        return node, st

    pos, internal = {}, []
    (root_xy, root_st) = layout(tree, internal, pos, [0])

    fig, (ax_keys, ax_tree) = plt.subplots(2, 1, figsize=(9, 6.5), gridspec_kw=dict(height_ratios=[0.6, 3]))

    # key axis: which keys each piece holds
    for i, (a, b) in enumerate(pieces):
        ax_keys.barh(0, b - a, left=a, color=piece_colors[i], edgecolor="black")
        ax_keys.text((a + b) / 2, 0, names[i], ha="center", va="center", fontsize=11, color="white", weight="bold")
    ax_keys.set_xlim(0, n_keys)
    ax_keys.set_yticks([])
    ax_keys.set_xlabel("key index")
    ax_keys.set_title(f"a random split of {n_keys} keys into {n_pieces} pieces", loc="left", fontsize=10)

    # the merge tree
    box = dict(boxstyle="round,pad=0.35", fc="white", ec="black", lw=0.8)
    for (x, y), (xa, ya), (xb, yb), st in internal:
        for cx, cy in ((xa, ya), (xb, yb)):
            ax_tree.plot([cx, cx, x], [cy, y, y], color="0.3", lw=1.2, zorder=1)
        ax_tree.text(x, y, f"merge\n$m$={st.m.item():.2f}  $\\ell$={st.l.item():.2f}", ha="center", va="center",
                     fontsize=8, bbox=box, zorder=2)
    for i, (x, y) in pos.items():
        st = leaf_states[i]
        a, b = pieces[i]
        light = tuple(0.6 + 0.4 * c for c in piece_colors[i])      # the piece's colour, lightened, opaque
        ax_tree.text(x, y, f"{names[i]}: keys {a}:{b}\n$m$={st.m.item():.2f}  $\\ell$={st.l.item():.2f}", ha="center",
                     va="center", fontsize=8, zorder=2, bbox=dict(boxstyle="round,pad=0.35", fc=light, ec="black", lw=0.8))
    top = max(y for (x, y), *_ in internal)
    ax_tree.annotate("finalize: $o = acc / \\ell$\n= softmax(s) v  (equal: "
                     f"{root_equals_direct})",
                     xy=(root_xy[0], top + 0.25), xytext=(root_xy[0], top + 0.9), ha="center", fontsize=9,
                     arrowprops=dict(arrowstyle="<-", color="black"))
    ax_tree.set_xlim(-0.8, n_pieces - 0.2)
    ax_tree.set_ylim(-0.6, top + 1.4)
    ax_tree.axis("off")
    ax_tree.set_title("a random merge tree of their states (one query row)", loc="left", fontsize=10)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def plot_error_vs_block_size(block_sizes, err32, err64, naive32, n_keys, name="02_error_vs_block_size.png"):
    """Relative error of blocked attention against block size, in float32 and float64."""
    fig, ax = plt.subplots(figsize=(9.4, 4.2))
    ax.loglog(block_sizes, err32, "o-", color="#C44E52", label="blocked, float32")
    ax.loglog(block_sizes, err64, "s-", color="#4C72B0", label="blocked, float64")
    ax.axhline(naive32, color="#C44E52", linestyle=":", label="naive (chapter 01), float32")
    for dtype in (torch.float32, torch.float64):
        eps = torch.finfo(dtype).eps
        ax.axhline(eps, color="0.5", linestyle="--", lw=0.8)
        ax.text(block_sizes[-1], eps / 1.5, f"{str(dtype)[6:]} machine epsilon", fontsize=8, color="0.4",
                ha="right", va="top")
    ax.set_xscale("log", base=2)
    ax.set_ylim(1e-17, 1e-5)
    ax.set_xlabel(f"block size (keys per step; {n_keys} keys in all)")
    ax.set_ylabel(r"relative error $\|O - O_{ref}\| / \|O_{ref}\|$")
    ax.set_title("Rounding error of blocked attention against block size", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    save_figure(fig, name)
    return fig
