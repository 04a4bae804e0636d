"""Figures of chapter 07 (the MTA layer and the toy task), so that the notebook's cells show the idea.

* :func:`plot_toy_runs`: training loss and held-out per-sequence error of toy runs, by arm (``mta.course.toy``'s JSON),
  beside the paper's errors;
* :func:`plot_attention_rows`: attention weights of one query over a lettered sequence, plain beside MTA;
* :func:`plot_layer_attention`: what the heads of each layer of trained models attend to from the target rows;
* :func:`plot_target_attention`: how much of that attention lands on the target block, per layer and head.

Every function takes numbers and returns the Figure; nothing is saved here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

ARM_COLORS = {"plain": "#4C72B0", "mta": "#DD8452"}
ARM_LABELS = {"plain": "plain attention", "mta": "MTA"}


def plot_toy_runs(results: dict, reference: dict | None = None):
    """Two panels from ``python -m mta.course.toy``'s results: training loss (target tokens) and held-out per-sequence
    error against the step, one line per (arm, seed). ``reference`` (arm -> error, e.g.
    ``mta.course.toy.PAPER_ERRORS``): dashed lines on the error panel, labelled as the paper's. Returns the Figure."""
    fig, (ax_loss, ax_err) = plt.subplots(1, 2, figsize=(11, 4))
    seen = set()
    for run in results["runs"]:
        arm = run["arm"]
        label = None if arm in seen else ARM_LABELS.get(arm, arm)
        seen.add(arm)
        color = ARM_COLORS.get(arm, "gray")
        ax_loss.plot(run["curve"]["step"], run["curve"]["loss"], color=color, alpha=0.7, linewidth=1, label=label)
        ax_err.plot(run["eval"]["step"], run["eval"]["error"], color=color, alpha=0.8, linewidth=1.3,
                    marker="o", markersize=2.5, label=label)
    for arm, error in (reference or {}).items():
        ax_err.axhline(error, color=ARM_COLORS.get(arm, "gray"), linestyle="--", linewidth=1,
                       label=f"{ARM_LABELS.get(arm, arm)}, the paper")
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss on the target block")
    ax_err.set_xlabel("step")
    ax_err.set_ylabel("held-out per-sequence error")
    ax_err.set_ylim(-0.02, 1.02)
    for ax in (ax_loss, ax_err):
        ax.grid(alpha=0.3)
        ax.legend()
    prov = results.get("provenance", {})
    fig.suptitle(f"find the block ({results.get('seq_len', '?')} tokens), seeds {results.get('seeds', [])}, "
                 f"on {prov.get('gpu', '?')}")
    fig.tight_layout()
    return fig


def plot_attention_rows(text: str, rows: dict, *, title: str = ""):
    """Bar charts of attention weights over the characters of ``text``: ``rows`` maps a label to a weight vector
    of ``len(text)`` (keys past the query are 0). Returns the Figure."""
    fig, axes = plt.subplots(len(rows), 1, figsize=(max(8, 0.32 * len(text)), 1.9 * len(rows)), sharex=True,
                             squeeze=False)
    x = np.arange(len(text))
    for ax, (label, weights) in zip(axes[:, 0], rows.items()):
        weights = np.asarray(weights, dtype=float)
        ax.bar(x, weights, color="#4C72B0")
        ax.set_ylabel("weight")
        ax.set_title(label, fontsize=10, loc="left")
        ax.set_ylim(0, max(0.05, weights.max() * 1.15))
        ax.grid(axis="y", alpha=0.3)
    axes[-1, 0].set_xticks(x)
    axes[-1, 0].set_xticklabels(list(text), fontfamily="monospace")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_layer_attention(text: str, maps: dict, rows: range, target: range, keys: range | None = None):
    """One row of panels per model, one panel per layer: the attention of the query rows ``rows`` (heads stacked)
    over the keys of ``text``, the target block's span ``target`` outlined. ``maps`` maps a label to that
    model's per-layer ``[H, N, N]`` probabilities of one sample (``mta.course.toy_model.attention_maps``).
    ``keys``: the key positions drawn (default all; a window around the target keeps a long sample's block
    readable). The key axis is labelled at the target block (its letters) and, when drawn, at the last ``#`` (with
    the query after it). Returns the Figure."""
    labels = list(maps)
    layers = len(maps[labels[0]])
    heads = maps[labels[0]][0].shape[0]
    keys = range(len(text)) if keys is None else keys
    fig, axes = plt.subplots(len(labels), layers, figsize=(3.4 * layers + 1, 0.8 + 0.3 * len(rows) * heads *
                             len(labels)), squeeze=False)
    hash_at = text.rfind("#")
    ticks = [((target.start + target.stop - 1) / 2, text[target.start:target.stop]),
             (hash_at, text[hash_at:len(text) - len(rows)])]
    ticks = [(x, label) for x, label in ticks if keys.start <= x < keys.stop]
    extent = (keys.start - 0.5, keys.stop - 0.5, len(rows) * heads - 0.5, -0.5)
    for i, label in enumerate(labels):
        for layer, probs in enumerate(maps[label]):
            probs = np.asarray(probs, dtype=float)
            image = np.concatenate([probs[h, rows.start:rows.stop, keys.start:keys.stop] for h in range(heads)],
                                   axis=0)
            ax = axes[i][layer]
            ax.imshow(image, aspect="auto", cmap="Greys", vmin=0, vmax=1, interpolation="nearest", extent=extent)
            for h in range(heads):
                ax.add_patch(plt.Rectangle((target.start - 0.5, h * len(rows) - 0.5), len(target), len(rows),
                                           fill=False, edgecolor=ARM_COLORS["mta"], linewidth=1.2))
                if h:
                    ax.axhline(h * len(rows) - 0.5, color="black", linewidth=0.6)
            ax.set_xticks([x for x, _ in ticks])
            ax.set_xticklabels([t for _, t in ticks], fontfamily="monospace", fontsize=7)
            ax.set_yticks([h * len(rows) for h in range(heads)])
            ax.set_yticklabels([f"head {h}" for h in range(heads)], fontsize=7)
            ax.set_title(f"{ARM_LABELS.get(label, label)}, layer {layer}", fontsize=9)
    fig.tight_layout()
    return fig


def plot_target_attention(shares: dict):
    """Two panels of bars, one bar per (layer, head) and model: the attention weight that the row of the last
    query letter (left) and the rows of the target's letters (right, their mean) put on the target block.
    ``shares`` maps a label to ``[layers, H, rows]`` (``mta.course.toy_model.attention_on_target``). Returns the
    Figure."""
    labels = list(shares)
    layers, heads, _ = shares[labels[0]].shape
    x = np.arange(layers * heads)
    width = 0.8 / len(labels)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
    panels = (("row of the last query letter (predicts the target's first letter)", lambda s: s[:, :, 0]),
              ("rows of the target's letters (mean)", lambda s: s[:, :, 1:].mean(-1)))
    for ax, (title, pick) in zip(axes, panels):
        for k, label in enumerate(labels):
            values = np.asarray(pick(shares[label]), dtype=float).reshape(-1)
            ax.bar(x + (k - (len(labels) - 1) / 2) * width, values, width, label=ARM_LABELS.get(label, label),
                   color=ARM_COLORS.get(label, "gray"))
        ax.set_xticks(x)
        ax.set_xticklabels([f"L{layer}H{h}" for layer in range(layers) for h in range(heads)])
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("attention weight on the target block")
    axes[0].legend()
    fig.tight_layout()
    return fig
