"""Matplotlib set-up shared by the report's figures: the Agg backend and atomic PNG writes."""

from __future__ import annotations

import os
from pathlib import Path

from dcut_sched.util.atomic import atomic_path

__all__ = ["figure_module", "save_figure"]


def figure_module():
    """``matplotlib.pyplot`` with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> None:
    """Write ``fig`` atomically (format from the suffix) and close it."""
    plt = figure_module()
    try:
        fmt = Path(path).suffix.lstrip(".").lower() or "png"
        with atomic_path(path, suffix=Path(path).suffix) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    finally:
        plt.close(fig)
