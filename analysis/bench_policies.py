"""Time one policy decision (``plan``) per policy, batch size and array backend.

Usage: python analysis/bench_policies.py [--batch-sizes 4,16,64] [--block-size 16] [--json out.json]

Goal: one ``dcut`` and one ``fine`` decision at bs=64, B=16 in <= 50 us with
numpy. The cost curve is a synthetic linear one built in memory (lookups are cached per shape, as in
a serving loop); confidences are random Beta draws, fixed per run.
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
import pandas as pd
import torch
from rich.table import Table

import dcut_sched as d
from dcut_sched.step_costs import StepCosts
from dcut_sched.util.console import make_console
from dcut_sched.util.tables import write_table


def linear_curve(batch_sizes, block_size):
    verify = [
        {"batch_size": bs, "num_tokens": k, "median_ms": 5.0 + 0.05 * k}
        for bs in batch_sizes
        for k in range(bs, bs * block_size + 1)
    ]
    draft = [{"batch_size": bs, "median_ms": 1.0 + 0.01 * bs} for bs in batch_sizes]
    return d.CostCurve(hardware={"backend": "analytic", "device_name": "bench"}, model={"name": "bench"},
                       block_size=block_size, context_len=0, verify=verify, draft=draft)


def time_us(fn, repeat: int = 7, number: int = 200) -> float:
    """Best-of-``repeat`` mean time of one call, in microseconds."""
    return min(timeit.repeat(fn, repeat=repeat, number=number)) / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="4,16,64")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--policies", default="dcut,fine,topk,full")
    ap.add_argument("--json", help="also write the figures here (.json; .csv and .parquet also work)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    curve = linear_curve(sizes, args.block_size)
    costs = StepCosts(curve, args.block_size)  # what a policy plans with (built once, as the controller does)
    rng = np.random.default_rng(0)
    rows = []
    for bs in sizes:
        conf_np = rng.beta(4, 1, size=(bs, args.block_size - 1))
        conf_t = torch.as_tensor(conf_np, dtype=torch.float32)
        for name in args.policies.split(","):
            for backend, conf in (("numpy", conf_np), ("torch-cpu", conf_t)):
                policy = d.policies.get(name)
                policy.plan(conf, costs)  # warm the per-shape caches
                rows.append({"policy": name, "batch_size": bs, "backend": backend,
                             "us_per_plan": time_us(lambda: policy.plan(conf, costs)),
                             "us_per_plan_unvalidated": time_us(lambda: policy.plan(conf, costs, validate=False))})
    table = Table(title=f"plan() time, B={args.block_size}, 1 thread (best of 7 x 200 calls)")
    for col in ("policy", "batch size", "backend", "us / plan", "us / plan (validate=False)"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["policy"], str(r["batch_size"]), r["backend"], f"{r['us_per_plan']:.1f}",
                      f"{r['us_per_plan_unvalidated']:.1f}")
    make_console().print(table)
    if args.json:
        write_table(pd.DataFrame(rows), args.json)


if __name__ == "__main__":
    main()
