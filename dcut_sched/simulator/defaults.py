"""Default inputs and run lengths of the simulator, in one place.

The default trace and cost curve are files shipped in the repository, given relative to its root, so
``dcut-sim`` with no arguments runs the project's main table. A missing default file is reported by
the CLI (exit 2) with the flag that replaces it.
"""

from __future__ import annotations

from pathlib import Path

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
    "REPO_ROOT",
    "default_path",
]

#: The repository root (the folder holding ``dcut_sched/``).
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Default acceptance trace, relative to :data:`REPO_ROOT`.
DEFAULT_TRACE = "traces/dflash-qwen3-8b-gsm8k-b16.parquet"
#: The published protocol's five benchmarks (mean speedup over them): the main job of ``dcut-sim``.
DEFAULT_TRACES = tuple(
    f"traces/dflash-qwen3-8b-{benchmark}-b16.parquet"
    for benchmark in ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")
)
#: Default cost curve, relative to :data:`REPO_ROOT`.
DEFAULT_COST = "profiler/profiles/h20-qwen3-8b-published.json"

#: Batch sizes of the default table.
DEFAULT_BATCH_SIZES = (4, 8, 16, 32, 64)
#: Closed loop: engine steps simulated per (policy, batch size), warm-up included.
DEFAULT_NUM_STEPS = 1500
#: Closed loop: leading steps left out of the steady-state figures.
DEFAULT_WARMUP_STEPS = 200
#: The main job (several benchmarks): the published comparison (DFlash = full, D-Cut = dcut), the
#: project's fine and the oracle bound; ``--policies all`` runs every registered policy.
DEFAULT_BENCHMARK_POLICIES = ("ar", "full", "dcut", "fine", "oracle")
#: The main job: steps per (benchmark, policy, batch size), warm-up included; shorter than a single
#: trace's run so the five-benchmark table stays interactive (the mean over five benchmarks averages
#: out much of the shorter run's noise; see docs/simulator.md).
DEFAULT_BENCHMARK_STEPS = 800
#: The main job: leading steps left out per run.
DEFAULT_BENCHMARK_WARMUP_STEPS = 100
#: Batch size of the selection curve (the published figure uses 64).
DEFAULT_SELECTION_BATCH_SIZE = 64


def default_path(relative: str) -> Path:
    """``REPO_ROOT / relative``: where a default input file lives."""
    return REPO_ROOT / relative
