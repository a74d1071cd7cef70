"""dcut-profile: measured (GPU, CPU), analytic and published verification cost curves.

Imported as ``dcut_profiler`` (the folder is ``profiler/``; the ``dcut_profiler`` symlink at the
repository root points at it and the distribution installs only that name).

Writes cost-curve files (schema ``dcut.cost-curve/2``, docs/design.md §4) through
:class:`dcut_sched.CostCurve`; ``dcut_sched`` never imports this package. See docs/profiler.md.

Modules: :mod:`~dcut_profiler.cli` (the ``dcut-profile`` command), :mod:`~dcut_profiler.grid` (cells),
:mod:`~dcut_profiler.harness` (measuring loop, partial files, resume), :mod:`~dcut_profiler.workload` (the
project's forward per cell), :mod:`~dcut_profiler.cuda_graphs` (capture and replay timing),
:mod:`~dcut_profiler.analytic` and :mod:`~dcut_profiler.devices` (roofline), :mod:`~dcut_profiler.efficiency_fit` (efficiency
fit, gap filling), :mod:`~dcut_profiler.published` (the shipped H20 curve), :mod:`~dcut_profiler.interp_error`
and :mod:`~dcut_profiler.report` (interpolation error, tables).
"""
