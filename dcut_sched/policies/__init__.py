"""The verification policies of docs/design.md §2, behind one interface and one registry
(``names()``, ``get(name, **params)``). Every module here that defines a ``@register``-ed
:class:`Policy` is imported below, so a new policy is one new file.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..defaults import DEFAULT_POLICY
from .base import (
    Policy,
    PolicyParamError,
    UnknownPolicyError,
    VerifyPlan,
    budget_from_ratio,
    check_params,
    get,
    names,
    param_defaults,
    param_help,
    policy_class,
    register,
)

# Registration order = the order of docs/design.md §2 (the order tables list policies in), then the
# published peers (docs/policies.md).
_ORDER = ("ar", "full", "uniform", "threshold", "topk", "dcut", "fine", "oracle")
PEERS = ("tetris", "smartspec", "vllm_adaptive", "dspark", "dense_fallback")
_ORDER = _ORDER + PEERS
for _name in _ORDER:
    importlib.import_module(f"{__name__}.{_name}")
for _mod in pkgutil.iter_modules(__path__):
    if _mod.name not in _ORDER and _mod.name not in ("base", "params"):
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = ["DEFAULT_POLICY", "PEERS", "Policy", "PolicyParamError", "UnknownPolicyError", "VerifyPlan", "budget_from_ratio",
           "check_params", "get", "names", "param_defaults", "param_help", "policy_class", "register"]
