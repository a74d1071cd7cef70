"""Start-up profiling for the vLLM plugin when no cost curve is configured (see :mod:`.profile`)."""

from __future__ import annotations

from .profile import startup_curve

__all__ = ["startup_curve"]
