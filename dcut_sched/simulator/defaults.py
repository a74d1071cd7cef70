"""Default inputs and run lengths of the simulator, in one place.

The default traces and cost curve are shipped package data, named here and found with
:mod:`dcut_sched.paths`, so ``dcut-sim`` with no arguments runs the project's main table from a
checkout or an installed wheel alike. A missing default file is reported by the CLI (exit 2) with the
flag that replaces it.
"""

from __future__ import annotations

from pathlib import Path

from ..paths import profile_path, trace_path

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_BENCHMARK_POLICIES",
    "DEFAULT_BENCHMARK_STEPS",
    "DEFAULT_BENCHMARK_WARMUP_STEPS",
    "DEFAULT_COST",
    "DEFAULT_NUM_STEPS",
    "DEFAULT_SELECTION_BATCH_SIZE",
    "DEFAULT_TRACE",
    "DEFAULT_TRACES",
    "DEFAULT_WARMUP_STEPS",
    "default_cost_path",
    "default_trace_path",
]

#: Default acceptance trace: a shipped trace's name (:func:`dcut_sched.paths.trace_path`).
DEFAULT_TRACE = "dflash-qwen3-8b-gsm8k-b16.parquet"
#: The published protocol's five benchmarks (mean speedup over them): the main job of ``dcut-sim``.
DEFAULT_TRACES = tuple(
    f"dflash-qwen3-8b-{benchmark}-b16.parquet"
    for benchmark in ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")
)
#: Default cost curve: a shipped curve's name (:func:`dcut_sched.paths.profile_path`).
DEFAULT_COST = "h20-qwen3-8b-published.json"

#: Batch sizes of the default table.
DEFAULT_BATCH_SIZES = (4, 8, 16, 32, 64)
#: Closed loop: engine steps simulated per (policy, batch size), warm-up included.
DEFAULT_NUM_STEPS = 1500
#: Closed loop: leading steps left out of the steady-state figures.
DEFAULT_WARMUP_STEPS = 200
#: The main job (several benchmarks): the published comparison (DFlash = full, D-Cut = dcut), the
#: project's fine and oracle (knows the acceptance, always drafts); ``--policies all`` runs every registered policy.
DEFAULT_BENCHMARK_POLICIES = ("ar", "full", "dcut", "fine", "oracle")
#: The main job: steps per (benchmark, policy, batch size), warm-up included; shorter than a single
#: trace's run so the five-benchmark table stays interactive (the mean over five benchmarks averages
#: out much of the shorter run's noise; see docs/simulator.md).
DEFAULT_BENCHMARK_STEPS = 800
#: The main job: leading steps left out per run.
DEFAULT_BENCHMARK_WARMUP_STEPS = 100
#: Batch size of the selection curve (the published figure uses 64).
DEFAULT_SELECTION_BATCH_SIZE = 64


def default_trace_path(name: str = DEFAULT_TRACE) -> Path:
    """Where shipped trace ``name`` lives (checkout or installed package)."""
    return trace_path(name)


def default_cost_path(name: str = DEFAULT_COST) -> Path:
    """Where shipped cost curve ``name`` lives (checkout or installed package)."""
    return profile_path(name)
