"""The real speculative-decoding engine: batched greedy decoding of SmolLM2-135M with its
self-speculative drafter, each step's verification chosen by the :class:`~dcut_sched.RatioController`.

See ``docs/controller.md`` and :mod:`dcut_sched.engine.spec_engine`.
"""

from .default_cost import builtin_cpu_curve, default_cost_curve
from .packing import RowPacking, pack_rows
from .prompts import DEFAULT_PROMPTS, PromptFileError, load_prompts
from .spec_engine import EngineResult, SpecEngine, StepRecord

__all__ = [
    "DEFAULT_PROMPTS",
    "EngineResult",
    "PromptFileError",
    "RowPacking",
    "SpecEngine",
    "StepRecord",
    "builtin_cpu_curve",
    "default_cost_curve",
    "load_prompts",
    "pack_rows",
]
