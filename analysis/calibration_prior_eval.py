"""ECE by depth of a drafter's calibration prior on a recorded trace: raw, the prior, and the online
calibrator started from the prior (scored before it sees each step: prequential).

Every position of a position-indexed trace is a fully verified block (its ``accept_len`` is exact);
the reached slots (drafts before them all accepted, the output long enough) are scored, as
``dcut_sched.traces.stats.calibration_by_depth`` does. The prior is fitted on the drafter's training
prompts (``dcut-drafter calibrate``), the shipped traces on held-out ones, so this is held-out
evidence. The online column feeds :class:`dcut_sched.calibration.LogisticCalibrator` the rows in
request order, ``--batch-size`` at a time, every slot verified, and scores each chunk before
observing it.

    PYTHONPATH=. python analysis/calibration_prior_eval.py \\
        --trace dcut_sched/data/traces/smollm2-135m-dflash-b16.parquet \\
        --prior drafters/smollm2-135m-dflash/calibration.json [--out table.csv]

Prints one row per depth (reached slots, acceptance, mean confidence raw / prior / online, ECE raw /
prior / online) and an ``all`` row with the log-loss; ``--out`` writes the table (.csv/.json/.parquet).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcut_sched.calibration import (  # noqa: E402
    CalibrationPrior,
    LogisticCalibrator,
    calibration_report,
    expected_calibration_error,
    reached_slots,
)
from dcut_sched.traces import Trace  # noqa: E402
from dcut_sched.util.tables import show_table  # noqa: E402


def slots_left(trace: Trace) -> np.ndarray:
    """Per row, the draft slots that lie inside the request's output (as traces/stats.py counts them)."""
    return (np.repeat(trace.starts + trace.num_positions, trace.num_positions) - np.arange(trace.num_rows) - 1)


def online_predictions(trace: Trace, prior: CalibrationPrior, batch_size: int) -> np.ndarray:
    """Each row's calibrated confidences from a LogisticCalibrator that has seen only earlier rows."""
    cal = LogisticCalibrator(trace.block_size, prior=prior)
    conf = trace.conf.astype(np.float64)
    lengths = np.minimum(trace.block_size, slots_left(trace) + 1).clip(min=1)
    out = np.empty_like(conf)
    for i in range(0, len(conf), batch_size):
        c = conf[i:i + batch_size]
        out[i:i + batch_size] = cal.transform(c)
        cal.observe(c, trace.accept_len[i:i + batch_size].astype(np.int64), lengths[i:i + batch_size])
    return out


def evaluate(trace: Trace, prior: CalibrationPrior, batch_size: int = 16) -> pd.DataFrame:
    """The per-depth table (module docstring)."""
    if not trace.exact_replay:
        raise ValueError(f"{trace.path}: a step-indexed trace has no fully verified block per row; use a "
                         "position-indexed trace")
    slots = slots_left(trace)
    conf, accept = trace.conf.astype(np.float64), trace.accept_len.astype(np.int64)
    rep = calibration_report(conf, accept, slots, prior)
    online = online_predictions(trace, prior, batch_size)
    reached, accepted = reached_slots(accept, conf.shape[1], slots)
    rows = []
    for r in rep["by_depth"]:
        t = r["depth"] - 1
        m = reached[:, t]
        y = accepted[m, t].astype(np.float64)
        rows.append({**r, "mean_online": round(float(online[m, t].mean()), 4),
                     "ece_online": round(expected_calibration_error(online[m, t], y), 4)})
    y = accepted[reached].astype(np.float64)
    p = np.clip(online[reached], 1e-6, 1 - 1e-6)
    rows.append({"depth": "all", "reached": rep["reached"], "acceptance": round(float(y.mean()), 4),
                 "mean_conf": round(float(conf[reached].mean()), 4),
                 "mean_calibrated": round(float(prior.probability(conf)[reached].mean()), 4),
                 "ece_raw": rep["ece_raw"], "ece_calibrated": rep["ece_calibrated"],
                 "mean_online": round(float(online[reached].mean()), 4),
                 "ece_online": round(expected_calibration_error(online[reached], y), 4),
                 "log_loss_raw": rep["log_loss_raw"], "log_loss_calibrated": rep["log_loss_calibrated"],
                 "log_loss_online": round(float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p))), 5)})
    return pd.DataFrame(rows).rename(columns={"mean_calibrated": "mean_prior", "ece_calibrated": "ece_prior",
                                              "log_loss_calibrated": "log_loss_prior"})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True, help="position-indexed trace (.parquet)")
    ap.add_argument("--prior", required=True, help="calibration.json (dcut-drafter calibrate)")
    ap.add_argument("--batch-size", type=int, default=16, help="rows the online calibrator sees per step (16)")
    ap.add_argument("--out", help="write the table (.csv, .json or .parquet)")
    args = ap.parse_args(argv)
    table = evaluate(Trace.load(args.trace), CalibrationPrior.load(args.prior), args.batch_size)
    show_table(table, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
