"""Default inputs and run lengths of the simulator, in one place.

The default trace and cost curve are files shipped in the repository, given relative to its root, so
``dcut-sim`` with no arguments runs the project's main table. A missing default file is reported by
the CLI (exit 2) with the flag that replaces it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_COST",
    "DEFAULT_NUM_STEPS",
    "DEFAULT_SELECTION_BATCH_SIZE",
    "DEFAULT_TRACE",
    "DEFAULT_WARMUP_STEPS",
    "REPO_ROOT",
    "default_path",
]

#: The repository root (the folder holding ``dcut_sched/``).
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Default acceptance trace, relative to :data:`REPO_ROOT`.
DEFAULT_TRACE = "traces/dflash-qwen3-8b-gsm8k-b16.parquet"
#: Default cost curve, relative to :data:`REPO_ROOT`.
DEFAULT_COST = "profiler/profiles/h20-qwen3-8b-published.json"

#: Batch sizes of the default table.
DEFAULT_BATCH_SIZES = (4, 8, 16, 32, 64)
#: Closed loop: engine steps simulated per (policy, batch size), warm-up included.
DEFAULT_NUM_STEPS = 1500
#: Closed loop: leading steps left out of the steady-state figures.
DEFAULT_WARMUP_STEPS = 200
#: Batch size of the selection curve (the published figure uses 64).
DEFAULT_SELECTION_BATCH_SIZE = 64


def default_path(relative: str) -> Path:
    """``REPO_ROOT / relative``: where a default input file lives."""
    return REPO_ROOT / relative
