"""Overhead of ``RatioController.plan()`` per engine step, against the step time it plans for.

For each batch size (default 4, 16, 64), B = 16, each policy (default dcut, fine, topk) and each
input kind (numpy, CPU torch; CUDA torch when available), times ``plan(conf)`` on random DFlash-like
confidences (Beta(4, 1), seeded) with ``timeit`` (best of ``--repeats`` runs of ``--number`` calls),
with and without online calibration; a policy that reads ``remaining`` (``fine``) is timed a third way,
as a draining batch (``plan(conf, remaining=...)``, each request 1..64 tokens from its end, seeded:
the plan a finite wave runs every step once nothing waits). The simulated step it is compared with is the published Qwen3-8B
H20 verification curve of docs/design.md §4 (D-Cut buckets at rho = 0.25/0.5/0.75/1.0, linear between
them): ``overhead_pct = plan_us / C_verify(bs, K of the plan)``, verify time only (no draft), so the
percentage is an upper bound.

Yardstick: for ``dcut`` (the published decision) every row also times :func:`minimal_dcut`, a minimal
independent numpy implementation of the same decision written here from the formulas alone (cumprod
of the confidences, one ``np.partition`` for all bucket budgets, per-row counts with exact tie
handling), checks that it returns the same lengths, and reports ``ratio = plan_us / yardstick_us``:
what the controller's generality (sanitising, calibration hook, registry, plan object) costs. The two
are timed interleaved, so machine load moves both. Goals: ratio <= 1.3 at bs 4, 16 and 64, and at
bs 64 <= 35 us numpy / <= 45 us CPU torch on a quiet machine.

    PYTHONPATH=. python analysis/bench_controller.py --out analysis/bench_controller.csv
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcut_sched import CostCurve, RatioController, policies  # noqa: E402
from dcut_sched.util.tables import write_table  # noqa: E402

B = 16
H20_CURVE = Path(__file__).resolve().parents[1] / "dcut_sched" / "profiler" / "profiles" / "h20-qwen3-8b-published.json"


def h20_curve() -> CostCurve:
    """The shipped published Qwen3-8B / H20 curve (docs/design.md §4: 20 verify cells, 5 AR steps)."""
    return CostCurve.load(H20_CURVE, check_hardware=False)


def minimal_dcut(conf: np.ndarray, ks: np.ndarray, verify_ms: np.ndarray) -> np.ndarray:
    """The D-Cut bucket decision from scratch: ``[bs, B-1]`` confidences -> ``[bs]`` lengths.

    ``s = [1, cumprod(conf)]``; ``E_q`` = sum of the top-``K_q`` scores (one partition at every
    ``K_q - 1``); ``q* = argmax E_q / C_verify(bs, K_q)``; lengths = per-row counts of scores above
    the ``K``-th largest, ties at it filled slot-major (earlier slot, then lower request).
    """
    bs = conf.shape[0]
    scores = np.empty((bs, conf.shape[1] + 1), dtype=conf.dtype)
    scores[:, 0] = 1
    np.cumprod(conf, axis=1, out=scores[:, 1:])
    part = np.partition(-scores.ravel(), ks - 1)
    expected = -np.cumsum(part, dtype=np.float64)[ks - 1]
    k = int(ks[int(np.argmax(expected / verify_ms))])
    v = -part[k - 1]
    lengths = (scores > v).sum(axis=1)
    need = k - int(lengths.sum())
    _, rows = np.nonzero((scores == v).T)
    return lengths + np.bincount(rows[:need], minlength=bs)


def bench(curve, policy, bs, kind, calibrate, number, repeats, seed, draining=False):
    rng = np.random.default_rng(seed)
    conf_np = rng.beta(4.0, 1.0, size=(bs, B - 1)).astype(np.float32)
    if kind == "numpy":
        conf = conf_np
    else:
        conf = torch.from_numpy(conf_np).to("cuda" if kind == "cuda" else "cpu")
    ctrl = RatioController(curve, B, policy=policy, calibrate=calibrate)
    remaining = rng.integers(1, 65, size=bs) if draining else None
    plan = ctrl.plan(conf, remaining=remaining)  # warm-up: caches the policy's candidate table
    if calibrate:  # a fitted (non-identity) map, as in steady state
        for _ in range(8):
            p = ctrl.plan(conf)
            accept = np.minimum(rng.integers(0, B, size=bs), np.asarray(p.lengths.tolist()) - 1)
            ctrl.observe(accept if kind == "numpy" else torch.as_tensor(accept, device=conf.device))
        ctrl.calibrator.refit()

    def step():
        ctrl.plan(conf, remaining=remaining)
        if kind == "cuda":
            torch.cuda.synchronize()

    yard = None
    if policy == "dcut":
        ks = ctrl.policy.budgets(bs, B)
        verify_ms = np.asarray(curve.verify_ms(bs, ks), dtype=np.float64)
        if not calibrate:  # same decision, checked (calibrated confidences differ by design)
            assert np.asarray(plan.lengths).tolist() == minimal_dcut(conf_np, ks, verify_ms).tolist()

        def yard():
            minimal_dcut(conf_np, ks, verify_ms)

    plan_runs, yard_runs = [], []
    for _ in range(repeats):  # interleaved, so load changes hit both
        plan_runs.append(timeit.Timer(step).timeit(number))
        if yard is not None:
            yard_runs.append(timeit.Timer(yard).timeit(number))
    # best run: on a shared machine the minimum is the least disturbed estimate of both
    plan_us = min(plan_runs) / number * 1e6
    yard_us = min(yard_runs) / number * 1e6 if yard_runs else float("nan")
    step_ms = curve.verify_ms(bs, plan.num_tokens)
    return {
        "policy": policy, "batch_size": bs, "kind": kind, "calibrate": calibrate, "draining": draining,
        "plan_us": round(plan_us, 1), "yardstick_us": round(yard_us, 1),
        "ratio": round(plan_us / yard_us, 2) if yard_runs else float("nan"),
        "num_tokens": plan.num_tokens, "verify_ms": round(step_ms, 2),
        "overhead_pct": round(100 * plan_us / (step_ms * 1e3), 3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="4,16,64", help="comma-separated (default 4,16,64)")
    ap.add_argument("--policies", default="dcut,fine,topk", help="comma-separated registry names")
    ap.add_argument("--number", type=int, default=200, help="calls per timing run (default 200)")
    ap.add_argument("--repeats", type=int, default=15, help="timing runs; the best is reported (default 15)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the table (.csv, .parquet or .json)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    kinds = ["numpy", "torch-cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    curve = h20_curve()
    rows = []
    for policy in args.policies.split(","):
        for bs in (int(b) for b in args.batch_sizes.split(",")):
            for kind in kinds:
                for calibrate in (False, True):
                    rows.append(bench(curve, policy, bs, kind, calibrate, args.number, args.repeats, args.seed))
                if policies.get(policy).reads_remaining:
                    rows.append(bench(curve, policy, bs, kind, False, args.number, args.repeats, args.seed, True))
    frame = pd.DataFrame(rows)
    from rich.table import Table

    from dcut_sched.util.console import make_console

    table = Table(title=f"RatioController.plan() overhead, B={B} (best of {args.repeats} x {args.number} calls)")
    for col in frame.columns:
        table.add_column(col, justify="right")
    for row in frame.itertuples(index=False):
        table.add_row(*[str(v) for v in row])
    make_console().print(table)
    print(f"machine load (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    # Machine-load reference: the one sort every global top-K plan does, timed alone.
    x = -np.random.default_rng(args.seed).random(64 * B).astype(np.float32)
    sort_us = min(timeit.Timer(lambda: np.argsort(x, kind="stable")).repeat(repeat=args.repeats, number=args.number))
    print(f"reference: numpy stable argsort of {64 * B} float32 = {sort_us / args.number * 1e6:.1f} us "
          f"(scale the figures above by how much slower this is than on your machine)")
    if args.out:
        write_table(frame, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
