"""Simulator speed: the main job's goals, request-steps per second per policy, the default-table time.

    PYTHONPATH=. python analysis/bench_sim.py                       # goals + synthetic DFlash-like inputs
    PYTHONPATH=. python analysis/bench_sim.py --trace T --cost C    # your files
    PYTHONPATH=. python analysis/bench_sim.py --main-job-only       # the goals alone (README block)

**The main job's goals** (``dcut-sim`` with no arguments: 5 benchmarks x 5 policies x 5 batch sizes,
measured first, on the machine as it is; run it on a quiet one for figures to quote):

- >= 400k simulated request-steps per second per core on the five-benchmark job: the job run in
  this process with ``jobs=1``, request-steps (warm-up included) over the process's CPU seconds;
- ``dcut-sim --quiet`` as a user runs it (a new process, imports included, ``--jobs`` = the usable
  cores) in <= 5 s wall on 2 cores, median of ``--repeats`` runs;
- <= 8 s of CPU in total for it (the process and its workers, from ``RUSAGE_CHILDREN``).

The figures, the 1-minute load before and after, the cores and the date go to
``analysis/results/bench_sim.json`` and the README's ``<!-- generated:main-job-time -->`` block
(``--readme-only`` rewrites the block from the saved file).

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
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dcut_sched import CostCurve, policies
from dcut_sched.simulator import run_closed_loop, simulate
from dcut_sched.simulator.defaults import DEFAULT_BATCH_SIZES, DEFAULT_NUM_STEPS, DEFAULT_WARMUP_STEPS
from dcut_sched.traces import Trace
from dcut_sched.util.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "analysis" / "results" / "bench_sim.json"
GOALS = {"request_steps_per_core_s": 400_000, "wall_s": 5.0, "cpu_s": 8.0}
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


def protocol_rate() -> dict:
    """The five-benchmark job in this process, one core: simulated request-steps per CPU second."""
    from dcut_sched.simulator import defaults as d
    from dcut_sched.simulator.protocol import simulate_benchmarks

    cpu0, wall0 = time.process_time(), time.perf_counter()
    df = simulate_benchmarks([str(d.default_trace_path(t)) for t in d.DEFAULT_TRACES], str(d.default_cost_path()),
                             policies=list(d.DEFAULT_BENCHMARK_POLICIES), num_steps=d.DEFAULT_BENCHMARK_STEPS,
                             warmup_steps=d.DEFAULT_BENCHMARK_WARMUP_STEPS, jobs=1)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    request_steps = int(((df["steps"] + df["warmup_steps"]) * df["batch_size"]).sum())
    return {"runs": len(df), "request_steps": request_steps, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "request_steps_per_core_s": round(request_steps / cpu)}


def dcut_sim_runs(repeats: int, jobs: int | None = None) -> dict:
    """``dcut-sim --quiet`` in new processes, as a user runs it: wall and CPU (process and workers)."""
    cmd = [sys.executable, "-m", "dcut_sched.cli.sim", "--quiet"] + ([] if jobs is None else ["--jobs", str(jobs)])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    walls, cpus = [], []
    for _ in range(repeats):
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
        walls.append(time.perf_counter() - t0)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime))
    med = sorted(range(repeats), key=lambda i: walls[i])[repeats // 2]
    return {"command": "dcut-sim --quiet" + ("" if jobs is None else f" --jobs {jobs}"), "repeats": repeats,
            "wall_s": round(walls[med], 2), "cpu_s": round(cpus[med], 2),
            "wall_s_all": [round(w, 2) for w in walls], "cpu_s_all": [round(c, 2) for c in cpus]}


def main_job(repeats: int) -> dict:
    """Every main-job figure, with the load around them (see the module docstring)."""
    from dcut_sched.simulator.parallel import usable_cores

    load0 = os.getloadavg()
    rate = protocol_rate()
    default = dcut_sim_runs(repeats)
    serial = dcut_sim_runs(repeats, jobs=1)
    load1 = os.getloadavg()
    met = {"request_steps_per_core_s": rate["request_steps_per_core_s"] >= GOALS["request_steps_per_core_s"],
           "wall_s": default["wall_s"] <= GOALS["wall_s"], "cpu_s": default["cpu_s"] <= GOALS["cpu_s"]}
    return {"one_core": rate, "dcut_sim": default, "dcut_sim_serial": serial, "goals": GOALS, "met": met,
            "usable_cores": usable_cores(), "load_before": [round(x, 2) for x in load0],
            "load_after": [round(x, 2) for x in load1],
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "python": sys.version.split()[0], "machine": platform.machine()}


def readme_block(r: dict) -> str:
    """The README line of the main job's time, from :func:`main_job`'s figures."""
    d, s, one = r["dcut_sim"], r["dcut_sim_serial"], r["one_core"]
    verdict = "; ".join(f"{k} {'met' if ok else 'missed'}" for k, ok in r["met"].items())
    return (f"`dcut-sim` (the main job, {one['runs']} runs) takes **{d['wall_s']:.1f} s wall and {d['cpu_s']:.1f} s "
            f"of CPU** on {r['usable_cores']} cores ({s['wall_s']:.1f} s wall with `--jobs 1`); one core simulates "
            f"{one['request_steps_per_core_s'] / 1e3:.0f}k request-steps per CPU second. Median of {d['repeats']} "
            f"runs, 1-min load {r['load_before'][0]} before and {r['load_after'][0]} after ({r['measured_at']}; "
            f"goals {verdict}; `python analysis/bench_sim.py --main-job-only` regenerates this line).")


def write_main_job(r: dict) -> None:
    sys.path.insert(0, str(ROOT / "analysis"))
    from readme_blocks import replace_block

    atomic_write_text(RESULT, json.dumps(r, indent=2) + "\n")
    for path in (ROOT / "README.md", ROOT / "docs" / "simulator.md"):
        replace_block("main-job-time", readme_block(r), path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", help="trace file (default: synthetic, built in code)")
    p.add_argument("--cost", help="cost curve file (default: analytic, built in code)")
    p.add_argument("--steps", type=int, default=2000, help="steps per timed run (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="dcut-sim runs per figure, median (default: %(default)s)")
    p.add_argument("--main-job-only", action="store_true", help="only the main job's goals")
    p.add_argument("--readme-only", action="store_true", help="rewrite the README block from the saved figures")
    p.add_argument("--out", help="write the per-policy figures as JSON")
    args = p.parse_args(argv)
    if args.readme_only:
        write_main_job(json.loads(RESULT.read_text()))
        return 0
    r = main_job(args.repeats)
    print(json.dumps(r, indent=2))
    write_main_job(r)
    if args.main_job_only:
        return 0 if all(r["met"].values()) else 1

    from rich.table import Table

    from dcut_sched.util.console import make_console

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
