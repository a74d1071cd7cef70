"""Package-wide defaults that several entry points share (importable without numpy or torch)."""

from __future__ import annotations

__all__ = ["DEFAULT_POLICY"]

#: The default policy of every caller that runs one (``RatioController``, ``dcut-engine``, the vLLM
#: plugin). ``fine`` keeps most of D-Cut's gain and, with the plain decode step among its candidate
#: plans, never plans a step that costs more per expected token than not speculating
#: (docs/policies.md); ``dcut`` is the published rule, chosen by name.
DEFAULT_POLICY = "fine"
