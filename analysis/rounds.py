"""The interleaved-rounds protocol the engine benchmarks share, so that noise cannot decide a 2 % floor.

A benchmark runs ``rounds`` rounds per (prompt set, batch size); each round runs every configuration
once, in an order rotated by one each round, the baseline (plain decoding) included in every round;
a throwaway run warms the process up first. Throughput is compared within a round (each run's
tokens/s over the same round's baseline or best reference), and the report gives the median over
rounds with its min-max spread. Pure pandas on the runs' rows; no engine is imported here.

Rows (one per run): ``prompt_set``, ``batch_size``, ``round``, ``config``, ``tokens_per_s`` and any
measurement columns (``cpu_share``, ``load_start``, ...).
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

__all__ = ["FLOOR", "floor_summary", "rotated", "summary_markdown"]

#: The goal: the adaptive policy keeps at least this share of the better reference in every cell.
FLOOR = 0.98


def rotated(configs: Sequence[str], round_index: int) -> list[str]:
    """``configs`` rotated left by ``round_index`` (round r starts with the r-th configuration)."""
    k = round_index % len(configs)
    return list(configs[k:]) + list(configs[:k])


def floor_summary(runs: pd.DataFrame, policy: str, references: Sequence[str], baseline: str) -> pd.DataFrame:
    """Per (prompt set, bs, config): median tokens/s and its spread over rounds, the median of the
    per-round ratio to ``baseline``, and for ``policy`` the median per-round ratio to the best of
    ``references`` (each round's max) and to every other configuration, with the floor verdict.

    Raises:
        ValueError: a round without the baseline or a reference.
    """
    out = []
    for (pset, bs), cell in runs.groupby(["prompt_set", "batch_size"], sort=True):
        by_round = cell.pivot_table(index="round", columns="config", values="tokens_per_s", aggfunc="first")
        missing = [c for c in (baseline, *references) if c not in by_round.columns or by_round[c].isna().any()]
        if missing:
            raise ValueError(f"{pset} bs {bs}: rounds without {missing}")
        best = by_round[list(references)].max(axis=1)
        for config in by_round.columns:
            tps = by_round[config].dropna()
            row = {"prompt_set": pset, "batch_size": int(bs), "config": config, "rounds": int(tps.size),
                   "tokens_per_s": float(tps.median()), "tokens_per_s_min": float(tps.min()),
                   "tokens_per_s_max": float(tps.max()),
                   "over_baseline": float((tps / by_round.loc[tps.index, baseline]).median())}
            if config == policy:
                ratio = tps / best.loc[tps.index]
                row.update(over_best_reference=float(ratio.median()), over_best_reference_min=float(ratio.min()),
                           over_best_reference_max=float(ratio.max()))
                worst = {c: float((tps / by_round.loc[tps.index, c]).median())
                         for c in by_round.columns if c != policy}
                row["worst_peer"] = min(worst, key=worst.get)
                row["over_worst_peer"] = worst[row["worst_peer"]]
                row["floor_met"] = bool(row["over_best_reference"] >= FLOOR and row["over_worst_peer"] >= FLOOR)
            out.append(row)
    return pd.DataFrame(out)


def summary_markdown(summary: pd.DataFrame, policy: str, references: Sequence[str], order: Sequence[str]) -> str:
    """Per prompt set: a (config x bs) table of median tokens/s with the min-max over rounds and the
    ratio to the baseline, then ``policy``'s row of ratios to the best reference and to its strongest
    rival, with the floor verdict per cell."""
    lines: list[str] = []
    for pset, g in summary.groupby("prompt_set", sort=False):
        bss = sorted(g.batch_size.unique())
        lines += [f"**{pset}** (decode tokens/s, median over rounds [min-max], x the round's baseline):", "",
                  "| config | " + " | ".join(f"bs {b}" for b in bss) + " |", "|---|" + "---:|" * len(bss)]
        for config in [c for c in order if c in set(g.config)]:
            cells = []
            for b in bss:
                h = g[(g.config == config) & (g.batch_size == b)]
                cells.append("" if h.empty else f"{h.iloc[0].tokens_per_s:.1f} [{h.iloc[0].tokens_per_s_min:.1f}-"
                                                 f"{h.iloc[0].tokens_per_s_max:.1f}] {h.iloc[0].over_baseline:.2f}x")
            lines.append(f"| `{config}` | " + " | ".join(cells) + " |")
        p = g[g.config == policy].set_index("batch_size")
        if not p.empty:
            lines.append(f"| `{policy}` / max({', '.join(references)}) | " + " | ".join(
                f"{p.loc[b, 'over_best_reference']:.3f} [{p.loc[b, 'over_best_reference_min']:.3f}-"
                f"{p.loc[b, 'over_best_reference_max']:.3f}]" if b in p.index else "" for b in bss) + " |")
            lines.append(f"| `{policy}` / strongest rival | " + " | ".join(
                f"{p.loc[b, 'over_worst_peer']:.3f} (`{p.loc[b, 'worst_peer']}`)" if b in p.index else "" for b in bss) + " |")
            lines.append(f"| floor >= {FLOOR} | " + " | ".join(
                ("met" if p.loc[b, "floor_met"] else "**missed**") if b in p.index else "" for b in bss) + " |")
        lines.append("")
    return "\n".join(lines)
