"""``dcut-sim``'s outputs: the tables on screen and the ``--out`` / ``--plot`` files.

The rows written to ``--out`` carry the run settings they do not hold themselves
(:func:`with_settings`); ``--out`` and ``--plot`` are written together or not at all, and each
written file is named on stderr (stdout stays the table).
"""

from __future__ import annotations

import math
import sys
from typing import Any

PROG = "dcut-sim"
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
TABLE_SUFFIXES = (".csv", ".parquet", ".json")


def report_tables(args, console, df, traces: list[str], costs: list[str], benchmarks: bool) -> None:
    """Report: the benchmarks' mean table (and the open-loop one), or one table per trace and curve."""
    from .render import render_benchmarks, render_open_benchmarks, render_runs

    if args.quiet:
        return
    if benchmarks:
        render_benchmarks(df, console, args, costs[0], PROG)
        if args.mode == "open":
            render_open_benchmarks(df, console, len(traces), PROG)
    else:
        render_runs(df, console, args, traces, costs, PROG)


#: The run settings that change results and that the simulator's rows do not hold themselves
#: (``--param`` values are in the policy label, e.g. ``uniform(rho=0.25)``); :func:`with_settings`
#: adds them to the rows written to ``--out``.
SETTING_COLUMNS = ("calibrate", "overhead_ms", "shuffle", "graph_tokens")
OPEN_SETTING_COLUMNS = ("requests", "slo_tpot_ms")


def with_settings(df, args):
    """The rows as ``--out`` holds them: ``df`` plus a column for each setting of
    :data:`SETTING_COLUMNS` (and, open loop, :data:`OPEN_SETTING_COLUMNS`), so a row says how it
    was produced: ``calibrate`` (``--calibrate``), ``overhead_ms``, ``shuffle`` (false with
    ``--no-shuffle``), ``graph_tokens`` (``--graph-tokens`` as ``64,128``; ``all``: every budget),
    ``requests`` and ``slo_tpot_ms`` (NaN: none). The same values go into the frame's ``attrs``.
    The table on screen is drawn from ``df`` and does not change."""
    out = df.copy()
    settings: dict[str, Any] = {
        "calibrate": bool(args.calibrate), "overhead_ms": float(args.overhead_ms), "shuffle": not args.no_shuffle,
        "graph_tokens": ",".join(str(n) for n in args.graph_tokens) if args.graph_tokens else "all"}
    if args.mode == "open":
        settings.update(requests=int(args.requests),
                        slo_tpot_ms=math.nan if args.slo_tpot_ms is None else float(args.slo_tpot_ms))
    for column, value in settings.items():
        if column not in out.columns:
            out[column] = value
    out.attrs = {**df.attrs, **settings}
    if args.mode == "open" and args.slo_tpot_ms is None:
        out.attrs["slo_tpot_ms"] = None
    return out


def write_outputs(args, df, traces: list[str], costs: list[str], benchmarks: bool) -> None:
    """Write: ``--out`` (the rows with their settings, :func:`with_settings`) and ``--plot``,
    together or not at all; then say what was written."""
    from ..simulator import benchmark_table, plot_speedup, write_frame
    from ..simulator.plot import describe_inputs
    from ..util.atomic import all_or_none

    with all_or_none():  # --out and --plot appear together or not at all
        if args.out:
            write_frame(with_settings(df, args), args.out)
        if args.plot and benchmarks:
            mean = benchmark_table(df).drop(columns="geomean").stack().rename("speedup_vs_ar").reset_index()
            mean.attrs = dict(df.attrs)
            plot_speedup(mean, args.plot, title=f"{args.mode} loop: mean speedup over {len(traces)} benchmarks "
                                                 f"vs ar\ncost {describe_inputs(df).partition('cost ')[2] or costs[0]}")
        elif args.plot:
            plot_speedup(df, args.plot)
    if args.out:
        rows = "trace, " if benchmarks else ("trace, cost, " if args.sweep else "")
        wrote(args.out, f"{len(df)} rows, one per ({rows}policy, batch size)")
    if args.plot:
        wrote(args.plot, "speedup plot")

def wrote(path: str, what: str) -> None:
    """Say which file a run wrote (stderr, so stdout stays the table; also with --quiet)."""
    print(f"{PROG}: wrote {path} ({what})", file=sys.stderr)
