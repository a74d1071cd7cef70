"""Start-up profiling for the vLLM plugin when no cost curve is configured (imported only inside vLLM)."""

from __future__ import annotations

from .config import DCutConfigError


def startup_curve(cfg, vllm_config, block_size: int):
    """The cost curve to plan with when ``cfg.cost_curve`` is unset (see :mod:`.profile`)."""
    raise DCutConfigError(
        f"{cfg.source}: policy {cfg.policy!r} needs a cost curve: set 'cost_curve' to a dcut.cost-curve "
        f"JSON for block size {block_size}"
    )
