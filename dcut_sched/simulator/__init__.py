"""Discrete-event simulator: replays acceptance traces under every policy with a measured cost curve.

>>> import dcut_sched as d
>>> df = d.simulate("dcut_sched/data/traces/x.parquet", "dcut_sched/profiler/profiles/y.json", batch_sizes=[4, 16, 64])  # doctest: +SKIP

Modules: ``config`` (``SimConfig``, every option, validated once), ``replay`` (vectorised trace
cursor), ``loop`` (simpy processes, closed and open
loop, each step run by the controller's ``StepDriver``), ``results`` (figures and the DataFrame),
``simulate`` (the public entry point), ``protocol`` (several benchmarks, mean speedup over them:
the published protocol), ``selection_curve``, ``sweep`` (parallel sweeps), ``plot``,
``output`` (result files), ``defaults`` (default inputs). Step times come from
:mod:`dcut_sched.step_costs` (``StepCosts``, re-exported here), the one owner shared with the policies
and the controller. See docs/simulator.md.

Names are imported on first use (PEP 562): ``from dcut_sched.simulator import defaults`` (what the
CLIs need to build their ``--help``) loads neither simpy, pandas nor matplotlib.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ..util._lazy import lazy_exports

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    "DEFAULT_BATCH_SIZES": ".defaults",
    "DEFAULT_COST": ".defaults",
    "DEFAULT_TRACE": ".defaults",
    "DEFAULT_TRACES": ".defaults",
    "benchmark_table": ".protocol",
    "simulate_benchmarks": ".protocol",
    "SimConfig": ".config",
    "Calibrator": ".loop",
    "ClosedLoopRun": ".loop",
    "OpenLoopRun": ".loop",
    "SimulatedSteps": ".loop",
    "run_closed_loop": ".loop",
    "run_open_loop": ".loop",
    "check_output_path": ".output",
    "write_frame": ".output",
    "plot_selection_curve": ".plot",
    "plot_speedup": ".plot",
    "ReplayBatch": ".replay",
    "RequestFeed": ".replay",
    "output_lengths": ".replay",
    "seed_spread": ".results",
    "speedup_table": ".results",
    "selection_curve": ".selection_curve",
    "SimulationError": ".config",
    "check_simulation": ".simulate",
    "resolve_policies": ".simulate",
    "simulate": ".simulate",
    "StepCosts": "..step_costs",
    "dask_executor": ".sweep",
    "sweep": ".sweep",
    "sweep_job": ".sweep",
}

__all__ = sorted(_EXPORTS)


class _Package(types.ModuleType):
    """This package's module type: a submodule named like the function it defines (``simulate``,
    ``selection_curve``, ``sweep``) does not replace the function as the package attribute when it is
    first imported (the import system sets ``package.<child> = module``), so ``simulator.simulate`` is
    the function whichever module imported ``.simulate`` first. The submodules stay in ``sys.modules``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (isinstance(value, types.ModuleType) and name in _EXPORTS
                and value.__name__ == f"{__name__}.{name}" and _EXPORTS[name] == f".{name}"):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
