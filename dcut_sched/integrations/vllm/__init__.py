"""RatioController inside vLLM 0.32.0 (V1 engine): the D-Cut plugin, what vLLM imports.

Importable without vLLM: this package holds the configuration (:mod:`.config`),
:func:`llm_kwargs` and the ``vllm.general_plugins`` entry point :func:`load_general_plugin`. The
parts that hook vLLM (:mod:`.scheduler`, a thin adapter over
:class:`~dcut_sched.controller.request_batch.RequestBatch`; :mod:`.startup`; :mod:`.hooks`;
:mod:`.cpu_kernels`; :mod:`.startup_profile`) import vLLM and are only imported inside it (by
``scheduler_cls`` and the entry point). The tools (environment, checkpoint writer, test harness,
``dcut-profile --vllm``) are :mod:`dcut_sched.integrations.vllm_tools`; this package never imports them.

>>> from vllm import LLM, SamplingParams                                    # doctest: +SKIP
>>> from dcut_sched.integrations.vllm import llm_kwargs                      # doctest: +SKIP
>>> llm = LLM(**llm_kwargs("target/", "draft/", block_size=8, policy="dcut",  # doctest: +SKIP
...                        cost_curve="dcut_sched/profiler/profiles/cpu-smollm2-135m-b8.json"))

See docs/vllm.md.
"""

from __future__ import annotations

import functools
from typing import Any

from ...defaults import DEFAULT_POLICY
from .config import (
    CONFIG_ENV,
    CONFIG_KEY,
    SUPPORTED_VLLM_VERSION,
    DCutConfigError,
    DCutVllmConfig,
    check_engine_config,
    require_vllm_version,
)

__all__ = ["CONFIG_ENV", "CONFIG_KEY", "SCHEDULER_CLS", "SUPPORTED_VLLM_VERSION", "DCutConfigError",
           "DCutVllmConfig", "check_engine_config", "llm_kwargs", "load_general_plugin", "require_vllm_version",
           "uses_dcut_scheduler"]

#: What to pass as vLLM's ``scheduler_cls`` (``--scheduler-cls`` on ``vllm serve``).
SCHEDULER_CLS = "dcut_sched.integrations.vllm.scheduler.DCutScheduler"


def llm_kwargs(target: str, draft: str, block_size: int, policy: str = DEFAULT_POLICY, *,
               cost_curve: str | None = None, dtype: str = "float32", **dcut: Any) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for ``target`` verified by D-Cut over a ``draft`` model.

    Args:
        target, draft: Hugging Face model folders (:mod:`~dcut_sched.integrations.vllm_tools.checkpoint`
            writes the SmolLM2 pair);
            ``draft="dflash:PATH"`` drafts with the DFlash block drafter in ``PATH`` (vLLM's
            ``dflash`` method: one parallel pass proposes all ``B - 1`` slots; docs/vllm.md).
        block_size: B; vLLM drafts ``num_speculative_tokens = B - 1`` tokens per request.
        policy, cost_curve, **dcut: the D-Cut config (:mod:`.config` lists the keys).
        dtype: ``float32`` for bit-exact greedy equality with plain decoding on CPU.

    Raises:
        DCutConfigError: a bad D-Cut config (checked here too, before the engine is built).
    """
    doc = {"policy": policy, "cost_curve": cost_curve, **dcut}
    DCutVllmConfig.from_mapping(doc, "llm_kwargs")
    method, _, path = draft.partition(":") if draft.startswith("dflash:") else ("draft_model", "", draft)
    return {
        "model": target,
        "dtype": dtype,
        "enforce_eager": True,
        "speculative_config": {"method": method, "model": path,
                               "num_speculative_tokens": int(block_size) - 1},
        "scheduler_cls": SCHEDULER_CLS,
        "async_scheduling": False,
        "additional_config": {CONFIG_KEY: doc},
    }


def load_general_plugin() -> None:
    """``vllm.general_plugins`` entry point, run in every vLLM process (front end, engine core, workers).

    Installs the worker hooks (:mod:`.hooks`) and the front-end check: ``EngineArgs.create_engine_config``
    (which the front end runs before any engine process starts) is wrapped so that an engine whose
    ``scheduler_cls`` is :data:`SCHEDULER_CLS` gets :func:`.config.check_engine_config` there. With
    ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` a bad D-Cut config then raises its own ``DCutConfigError``
    in the user's process, not vLLM's "Engine core initialization failed".

    A no-op on other vLLM versions (the scheduler then refuses to start with the reason), so an
    environment that merely has dcut-sched installed keeps a working vLLM.
    """
    import vllm

    if vllm.__version__ != SUPPORTED_VLLM_VERSION:
        return
    from . import hooks

    hooks.install()
    _install_front_end_check()


def uses_dcut_scheduler(scheduler_cls: Any) -> bool:
    """Whether vLLM's ``scheduler_cls`` setting (a dotted name or a class) is D-Cut's scheduler."""
    if isinstance(scheduler_cls, str):
        return scheduler_cls == SCHEDULER_CLS
    return isinstance(scheduler_cls, type) and any(
        f"{c.__module__}.{c.__qualname__}" == SCHEDULER_CLS for c in scheduler_cls.__mro__)


def _install_front_end_check() -> None:
    """Wrap ``EngineArgs.create_engine_config`` once (idempotent; see :func:`load_general_plugin`)."""
    from vllm.engine.arg_utils import EngineArgs

    create = EngineArgs.create_engine_config
    if getattr(create, "_dcut_checked", False):
        return

    @functools.wraps(create)
    def create_engine_config(self, *args: Any, **kwargs: Any):
        vllm_config = create(self, *args, **kwargs)
        if uses_dcut_scheduler(getattr(vllm_config.scheduler_config, "scheduler_cls", None)):
            check_engine_config(vllm_config)
        return vllm_config

    create_engine_config._dcut_checked = True
    EngineArgs.create_engine_config = create_engine_config
