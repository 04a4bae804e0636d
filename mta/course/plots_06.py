"""Figures of chapter 06 (split-K decode) and its appendix 06b, so that the notebooks' cells show the idea, not the
matplotlib.

* :func:`plot_decode_roofline`: decode steps and a prefill point on a roofline;
* :func:`plot_programs_vs_sms`: the SMs a one-program-per-(batch, kv head) grid keeps busy, and with splits;
* :func:`plot_wave_efficiency`: wave efficiency against the number of splits, with the splits a rule picks;
* :func:`plot_mta_key_axis`: which keys of the new queries are far (split, with halos), band or future;
* :func:`plot_even_deal`: the key tiles of all units dealt out in equal runs (appendix 06b);
* :func:`prefill_grid_rows`: the prefill grid of section 2 read from the committed decode benchmark (a table,
  not a figure: the notebook prints it and ``tests/test_chapter06_facts.py`` checks what the chapter says of it).

Every plotting function takes numbers computed in the notebook and returns the Figure; nothing is saved here.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

BUSY, IDLE, BAND, FUTURE = "#4C72B0", "#E8E8E8", "#DD8452", "#BBBBBB"


def plot_decode_roofline(peak_flops: float, bandwidth: float, points: list[tuple[str, float]], *,
                         title: str = "Decode and prefill on the H100 roofline (bf16)"):
    """The roofline ``min(peak, I * bandwidth)`` with labelled points ``(label, intensity in FLOP/byte)``,
    each drawn on the roof. Returns the Figure."""
    ridge = peak_flops / bandwidth
    xs = np.logspace(-1, 4.5, 200)
    roof = np.minimum(peak_flops, xs * bandwidth) / 1e12
    fig, ax = plt.subplots(figsize=(8.0, 5.6))
    ax.loglog(xs, roof, "k-", linewidth=2, label="roofline (datasheet peaks)")
    ax.axvline(ridge, color="gray", linestyle=":", linewidth=1)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, 0.3), xytext=(4, 0), textcoords="offset points", color="gray")
    for index, (label, intensity) in enumerate(points):
        y = min(peak_flops, intensity * bandwidth) / 1e12
        ax.scatter([intensity], [y], s=55, zorder=3, color=f"C{index}", edgecolor="white", linewidth=0.5,
                   label=f"{label}: {intensity:.3g} FLOP/B, {y / (peak_flops / 1e12):.2%} of peak")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of HBM traffic)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_ylim(0.2, 3000)
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8.5, ncol=1, frameon=False)
    fig.tight_layout()
    return fig


def _sm_grid(ax, busy: int, sms: int, title: str, columns: int = 12):
    rows = math.ceil(sms / columns)
    grid = np.full(rows * columns, np.nan)
    grid[:sms] = 0.0
    grid[:min(busy, sms)] = 1.0
    ax.imshow(grid.reshape(rows, columns), cmap=ListedColormap([IDLE, BUSY]), vmin=0, vmax=1)
    ax.set_xticks(np.arange(-0.5, columns, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, rows, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    ax.set_title(title, fontsize=9)


def plot_programs_vs_sms(rows: list[dict], sms: int, grid_row: int = 0):
    """Left: the ``sms`` SMs, those with a program in the first wave coloured, for ``rows[grid_row]``.
    Right: for each row ``{"label", "programs", "split_programs"}``, the fraction of SM time doing work
    (the wave efficiency ``w / ceil(w)``, ``w = programs / sms``) with one program per (batch, kv head) and with
    the rule's splits. Returns the Figure."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 3.9), gridspec_kw={"width_ratios": [1, 2.1]})
    first = rows[grid_row]
    _sm_grid(left, first["programs"], sms, f"{first['label']}:\n{first['programs']} programs on {sms} SMs")
    labels = [r["label"] for r in rows]
    x = np.arange(len(rows))

    def efficiency(p):
        waves = p / sms
        return waves / math.ceil(waves)

    plain = [efficiency(r["programs"]) for r in rows]
    split = [efficiency(r["split_programs"]) for r in rows]
    right.bar(x - 0.2, plain, 0.4, color=IDLE, edgecolor="0.4", label="one program per (batch, kv head)")
    right.bar(x + 0.2, split, 0.4, color=BUSY, label="split-K: programs x the rule's splits")
    for xi, r, p, s in zip(x, rows, plain, split):
        right.annotate(f"{r['programs']}", (xi - 0.2, p), xytext=(0, 2), textcoords="offset points", ha="center",
                       fontsize=7.5)
        right.annotate(f"{r['split_programs']}", (xi + 0.2, s), xytext=(0, 2), textcoords="offset points",
                       ha="center", fontsize=7.5)
    right.set_xticks(x, labels, fontsize=8)
    right.set_ylim(0, 1.15)
    right.set_ylabel("wave efficiency")
    right.set_title(f"Busy fraction of {sms} SMs (numbers: programs launched)", fontsize=9)
    right.legend(fontsize=8, loc="upper left", ncol=2)
    right.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_wave_efficiency(curves: dict[str, tuple[list[int], list[float]]], chosen: dict[str, int], sms: int,
                         threshold: float):
    """Wave efficiency against splits, one line per ``{label: (splits, efficiencies)}`` with a dot at each split
    count given; the split each ``chosen[label]`` picks is circled. ``threshold``: the fraction of the best a pick
    must reach, drawn as text.
    Returns the Figure."""
    fig, ax = plt.subplots(figsize=(8.6, 3.9))
    for index, (label, (splits, eff)) in enumerate(curves.items()):
        color = f"C{index}"
        ax.plot(splits, eff, "-o", color=color, linewidth=1.2, markersize=2.5,
                label=f"{label}: picks {chosen[label]}")
        s = chosen[label]
        ax.scatter([s], [eff[splits.index(s)]], s=90, facecolor="none", edgecolor=color, linewidth=1.8, zorder=3)
    ax.set_xlabel("splits per (batch, kv head)")
    ax.set_ylabel("wave efficiency  $w / \\lceil w \\rceil$")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{sms} SMs: the smallest split count within {threshold:.0%} of the best (circled)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def plot_mta_key_axis(seq_len: int, n_new: int, cq: int, ck: int, bounds: list[tuple[int, int]]):
    """Rows: the ``n_new`` new queries; columns: keys ``0 .. seq_len - 1``. Each key is coloured by who computes
    its score: far keys (``i - j >= E``) by their split (``bounds``: ``[start, stop)`` per split), the band
    (``0 <= i - j < E``) in orange, the future in grey. Below, the keys each split reads, its halo included.
    Returns the Figure."""
    pk = (ck - 1) // 2
    E = cq - 1 + pk
    cmap = plt.get_cmap("Blues")
    image = np.ones((n_new, seq_len, 3))
    for t in range(n_new):
        i = seq_len - n_new + t
        for j in range(seq_len):
            if j > i:
                image[t, j] = plt.matplotlib.colors.to_rgb(FUTURE)
            elif i - j < E:
                image[t, j] = plt.matplotlib.colors.to_rgb(BAND)
            else:
                s = next(k for k, (a, b) in enumerate(bounds) if a <= j < b)
                image[t, j] = cmap(0.35 + 0.5 * s / max(len(bounds) - 1, 1))[:3]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 1.2 + 0.35 * (n_new + len(bounds))), sharex=True,
                                      gridspec_kw={"height_ratios": [n_new, len(bounds) + 0.5]})
    top.imshow(image, aspect="auto", interpolation="nearest", extent=(-0.5, seq_len - 0.5, n_new - 0.5, -0.5))
    top.set_yticks(range(n_new), [f"i = {seq_len - n_new + t}" for t in range(n_new)], fontsize=8)
    top.set_title(f"Keys of the {n_new} newest queries, kernel {cq}x{ck} ($E$ = {E}, $p_k$ = {pk}): "
                  f"far keys by split, band, future", fontsize=10)
    for s, (a, b) in enumerate(bounds):
        color = cmap(0.35 + 0.5 * s / max(len(bounds) - 1, 1))
        lo, hi = max(a - pk, 0), min(b - 1 + pk, seq_len - 1)
        bottom.plot([a - 0.5, b - 0.5], [s, s], color=color, linewidth=7, solid_capstyle="butt")
        bottom.plot([lo - 0.5, hi + 0.5], [s, s], color=color, linewidth=2)
        bottom.plot([lo - 0.5, hi + 0.5], [s, s], "|", color="black", markersize=9)
    bottom.set_ylim(len(bounds) - 0.5, -0.7)
    bottom.set_yticks(range(len(bounds)), [f"split {s}" for s in range(len(bounds))], fontsize=8)
    bottom.set_xlabel("key $j$ (thick: the split's keys; thin, to the bars: the keys it reads, halo included)")
    handles = [Patch(color=cmap(0.6), label="far: a split"), Patch(color=BAND, label="band (exact, one more split)"),
               Patch(color=FUTURE, label="future")]
    top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig




