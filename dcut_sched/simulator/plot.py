"""Figures of simulator results (matplotlib, Agg backend), written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ..atomic import atomic_path

__all__ = ["plot_selection_curve", "plot_speedup"]


def _save(fig, path: str | os.PathLike) -> None:
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    with atomic_path(path, suffix=Path(path).suffix) as tmp:
        fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight")


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speedup(df: pd.DataFrame, path: str | os.PathLike, title: str | None = None) -> None:
    """Speedup over ``ar`` vs batch size, one line per policy, 1.0 marked; format by ``path``'s suffix.

    Args:
        df: a results frame of :func:`~.simulate.simulate` (one trace and curve).
        path: output file (``.png``, ``.svg``, ``.pdf``, ...).
        title: figure title (default: says closed/open loop, and "approximate" for step-indexed traces).
    """
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, rows in df.groupby("policy", sort=False):
        rows = rows.sort_values("batch_size")
        ax.plot(rows["batch_size"], rows["speedup_vs_ar"], marker="o", label=policy)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ar = 1.0")
    ax.set_xscale("log", base=2)
    sizes = sorted(df["batch_size"].unique())
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size" + (" (max, open loop)" if df.attrs.get("mode") == "open" else ""))
    ax.set_ylabel("speedup over autoregressive decoding")
    if title is None:
        title = f"{df.attrs.get('mode', 'closed')} loop speedup vs ar"
        if df.attrs.get("approximate"):
            title += " (approximate: step-indexed trace)"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    try:
        _save(fig, path)
    finally:
        plt.close(fig)


def plot_selection_curve(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """Accepted tokens per step vs verification budget, one line per policy."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, rows in df.groupby("policy", sort=False):
        ax.plot(rows["budget"], rows["accepted_tokens"], marker="o", label=policy)
    bs = int(df["batch_size"].iat[0])
    ax.set_xlabel("verification budget K (slots per step)")
    ax.set_ylabel("accepted tokens per step")
    title = f"selection curve at batch size {bs}"
    if bool(df["approximate"].any()):
        title += " (approximate: step-indexed trace)"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    try:
        _save(fig, path)
    finally:
        plt.close(fig)
