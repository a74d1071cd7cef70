"""The shipped default curve built from public D-Cut measurements (docs/design.md §4).

``dcut_sched/profiler/profiles/h20-qwen3-8b-published.json``:
    - ``published`` verify rows: the public D-Cut verification times of Qwen3-8B on one NVIDIA H20
      (TP1, B = 16) at rho = 0.25/0.5/0.75/1.0 for bs 4, 8, 16, 32, 64 (20 points), copied exactly;
    - ``published`` ar rows: the public plain AR engine's steady output throughput on the same setup
      (:data:`PUBLISHED_AR_H20_QWEN3_8B_TOK_S`, at bs 4 / 8 / 16 / 32 / 64; the figures: docs/design.md
      §4) as one step, ``1000 * bs / throughput`` ms (:func:`published_ar_ms`);
    - ``fitted`` rows: everything those figures lack (the verify point num_tokens = bs, batch sizes 1
      and 2, the plain step at bs 1 and 2, and the draft step of a 5-layer DFlash-style drafter of the
      target's width) from the analytic model (:mod:`dcut_sched.profiler.analytic`) with its efficiency factors
      fitted (:mod:`dcut_sched.profiler.efficiency_fit`) to the published verify and ar rows together.

The public figures do not state the context length; the file records ``context_len = 1024``
(assumed). Only ``context_len / eta_attention`` is identifiable from them, so the fitted rows hardly
depend on that choice.

The MoE row (Qwen3.5-35B-A3B, TP2, bs 64; the figures: docs/design.md §4) is kept in
:data:`PUBLISHED_MOE_H20` but not turned into a file: four points at one batch size, measured with
two-way tensor parallelism on an architecture whose exact shape is not verified here, cannot pin
down four efficiency factors, so every fitted row would be a guess.

Rebuild with ``python -m dcut_sched.cli.published_curve [--out PATH]``.
"""

from __future__ import annotations

from dcut_sched import CostCurve
from dcut_sched.paths import profile_path

from .analytic import parse_draft_spec
from .devices import get_device
from .efficiency_fit import EfficiencyFit, fill_curve, fit_efficiency
from .grid import DEFAULT_RATIOS, bucket_tokens
from .shapes import resolve_model

__all__ = ["PUBLISHED_AR_H20_QWEN3_8B_TOK_S", "PUBLISHED_H20_QWEN3_8B", "published_ar_ms", "PUBLISHED_MOE_H20", "PUBLISHED_SOURCE", "build_h20_qwen3_8b",
           "published_rows_curve"]

#: Verification ms of Qwen3-8B on NVIDIA H20 (TP1, B=16) at rho = 0.25, 0.5, 0.75, 1.0 (docs/design.md §4).
PUBLISHED_H20_QWEN3_8B: dict[int, tuple[float, float, float, float]] = {
    4: (8.2, 8.7, 9.7, 10.9),
    8: (10.6, 12.8, 16.3, 19.6),
    16: (16.0, 22.7, 29.8, 35.8),
    32: (29.8, 43.1, 56.6, 70.1),
    64: (55.2, 82.2, 107.9, 133.9),
}
#: Steady output throughput (tok/s) of the plain AR engine on the same setup (docs/design.md §4).
PUBLISHED_AR_H20_QWEN3_8B_TOK_S: dict[int, float] = {4: 525.8, 8: 958.7, 16: 1691.3, 32: 2700.2, 64: 3594.4}
#: Qwen3.5-35B-A3B (MoE) on two H20 (TP2), bs 64, same ratios (not shipped, see module docstring).
PUBLISHED_MOE_H20: dict[int, tuple[float, float, float, float]] = {64: (79.9, 85.4, 86.1, 90.6)}

PUBLISHED_SOURCE = (
    "published rows: public D-Cut measurements of C_graph(bs, rho), Qwen3-8B on one NVIDIA H20 (TP1), block size 16, "
    "rho = 0.25/0.5/0.75/1.0, bs 4/8/16/32/64; published ar rows: the public plain AR engine's steady output "
    "throughput on the same setup (525.8/958.7/1691.3/2700.2/3594.4 tok/s at bs 4/8/16/32/64) as one step of "
    "1000*bs/throughput ms; both as recorded in docs/design.md section 4 of this project (source: the D-Cut documentation "
    "page, AngelSlim docs); context length not stated (1024 assumed). fitted rows: dcut_sched.profiler.analytic roofline with "
    "efficiency factors fitted to the published verify and ar rows together (dcut_sched.profiler.efficiency_fit: shared GEMM factors, "
    "per-path attention and overhead); the draft step is a 5-layer DFlash-style drafter of the target's width "
    "(assumed)."
)
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_OUT = profile_path("h20-qwen3-8b-published.json")


def published_ar_ms(batch_size: int) -> float:
    """One published plain AR step in ms: ``1000 * bs / throughput(bs)`` (raises KeyError off the table)."""
    return 1000.0 * batch_size / PUBLISHED_AR_H20_QWEN3_8B_TOK_S[batch_size]


def published_rows_curve(context_len: int = 1024, block_size: int = 16) -> CostCurve:
    """The published H20 / Qwen3-8B verify and ar rows alone, exactly as public (``provenance="published"``)."""
    _, cfg = resolve_model("qwen3-8b")
    verify = []
    for bs, times in PUBLISHED_H20_QWEN3_8B.items():
        for k, ms in zip(bucket_tokens(bs, block_size, DEFAULT_RATIOS), times):
            verify.append({"batch_size": bs, "num_tokens": k, "median_ms": ms, "provenance": "published"})
    ar = [{"batch_size": bs, "median_ms": published_ar_ms(bs), "provenance": "published"}
          for bs in PUBLISHED_AR_H20_QWEN3_8B_TOK_S]
    return CostCurve(
        hardware={"device_name": get_device("h20").name, "backend": "cuda-graph", "tensor_parallel": 1},
        model={"name": "qwen3-8b", "config": cfg.to_dict(), "dtype": "bfloat16"},
        block_size=block_size, context_len=context_len, verify=verify, ar=ar, graph_mode="full",
        source=PUBLISHED_SOURCE,
    )


def build_h20_qwen3_8b(batch_sizes=DEFAULT_BATCH_SIZES, context_len: int = 1024,
                       draft: str = "dflash:5") -> tuple[CostCurve, EfficiencyFit]:
    """The shipped curve (published rows + fitted gaps) and the fit that made the gaps."""
    base = published_rows_curve(context_len)
    shape, _ = resolve_model("qwen3-8b")
    device = get_device("h20")
    fit = fit_efficiency(base, shape, device)
    curve = fill_curve(base, shape, fit, batch_sizes=batch_sizes, ratios=DEFAULT_RATIOS, grid_step=0,
                       draft=parse_draft_spec(draft))
    return curve, fit
