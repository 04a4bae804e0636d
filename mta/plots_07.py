"""Figures of chapter 07 (the MTA layer and the toy task), so that the notebook's cells show the idea.

* :func:`plot_toy_runs`: training loss and held-out per-sequence error of toy runs, by arm (``mta.toy``'s JSON);
* :func:`plot_attention_rows`: attention weights of one query over a lettered sequence, plain beside MTA;
* :func:`plot_layer_attention`: what the heads of each layer of trained models attend to from the target rows.

Every function takes numbers and returns the Figure; nothing is saved here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

ARM_COLORS = {"plain": "#4C72B0", "mta": "#DD8452"}
ARM_LABELS = {"plain": "plain attention", "mta": "MTA"}


def plot_toy_runs(results: dict):
    """Two panels from ``python -m mta.toy``'s results: training loss (target tokens) and held-out per-sequence
    error against the step, one line per (arm, seed). Returns the Figure."""
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


def plot_layer_attention(text: str, maps: dict, rows: range, target: range):
    """One row of panels per model, one panel per layer: the attention of the query rows ``rows`` (heads side by
    side) over the keys of ``text``, the target block's span ``target`` outlined. ``maps`` maps a label to that
    model's per-layer ``[H, N, N]`` probabilities of one sample (``mta.toy.attention_maps``). Returns the Figure."""
    labels = list(maps)
    layers = len(maps[labels[0]])
    fig, axes = plt.subplots(len(labels), layers, figsize=(3.2 * layers + 1, 0.5 + 0.28 * len(rows) *
                             maps[labels[0]][0].shape[0] * len(labels)), squeeze=False)
    for i, label in enumerate(labels):
        for layer, probs in enumerate(maps[label]):
            probs = np.asarray(probs, dtype=float)
            image = np.concatenate([probs[h, rows.start:rows.stop] for h in range(probs.shape[0])], axis=0)
            ax = axes[i][layer]
            ax.imshow(image, aspect="auto", cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
            for h in range(probs.shape[0]):
                ax.add_patch(plt.Rectangle((target.start - 0.5, h * len(rows) - 0.5), len(target), len(rows),
                                           fill=False, edgecolor=ARM_COLORS["mta"], linewidth=1.2))
            ax.set_xticks(range(len(text)))
            ax.set_xticklabels(list(text), fontfamily="monospace", fontsize=5)
            ax.set_yticks([h * len(rows) + (len(rows) - 1) / 2 for h in range(probs.shape[0])])
            ax.set_yticklabels([f"head {h}" for h in range(probs.shape[0])], fontsize=7)
            ax.set_title(f"{label}, layer {layer}", fontsize=9)
    fig.tight_layout()
    return fig
