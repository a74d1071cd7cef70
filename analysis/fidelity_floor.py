"""Simulator fidelity against the interleaved floor benchmarks (one command, seconds).

    python analysis/fidelity_floor.py            # predict: reads the committed rounds files
    python analysis/fidelity_floor.py record     # the acceptance traces it needs (minutes; once per drafter)

``predict`` prices every cell (prompt set x bs x configuration) of the two floor benchmarks with
the simulator and sets the prediction beside the measured rounds:

- vLLM: ``analysis/results/vllm-dflash/bench_vllm_rounds_runs.csv`` (``analysis/bench_vllm.py
  --drafter dflash --stage rounds``), priced with the curve it plans with
  (``vllm-cpu-smollm2-135m-dflash-b8.json``: forwards, ``draft_first``, drafted / undrafted / plain
  ``step_overhead`` rows). ``nospec`` is ``ar``; ``full``/``dcut``/``fine`` are themselves; the
  peers run vLLM's DFlash without D-Cut: ``vllm-kK`` verifies K drafts per request every step
  (``uniform`` at rho = (K + 1) / B), ``vllm-dynsd`` the K its schedule gives the bs (stated in
  the rounds file): K > 0 as ``vllm-kK``, K = 0 undrafted steps that run vLLM's own whole
  drafter pass and its rejection sampler (D-Cut's context-only pass and plain sampler are not
  installed without a D-Cut config), priced as the curve's undrafted step plus what vLLM's own
  drafter pass costs over D-Cut's in ``analysis/results/undrafted_step.csv`` (``block_pass_extra_ms``).
- The project's engine: ``analysis/results/bench_engine_rounds_runs.csv`` (``analysis/bench_engine.py
  --rounds 3``), priced with ``bench_engine.CURVE`` (forwards only: an undrafted step is priced as
  a plain step, which the engine's 0.5-1 % upkeep, ``undrafted_step.md``, allows).

Each cell is one ``run_open_loop`` (the wave's bs requests at t = 0, max batch = bs, no shuffle,
free prefill), the policy with its defaults and the drafter's calibration prior (as
``RatioController`` and the vLLM plugin build it), over the recorded trace of the set at the
engine's block size cut to the engine's decode steps (``fidelity.engine_matched_trace``). Block
size and tokens per request are read from the rounds' ``.md`` header, so a regenerated benchmark
is re-predicted by rerunning this script (``record`` first if those changed).

Per cell: measured median tok/s and [min-max] over rounds, the spread ((max - min) / median, the
noise floor), predicted, error; the speedup over the round's plain decoding, measured (median
over rounds) and predicted, and its error (what is left once the machine's speed that day is
divided out); steps and drafted steps, engine vs simulator (vLLM counts its prefill step, which
is subtracted); the plain step measured in the cell vs the curve's; and for cells over 10 % the
cause (:func:`cause`). Writes ``analysis/results/fidelity_floor/fidelity_floor.{csv,md}``.

``record`` writes, under ``analysis/results/fidelity_floor/``, one position-indexed trace per
(prompt set, block size) the benchmarks run, recorded in the project's engine with the shipped
DFlash drafter: the first 16 prompts of each set, 64 greedy tokens (the longest run of either benchmark), **EOS ignored** (the vLLM runs
set ``ignore_eos`` and the project's engine runs without ``eos_id``, so a request decodes past
``<|im_end|>``). Greedy, so the target's outputs are the engines'.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "analysis"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

DFLASH_DIR = ROOT / "drafters" / "smollm2-135m-dflash"
PROMPT_SETS = {"heldout": ROOT / "dcut_sched" / "data" / "traces" / "prompts.jsonl",
               "unlike": ROOT / "dcut_sched" / "data" / "traces" / "prompts-unlike.jsonl"}
OUT_DIR = ROOT / "analysis" / "results" / "fidelity_floor"
VLLM_DIR = ROOT / "analysis" / "results" / "vllm-dflash"
#: per engine: the rounds' runs, their report (settings in its header), the curve it planned with (the
#: runs' ``curve`` column, relative to the repository, where they record one), the name of plain
#: decoding, and the prefill steps its step counts include
ENGINES = {
    "vllm": {"runs": VLLM_DIR / "bench_vllm_rounds_runs.csv", "report": VLLM_DIR / "bench_vllm_rounds.md",
             "curve": VLLM_DIR / "vllm-cpu-smollm2-135m-dflash-b8.json", "plain": "nospec", "prefill_steps": 1},
    "own": {"runs": ROOT / "analysis" / "results" / "bench_engine_rounds_runs.csv",
            "report": ROOT / "analysis" / "results" / "bench_engine_rounds.md",
            "curve": ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-dflash-b16.json",
            "plain": "ar", "prefill_steps": 0},
}
UNDRAFTED = ROOT / "analysis" / "results" / "undrafted_step.csv"
#: a cell is explained when its |error| is at most this
TOLERANCE = 0.10
#: what the benchmarks run: block size per engine, new tokens per request (the first from prefill),
#: and the largest wave (the first ``bs`` prompts of a set)
BLOCK = {"vllm": 8, "own": 16}
MAX_TOKENS = 64
NUM_PROMPTS = 16


# ============================================================================ pure parts (tested)
def read_settings(report: str) -> dict:
    """Block size, tokens per request and (vLLM) the Dynamic SD schedule from a rounds report's header
    (``B = 8, one wave of bs prompts x 32 greedy tokens``; ``({1: 7, 2: 0}; ...``).

    Raises:
        ValueError: the header does not state the block size or the tokens.
    """
    b = re.search(r"B = (\d+)", report)
    t = re.search(r"x (\d+) greedy tokens", report)
    if not (b and t):
        raise ValueError("rounds report: no 'B = N' or 'x N greedy tokens' in its header")
    sched = re.search(r"\(\{([0-9: ,]+)\}", report)
    schedule = {int(k): int(v) for k, v in (kv.split(":") for kv in sched.group(1).split(","))} if sched else {}
    return {"block_size": int(b.group(1)), "max_tokens": int(t.group(1)), "schedule": schedule}


def sim_policy(config: str, batch_size: int, block_size: int, schedule: dict[int, int]) -> tuple[str, dict, bool]:
    """``(policy, params, block_pass)`` the simulator runs for a benchmark configuration:
    plain decoding is ``ar``; ``vllm-kK`` verifies K drafts per request every step (``uniform`` at
    rho = (K + 1) / B); ``vllm-dynsd`` is ``vllm-kK`` with the schedule's K at ``batch_size``, and
    with K = 0 never drafts, on a speculative engine whose undrafted steps run vLLM's whole drafter
    pass (``block_pass``: ``ar``'s steps repriced as such); any other name is the policy itself."""
    if config in ("nospec", "ar"):
        return "ar", {}, False
    if config == "vllm-dynsd":
        k = int(schedule[int(batch_size)])
        return ("ar", {}, True) if k == 0 else ("uniform", {"rho": (k + 1) / block_size}, False)
    m = re.fullmatch(r"vllm-k(\d+)", config)
    if m:
        return "uniform", {"rho": (int(m.group(1)) + 1) / block_size}, False
    return config, {}, False


def measured_cells(runs: pd.DataFrame, plain: str, prefill_steps: int, max_tokens: int) -> pd.DataFrame:
    """Per (prompt set, bs, config) of the rounds' runs: median tok/s, min, max, ``spread`` ((max -
    min) / median, the noise floor), ``speedup`` (median over rounds of tok/s over the same round's
    ``plain`` run), the engine's decode ``steps`` and ``drafted_steps`` (medians; its ``prefill_steps``
    subtracted; plain decoding takes ``max_tokens - 1``; NaN where not recorded), the measured
    ``plain_step_ms`` of the cell's plain decoding (bs / median plain tok/s) and the measured
    ``ms_per_step`` (decode time over decode steps; every configuration decodes bs x (max_tokens - 1)
    tokens)."""
    runs = runs.copy()
    base = runs[runs["config"] == plain].set_index(["prompt_set", "batch_size", "round"])["tokens_per_s"]
    runs["speedup"] = runs["tokens_per_s"].to_numpy() / base.reindex(
        pd.MultiIndex.from_frame(runs[["prompt_set", "batch_size", "round"]])).to_numpy()
    for col in ("steps", "drafted_steps"):
        if col not in runs:
            runs[col] = np.nan
    g = runs.groupby(["prompt_set", "batch_size", "config"], sort=False)
    out = g["tokens_per_s"].agg(measured="median", measured_min="min", measured_max="max").join(
        g[["speedup", "steps", "drafted_steps"]].median()).reset_index()
    out["spread"] = (out["measured_max"] - out["measured_min"]) / out["measured"]
    out["steps"] = out["steps"] - prefill_steps
    is_plain = out["config"] == plain
    out.loc[is_plain, "steps"] = max_tokens - 1
    out.loc[is_plain, "drafted_steps"] = 0
    plain_tps = out[is_plain].set_index(["prompt_set", "batch_size"])["measured"]
    out["plain_step_ms"] = out["batch_size"] * 1e3 / plain_tps.reindex(
        pd.MultiIndex.from_frame(out[["prompt_set", "batch_size"]])).to_numpy()
    out["ms_per_step"] = out["batch_size"] * (max_tokens - 1) * 1e3 / out["measured"] / out["steps"]
    return out


def cause(row: pd.Series | dict, tolerance: float = TOLERANCE) -> str:
    """Why the engine and the simulator disagree on a cell (``""`` when ``|error| <= tolerance``).

    ``predicted / measured = (engine steps / simulated steps) x (measured ms per step / simulated ms
    per step)``, so a cell's error is split into its steps and its step time; the step time is set
    against the cell's plain step (measured vs the curve's: the machine's speed that day). Reads
    ``error``, ``spread``, ``measured_min``/``measured_max``/``predicted``, ``steps``/``sim_steps``,
    ``drafted_steps``/``sim_drafted_steps``, ``ms_per_step``/``sim_ms_per_step`` and
    ``plain_step_error`` (curve's plain step / measured - 1)."""
    err = float(row["error"])
    if not abs(err) > tolerance:
        return ""
    parts = []
    if row["measured_min"] <= row["predicted"] <= row["measured_max"] or row["spread"] >= abs(err):
        parts.append(f"noise: the rounds' spread {row['spread']:.0%} >= |error| {abs(err):.0%}"
                     if row["spread"] >= abs(err) else "noise: the prediction is inside the rounds' range")
    steps, sim_steps = row.get("steps", np.nan), row["sim_steps"]
    if pd.notna(steps) and abs(sim_steps / steps - 1) > 0.05:
        parts.append(f"steps differ: engine {steps:g} ({row['drafted_steps']:g} drafted), simulator "
                     f"{sim_steps:g} ({row['sim_drafted_steps']:g} drafted)")
    elif pd.notna(steps) and pd.notna(row.get("drafted_steps")) and abs(row["drafted_steps"] - row["sim_drafted_steps"]) > max(2, 0.2 * steps):
        parts.append(f"drafted steps differ: engine {row['drafted_steps']:g}, simulator {row['sim_drafted_steps']:g} "
                     f"of {steps:g}")
    plain = float(row["plain_step_error"])
    if pd.notna(steps):
        t = float(row["sim_ms_per_step"] / row["ms_per_step"] - 1)
        if abs(t) > 0.05:
            if row.get("config") in ("ar", "nospec") or abs(t - plain) <= 0.05:
                parts.append(f"step time: the curve's plain step is {plain:+.0%} off this cell's measured one "
                             f"(step time {t:+.0%})")
            else:
                parts.append(f"step time {t:+.0%} vs plain step {plain:+.0%}: the drafted step (drafter + "
                             f"verify + overheads) is mispriced by about {t - plain:+.0%}")
    elif abs(plain) > 0.05:
        parts.append(f"the curve's plain step is {plain:+.0%} off this cell's measured one (steps not recorded)")
    return "; ".join(parts) or "unexplained (steps and step time within 5 %)"


def trace_path(prompt_set: str, block_size: int) -> Path:
    """The recorded trace of ``prompt_set`` at ``block_size`` (``record`` writes it)."""
    return OUT_DIR / f"trace-{prompt_set}-b{block_size}.parquet"


def record(fresh: bool = False, threads: int = 1) -> int:
    """Record every (prompt set, block size) trace that is missing (all with ``fresh``)."""
    import torch

    from dcut_sched.drafters import load_dflash
    from dcut_sched.engine.trace_backends import DFlashBackend
    from dcut_sched.traces.prompts import load_prompt_records
    from dcut_sched.traces.record import record_trace

    torch.set_num_threads(threads)
    backend = None
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for block_size in sorted(set(BLOCK.values()), reverse=True):
        for pset, prompts_file in PROMPT_SETS.items():
            out = trace_path(pset, block_size)
            if out.exists() and not fresh:
                continue
            if backend is None:
                backend = DFlashBackend(load_dflash(DFLASH_DIR), str(DFLASH_DIR.relative_to(ROOT)))
                backend.eos_id = None  # the benchmarks decode past <|im_end|> (module docstring)
            prompts = load_prompt_records(prompts_file)[:NUM_PROMPTS]
            t0 = time.perf_counter()
            trace = record_trace(backend, prompts, out, block_size=block_size, max_new_tokens=MAX_TOKENS,
                                 dataset=pset, resume=not fresh, progress=False,
                                 extra_metadata={"eos": "ignored (as the benchmarks)",
                                                 "made_by": "python analysis/fidelity_floor.py record"})
            print(f"{out.relative_to(ROOT)}: {trace.num_requests} requests, {trace.num_rows} positions, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 0


# ============================================================================ the simulator's side
def block_pass_extra_ms(table: pd.DataFrame) -> dict[int, float]:
    """Per bs: what vLLM's own drafter pass on an undrafted step costs over D-Cut's context-only pass
    written every step (the pass the rounds and the curve's profile ran before deferral):
    ``undrafted_step.csv``, the vLLM rows' median ``upkeep_ms`` (timed inside each step, so a host's
    drift between runs does not enter), ``block`` - ``context-write`` (``context`` in a file from before
    that row existed). vLLM's rejection sampler over zero drafts, which its own undrafted step also runs
    (about 0.6 ms at bs 16, docs/vllm.md), is not in it."""
    v = table[table["engine"] == "vllm"].pivot(index="batch_size", columns="config", values="upkeep_ms")
    ours = "context-write" if "context-write" in v.columns else "context"
    return {int(bs): float(r["block"] - r[ours]) for bs, r in v.iterrows()}


def simulate_cell(trace, curve, prior, config: str, bs: int, settings: dict, extra_ms: dict[int, float]) -> dict:
    """One benchmark cell in the simulator (module docstring): predicted tok/s, steps, drafted steps
    and the mean simulated step."""
    from fidelity import engine_matched_trace, step_time_ms

    from dcut_sched import policies
    from dcut_sched.calibration import LogisticCalibrator
    from dcut_sched.simulator import run_open_loop

    B, T = settings["block_size"], settings["max_tokens"]
    name, params, block_pass = sim_policy(config, bs, B, settings["schedule"])
    wave = engine_matched_trace(trace, [T] * bs, requests=range(bs))
    run = run_open_loop(wave, curve, policies.get(name, **params), bs, rate_rps=1.0, num_requests=bs,
                        shuffle=False, arrival_ms=np.zeros(bs), calibrator=LogisticCalibrator(B, prior=prior))
    st = run.steps
    step_ms = np.asarray(st.step_ms, dtype=float)
    if block_pass:  # vLLM's speculative engine with no drafts: undrafted steps running the whole pass
        step_ms = step_time_ms(curve, st.batch_size, st.num_tokens, np.zeros(len(st), dtype=bool), speculative=True)
        step_ms = step_ms + np.array([extra_ms[int(b)] for b in st.batch_size])
    return {"predicted": float(st.tokens.sum()) / step_ms.sum() * 1e3, "sim_steps": len(st),
            "sim_drafted_steps": int(np.sum(st.drafted)), "sim_ms_per_step": float(step_ms.mean()),
            "sim_tokens": int(st.tokens.sum())}


def predict_engine(engine: str) -> pd.DataFrame:
    """Every cell of one engine's rounds, measured beside predicted (module docstring)."""
    from dcut_sched.calibration import CalibrationPrior
    from dcut_sched.cost_curve import CostCurve
    from dcut_sched.step_costs import StepCosts
    from dcut_sched.traces import Trace

    spec = ENGINES[engine]
    settings = read_settings(spec["report"].read_text())
    B, T = settings["block_size"], settings["max_tokens"]
    runs = pd.read_csv(spec["runs"])
    cells = measured_cells(runs, spec["plain"], spec["prefill_steps"], T)
    recorded = runs["curve"].dropna().unique() if "curve" in runs else []
    if len(recorded) > 1:
        raise SystemExit(f"fidelity_floor.py: {spec['runs']}: the runs planned with {len(recorded)} curves "
                         f"({', '.join(recorded)}); re-run the rounds with one")
    curve_path = ROOT / recorded[0] if len(recorded) else spec["curve"]
    curve = CostCurve.load(curve_path, check_hardware=False)
    costs = StepCosts(curve, B)
    prior = CalibrationPrior.from_folder(DFLASH_DIR)
    extra = block_pass_extra_ms(pd.read_csv(UNDRAFTED)) if engine == "vllm" else {}
    traces = {}
    rows = []
    for cell in cells.itertuples(index=False):
        if cell.prompt_set not in traces:
            path = trace_path(cell.prompt_set, B)
            if not path.exists():
                raise FileNotFoundError(f"{path.relative_to(ROOT)}: run `python analysis/fidelity_floor.py record`")
            traces[cell.prompt_set] = Trace.load(path)
        tr = traces[cell.prompt_set]
        if tr.block_size != B or int(tr.num_positions.min()) < T:
            raise ValueError(f"{tr.name}: block size {tr.block_size} / {int(tr.num_positions.min())} positions; the "
                             f"benchmark ran B = {B}, {T} tokens: re-record (`record --fresh`)")
        sim = simulate_cell(tr, curve, prior, cell.config, int(cell.batch_size), settings, extra)
        if sim["sim_tokens"] != cell.batch_size * (T - 1):
            raise AssertionError(f"{engine} {cell.prompt_set} bs {cell.batch_size} {cell.config}: simulated "
                                 f"{sim['sim_tokens']} tokens, the engine decodes {cell.batch_size * (T - 1)}")
        rows.append({"engine": engine, **cell._asdict(), **sim,
                     "curve_plain_step_ms": costs.plain_ms(int(cell.batch_size))})
    out = pd.DataFrame(rows)
    out["error"] = out["predicted"] / out["measured"] - 1.0
    plain_pred = out[out["config"] == spec["plain"]].set_index(["prompt_set", "batch_size"])["predicted"]
    out["predicted_speedup"] = out["predicted"] / plain_pred.reindex(
        pd.MultiIndex.from_frame(out[["prompt_set", "batch_size"]])).to_numpy()
    out["speedup_error"] = out["predicted_speedup"] / out["speedup"] - 1.0
    out["plain_step_error"] = out["curve_plain_step_ms"] / out["plain_step_ms"] - 1.0
    out["cause"] = [cause(r) for _, r in out.iterrows()]
    out["curve"] = str(Path(curve_path).relative_to(ROOT))
    return out


def markdown(res: pd.DataFrame) -> str:
    """The report: per engine the median |error|, then one table per engine."""
    lines = ["# The simulator against the floor benchmarks", "",
             "Every cell of the interleaved rounds ("
             + ", ".join(f"`{ENGINES[e]['runs'].relative_to(ROOT)}`" for e in res["engine"].unique())
             + ") predicted by the simulator from a trace of the same "
             "drafter on the same prompts (greedy, EOS ignored, as the benchmarks) and the curve each engine planned "
             "with; `python analysis/fidelity_floor.py` regenerates this file (method: its docstring). measured: "
             "median decode tok/s over the rounds [min-max]; spread = (max - min) / median, the noise floor; "
             "speedup: over the same round's plain decoding (median over rounds), predicted over the simulated plain "
             "decoding; steps: engine / simulator, decode steps (drafted); plain step: the cell's measured plain "
             "step (bs / plain tok/s) and the curve's.", ""]
    for engine, g in res.groupby("engine", sort=False):
        a, s = g["error"].abs(), g["speedup_error"].abs()
        over = g[a > TOLERANCE]
        noise = over["cause"].str.startswith("noise")
        lines += [f"## {'vLLM 0.32' if engine == 'vllm' else 'The project engine'}", "",
                  f"{len(g)} cells: median |error| **{a.median():.1%}** (mean {a.mean():.1%}, max {a.max():.1%}); "
                  f"{len(over)} cells over {TOLERANCE:.0%}, {int(noise.sum())} of them within the rounds' noise; median "
                  f"spread over rounds {g['spread'].median():.1%}. Speedup over plain decoding: median |error| "
                  f"{s.median():.1%}. Median plain-step error of the curve (curve / measured - 1): "
                  f"{g.drop_duplicates(['prompt_set', 'batch_size'])['plain_step_error'].median():+.1%}. Curve: "
                  f"`{g['curve'].iloc[0]}`.", "",
                  "| set | bs | config | measured [min-max] | spread | predicted | error | speedup meas / pred | "
                  "steps eng / sim (drafted) | plain step ms meas / curve | cause (cells over 10 %) |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in g.itertuples(index=False):
            st = ("- / " if pd.isna(r.steps) else f"{r.steps:g} ({r.drafted_steps:g}) / ") + \
                 f"{r.sim_steps} ({r.sim_drafted_steps})"
            lines.append(f"| {r.prompt_set} | {r.batch_size} | `{r.config}` | {r.measured:.1f} [{r.measured_min:.1f}-"
                         f"{r.measured_max:.1f}] | {r.spread:.0%} | {r.predicted:.1f} | {r.error:+.1%} | "
                         f"{r.speedup:.2f} / {r.predicted_speedup:.2f} | {st} | {r.plain_step_ms:.1f} / "
                         f"{r.curve_plain_step_ms:.1f} | {r.cause} |")
        lines.append("")
    return "\n".join(lines)


def write(res: pd.DataFrame) -> str:
    """Write the csv and the report of ``res`` (all or none); returns the report."""
    from dcut_sched.util.atomic import all_or_none, atomic_write_text

    md = markdown(res)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with all_or_none():
        atomic_write_text(OUT_DIR / "fidelity_floor.csv", res.round(4).to_csv(index=False))
        atomic_write_text(OUT_DIR / "fidelity_floor.md", md)
    return md


def predict(engines: Sequence[str] = tuple(ENGINES)) -> int:
    print(write(pd.concat([predict_engine(e) for e in engines], ignore_index=True)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="see the module docstring")
    ap.add_argument("stage", nargs="?", choices=["predict", "record"], default="predict")
    ap.add_argument("--fresh", action="store_true", help="record: re-record existing traces")
    ap.add_argument("--threads", type=int, default=1, help="record: torch threads [1]")
    ap.add_argument("--engines", type=lambda t: [x for x in t.split(",") if x], default=list(ENGINES),
                    help=f"predict: comma list of {', '.join(ENGINES)} [all]")
    args = ap.parse_args(argv)
    if args.stage == "record":
        return record(args.fresh, args.threads)
    if not args.engines or set(args.engines) - set(ENGINES):
        ap.error(f"--engines: choose from {', '.join(ENGINES)}")
    return predict(args.engines)


if __name__ == "__main__":
    sys.exit(main())
