"""What every benchmark plot shares: matplotlib without a display, and how a figure is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DPI = 120  # the benchmark PNGs' resolution


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (imported on first use: most commands draw nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    """`fig` laid out (within `rect` of the figure, leaving the rest to a legend), written to `path` and closed."""
    fig.tight_layout(rect=rect)
    path = Path(path)
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path
