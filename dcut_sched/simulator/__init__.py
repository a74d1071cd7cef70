"""Discrete-event simulator: replays acceptance traces under every policy with a measured cost curve.

>>> import dcut_sched as d
>>> df = d.simulate("traces/x.parquet", "profiler/profiles/y.json", batch_sizes=[4, 16, 64])  # doctest: +SKIP

Modules: ``replay`` (vectorised trace cursor), ``step_cost`` (step times from the cost curve),
``engine`` (simpy processes, closed and open loop), ``results`` (figures and the DataFrame),
``simulate`` (the public entry point), ``selection_curve``, ``sweep`` (parallel sweeps), ``plot``,
``output`` (result files), ``defaults`` (default inputs). See docs/simulator.md.
"""

from .defaults import DEFAULT_BATCH_SIZES, DEFAULT_COST, DEFAULT_TRACE
from .engine import Calibrator, ClosedLoopRun, OpenLoopRun, StepRecord, run_closed_loop, run_open_loop
from .output import check_output_path, write_frame
from .plot import plot_selection_curve, plot_speedup
from .replay import ReplayBatch, RequestFeed, output_lengths
from .results import seed_spread, speedup_table
from .selection_curve import selection_curve
from .simulate import SimulationError, check_simulation, resolve_policies, simulate
from .step_cost import StepCosts
from .sweep import sweep, sweep_job

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_COST",
    "DEFAULT_TRACE",
    "Calibrator",
    "ClosedLoopRun",
    "OpenLoopRun",
    "ReplayBatch",
    "RequestFeed",
    "SimulationError",
    "StepCosts",
    "StepRecord",
    "check_output_path",
    "check_simulation",
    "output_lengths",
    "plot_selection_curve",
    "plot_speedup",
    "resolve_policies",
    "run_closed_loop",
    "run_open_loop",
    "selection_curve",
    "simulate",
    "seed_spread",
    "speedup_table",
    "sweep",
    "sweep_job",
    "write_frame",
]
