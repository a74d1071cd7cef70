"""Markdown of the results report: tables from the report's DataFrames, figures, commands, commentary.

Tables go through ``pandas.DataFrame.to_markdown`` (tabulate). The commentary quotes figures
computed here from the results, so a regenerated report states its own numbers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from report_speedup import family_table
from scipy.stats import gmean

__all__ = ["render_report", "speedup_markdown"]

SIM = "dcut-sim"


def _md(df: pd.DataFrame, floatfmt: str = ".2f", index: bool = True) -> str:
    return df.to_markdown(index=index, floatfmt=floatfmt)


def speedup_markdown(table: pd.DataFrame, exclude_best: tuple = ("oracle",)) -> str:
    """A paper-style speedup table (policies x batch sizes + geomean) in Markdown, cells ``1.23x``,
    the best non-``oracle`` policy of each column in bold."""
    cells = table.copy().astype(object)
    for col in table.columns:
        values = table[col].drop([p for p in exclude_best if p in table.index], errors="ignore")
        best = values.max()
        for pol in table.index:
            v = table.at[pol, col]
            text = "" if pd.isna(v) else f"{v:.2f}x"
            cells.at[pol, col] = f"**{text}**" if (pol in values.index and v == best) else text
    cells.columns = [f"bs {c}" if isinstance(c, (int, np.integer)) else str(c) for c in table.columns]
    cells.index.name = "policy"
    return cells.to_markdown()


def _cmd_family(fam) -> str:
    pols = f" --policies {','.join(fam.policies)}" if getattr(fam, "policies", None) else ""
    lines = [f"{SIM} --trace {t} --cost {fam.cost}{pols} --batch-sizes {','.join(map(str, fam.batch_sizes))}"
             for t in fam.traces]
    return "```\n" + "\n".join(lines) + "\n```"


def _best(table: pd.DataFrame, col, exclude=("oracle", "ar")) -> tuple[str, float]:
    values = table[col].drop([p for p in exclude if p in table.index], errors="ignore")
    return str(values.idxmax()), float(values.max())


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


VLLM_INTRO = (
    "`analysis/bench_vllm.py` runs vLLM 0.32.0 (CPU, fp32, eager) without speculation and with the D-Cut plugin "
    "(`full`, `dcut`, `fine`; SmolLM2-135M target, its skip-14-15 draft, B = 8) at bs 1..16, profiles the cost "
    "curve in vLLM (`dcut-profile --vllm`: its own forward on dummy batches, and real engine steps on held-out "
    "prompts for the draft pass and the per-step engine overhead of plain, drafted and undrafted steps), records a "
    "step-indexed trace in vLLM (the `full` runs), and replays each wave with the simulator at the same batch "
    "sizes; the error is on decode tokens/s, the prefill step being outside the model (docs/vllm.md). Files: "
    "`analysis/results/vllm/`.\n")


VLLM_DFLASH = """### The same benchmark over the DFlash drafter, the floor in rounds, and signed overhead rows

- `python analysis/bench_vllm.py --drafter dflash --peers topk,threshold` runs it over the shipped
  DFlash block drafter (vLLM `dflash`), with the peers `topk` and `threshold`: results in
  `analysis/results/vllm-dflash/` (`bench_vllm.md` holds the table; first drafter, former host); the
  simulator's median |error| there is 12.4 %, each cell over 10 % explained in docs/vllm.md ("DFlash
  in real vLLM").
- `python analysis/bench_vllm.py --drafter dflash --stage rounds` is the floor benchmark: interleaved
  rounds with vLLM's own peers (fixed K, Dynamic SD) on two prompt sets
  (`analysis/results/vllm-dflash/bench_vllm_rounds.md`; read with docs/vllm.md, "The floor, in rounds").
- `python analysis/vllm_signed_rows.py` rebuilds the committed layer-skip curve's `step_overhead`
  rows from the same recorded engine steps with signed residuals and one drafted row per K bucket,
  and re-predicts the same measured runs (no vLLM run): median |error| 4.0 % -> 3.7 %, cells over
  10 %: 5 -> 3 (`analysis/results/vllm/signed_rows.md`).
