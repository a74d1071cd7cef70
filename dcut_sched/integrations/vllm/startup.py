"""What :class:`~.scheduler.DCutScheduler` builds at start-up: the controller of the D-Cut config.

Imported only inside vLLM (the start-up profile, :mod:`.startup_profile`, times the in-process engine).
"""

from __future__ import annotations

import numpy as np

from ... import policies
from ...calibration import CalibrationPrior, CalibrationPriorError
from ...controller import RatioController
from ...cost_curve import CostCurve, CostCurveError, CostCurveRangeError
from .config import DCutConfigError, DCutVllmConfig
from .startup_profile import startup_curve

__all__ = ["build_controller", "drafter_prior"]


def drafter_prior(cfg: DCutVllmConfig, vllm_config):
    """The drafter's calibration prior: ``calibration.json`` in ``speculative_config.model`` when that is
    a local folder holding one, else ``None`` (the identity).

    Raises:
        DCutConfigError: the file is there but malformed (names the file, the field and the fix).
    """
    model = getattr(getattr(vllm_config, "speculative_config", None), "model", None)
    if not isinstance(model, str) or not model:
        return None
    try:
        return CalibrationPrior.from_folder(model)
    except CalibrationPriorError as exc:
        raise DCutConfigError(f"{cfg.source}: the drafter's {exc}") from None


def build_controller(cfg: DCutVllmConfig, vllm_config, block_size: int):
    """The RatioController of ``cfg``; checks the curve against the block size and ``max_num_seqs``."""
    # the policy the config check built (built here only for a config made in code)
    policy = cfg.policy_object if cfg.policy_object is not None else policies.get(cfg.policy, **cfg.policy_params)
    curve = None
    if cfg.cost_curve:
        try:
            curve = CostCurve.load(cfg.cost_curve, check_hardware=False)
        except (OSError, CostCurveError) as exc:
            raise DCutConfigError(f"{cfg.source}: 'cost_curve' {cfg.cost_curve}: {exc}") from None
    elif policy.needs_cost:
        curve = startup_curve(cfg, vllm_config, block_size)
    if curve is not None and curve.block_size != block_size:
        raise DCutConfigError(
            f"{cfg.source}: cost curve {curve.path or cfg.cost_curve} was measured for block size "
            f"{curve.block_size}, but vLLM serves block size {block_size} (num_speculative_tokens "
            f"{block_size - 1} + 1); profile it with dcut-profile --vllm MODEL --block-size {block_size}"
        )
    max_bs = int(vllm_config.scheduler_config.max_num_seqs)
    try:  # every step the policy reads, at every batch size up to max_num_seqs, priced now
        ctrl = RatioController(curve, block_size, policy, calibrate=cfg.calibrate, max_batch_size=max_bs,
                               calibration_prior=drafter_prior(cfg, vllm_config) if cfg.calibrate else None)
    except (CostCurveError, CostCurveRangeError) as exc:
        raise DCutConfigError(f"{cfg.source}: cost curve {curve.path or cfg.cost_curve} cannot serve batch sizes up "
                              f"to max_num_seqs {max_bs} ({exc}); profile up to max_num_seqs or lower "
                              f"max_num_seqs") from None
    except ValueError as exc:  # e.g. fine's allowed_num_tokens leaves some batch size no budget
        raise DCutConfigError(
            f"{cfg.source}: 'policy_params' {cfg.policy_params} cannot plan every batch size up to max_num_seqs "
            f"{max_bs} ({exc}); give token counts that cover [bs, bs*{block_size}] at every batch size, or "
            f"lower max_num_seqs"
        ) from None
    if curve is not None:
        try:
            for bs in range(1, max_bs + 1):
                ctrl.plan(np.full((bs, block_size - 1), 0.5, dtype=np.float32))
        except CostCurveRangeError as exc:
            raise DCutConfigError(
                f"{cfg.source}: cost curve {curve.path} does not cover batch size {bs} <= max_num_seqs "
                f"{max_bs} ({exc}); profile up to max_num_seqs or lower max_num_seqs"
            ) from None
    ctrl.reset()
    return ctrl
