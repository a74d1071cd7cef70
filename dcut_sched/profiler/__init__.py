"""dcut-profile: measured (GPU, CPU), analytic and published verification cost curves.

Writes cost-curve files (schema ``dcut.cost-curve/2``, docs/design.md §4) through
:class:`dcut_sched.CostCurve`; the rest of ``dcut_sched`` but its command (:mod:`dcut_sched.cli.profile`)
never imports this package's modules (only its package data, the shipped curves in ``profiles/``,
through :mod:`dcut_sched.paths`). See docs/profiler.md.

Modules: :mod:`~dcut_sched.cli.profile` (the ``dcut-profile`` command), :mod:`~dcut_sched.profiler.grid` (cells),
:mod:`~dcut_sched.profiler.harness` (measuring loop, partial files, resume), :mod:`~dcut_sched.profiler.workload` (the
project's forward per cell), :mod:`~dcut_sched.profiler.cuda_graphs` (capture and replay timing),
:mod:`~dcut_sched.profiler.analytic` and :mod:`~dcut_sched.profiler.devices` (roofline), :mod:`~dcut_sched.profiler.efficiency_fit` (efficiency
fit, gap filling), :mod:`~dcut_sched.profiler.published` (the shipped H20 curve), :mod:`~dcut_sched.profiler.interp_error`
and :mod:`~dcut_sched.profiler.report` (interpolation error, tables).
"""