def plot_even_deal(units: int, tiles: int, per_program: int):
    """The even deal of plain decode (:func:`mta.decode.stream_programs`): ``units`` rows of ``tiles`` key tiles
    each, coloured by the program that streams them (runs of ``per_program`` tiles of the flattened list, which
    cross from one unit into the next), each tile labelled with its program. Returns the Figure."""
    owner = np.arange(units * tiles).reshape(units, tiles) // per_program
    programs = int(owner.max()) + 1
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * tiles, 0.9 + 0.45 * units))
    ax.imshow(owner, cmap=ListedColormap(plt.get_cmap("tab10").colors[:programs]), aspect="auto",
              vmin=-0.5, vmax=programs - 0.5)
    for (u, t), g in np.ndenumerate(owner):
        ax.text(t, u, f"p{g}", ha="center", va="center", fontsize=8, color="white")
    ax.set_xticks(range(tiles), [str(t) for t in range(tiles)], fontsize=8)
    ax.set_yticks(range(units), [f"unit {u}" for u in range(units)], fontsize=8)
    ax.set_xlabel("key tile of the unit's cache")
    ax.set_title(f"{units} units x {tiles} tiles dealt to {programs} programs, {per_program} tiles each", fontsize=9)
    fig.tight_layout()
    return fig


