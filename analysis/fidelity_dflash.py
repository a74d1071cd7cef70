"""Simulator fidelity against the real engine with the DFlash block drafter (one command, seconds).

    python analysis/fidelity_dflash.py          # reads analysis/results/bench_engine_dflash.csv

The simulator predicts every run of ``analysis/bench_engine.py`` (policy x bs, the first 8 prompts
of ``dcut_sched/data/traces/prompts.jsonl``, 48 new tokens, B = 16) from:

- the recorded position-indexed trace of the same drafter on the same prompts
  (``dcut_sched/data/traces/smollm2-135m-dflash-b16.parquet``, greedy, so the target's outputs are the engine's),
  cut to the engine's decode steps (``fidelity.engine_matched_trace``: output length
  ``min(48, recorded)``, the prefill's token dropped);
- the CPU cost curve the engine planned with (``dcut_sched/profiler/profiles/cpu-smollm2-135m-dflash-b16.json``).

Each run is ``run_open_loop`` with every request arriving at t = 0, max batch = bs, no shuffle, free
prefill: the engine's own setting. The predicted decode tokens/s (simulated tokens / simulated
decode time; ``oracle`` is priced with a full verification, which is what the engine runs to learn
the acceptance) is compared with the measured one; per run also the phase totals (draft, verify)
against the curve, which is where a mismatch comes from. Writes
``analysis/results/fidelity_dflash.{csv,md,json}``; the measured runs' cpu_share and load come from
the benchmark file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "analysis"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

BENCH = ROOT / "analysis" / "results" / "bench_engine_dflash.csv"
TRACE = ROOT / "dcut_sched" / "data" / "traces" / "smollm2-135m-dflash-b16.parquet"
CURVE = ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-dflash-b16.json"
OUT = ROOT / "analysis" / "results" / "fidelity_dflash"


def main() -> int:
    from fidelity import RECORDED_PARAMS, engine_matched_trace, error_summary, relative_error

    from dcut_sched import policies
    from dcut_sched.cost_curve import CostCurve
    from dcut_sched.simulator import run_open_loop
    from dcut_sched.traces import Trace
    from dcut_sched.util.atomic import all_or_none, atomic_write_text

    bench = pd.read_csv(BENCH)
    settings = json.loads(BENCH.with_suffix(".json").read_text())["settings"]
    nreq, max_new, B = int(settings["num_prompts"]), int(settings["max_new_tokens"]), int(settings["block_size"])
    trace = Trace.load(TRACE)
    out_len = [min(max_new, int(n)) for n in trace.num_positions[:nreq]]
    matched = engine_matched_trace(trace, out_len)
    curve = CostCurve.load(CURVE, check_hardware=False)
    rows = []
    for _, run in bench.iterrows():
        policy, bs = run["policy"], int(run["batch_size"])
        recorded = policies.get(policy, **RECORDED_PARAMS.get(policy, {}))
        sim = run_open_loop(matched, curve, recorded, bs, rate_rps=1.0, num_requests=nreq,
                            shuffle=False, arrival_ms=np.zeros(nreq))
        st = sim.steps
        step_ms = np.asarray(st.step_ms, dtype=float)
        if policy == "oracle":  # the engine verifies the whole block to learn the acceptance, then reuses it
            full_v = np.array([float(curve.verify_ms(int(b), int(b) * B)) for b in st.batch_size])
            own_v = np.array([float(curve.verify_ms(int(b), int(k))) for b, k in zip(st.batch_size, st.num_tokens)])
            step_ms = step_ms + np.where(st.drafted, full_v - own_v, 0.0)
        tokens = int(st.tokens.sum())
        sim_draft = float(np.sum([curve.draft_ms(int(b)) if d else 0.0 for b, d in zip(st.batch_size, st.drafted)]))
        measured = float(run["decode_tokens_per_s"])
        predicted = tokens / step_ms.sum() * 1e3
        rows.append({"policy": policy, "batch_size": bs, "measured_tokens_per_s": measured,
                     "predicted_tokens_per_s": round(predicted, 2),
                     "error": float(relative_error(predicted, measured)),
                     "engine_steps": int(run["steps"]), "sim_steps": len(st),
                     "engine_draft_ms": float(run["draft_ms"]), "sim_draft_ms": round(sim_draft, 1),
                     "engine_verify_plan_ms": float(run["verify_ms"] + run["plan_ms"]),
                     "sim_verify_ms": round(float(step_ms.sum()) - sim_draft, 1),
                     "cpu_share": float(run["cpu_share"]), "load_before": float(run["load_before"])})
    res = pd.DataFrame(rows)
    summ = error_summary(res["error"])
    big = res[res["error"].abs() > 0.10]
    summary = {"tokens_per_s": summ, "runs": len(res), "over_10pct": len(big),
               "median_abs_error": float(res["error"].abs().median()),
               "steps_match": bool((res["engine_steps"] == res["sim_steps"]).all()),
               "step_mismatch_runs": res.loc[res["engine_steps"] != res["sim_steps"], ["policy", "batch_size"]].values.tolist(),
               "cpu_share_range": [float(res["cpu_share"].min()), float(res["cpu_share"].max())]}
    lines = [f"Simulator vs the real engine with the DFlash drafter: {len(res)} runs (13 policies x bs 1-16), "
             f"median |error| on decode tokens/s **{100 * summary['median_abs_error']:.1f} %** "
             f"({summary['over_10pct']} runs over 10 %); engine and simulator took the same number of steps in "
             f"{int((res['engine_steps'] == res['sim_steps']).sum())} of {len(res)} runs; measured runs' cpu_share "
             f"{summary['cpu_share_range'][0]:.2f}-{summary['cpu_share_range'][1]:.2f}.", "",
             "| policy | bs | measured tok/s | predicted | error | steps engine / sim | draft ms engine / sim | verify+plan ms engine / sim |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res.itertuples():
        lines.append(f"| `{r.policy}` | {r.batch_size} | {r.measured_tokens_per_s:.1f} | {r.predicted_tokens_per_s:.1f} | "
                     f"{100 * r.error:+.1f} % | {r.engine_steps} / {r.sim_steps} | {r.engine_draft_ms:.0f} / "
                     f"{r.sim_draft_ms:.0f} | {r.engine_verify_plan_ms:.0f} / {r.sim_verify_ms:.0f} |")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with all_or_none():
        atomic_write_text(OUT.with_suffix(".csv"), res.to_csv(index=False))
        atomic_write_text(OUT.with_suffix(".json"), json.dumps(summary, indent=2, default=float) + "\n")
        atomic_write_text(OUT.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
