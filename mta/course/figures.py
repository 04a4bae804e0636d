"""Where the course's figures go: ``figures/`` at the top of the repository."""

from __future__ import annotations

from pathlib import Path

FIGURES_DIR = Path(__file__).resolve().parents[2] / "figures"


def save_figure(fig, name: str) -> Path:
    """Write ``fig`` to ``figures/<name>`` (PNG, no timestamp metadata) and return the path."""
    FIGURES_DIR.mkdir(exist_ok=True)
    path = FIGURES_DIR / name
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path


def tile_grid_axes(ax, n: int) -> None:
    """Axes for an ``n x n`` grid of tiles drawn as unit squares: query tile ``I`` down, key tile ``J`` across."""
    ax.set_xlim(0, n)
    ax.set_ylim(n, 0)
    ax.set_aspect("equal")
    ax.set_xticks([x + 0.5 for x in range(n)], range(n))
    ax.set_yticks([x + 0.5 for x in range(n)], range(n))
    ax.set_xlabel("key tile $J$")
    ax.set_ylabel("query tile $I$")