__all__ = ["plot_decode_roofline", "plot_even_deal", "plot_mta_key_axis", "plot_programs_vs_sms",
           "plot_wave_efficiency"]


def prefill_grid_rows(bench: dict, flash_bench: dict | None, sms: int) -> dict[tuple[int, int, int, int], dict]:
    """``mta.flash_attention`` run as a decoder (``impl == "mta_flash"``) at the longest cache of ``bench`` (the
    results of ``python -m mta.bench decode``), keyed by ``(B, Hq, Hkv, d)``: its ``programs`` (one per query head,
    the prefill tile of ``block_m`` rows from :mod:`mta.tuning`), the ``waves`` they take on ``sms`` SMs, its time
    ``us`` and the decoder's ``decoder_us`` there, ``per_sm``: the TFLOP/s of all ``block_m`` rows' products per
    busy SM, and ``at_prefill``: the best bf16 forward rate per SM of chapter 03's benchmark (``flash_bench``,
    ``None`` without it) at that head dim."""
    import torch

    from ..launch import head_dim_block
    from ..tuning import config_for

    longest = max(r["seq_len"] for r in bench["results"])
    at = {(r["impl"], r["batch"], r["heads"], r["kv_heads"], r["head_dim"]): r
          for r in bench["results"] if r["seq_len"] == longest}
    rows = {}
    for (impl, B, Hq, Hkv, d), r in sorted(at.items()):
        if impl != "mta_flash" or not r.get("us"):
            continue
        block_m = config_for("flash_forward", head_dim_block(d), torch.bfloat16, True, family="hopper",
                             n=longest)["BLOCK_M"]
        programs = math.ceil(1 / block_m) * B * Hq                 # the flash launcher's grid for one new query
        waves = math.ceil(programs / sms)
        rates = [x["fwd_tflops"] for x in (flash_bench or {"results": []})["results"]
                 if x["impl"] == "mta" and x["head_dim"] == d and x["dtype"] == "bfloat16" and x.get("fwd_tflops")]
        rows[(B, Hq, Hkv, d)] = {
            "seq_len": longest, "block_m": block_m, "programs": programs, "waves": waves, "us": r["us"],
            "decoder_us": at[("mta_decode", B, Hq, Hkv, d)]["us"],
            "per_sm": 4 * block_m * longest * d / (r["us"] / waves * 1e-6) / 1e12,
            "at_prefill": max(rates) / sms if rates else None}
    return rows
