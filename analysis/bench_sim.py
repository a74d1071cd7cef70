"""Simulator speed: simulated request-steps per second (closed loop, one process) and the default-table time.

    PYTHONPATH=. python analysis/bench_sim.py                       # synthetic DFlash-like inputs
    PYTHONPATH=. python analysis/bench_sim.py --trace T --cost C    # your files
    PYTHONPATH=. python analysis/bench_sim.py --out bench.json

A request-step is one request in one engine step; a closed-loop run of S steps at batch size bs
simulates S * bs of them. The script times, for every policy and batch size of the default table,
one closed-loop run of ``--steps`` steps (wall clock of ``run_closed_loop``, policy planning
included, file loading excluded), then the whole default table through ``dcut_sched.simulate``
(all policies x batch sizes 4, 8, 16, 32, 64 with the default run length).

Without ``--trace/--cost`` it builds its inputs in code so it runs anywhere:

- trace: 400 position-indexed requests of 150..450 tokens, B = 16, confidences ~ Beta(8, 1.2) and a
  draft accepted with probability equal to its confidence (mean acceptance length about 6);
- cost curve: ``analytic``, C_verify(bs, K) linear in K through the public Qwen3-8B / H20 points of
  docs/design.md §4 (rho = 0.25 and 1.0 at bs 4, 16, 64), extended down to K = bs; C_draft = 1.5 + 0.02 bs ms
  (assumed). Only the simulator's speed is measured here, not a speedup claim.

Timings are noisy on a shared machine; run it on an idle one for figures to quote.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np

from dcut_sched import CostCurve, policies
from dcut_sched.atomic import atomic_write_text
from dcut_sched.simulator import run_closed_loop, simulate
from dcut_sched.simulator.defaults import DEFAULT_BATCH_SIZES, DEFAULT_NUM_STEPS, DEFAULT_WARMUP_STEPS
from dcut_sched.traces import Trace

B = 16
# Public H20 / Qwen3-8B verify ms at rho = 0.25 and 1.0 (docs/design.md §4).
PUBLISHED = {4: (8.2, 10.9), 16: (16.0, 35.8), 64: (55.2, 133.9)}


def synthetic_trace(num_requests: int = 400, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    rid, pos, acc, conf = [], [], [], []
    for r in range(num_requests):
        n = int(rng.integers(150, 451))
        c = rng.beta(8.0, 1.2, size=(n, B - 1)).astype(np.float32)
        ok = rng.random((n, B - 1)) < c
        a = np.where(ok.all(1), B - 1, np.argmin(ok, 1))
        a = np.minimum(a, n - 1 - np.arange(n))
        rid.append(np.full(n, r, np.int32))
        pos.append(np.arange(n, dtype=np.int32))
        acc.append(a.astype(np.int8))
        conf.append(c)
    return Trace(np.concatenate(rid), np.concatenate(pos), np.concatenate(acc), np.concatenate(conf),
                 metadata={"indexing": "position", "source": "synthetic", "generator": "analysis/bench_sim.py"})


def analytic_curve() -> CostCurve:
    verify, draft = [], []
    for bs, (lo_ms, hi_ms) in PUBLISHED.items():
        k_lo, k_hi = bs * B // 4, bs * B
        slope = (hi_ms - lo_ms) / (k_hi - k_lo)
        for k in range(bs, k_hi + 1):
            verify.append({"batch_size": bs, "num_tokens": k, "median_ms": lo_ms + slope * (k - k_lo),
                           "provenance": "analytic"})
        draft.append({"batch_size": bs, "median_ms": 1.5 + 0.02 * bs, "provenance": "analytic"})
    return CostCurve(hardware={"device_name": "NVIDIA H20 (published points, linear fit)", "backend": "analytic"},
                     model={"name": "Qwen3-8B", "config": {}}, block_size=B, context_len=0, verify=verify,
                     draft=draft, source="bench_sim.py: linear through docs/design.md §4 public points")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", help="trace file (default: synthetic, built in code)")
    p.add_argument("--cost", help="cost curve file (default: analytic, built in code)")
    p.add_argument("--steps", type=int, default=2000, help="steps per timed run (default: %(default)s)")
    p.add_argument("--out", help="write the figures as JSON")
    args = p.parse_args(argv)

    from dcut_sched.console import make_console
    from rich.table import Table

    trace = Trace.load(args.trace) if args.trace else synthetic_trace()
    cost = CostCurve.load(args.cost, check_hardware=False) if args.cost else analytic_curve()
    console = make_console()
    console.print(f"trace: {trace.describe()}\ncost: {cost!r}")

    names = policies.names()
    rates: dict[str, dict[int, float]] = {n: {} for n in names}
    total_rs, total_s = 0, 0.0
    for bs in DEFAULT_BATCH_SIZES:
        for name in names:
            run_closed_loop(trace, cost, policies.get(name), bs, num_steps=20)  # warm caches
            t0 = time.perf_counter()
            run = run_closed_loop(trace, cost, policies.get(name), bs, num_steps=args.steps)
            dt = time.perf_counter() - t0
            rs = int(run.steps.batch_size.sum())
            rates[name][bs] = rs / dt
            total_rs += rs
            total_s += dt
    table = Table(title=f"simulated request-steps/s, closed loop, one process ({args.steps} steps per run)")
    table.add_column("policy")
    for bs in DEFAULT_BATCH_SIZES:
        table.add_column(f"bs {bs}", justify="right")
    for name in names:
        table.add_row(name, *[f"{rates[name][bs]:,.0f}" for bs in DEFAULT_BATCH_SIZES])
    console.print(table)
    overall = total_rs / total_s
    console.print(f"all runs together: {total_rs:,} request-steps in {total_s:.2f} s = {overall:,.0f} request-steps/s")

    t0 = time.perf_counter()
    df = simulate(trace, cost)
    table_s = time.perf_counter() - t0
    console.print(
        f"default table (simulate: {len(names)} policies x batch sizes {list(DEFAULT_BATCH_SIZES)}, "
        f"{DEFAULT_NUM_STEPS} steps, {DEFAULT_WARMUP_STEPS} warm-up): {table_s:.2f} s wall, "
        f"{int(df['request_steps'].sum() + DEFAULT_WARMUP_STEPS * len(names) * sum(DEFAULT_BATCH_SIZES)):,} request-steps"
    )
    if args.out:
        doc = {
            "request_steps_per_s": {n: {str(bs): r for bs, r in v.items()} for n, v in rates.items()},
            "overall_request_steps_per_s": overall,
            "default_table_s": table_s,
            "steps_per_run": args.steps,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "processor": platform.processor(),
        }
        atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
