"""dcut-profile: measured (GPU, CPU), analytic and published verification cost curves.

Writes cost-curve files (schema ``dcut.cost-curve/2``, docs/design.md §4) through
:class:`dcut_sched.CostCurve`; ``dcut_sched`` never imports this package. See docs/profiler.md.

Modules: :mod:`~profiler.cli` (the ``dcut-profile`` command), :mod:`~profiler.grid` (cells),
:mod:`~profiler.harness` (measuring loop, partial files, resume), :mod:`~profiler.workload` (the
project's forward per cell), :mod:`~profiler.cuda_graphs` (capture and replay timing),
:mod:`~profiler.analytic` and :mod:`~profiler.devices` (roofline), :mod:`~profiler.fit` (efficiency
fit, gap filling), :mod:`~profiler.published` (the shipped H20 curve), :mod:`~profiler.interp_error`
and :mod:`~profiler.report` (interpolation error, tables).
"""
