"""The real speculative-decoding engine: batched greedy decoding of SmolLM2-135M with its
self-speculative drafter, each step's verification chosen by the :class:`~dcut_sched.RatioController`.

See ``docs/controller.md`` and :mod:`dcut_sched.engine.spec_engine`. Names are imported on first use
(PEP 562), so ``dcut-engine --help`` answers without loading torch.
"""

from __future__ import annotations

from ..util._lazy import lazy_exports

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    "builtin_cpu_curve": ".default_cost",
    "default_cost_curve": ".default_cost",
    "RowPacking": ".packing",
    "pack_rows": ".packing",
    "DEFAULT_PROMPTS": ".prompts",
    "PromptFileError": ".prompts",
    "load_prompt_texts": ".prompts",
    "EngineObserver": ".observer",
    "PHASES": ".observer",
    "EngineResult": ".spec_engine",
    "SpecEngine": ".spec_engine",
    "DecodeBatch": ".decode_step",
    "DecodeContext": ".decode_step",
    "StepOutcome": ".decode_step",
    "EngineStepRecord": ".decode_step",
    "Verification": ".decode_step",
    "accepted_drafts": ".decode_step",
    "prefill_free_rows": ".decode_step",
    "speculative_step": ".decode_step",
    "verify_block": ".decode_step",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
