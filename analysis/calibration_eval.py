"""How well raw vs. online-calibrated draft confidences predict acceptance on a recorded trace.

Splits the trace's requests in two halves (seeded): the calibrator observes the first half's steps
in order (as ``RatioController.observe`` would, every slot verified), then on the second half it is
scored against the true outcomes:

- ``ece``: expected calibration error (15 bins) of ``P(draft t accepted | drafts < t accepted)``
  over the observed slots (every slot up to and including the first rejection);
- ``nll``: mean Bernoulli negative log-likelihood of the same outcomes (``scipy.special.xlogy``);
- ``tokens_mae``: per step, |expected tokens - actual tokens| with all B slots verified, where
  expected = sum of slot scores (docs/design.md §1) and actual = 1 + accept_len.

Rows: ``raw`` (identity), ``pooled`` (one map for all depths) and ``banded`` (default depth bands).
The trace's ``accept_len`` must be exact (position-indexed, or step-indexed with full verification,
e.g. ``dcut-engine --policy full --trace FILE``).

    PYTHONPATH=. python analysis/calibration_eval.py --trace smollm2-full-b8.parquet --out calib.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import xlogy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcut_sched.calibration import OnlineCalibrator, censored_outcomes, expected_calibration_error  # noqa: E402
from dcut_sched.scores import slot_scores  # noqa: E402
from dcut_sched.traces import Trace  # noqa: E402
from dcut_sched.util.tables import show_table  # noqa: E402


def evaluate(name, transform, conf, accept_len, block):
    lengths = np.full(len(conf), block)
    observed, accepted = censored_outcomes(accept_len, lengths, block - 1)
    p = np.clip(transform(conf), 1e-6, 1 - 1e-6)
    y = accepted[observed].astype(np.float64)
    q = p[observed]
    nll = float(-np.mean(xlogy(y, q) + xlogy(1 - y, 1 - q)))
    expected = slot_scores(transform(conf), validate=False).sum(1)
    return {
        "map": name,
        "ece": round(expected_calibration_error(q, y), 4),
        "nll": round(nll, 4),
        "tokens_mae": round(float(np.mean(np.abs(expected - (1 + accept_len)))), 4),
        "mean_expected_tokens": round(float(expected.mean()), 3),
        "mean_actual_tokens": round(float((1 + accept_len).mean()), 3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True, help="trace Parquet with exact accept_len")
    ap.add_argument("--seed", type=int, default=0, help="seed of the request split (default 0)")
    ap.add_argument("--out", help="write the table (.csv, .parquet or .json)")
    args = ap.parse_args(argv)
    trace = Trace.load(args.trace)
    block = trace.block_size
    rng = np.random.default_rng(args.seed)
    ids = trace.request_ids.copy()
    rng.shuffle(ids)
    fit_ids = set(ids[: len(ids) // 2].tolist())
    fit = np.isin(trace.request_id, list(fit_ids))
    conf, accept = trace.conf.astype(np.float64), trace.accept_len.astype(np.int64)
    maps = {"raw": lambda c: c}
    for name, bands in (("pooled", None), ("banded", (1, 2, 4, 8))):
        cal = OnlineCalibrator(block, depth_bands=bands, refit_every=64)
        rows = np.flatnonzero(fit)
        for start in range(0, len(rows), 8):  # steps of 8 requests, in trace order
            r = rows[start : start + 8]
            cal.observe(conf[r], accept[r], np.full(len(r), block))
        cal.refit()
        maps[name] = cal.transform
    table = pd.DataFrame([evaluate(n, f, conf[~fit], accept[~fit], block) for n, f in maps.items()])
    table.insert(0, "test_rows", int((~fit).sum()))
    table.insert(0, "fit_rows", int(fit.sum()))
    print(f"trace {args.trace}: B={block}, {trace.num_requests} requests, {trace.num_rows} rows, "
          f"indexing={trace.indexing}, censored={trace.metadata.get('accept_len_censored', 'false')}")
    show_table(table, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
