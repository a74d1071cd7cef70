"""Figures of simulator results (matplotlib, Agg backend), written atomically."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pandas as pd

from ..cost_curve import CostCurve
from ..util.atomic import atomic_path

__all__ = ["describe_inputs", "plot_selection_curve", "plot_speedup"]


#: Metadata keys that would put a version or a date into the file: left out, so a rerun with the
#: same inputs writes the same bytes.
_NO_STAMP = {"png": {"Software": None}, "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
             "svg": {"Creator": None, "Date": None}}


def _save(fig, path: str | os.PathLike) -> None:
    import matplotlib

    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    with atomic_path(path, suffix=Path(path).suffix) as tmp, matplotlib.rc_context({"svg.hashsalt": "dcut-sched"}):
        fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight", metadata=_NO_STAMP.get(fmt))


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: Marker and line style per policy, so lines that lie on top of each other stay distinguishable.
POLICY_STYLES = {
    "ar": ("s", ":"), "full": ("o", "-"), "uniform": ("v", "-"), "threshold": ("^", "--"),
    "topk": ("D", "-."), "dcut": ("*", "-"), "fine": ("x", "--"), "oracle": ("P", ":"),
}

#: Legend labels that say what a policy is where its name alone misleads.
POLICY_LABELS = {"oracle": "oracle (knows the acceptance, always drafts)"}


def _style(policy: str, index: int) -> tuple[str, str, str]:
    """(marker, line style, colour): fixed per policy name, so both panels and all plots agree."""
    base = policy.split("(", 1)[0]
    names = list(POLICY_STYLES)
    slot = names.index(base) if base in names else len(names) + index
    marker, line = POLICY_STYLES.get(base, ("o", "-"))
    return marker, line, f"C{slot % 10}"


def _label(policy: str) -> str:
    return POLICY_LABELS.get(policy, policy)


def describe_inputs(df: pd.DataFrame) -> str:
    """``trace NAME, cost MODEL on DEVICE (BACKEND)`` for a results frame's trace and cost curve."""
    trace = df.attrs.get("trace") or (str(df["trace"].iat[0]) if "trace" in df and len(df) else "")
    cost = df.attrs.get("cost") or (str(df["cost"].iat[0]) if "cost" in df and len(df) else "")
    parts = [f"trace {Path(trace).stem}"] if trace else []
    if cost:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a label: the run itself already warned
                curve = CostCurve.load(cost, check_hardware=False)
            hw = curve.hardware
            parts.append(f"cost {curve.model.get('name', '?')} on {hw.get('device_name', '?')} "
                         f"({hw.get('backend', '?')})")
        except (OSError, ValueError):
            parts.append(f"cost {Path(cost).stem}")
    return ", ".join(parts)


def plot_speedup(df: pd.DataFrame, path: str | os.PathLike, title: str | None = None) -> None:
    """Speedup over ``ar`` vs batch size per policy, and each policy's difference to ``dcut``.

    The upper panel has one line per policy (its own marker and line style), 1.0 marked; when
    ``dcut`` is in the frame a lower panel shows ``speedup / dcut speedup - 1`` in percent (linear
    within +-10 %, logarithmic beyond), where policies within a few percent of each other separate. The format follows ``path``'s suffix.

    Args:
        df: a results frame of :func:`~.simulate.simulate` (one trace and curve).
        path: output file (``.png``, ``.svg``, ``.pdf``, ...).
        title: figure title (default: the mode, the trace, the cost curve's model and device, and
            "approximate" for step-indexed traces).
    """
    plt = _figure()
    has_dcut = "dcut" in set(df["policy"])
    if has_dcut:
        fig, (ax, dx) = plt.subplots(2, 1, figsize=(7.5, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    else:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        dx = None
    dcut = df[df["policy"] == "dcut"].set_index("batch_size")["speedup_vs_ar"] if has_dcut else None
    for i, (policy, rows) in enumerate(df.groupby("policy", sort=False)):
        rows = rows.sort_values("batch_size")
        marker, line, color = _style(policy, i)
        ax.plot(rows["batch_size"], rows["speedup_vs_ar"], marker=marker, linestyle=line, color=color,
                label=_label(policy), markersize=6, alpha=0.9)
        if dx is not None and policy not in ("ar", "dcut"):
            rel = 100.0 * (rows["speedup_vs_ar"].to_numpy() / dcut.reindex(rows["batch_size"]).to_numpy() - 1.0)
            dx.plot(rows["batch_size"], rel, marker=marker, linestyle=line, color=color, label=_label(policy),
                    markersize=6)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ar = 1.0")
    sizes = sorted(df["batch_size"].unique())
    open_loop = df.attrs.get("mode") == "open"
    bottom = dx if dx is not None else ax
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(sizes, [str(b) for b in sizes])
    bottom.set_xlabel("batch size" + (" (max, open loop)" if open_loop else ""))
    ax.set_ylabel("speedup over ar" + (" (ar TPOT / TPOT)" if open_loop else " (tokens/s ratio)"))
    if title is None:
        title = f"{df.attrs.get('mode', 'closed')} loop: speedup over ar"
        if df.attrs.get("approximate"):
            title += " (approximate: step-indexed trace)"
        inputs = describe_inputs(df)
        if inputs:
            title += "\n" + inputs
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: no line hidden
    if dx is not None:
        from matplotlib.ticker import FuncFormatter, SymmetricalLogLocator

        dx.axhline(0.0, color="black", linewidth=1)
        dx.set_yscale("symlog", linthresh=10.0)  # linear within +-10 %, logarithmic beyond
        dx.yaxis.set_major_locator(SymmetricalLogLocator(linthresh=10.0, base=10, subs=(1.0, 2.0, 5.0)))
        dx.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:+g}" if v else "0"))
        dx.set_ylabel("vs dcut, % (symlog)")
        dx.set_title("speedup relative to dcut (same markers)", fontsize=9)
        dx.grid(True, alpha=0.3)
    try:
        _save(fig, path)
    finally:
        plt.close(fig)


def plot_selection_curve(df: pd.DataFrame, path: str | os.PathLike, trace: str | os.PathLike | None = None) -> None:
    """Accepted tokens per step vs verification budget, one line per policy.

    Args:
        df: a frame of :func:`~.selection_curve.selection_curve`.
        path: output file (format by suffix).
        trace: the trace the curve was sampled from (named in the title).
    """
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (policy, rows) in enumerate(df.groupby("policy", sort=False)):
        marker, line, color = _style(policy, i)
        ax.plot(rows["budget"], rows["accepted_tokens"], marker=marker, linestyle=line, color=color, label=policy)
    bs = int(df["batch_size"].iat[0])
    ax.set_xlabel("verification budget K (slots per step)")
    ax.set_ylabel("accepted tokens per step")
    title = f"selection curve at batch size {bs}"
    if bool(df["approximate"].any()):
        title += " (approximate: step-indexed trace)"
    if trace is not None:
        title += f"\ntrace {Path(trace).stem}"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    try:
        _save(fig, path)
    finally:
        plt.close(fig)
