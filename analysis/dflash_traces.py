"""Real block-draft traces of the DFlash drafter, their per-depth calibration, and what it changes.

One command (about 15 minutes on a quiet 2-core machine)::

    python analysis/dflash_traces.py all

Stages:

- ``record``: ``dcut-trace record --draft dflash:drafters/smollm2-135m-dflash`` on the 80 prompts of
  ``dcut_sched/data/traces/prompts.jsonl`` (held out from the drafter's training), 128 new tokens, greedy and
  T = 0.7, B = 16 and B = 8: ``dcut_sched/data/traces/smollm2-135m-dflash-b{16,8}[-t07].parquet``.
- ``cards``: a card per trace (``.md`` beside it): tau, per-depth acceptance and calibration (mean
  confidence against acceptance of the reached slots, ECE, over/under-confidence by depth), next to
  the synthetic presets' assumption (calibrated by construction).
- ``fit``: the synthetic generator's calibration model, fitted to the real greedy B = 16 trace only:
  reported confidence logit = ``slope * logit(p) + bias + depth * (t - 1)`` where ``p`` is the
  probability that the draft is right (``SynthParams.calibration_slope/bias/depth``), by maximum
  likelihood of the reached slots' outcomes (scipy.optimize). Written to
  ``analysis/results/dflash_calibration_fit.json``.
- ``protocol``: the published-protocol job (five DFlash presets on the published H20 curve) re-run
  with the presets' confidences given the fitted calibration (acceptance unchanged), against the
  shipped presets: speedups and the ratio ``dcut`` picks, ``analysis/results/dflash_calibration_protocol.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DRAFTER = "drafters/smollm2-135m-dflash"
TRACES = {  # name -> (block size, temperature)
    "smollm2-135m-dflash-b16": (16, 0.0),
    "smollm2-135m-dflash-b8": (8, 0.0),
    "smollm2-135m-dflash-b16-t07": (16, 0.7),
    "smollm2-135m-dflash-b8-t07": (8, 0.7),
}
PRESETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")
RESULTS = ROOT / "analysis" / "results"
BUILD = ROOT / "build" / "dflash-calibration"


def record(args) -> None:
    for name, (b, temp) in TRACES.items():
        cmd = [sys.executable, "-m", "dcut_sched.cli.trace", "record", "--fresh", "--no-progress", "--threads",
               str(args.threads), "--prompts", "dcut_sched/data/traces/prompts.jsonl", "--dataset", "dcut-prompts-v1",
               "--max-new-tokens", str(args.max_new_tokens), "--draft", f"dflash:{DRAFTER}", "--block-size", str(b),
               "--out", f"dcut_sched/data/traces/{name}.parquet"]
        if temp:
            cmd += ["--temperature", str(temp), "--seed", "0"]
        t0, load0 = time.time(), os.getloadavg()[0]
        subprocess.run(cmd, cwd=ROOT, check=True)
        meta = {"command": "dcut-trace " + " ".join(cmd[3:]), "seconds": round(time.time() - t0, 1),
                "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2), "threads": args.threads}
        (BUILD / f"{name}.record.json").write_text(json.dumps(meta, indent=2))
        print(f"{name}: {meta['seconds']} s", flush=True)


def depth_table(trace) -> pd.DataFrame:
    from dcut_sched.traces.stats import calibration_by_depth

    return pd.DataFrame(calibration_by_depth(trace))


def cards(args) -> None:
    from dcut_sched.traces import Trace
    from dcut_sched.traces.stats import trace_stats
    from dcut_sched.util.atomic import atomic_write_text

    preset = Trace.load(ROOT / "dcut_sched" / "data" / "traces" / "dflash-qwen3-8b-gsm8k-b16.parquet")
    ptab = depth_table(preset)
    for name, (b, temp) in TRACES.items():
        path = ROOT / "dcut_sched" / "data" / "traces" / f"{name}.parquet"
        tr = Trace.load(path)
        st = trace_stats(tr)
        tab = depth_table(tr)
        rec = json.loads((BUILD / f"{name}.record.json").read_text()) if (BUILD / f"{name}.record.json").exists() else {}
        over = tab[tab["reached"] >= 50]
        kind = "greedy (temperature 0)" if not temp else f"sampled at T = {temp} (keyed draws, seed 0; p1..p{b - 1} recorded)"
        lines = [f"# {name}.parquet", "",
                 f"Real position-indexed acceptance trace, B = {b}: target SmolLM2-135M-Instruct (fp32), draft = the "
                 f"DFlash block drafter `{DRAFTER}` (trained here, docs/drafters.md), {kind}.", "",
                 f"- Made by (`analysis/dflash_traces.py record`): `{rec.get('command', '')}`",
                 f"- Recording: {rec.get('seconds', '?')} s, {rec.get('threads', '?')} torch threads, 1-min load "
                 f"{rec.get('load_before', '?')} before and {rec.get('load_after', '?')} after.",
                 "- Prompts: the 80 of `dcut_sched/data/traces/prompts.jsonl` (held out from the drafter's training), chat "
                 "template, up to 128 new tokens, stopping after `<|im_end|>`.",
                 f"- Contents: {st['num_requests']} requests, {st['num_positions']} positions, {st['num_steps']} "
                 "full-verification steps.",
                 f"- tau (full-verification replay, incl. bonus) = **{st['tau']:.2f}**; per-position mean "
                 f"1 + accept_len = {st['tau_per_position']:.2f}.",
                 f"- Acceptance-length histogram (steps, 0..{b - 1}): {st['accept_len_hist']}.",
                 f"- Calibration of the reached slots: ECE = {st['ece']:.3f} over {st['num_reached_slots']} slots.",
                 "", "Per-depth calibration (reached slots; gap = mean confidence - acceptance, > 0 over-confident), "
                 "beside the shipped synthetic preset `dflash-qwen3-8b-gsm8k-b16` (calibrated by construction):", "",
                 "| depth | reached | mean conf | accept rate | gap | ECE | preset gap | preset ECE |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in tab.itertuples():
            pr = ptab[ptab["depth"] == r.depth]
            pg = f"{pr['gap'].iat[0]:+.3f}" if len(pr) else ""
            pe = f"{pr['ece'].iat[0]:.3f}" if len(pr) else ""
            lines.append(f"| {r.depth} | {r.reached} | {r.mean_conf:.3f} | {r.accept_rate:.3f} | {r.gap:+.3f} | "
                         f"{r.ece:.3f} | {pg} | {pe} |")
        if len(over):
            sign = "over" if over["gap"].mean() > 0 else "under"
            lines += ["", f"Over the depths with >= 50 reached slots the drafter is **{sign}-confident** on average "
                      f"(mean gap {over['gap'].mean():+.3f}, from {over['gap'].iat[0]:+.3f} at depth 1 to "
                      f"{over['gap'].iat[-1]:+.3f} at depth {int(over['depth'].iat[-1])})."]
        atomic_write_text(path.with_suffix(".md"), "\n".join(lines) + "\n")
        print(f"wrote {path.with_suffix('.md')}")


def fit(args) -> dict:
    from scipy.optimize import minimize
    from scipy.special import expit, log_expit, logit

    from dcut_sched.traces import Trace
    from dcut_sched.util.atomic import atomic_write_text

    tr = Trace.load(ROOT / "dcut_sched" / "data" / "traces" / "smollm2-135m-dflash-b16.parquet")
    k = tr.block_size - 1
    a = tr.accept_len.astype(np.int64)
    remaining = np.repeat(tr.starts + tr.num_positions, tr.num_positions) - np.arange(tr.num_rows) - 1
    depth = np.arange(1, k + 1)[None, :]
    reached = (a[:, None] >= depth - 1) & (depth <= remaining[:, None])
    conf = np.clip(tr.conf.astype(np.float64), 1e-6, 1 - 1e-6)[reached]
    y = (a[:, None] >= depth)[reached].astype(np.float64)
    t = np.broadcast_to(depth - 1, reached.shape)[reached].astype(np.float64)
    lc = logit(conf)

    def nll(theta):
        slope, bias, dep = theta
        lp = (lc - bias - dep * t) / slope  # logit of the probability the draft is right
        return -(y * log_expit(lp) + (1 - y) * log_expit(-lp)).mean()

    res = minimize(nll, x0=[1.0, 0.0, 0.0], method="L-BFGS-B", bounds=[(0.05, 20.0), (-10, 10), (-2, 2)])
    slope, bias, dep = (float(x) for x in res.x)
    base = nll([1.0, 0.0, 0.0])
    out = {"trace": "dcut_sched/data/traces/smollm2-135m-dflash-b16.parquet", "reached_slots": int(y.size),
           "calibration_slope": round(slope, 4), "calibration_bias": round(bias, 4), "calibration_depth": round(dep, 4),
           "nll_fitted": round(float(res.fun), 5), "nll_as_calibrated": round(float(base), 5),
           "converged": bool(res.success),
           "note": "reported confidence logit = slope * logit(p_right) + bias + depth * (t - 1); fitted to the real "
                   "greedy B16 trace only (no speedup table)."}
    # check: the fitted model's predicted acceptance by depth vs the observed
    p_hat = expit((lc - bias - dep * t) / slope)
    out["by_depth"] = [{"depth": int(d + 1), "observed": round(float(y[t == d].mean()), 4),
                        "fitted": round(float(p_hat[t == d].mean()), 4), "mean_conf": round(float(conf[t == d].mean()), 4)}
                       for d in range(k) if (t == d).sum() >= 50]
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS / "dflash_calibration_fit.json", json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return out


def protocol(args) -> None:
    from dcut_sched.simulator import benchmark_table
    from dcut_sched.traces.synth import generate, get_preset
    from dcut_sched.util.atomic import atomic_write_text

    f = json.loads((RESULTS / "dflash_calibration_fit.json").read_text())
    BUILD.mkdir(parents=True, exist_ok=True)
    paths = []
    for ds in PRESETS:
        pre = get_preset(f"dflash-qwen3-8b-{ds}")
        p = pre.params.replace(calibration_slope=f["calibration_slope"], calibration_bias=f["calibration_bias"],
                               calibration_depth=f["calibration_depth"])
        path = BUILD / f"dflash-qwen3-8b-{ds}-b16-realcal.parquet"
        generate(p, num_requests=48, seed=0, dataset=ds).save(path)
        paths.append(path)
    frames = {}
    for label, traces in (("shipped presets (calibrated)", [ROOT / f"dcut_sched/data/traces/dflash-qwen3-8b-{ds}-b16.parquet" for ds in PRESETS]),
                          ("presets with the real drafter's calibration", paths)):
        out = BUILD / f"{'shipped' if 'shipped' in label else 'realcal'}.csv"
        trace_args = [a for t in traces for a in ("--trace", str(t))]
        subprocess.run([sys.executable, "-m", "dcut_sched.cli.sim", *trace_args, "--quiet",
                        "--policies", "ar,full,dcut,fine,oracle", "--out", str(out)], cwd=ROOT, check=True)
        frames[label] = pd.read_csv(out)
    lines = ["Published-protocol job (five DFlash presets, published H20 Qwen3-8B curve), speedup over `ar` "
             "(mean over the five benchmarks) and the mean ratio rho each policy verifies, with the presets' "
             "confidences as shipped (calibrated) and with the calibration fitted to the real DFlash drafter "
             f"(slope {f['calibration_slope']}, bias {f['calibration_bias']}, depth {f['calibration_depth']}; "
             "acceptance unchanged).", ""]
    for label, df in frames.items():
        sp = benchmark_table(df)
        rho = benchmark_table(df, value="mean_ratio")
        lines += [f"**{label}**", "", "| policy | " + " | ".join(f"bs {c}" if c != "geomean" else "geomean (25)" for c in sp.columns) + " |",
                  "|---|" + "---:|" * len(sp.columns)]
        for pol in sp.index:
            cells = []
            for c in sp.columns:
                r = f" / rho {rho.loc[pol, c]:.2f}" if c != "geomean" else ""
                cells.append(f"{sp.loc[pol, c]:.2f}x{r}")
            lines.append(f"| `{pol}` | " + " | ".join(cells) + " |")
        lines.append("")
    atomic_write_text(RESULTS / "dflash_calibration_protocol.md", "\n".join(lines))
    print("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=("all", "record", "cards", "fit", "protocol"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    BUILD.mkdir(parents=True, exist_ok=True)
    stages = ["record", "cards", "fit", "protocol"] if args.stage == "all" else [args.stage]
    for s in stages:
        globals()[s](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
