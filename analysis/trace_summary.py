"""Print a Markdown summary of trace files (tau, per-depth acceptance, ECE, size, recording time).

Usage: PYTHONPATH=. python analysis/trace_summary.py dcut_sched/data/traces/*.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dcut_sched.traces import Trace
from dcut_sched.traces.stats import trace_stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--depths", type=int, default=8, help="per-depth acceptance columns to show")
    args = ap.parse_args()
    head = ["file", "B", "requests", "positions", "tau", "tau/pos", "ECE",
            "P(accept t | t-1), t = 1.." + str(args.depths), "record s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for f in args.files:
        t = Trace.load(f)
        s = trace_stats(t)
        rates = " ".join("-" if r is None else f"{r:.2f}" for r in s["accept_rate_by_depth"][: args.depths])
        rec = t.metadata.get("record_seconds", "")
        print(f"| {Path(f).name} | {s['block_size']} | {s['num_requests']} | {s['num_positions']} | {s['tau']:.2f} | "
              f"{s['tau_per_position']:.2f} | {s['ece']:.3f} | {rates} | {rec} |")


if __name__ == "__main__":
    main()