"""


def render_report(results: dict, families: list, settings, *, fidelity: str | None, peers: str | None = None,
                  vllm: str | None = None, sampling: str | None = None) -> str:
    """The whole ``analysis/README.md`` (a function of the results only: no run time or date in it;
    ``peers``: the Markdown of report_peers' section, if computed; ``vllm``: analysis/bench_vllm.py's
    Markdown, if written; ``sampling``: analysis/sampling_report.py's Markdown, if written)."""
    from report_commentary import commentary

    c = commentary(results, families, settings)
    speed = results["speedup"]
    out = []
    w = out.append
    w("# Results report\n")
    w("Regenerate everything below (tables, `analysis/figures/*.png`, `analysis/results/*.csv`) from the "
      "shipped traces and cost curves with one command (seeded, so a rerun rewrites the same files; it "
      "prints its own run time; progress bar on stderr):\n")
    w("```\nPYTHONPATH=. python analysis/make_report.py      # or: python analysis/make_report.py after pip install -e .[analysis]\n```\n")
    w(f"Settings: closed loop, {settings.num_steps} steps per run, first {settings.warmup_steps} left out "
      f"(warm-up), seed {settings.seed}; the policies of docs/design.md §2 (section 6: the published peers) with their default parameters. "
      "Each section names the equivalent `dcut-sim` command.\n")
    w(c["summary"])
    if "reproduce" in results:
        from report_reproduce import render_section

        w(render_section(results["reproduce"], number="0"))

    # ---------------------------------------------------------------- speedup
    w("## 1. Speedup vs batch size\n")
    w("Cells: output tokens/s of the policy over `ar` (plain autoregressive decoding) at the same batch size; "
      "**bold** = best non-oracle policy of the column (`oracle` knows the acceptance lengths and verifies "
      "exactly the accepted prefix, but always drafts: not a policy one can deploy, and not an upper bound where "
      "drafting loses to a plain step). Family tables pool their traces by geometric mean; `geomean` = over batch "
      "sizes. Per-trace rows: `analysis/results/speedup.csv`.\n")
    for fam in families:
        rows = speed[speed["family"] == fam.key]
        w(f"### {fam.title}\n")
        w(f"*{fam.note}.*\n")
        w(speedup_markdown(family_table(rows)) + "\n")
        if len(fam.traces) > 1:
            per = (rows.groupby(["trace_name", "policy"], sort=False)["speedup_vs_ar"].agg(gmean)
                   .unstack("trace_name"))
            per = per[list(dict.fromkeys(rows["trace_name"]))]
            w("Geometric mean over batch sizes, per trace:\n")
            w(_md(per) + "\n")
        w(f"![speedup {fam.key}](figures/speedup-{fam.key}.png)\n")
        w("Command (one table per trace):\n")
        w(_cmd_family(fam) + "\n")
        w(c.get(f"speedup-{fam.key}", ""))

    # ---------------------------------------------------------------- selection
    sel = results["selection"]
    w("## 2. Selection curve: accepted tokens vs verification budget\n")
    w("Tokens produced per batch step (accepted drafts + one bonus token per request) when the batch verifies K "
      "slots in total, bs = 32, B = 16, averaged over sampled batches of trace rows. `uniform`: every request "
      "verifies K/bs slots; `topk`: the K best slot scores of the batch (the D-Cut selection). Published: D-Cut's "
      "figures for DFlash/Qwen3-8B on GSM8K.\n")
    tab = sel.pivot_table(index=["trace_name", "weighting", "policy"], columns="budget", values="accepted_tokens",
                          sort=False)
    tab.columns = [f"K={k}" for k in tab.columns]
    pub = sel[sel["weighting"] == "step-weighted"].dropna(subset=["published_tokens"])
    if len(pub):
        ptab = pub.pivot_table(index=["trace_name", "weighting", "policy"], columns="budget", values="published_tokens",
                               sort=False)
        ptab.columns = [f"K={k}" for k in ptab.columns]
        ptab.index = pd.MultiIndex.from_tuples([("published (D-Cut, DFlash GSM8K)", "", p) for _, _, p in ptab.index])
        tab = pd.concat([ptab, tab])
    tab.index = [" / ".join(x for x in idx if x) for idx in tab.index]
    w(_md(tab, ".1f") + "\n")
    w("![selection curve](figures/selection-curve.png)\n")
    w("Command:\n```\n" + "\n".join(
        f"{SIM} --trace {t} --selection-curve sel.csv --selection-bs 32 --selection-batches {settings.selection_batches}"
        for t in dict.fromkeys(["dcut_sched/data/traces/" + n + ".parquet" for n in sel["trace_name"]])) + "\n```\n")
    w("(`dcut-sim --selection-curve` uses every multiple of bs from 2*bs to bs*B; the table keeps 128..512.)\n")
    w(c["selection"])

    # ---------------------------------------------------------------- budgets
    bsum = results["budget_summary"]
    w("## 3. Where `fine` beats `dcut`, and why\n")
    w("Both verify a global top-K of slot scores; they differ in how K is chosen. `dcut` picks among 4 captured "
      "ratios (rho = 0.25/0.5/0.75/1.0) by expected tokens per *verify* ms; `fine` picks among every token count "
      "(every `ceil(bs*B/128)`-th above 128) by expected tokens per *full step* ms (draft + verify), and stops drafting when a drafted step is "
      "expected to beat a plain autoregressive step (C_ar) by its 5 % margin, re-probing only while what drafting "
      "lost against plain decoding stays within 0.5 % of the run's time (its probe budget).\n")
    show = bsum.copy()
    show = show[["trace_name", "cost", "batch_size", "policy", "tokens_per_s", "vs_dcut", "tokens_per_step",
                 "ms_per_step", "mean_ratio", "distinct_budgets", "skipped_draft_frac"]]
    show = show.round({"tokens_per_s": 1, "vs_dcut": 3, "tokens_per_step": 1, "ms_per_step": 1, "mean_ratio": 3,
                       "skipped_draft_frac": 3})
    w(show.astype({"batch_size": str, "distinct_budgets": str}).to_markdown(index=False, floatfmt="g") + "\n")
    w("`vs_dcut`: tokens/s over `dcut`'s; `tokens_per_step`: output tokens per batch step; `mean_ratio`: mean "
      "K/(bs*B); `skipped_draft_frac`: share of steps that ran no draft.\n")
    w("![budgets on H20](figures/budgets-h20.png)\n")
    w("![budgets on CPU](figures/budgets-cpu.png)\n")
    w("Chosen ratio over 150 steady-state steps (dots: `fine`'s plain steps). Per-step records come from "
      "`dcut_sched.simulator.run_closed_loop(...).steps` (`num_tokens`, `drafted`, `tokens`, `step_ms`); "
      "the simulator already returned them, so it was not changed. Command for the table rows:\n")
    w("```\n" + f"{SIM} --trace dcut_sched/data/traces/dflash-qwen3-8b-gsm8k-b16.parquet --cost dcut_sched/profiler/profiles/h20-qwen3-8b-published.json "
      "--policies dcut,fine --batch-sizes 4,64 --out budgets.csv   # mean_ratio, draft_frac columns\n```\n")
    w(c["budgets"])

    # ---------------------------------------------------------------- calibration
    rel = results["reliability"]
    w("## 4. Calibration of draft confidence\n")
    w("### Reliability on the real traces (held-out half)\n")
    w("An `OnlineCalibrator` (default: 20 bins, pooled over depth, isotonic) learns from half of the requests "
      "(seeded split, every slot verified); on the other half each observed draft slot (up to and including the "
      "first rejection) is one prediction of P(accept | earlier drafts accepted). ECE: 15 equal-width bins.\n")
    rtab = rel.pivot_table(index="trace_name", columns="map", values="ece", sort=False)[["raw", "calibrated"]]
    rtab.columns = ["ECE raw", "ECE calibrated"]
    extra = rel[rel["map"] == "raw"].set_index("trace_name")[["accept_rate", "mean_prob", "test_slots",
                                                              "fit_requests", "test_requests"]]
    extra = extra.rename(columns={"accept_rate": "accept rate", "mean_prob": "mean raw conf"})
    rtab = rtab.join(extra.astype({"test_slots": int, "fit_requests": int, "test_requests": int}).astype(
        {"test_slots": str, "fit_requests": str, "test_requests": str}))
    w(rtab.to_markdown(floatfmt=".3f") + "\n")
    w("![reliability](figures/reliability.png)\n")
    w("Command: `PYTHONPATH=. python analysis/calibration_eval.py --trace dcut_sched/data/traces/smollm2-135m-skip14-15-b16.parquet` "
      "(same split idea, NLL and tokens MAE too); the figure and table above come from `make_report.py`.\n")
    w(c["reliability"])
    cal = results["calibrate"]
    w("### Throughput with `dcut-sim --calibrate`\n")
    w("`--calibrate` passes every drafted step's confidences through an `OnlineCalibrator` that starts at the "
      "identity and learns online from the run's own verified outcomes. Cells: change of tokens/s, calibrated "
      "vs raw, same requests and seed (the speedups themselves: `analysis/results/calibrate_throughput.csv`).\n")
    for (trace_name, cost), rows in cal.groupby(["trace_name", "cost"], sort=False):
        t = rows.pivot_table(index="policy", columns="batch_size", values="change", sort=False)
        t = t.map(lambda v: _pct(v)) if hasattr(t, "map") else t.applymap(_pct)
        t.columns = [f"bs {b}" for b in t.columns]
        w(f"**{trace_name}** on `{cost}`:\n")
        w(t.to_markdown() + "\n")
    w("Command:\n```\n" + f"{SIM} --trace dcut_sched/data/traces/smollm2-135m-skip14-15-b16.parquet --cost dcut_sched/profiler/profiles/h20-qwen3-8b-published.json "
      "--policies threshold,topk,dcut,fine --calibrate\n"
      f"{SIM} --trace dcut_sched/data/traces/smollm2-135m-skip14-15-b16.parquet --cost dcut_sched/profiler/profiles/cpu-smollm2-135m-b16.json "
      "--policies threshold,topk,dcut,fine --batch-sizes 4,8,16 --calibrate\n```\n(and the same without `--calibrate`).\n")
    w(c["calibrate"])

    # ---------------------------------------------------------------- fidelity
    w("## 5. Simulator fidelity (real engine vs simulator, CPU)\n")
    if fidelity:
        w(fidelity.strip() + "\n")
    else:
        w("*Not generated yet: run `PYTHONPATH=. python analysis/fidelity.py` (writes `analysis/results/fidelity.csv` "
          "and `analysis/results/fidelity.md`), then `python analysis/make_report.py` to include it here.*\n")

    if peers:
        w("## 6. Published peer policies side by side\n")
        w(peers.strip() + "\n")
    # ---------------------------------------------------------------- vLLM
    w("## 7. D-Cut inside real vLLM (CPU): measured vs simulated\n")
    w(VLLM_INTRO)
    if vllm:
        w(vllm.strip().split("\n", 1)[1].strip() + "\n")  # drop its own title
    else:
        w("*No vLLM benchmark yet: run `PYTHONPATH=. python analysis/bench_vllm.py` (needs the vLLM environment), then "
          "`python analysis/make_report.py` to include it here.*\n")
    w(VLLM_DFLASH)
    # ---------------------------------------------------------------- sampling
    if sampling:
        # its figure links are relative to analysis/results/; this report lives in analysis/
        w(sampling.strip().replace("](../figures/", "](figures/") + "\n")

    w("## Caveats\n")
    w(c["caveats"])
    return "\n".join(out)
