"""Policy parameters: the one validation path (names, keys, kinds, finite values), run by every
boundary that takes them from a person before anything is built; the constructors then check
ranges. Kinds come from the constructor's annotations as a strict pydantic model per policy:
booleans are not numbers, an integral float is an integer, a sequence is a non-empty list; NaN,
infinities and integers beyond :data:`MAX_INT_PARAM` are refused. Errors: :class:`PolicyParamError`
(a ``ValueError``) and :class:`UnknownPolicyError` (a ``KeyError``), naming the key and the fix.
"""

from __future__ import annotations

import collections.abc
import inspect
import math
import typing
from functools import lru_cache
from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, ConfigDict, Field, Strict, ValidationError, create_model

from ..util.inputs import shown
from ..util.validation import field_message

__all__ = ["PolicyParamError", "UnknownPolicyError", "param_defaults", "validate_params"]


class PolicyParamError(ValueError):
    """A policy name or parameter is invalid; the message names the policy, the key and the fix."""


class UnknownPolicyError(PolicyParamError, KeyError):
    """No policy is registered under that name (a ``KeyError`` too; the message lists the known names)."""

    __str__ = BaseException.__str__  # the message as written, not KeyError's quoted repr


def param_defaults(cls: type) -> dict[str, Any]:
    """The constructor parameters of policy class ``cls`` and their defaults (``inspect.signature``)."""
    return dict(_signature(cls)[0])


@lru_cache(maxsize=None)
def _signature(cls: type) -> tuple[tuple[tuple[str, Any], ...], dict[str, Any]]:
    """``((name, default) ...)`` and ``{name: annotation}`` of ``cls.__init__``'s keyword parameters."""
    sig = inspect.signature(cls.__init__)
    params = [p for p in list(sig.parameters.values())[1:]
              if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that does not resolve: such parameters go unchecked
        hints = {}
    defaults = tuple((p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params)
    return defaults, {p.name: hints.get(p.name, Any) for p in params}


# ---------------------------------------------------------------------------- kinds
def _plain(value: Any) -> Any:
    """A numpy scalar as the Python scalar it holds (a numpy array as a list); anything else as is."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def _integral(value: Any) -> Any:
    value = _plain(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _kind(annotation: Any) -> tuple[Any, str] | None:
    """``(pydantic type, what it is in words)`` for a constructor annotation; ``None``: not checked."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is bool:
        return Annotated[bool, BeforeValidator(_plain), Strict()], "a boolean"
    if annotation is int:
        return Annotated[int, BeforeValidator(_integral), Strict()], "an integer"
    if annotation is float:
        return Annotated[float, BeforeValidator(_plain), Strict(), Field(allow_inf_nan=False)], "a number"
    if annotation is str:
        return Annotated[str, Strict()], "a string"
    if origin in (collections.abc.Sequence, list, tuple):
        item = _kind(args[0]) if args and args[0] is not Ellipsis else None
        if item is None or item[1] not in ("an integer", "a number"):
            return None
        words = "a list of integers" if item[1] == "an integer" else "a list of numbers"
        return Annotated[list[item[0]], BeforeValidator(_plain), Field(min_length=1)], words
    if args and type(None) in args and len(args) == 2:  # X | None
        inner = _kind(next(a for a in args if a is not type(None)))
        if inner is None:
            return None
        return typing.Optional[inner[0]], f"{inner[1]} or None"
    return None


@lru_cache(maxsize=None)
def params_model(cls: type) -> tuple[Any, dict[str, str]]:
    """The strict pydantic model of ``cls``'s parameters (from its constructor's signature, the one
    statement of them) and each checked key's kind in words; built once, when ``@register`` runs."""
    defaults, hints = _signature(cls)
    fields: dict[str, Any] = {}
    words: dict[str, str] = {}
    for key, default in defaults:
        kind = _kind(hints[key])
        if kind is None:
            fields[key] = (Any, default)
        else:
            fields[key] = (kind[0], default)
            words[key] = kind[1]
    model = create_model(f"{cls.__name__}Params", __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True),
                         **fields)
    return model, words


def _non_finite(value: Any, depth: int = 0) -> bool:
    """A NaN, an infinity or a number too large for a float anywhere in ``value`` (nesting beyond 8
    levels counts as bad).
    """
    value = _plain(value)
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        try:
            return not math.isfinite(float(value))
        except OverflowError:
            return True
    if isinstance(value, (list, tuple)):
        return depth >= 8 or any(_non_finite(v, depth + 1) for v in value)
    return False


def keys_text(cls: type) -> str:
    """``"key (default ...), ..."`` of ``cls``'s parameters, for messages."""
    keys = param_defaults(cls)
    return ", ".join(f"{k} (default {v!r})" for k, v in keys.items()) or "none (the policy takes no parameters)"


def validate_params(cls: type, params: dict[str, Any]) -> dict[str, Any]:
    """Check ``params`` against policy class ``cls`` (module docstring); returns them unchanged or raises
    :class:`PolicyParamError` naming the valid keys or the expected kind and default.
    """
    name = cls.name
    defaults = param_defaults(cls)
    for key in params:
        if key not in defaults:
            raise PolicyParamError(field_message(f"policy {name}", key, "is not a parameter of this policy",
                                                 f"valid keys: {keys_text(cls)}", noun="parameter", quote=True))
    model, words = params_model(cls)
    try:
        model(**params)
    except ValidationError as exc:
        key = str(exc.errors()[0]["loc"][0])
        value = params[key]
        if _non_finite(value):
            raise PolicyParamError(_not_finite(name, key, value, defaults[key])) from None
        raise PolicyParamError(field_message(
            f"policy {name}", key, f"expects {words.get(key, 'another kind')}, got {shown(value)} ({type(value).__name__})",
            f"default {defaults[key]!r}", noun="parameter")) from None
    for key, value in params.items():  # an unchecked kind, or an integer beyond the float range
        if _non_finite(value):
            raise PolicyParamError(_not_finite(name, key, value, defaults[key]))
        if _too_large(value):
            raise PolicyParamError(field_message(
                f"policy {name}", key, f"{shown(value)} holds an integer beyond {MAX_INT_PARAM:,} (the limit of every "
                "integer parameter)", f"give a real value (default {defaults[key]!r})", noun="parameter"))
    return params


def _not_finite(name: str, key: str, value: Any, default: Any) -> str:
    return field_message(f"policy {name}", key, f"{shown(value)} is not finite (or beyond the float range)",
                         f"give a finite number (default {default!r})", noun="parameter")


#: The largest integer any policy parameter may hold (a count of tokens, steps or requests; also an
#: element of a list parameter): larger values overflow int64 arrays or size unbounded work.
MAX_INT_PARAM = 2**31 - 1


def _too_large(value: Any, depth: int = 0) -> bool:
    value = _plain(value)
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) > MAX_INT_PARAM
    if isinstance(value, (list, tuple)):
        return depth < 8 and any(_too_large(v, depth + 1) for v in value)
    return False
