"""Where the course's figures go: ``figures/`` at the top of the repository."""

from __future__ import annotations

from pathlib import Path

FIGURES_DIR = Path(__file__).resolve().parents[1] / "figures"


def save_figure(fig, name: str) -> Path:
    """Write ``fig`` to ``figures/<name>`` (PNG, no timestamp metadata) and return the path."""
    FIGURES_DIR.mkdir(exist_ok=True)
    path = FIGURES_DIR / name
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path
