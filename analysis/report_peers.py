"""Report section: the published peer policies next to ``fine`` (and ``dcut``), speedup over ``ar`` at bs 1..64.

Two families, closed loop (the published benchmark), every peer of ``dcut_sched.policies.PEERS`` with its
default (published) parameters plus the references ``dcut`` and ``fine``:

- ``h20``: the five DFlash-like presets (``dcut_sched/data/traces/dflash-qwen3-8b-*-b16.parquet``) on the published
  H20 / Qwen3-8B curve, bs 1, 2, 4, 8, 16, 32, 64;
- ``cpu``: the two real SmolLM2-135M B=16 traces on their own measured CPU curve, bs 1, 2, 4, 8, 16
  (the CPU curve is measured at bs 1..16).

A family's cell is the arithmetic **mean** over its traces of ``speedup_vs_ar`` (as the
published protocol: the mean over the five DFlash presets); the table adds the best peer per batch size and ``fine`` / best
peer. :func:`peer_wins` lists every (family, bs) where a peer beats ``fine``, with the budget and
drafting figures that explain it.

Standalone (writes ``analysis/results/peers.csv``, ``analysis/results/peers.md`` and
``analysis/figures/peers.png``; ``make_report.py`` runs the same functions for its section 6):

    PYTHONPATH=. python analysis/report_peers.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dcut_sched as d  # noqa: E402
from dcut_sched.policies import PEERS  # noqa: E402

__all__ = ["PEER_FAMILIES", "PeerFamily", "REFERENCES", "peer_wins", "peers_commentary", "peers_markdown",
           "peers_table", "plot_peers", "run_peers"]

REFERENCES = ("dcut", "fine")


@dataclass(frozen=True)
class PeerFamily:
    """Traces simulated together on one cost curve for the peers section."""

    key: str
    title: str
    traces: Sequence[str]
    cost: str
    batch_sizes: Sequence[int]


PEER_FAMILIES = (
    PeerFamily("h20", "DFlash-like presets (5 datasets) on the published H20 Qwen3-8B curve",
               tuple(f"dcut_sched/data/traces/dflash-qwen3-8b-{n}-b16.parquet" for n in ("gsm8k", "math500", "humaneval", "mbpp",
                                                                          "mt-bench")),
               "dcut_sched/profiler/profiles/h20-qwen3-8b-published.json", (1, 2, 4, 8, 16, 32, 64)),
    PeerFamily("cpu", "real SmolLM2-135M traces (B=16) on their own measured CPU curve",
               ("dcut_sched/data/traces/smollm2-135m-skip14-15-b16.parquet", "dcut_sched/data/traces/smollm2-135m-skip21-22-b16.parquet"),
               "dcut_sched/profiler/profiles/cpu-smollm2-135m-b16.json", (1, 2, 4, 8, 16)),
)


#: Ablations run beside the peers (not counted as peers): vLLM's rule without its one-step lag, and
#: ``fine`` with a longer averaging window for its pause decision (see peers_commentary).
LAG_ABLATION = ("vllm_adaptive", {"lag_steps": 0})
LAG_ABLATION_LABEL = "vllm_adaptive(lag_steps=0)"
FINE_ABLATION = ("fine", {"ema_decay": 0.95})
FINE_ABLATION_LABEL = "fine(ema_decay=0.95)"


def policies_run() -> list:
    """``ar`` (the baseline), the references, the peers in registry order, then the ablations."""
    return ["ar", *REFERENCES, *PEERS, LAG_ABLATION, FINE_ABLATION]


def _policy_arg(spec) -> str:
    return spec if isinstance(spec, str) else spec[0]


def run_peers(
    families: Sequence[PeerFamily] = PEER_FAMILIES, *, num_steps: int, warmup_steps: int, seed: int,
    on_run: Callable[[int, int, str], None] | None = None,
) -> pd.DataFrame:
    """Simulate every trace of every family under :func:`policies_run`; returns the ``simulate`` rows
    with ``family``, ``trace_name`` and ``cost_name`` columns."""
    parts = []
    for fam in families:
        for path in fam.traces:
            df = d.simulate(path, fam.cost, policies=policies_run(), batch_sizes=list(fam.batch_sizes),
                            num_steps=num_steps, warmup_steps=warmup_steps, seed=seed, on_run=on_run)
            df.insert(0, "cost_name", Path(str(fam.cost)).stem)
            df.insert(0, "trace_name", Path(str(path)).stem)
            df.insert(0, "family", fam.key)
            parts.append(df)
    return pd.concat(parts, ignore_index=True)


def _means(df: pd.DataFrame, column: str = "speedup_vs_ar") -> pd.DataFrame:
    """policy x batch size of the mean of ``column`` over the traces of one family (policy order kept)."""
    order = list(dict.fromkeys(df["policy"]))
    table = df.groupby(["policy", "batch_size"], sort=False)[column].mean().unstack("batch_size")
    return table.loc[order, sorted(table.columns)]


def peers_table(df: pd.DataFrame) -> pd.DataFrame:
    """The peers table of one family: mean speedup per policy and bs, then ``best peer`` and ``fine / best peer``.

    Args:
        df: the :func:`run_peers` rows of one family.

    Returns:
        A frame indexed by policy name plus the rows ``best peer`` (its name) and ``fine / best peer``
        (a ratio; > 1: ``fine`` is ahead), one column per batch size (object dtype: names and numbers).
    """
    table = _means(df)
    peers = table.loc[[p for p in table.index if p in PEERS]]
    best = peers.idxmax(axis=0)
    ratio = table.loc["fine"] / peers.max(axis=0)
    out = table.astype(object)
    out.loc["best peer"] = best
    out.loc["fine / best peer"] = ratio
    return out


def peer_wins(df: pd.DataFrame, *, margin: float = 0.0) -> pd.DataFrame:
    """Every (family, bs, peer) whose mean speedup beats ``fine``'s by more than ``margin`` (relative).

    Returns columns ``family, batch_size, peer, peer_speedup, fine_speedup, gain`` (peer / fine - 1) and,
    mean over traces, each side's ``verified_tokens_per_step``, ``mean_tokens_per_step`` and
    ``draft_frac`` (``_peer`` / ``_fine`` suffixes): how much each verified, produced, and drafted.
    """
    rows = []
    cols = ("speedup_vs_ar", "verified_tokens_per_step", "mean_tokens_per_step", "draft_frac")
    for fam, part in df.groupby("family", sort=False):
        means = part.groupby(["policy", "batch_size"], sort=False)[list(cols)].mean()
        for bs in sorted(part["batch_size"].unique()):
            fine = means.loc[("fine", bs)]
            for peer in PEERS:
                if (peer, bs) not in means.index:
                    continue
                p = means.loc[(peer, bs)]
                gain = p["speedup_vs_ar"] / fine["speedup_vs_ar"] - 1.0
                if gain > margin:
                    rows.append({"family": fam, "batch_size": int(bs), "peer": peer,
                                 "peer_speedup": p["speedup_vs_ar"], "fine_speedup": fine["speedup_vs_ar"],
                                 "gain": gain,
                                 **{f"{c}_peer": p[c] for c in cols[1:]}, **{f"{c}_fine": fine[c] for c in cols[1:]}})
    return pd.DataFrame(rows, columns=["family", "batch_size", "peer", "peer_speedup", "fine_speedup", "gain",
                                       *[f"{c}_{s}" for s in ("peer", "fine") for c in cols[1:]]])


def plot_peers(df: pd.DataFrame, path: str | os.PathLike, families: Sequence[PeerFamily] = PEER_FAMILIES) -> None:
    """One panel per family: mean speedup over ``ar`` vs batch size, one line per policy (references bold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [f for f in families if f.key in set(df["family"])]
    fig, axes = plt.subplots(1, len(present), figsize=(6.5 * len(present), 4.6), squeeze=False)
    for ax, fam in zip(axes[0], present):
        table = _means(df[df["family"] == fam.key])
        for policy, row in table.iterrows():
            if policy == "ar":
                continue
            ref = policy in REFERENCES
            ax.plot(row.index, row.values, marker="o", linewidth=2.6 if ref else 1.4,
                    linestyle="-" if ref else "--", label=policy)
        ax.axhline(1.0, color="black", linestyle=":", linewidth=1, label="ar = 1.0")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(table.columns), [str(b) for b in table.columns])
        ax.set_xlabel("batch size (closed loop)")
        ax.set_ylabel("speedup over ar (mean over traces)")
        ax.set_title(fam.title, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp{Path(path).suffix}")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


def _fmt(table: pd.DataFrame) -> str:
    def cell(v):
        return v if isinstance(v, str) else f"{v:.2f}"

    head = "| policy | " + " | ".join(f"bs {c}" for c in table.columns) + " |"
    sep = "|---|" + "---:|" * len(table.columns)
    body = []
    for name, row in table.iterrows():
        label = f"**{name}**" if name in ("fine", "fine / best peer") else f"`{name}`" if name not in (
            "best peer",) else name
        body.append(f"| {label} | " + " | ".join(cell(v) for v in row.values) + " |")
    return "\n".join([head, sep, *body])


def peers_markdown(df: pd.DataFrame, families: Sequence[PeerFamily] = PEER_FAMILIES, *,
                   figure: str = "figures/peers.png", commentary: str = "") -> str:
    """The peers section: one table per family, the plot, the commands, where a peer beats ``fine``."""
    out = []
    w = out.append
    w("Each published alternative to D-Cut, implemented from its own paper or pull request with the parameters "
      "it publishes (sources, rules and what each needs from the engine: [docs/policies.md](../docs/policies.md)); "
      "`dcut` and `fine` for reference. Cells: speedup over `ar`, **mean** over the family's traces; "
      "`best peer` = the fastest of the five at that batch size; `fine / best peer` > 1 means `fine` is ahead. "
      "Lags are simulated as online: `vllm_adaptive` applies lengths decided on the previous step's confidences, "
      "`dspark` sizes its budget from an average of earlier steps, `smartspec` learns its acceptance rate from the "
      "outcomes the simulator feeds back. Rows per trace: `analysis/results/peers.csv`.\n")
    for fam in families:
        part = df[df["family"] == fam.key]
        if part.empty:
            continue
        w(f"### {fam.title}\n")
        w(_fmt(peers_table(part)) + "\n")
        bs = ",".join(str(b) for b in fam.batch_sizes)
        pols = ",".join(dict.fromkeys(_policy_arg(p) for p in policies_run()))
        w("```\n" + "\n".join(f"dcut-sim --trace {t} --cost {fam.cost} --policies {pols} --batch-sizes {bs}"
                              for t in fam.traces) + "\n```\n")
        w(f"(Ablation rows: `{LAG_ABLATION_LABEL}` is the same rule deciding on the current confidences, "
          f"`{FINE_ABLATION_LABEL}` is `fine` averaging its pause decision over about 20 steps instead of 5; "
          f"`dcut_sched.simulate(..., policies=[{LAG_ABLATION!r}, {FINE_ABLATION!r}])`, since `dcut-sim "
          f"--param` sets one value per policy name per run.)\n")
        table = _means(part)
        if LAG_ABLATION_LABEL in table.index:
            cost = 1.0 - table.loc["vllm_adaptive"] / table.loc[LAG_ABLATION_LABEL]
            w(f"Cost of `vllm_adaptive`'s one-step lag here: {100 * cost.min():.0f} to {100 * cost.max():.0f} % of "
              f"its speedup (how much a request's next drafts resemble its last ones decides it).\n")
    w(f"![peers]({figure})\n")
    wins = peer_wins(df)
    w("#### Where a peer beats `fine`\n")
    if wins.empty:
        w("Nowhere: at every batch size of both families `fine` is at least as fast as every peer.\n")
    else:
        w("| family | bs | peer | peer | fine | gain | verified/req-step peer / fine | tokens/req-step peer / fine "
          "| drafted steps peer / fine |\n|---|---:|---|---:|---:|---:|---:|---:|---:|")
        for r in wins.itertuples():
            w(f"| {r.family} | {r.batch_size} | `{r.peer}` | {r.peer_speedup:.3f} | {r.fine_speedup:.3f} | "
              f"{100 * r.gain:+.1f} % | {r.verified_tokens_per_step_peer:.2f} / {r.verified_tokens_per_step_fine:.2f} | "
              f"{r.mean_tokens_per_step_peer:.2f} / {r.mean_tokens_per_step_fine:.2f} | "
              f"{100 * r.draft_frac_peer:.0f} % / {100 * r.draft_frac_fine:.0f} % |")
        w("")
    if commentary:
        w(commentary)
    return "\n".join(out)


def _plain_step_ms(fam: PeerFamily, bs: int) -> tuple[float, float]:
    """(``C_ar(bs)`` the policies price a plain step at, the plain-step ms the simulator charges)."""
    import warnings

    from dcut_sched.step_costs import StepCosts

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost = d.CostCurve.load(fam.cost, check_hardware=False)
        return cost.ar_ms(bs), StepCosts(cost, cost.block_size).plain_ms(bs)


def peers_commentary(df: pd.DataFrame, families: Sequence[PeerFamily] = PEER_FAMILIES) -> str:
    """Why each peer that beats ``fine`` does, read off the run figures (one bullet per family and cause)."""
    wins = peer_wins(df)
    if wins.empty:
        return ""
    by_key = {f.key: f for f in families}
    out = ["Why:\n"]
    for fam_key, part in wins.groupby("family", sort=False):
        fam = by_key[fam_key]
        skipped = part[part["draft_frac_fine"] < part["draft_frac_peer"] - 0.01]
        if not skipped.empty:
            cells = []
            for bs, rows in skipped.groupby("batch_size"):
                ar_ms, plain_ms = _plain_step_ms(fam, int(bs))
                cells.append(f"bs {bs}: `fine` drafted {100 * rows['draft_frac_fine'].iat[0]:.0f} % of steps, "
                             f"plain step priced {ar_ms:.1f} ms (C_ar), charged {plain_ms:.1f} ms")
            agree = all(abs(a - b) <= 1e-6 * max(a, b) for a, b in
                        (_plain_step_ms(fam, int(bs)) for bs in skipped["batch_size"].unique()))
            ablation = _means(df[df["family"] == fam_key])
            fixed = ""
            if FINE_ABLATION_LABEL in ablation.index:
                fixed = "; " + ", ".join(
                    f"bs {bs}: `{FINE_ABLATION_LABEL}` {ablation.loc[FINE_ABLATION_LABEL, bs]:.3f} against "
                    f"`fine` {ablation.loc['fine', bs]:.3f}" for bs in sorted(skipped["batch_size"].unique()))
            cause = ("the plain-step price and the charge agree, so the loss is the pause decision itself: `fine` "
                     "pauses when an EMA of its per-step expected rate (weight 0.8 on the history, about 5 steps) "
                     "falls below plain decoding, and a pause commits it to plain steps until the next probe. At a "
                     "small batch a step averages few requests, so a short hard stretch of one request is enough "
                     "to pause although drafting pays on average (the peers here never pause)" + fixed +
                     ". The idea `fine` can take (no special case): average the pause decision over a fixed number "
                     "of request-steps rather than steps (history weight exp(-bs / N) per step, N about 64), so a "
                     "pause needs the same evidence at every batch size" if agree else
                     "`fine`'s skip rule prices a plain step with the curve's measured plain-decode step C_ar(bs) "
                     "while this simulator charges a plain step C_verify(bs, bs): the two disagree, so the plain "
                     "steps `fine` chose cost more than it expected; the peers never skip the draft (`smartspec` "
                     "skips and is priced the same way). This is a cost-accounting mismatch, not an idea "
                     "`fine` lacks: it disappears once the simulator charges plain steps at C_ar(bs)")
            out.append(f"- **{fam.title}**, " + "; ".join(cells) + f". Cause: {cause}.\n")
        rest = part[~part.index.isin(skipped.index)]
        paused = rest[(rest["peer"] == "smartspec") & (rest["draft_frac_peer"] < 0.01)]
        if not paused.empty:
            cells = ", ".join(f"bs {r.batch_size} {100 * r.gain:+.1f} %" for r in paused.itertuples())
            out.append(f"- **{fam.title}** ({cells}): drafting never pays here, and both policies decode plainly. "
                       f"`smartspec` stopped drafting after its first step and, at a fixed batch size, never "
                       f"measures again; `fine` drafts a probe after a stretch of plain steps (exponential back-off "
                       f"from 16 to 1024 plain steps) to notice if acceptance has improved, and each probe costs a "
                       f"full drafted step. The gap is that probing, counted over a run whose back-off is still "
                       f"ramping up (in a long run it tends to one drafted step per 1024 plain ones). Not an idea "
                       f"`fine` lacks: `smartspec` cannot notice when drafting starts to pay at the same batch "
                       f"size. What `fine` could take from it: predict a paused draft's payoff from the last "
                       f"measured acceptance and the cost curve, and space probes by how far that prediction is "
                       f"from paying (a probe that needs acceptance to quadruple can wait longer than one that "
                       f"needs 5 %).\n")
        for r in rest[~rest.index.isin(paused.index)].itertuples():
            out.append(f"- **{fam.title}**, bs {r.batch_size}: `{r.peer}` verified "
                       f"{r.verified_tokens_per_step_peer:.2f} slots per request-step against `fine`'s "
                       f"{r.verified_tokens_per_step_fine:.2f} and produced {r.mean_tokens_per_step_peer:.2f} "
                       f"tokens against {r.mean_tokens_per_step_fine:.2f} (+{100 * r.gain:.1f} %).\n")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500, help="simulated steps per run (default 1500)")
    ap.add_argument("--warmup", type=int, default=200, help="warm-up steps left out (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the request order (default 0)")
    ap.add_argument("--out-dir", default=str(ROOT / "analysis"), help="report folder (default: analysis/)")
    args = ap.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        ap.error(f"need 0 <= --warmup ({args.warmup}) < --steps ({args.steps})")
    from dcut_sched.util.atomic import atomic_write_text

    os.chdir(ROOT)
    start = time.perf_counter()
    df = run_peers(num_steps=args.steps, warmup_steps=args.warmup, seed=args.seed)
    out = Path(args.out_dir)
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results" / "peers.csv", df.to_csv(index=False, float_format="%.6g"))
    plot_peers(df, out / "figures" / "peers.png")
    atomic_write_text(out / "results" / "peers.md", peers_markdown(df, figure="../figures/peers.png",
                                                                   commentary=peers_commentary(df)))
    print(f"peers: {len(df)} runs in {time.perf_counter() - start:.0f} s; wrote {out / 'results' / 'peers.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
