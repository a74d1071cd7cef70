"""The cost curve the engine uses when the user passes none."""

from __future__ import annotations

from pathlib import Path

from ..cost_curve import CostCurve
from ..paths import profile_path

__all__ = ["DEFAULT_PROFILE_TEMPLATE", "DFLASH_PROFILE_TEMPLATE", "builtin_cpu_curve", "default_cost_curve", "default_profile_path"]

#: Recorded CPU profiles of the engine's own forward, by drafter kind (``self``: the self-speculative
#: drafter, ``dflash``: the DFlash block drafter): shipped curves' names (dcut_sched.paths).
DEFAULT_PROFILE_TEMPLATE = "cpu-smollm2-135m-b{block_size}.json"
DFLASH_PROFILE_TEMPLATE = "cpu-smollm2-135m-dflash-b{block_size}.json"


def default_profile_path(block_size: int, drafter: str = "self") -> Path:
    """Where the shipped CPU profile for ``block_size`` and ``drafter`` (``self`` or ``dflash``) is (it
    may not exist for that block size)."""
    template = DFLASH_PROFILE_TEMPLATE if drafter == "dflash" else DEFAULT_PROFILE_TEMPLATE
    return profile_path(template.format(block_size=block_size))

# A linear fit to eager fp32 SmolLM2-135M forwards; the measurements it fits are in docs/profiler.md,
# "The engine's built-in CPU estimate".
_BASE_MS = 130.0
_PER_TOKEN_MS = 6.4
_DRAFTER_LAYER_FRACTION = 28 / 30  # self-speculative drafter: 28 of the 30 layers


def builtin_cpu_curve(block_size: int, max_batch_size: int) -> CostCurve:
    """An analytic linear CPU curve for SmolLM2-135M: ``C_verify = 130 + 6.4 * num_tokens`` ms,
    ``C_draft(bs) = (B-1) * 28/30 * (130 + 6.4 * bs)`` ms (B-1 sequential one-token forwards of the
    28-layer drafter), ``C_ar(bs) = 130 + 6.4 * bs`` ms (the plain step: on this eager CPU path the
    same one-token-per-request forward as verifying the anchors), on every token count of batch sizes
    ``1..max_batch_size``.

    A rough stand-in (source: the comment above) until a measured profile exists; pass a measured
    curve with ``--cost`` for meaningful policy decisions.
    """
    verify, draft, ar = [], [], []
    for bs in range(1, max_batch_size + 1):
        for k in range(bs, bs * block_size + 1):
            verify.append({"batch_size": bs, "num_tokens": k, "median_ms": _BASE_MS + _PER_TOKEN_MS * k,
                           "provenance": "analytic"})
        draft_ms = (block_size - 1) * _DRAFTER_LAYER_FRACTION * (_BASE_MS + _PER_TOKEN_MS * bs)
        draft.append({"batch_size": bs, "median_ms": draft_ms, "provenance": "analytic"})
        ar.append({"batch_size": bs, "median_ms": _BASE_MS + _PER_TOKEN_MS * bs, "provenance": "analytic"})
    return CostCurve(
        hardware={"device_name": "cpu (2 cores, development machine)", "backend": "analytic"},
        model={"name": "SmolLM2-135M-Instruct", "config": {"preset": "smollm2-135m"}},
        block_size=int(block_size),
        context_len=64,
        verify=verify,
        draft=draft,
        ar=ar,
        source=(
            f"dcut_sched.engine.default_cost.builtin_cpu_curve: linear fit {_BASE_MS} ms + {_PER_TOKEN_MS} "
            f"ms/token of eager fp32 CPU forwards; draft = (B-1) x 28/30 of a one-token-per-request forward"
        ),
    )


def default_cost_curve(block_size: int, max_batch_size: int, drafter: str = "self") -> tuple[CostCurve, str]:
    """``(curve, description)``: the shipped CPU profile of ``drafter`` (``self``:
    ``cpu-smollm2-135m-b{B}.json``, ``dflash``: ``cpu-smollm2-135m-dflash-b{B}.json``;
    :func:`default_profile_path`) when it exists and covers ``max_batch_size``, else
    :func:`builtin_cpu_curve`, whose draft step is the self-speculative drafter's (the description
    says so for a DFlash drafter: pass a DFlash profile to price its one-pass draft)."""
    path = default_profile_path(block_size, drafter)
    if path.is_file():
        curve = CostCurve.load(path, check_hardware=False)
        if curve.block_size == block_size and curve.batch_sizes[0] <= 1 and curve.batch_sizes[-1] >= max_batch_size:
            return curve, f"recorded CPU profile {path.name}"
    why = (f" (no shipped DFlash profile {path.name} for this block size and batch size: the draft step is "
           "priced as the self-speculative drafter's; pass --cost with a DFlash profile)" if drafter == "dflash" else "")
    return builtin_cpu_curve(block_size, max_batch_size), "built-in linear CPU estimate (130 ms + 6.4 ms/token)" + why
