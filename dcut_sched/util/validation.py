"""The one validation layer: strict pydantic models checked by :func:`validate`, and the one error
line every input check prints, :func:`field_message` (``WHERE: field NAME: PROBLEM; FIX``).

A pydantic :class:`~pydantic.ValidationError` becomes that line through :func:`validation_message`
(its first error: the field's dotted path, pydantic's problem and the value given); checks that run
over whole arrays (a trace's columns) call :func:`field_message` with their own problem text.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from .inputs import shown

__all__ = ["field_message", "invalid", "problems", "validate", "validation_message"]

#: The error type of :func:`invalid`.
_NAMED = "dcut_invalid"

M = TypeVar("M", bound=BaseModel)


def field_message(where: str, name: str, problem: str, fix: str = "", *, noun: str = "field",
                  quote: bool = False) -> str:
    """``WHERE: NOUN NAME: PROBLEM; FIX``, the one shape of an input error.

    Args:
        where: the file or source (``"cost curve c.json"``, ``"$DCUT_VLLM_CONFIG"``), with any row
            named after it (``"t.parquet, row 3, request 4, pos 3"``).
        name: the field's dotted path (``verify[2].median_ms``, ``dflash_config.mask_token_id``).
        problem: what is wrong, with the value given.
        fix: what to do about it; omitted when empty.
        noun: ``"field"`` for files, ``"key"`` for configuration objects.
        quote: write the name quoted (``field 'c2'``), as the trace and cost-curve messages do.
    """
    shown_name = repr(name) if quote else name
    return f"{where}: {noun} {shown_name}: {problem}" + (f"; {fix}" if fix else "")


def _loc(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a dotted path (``samples_ms.ar:1.0``); ``(top level)`` when empty."""
    return ".".join(str(x) for x in loc) or "(top level)"


def invalid(problem: str) -> PydanticCustomError:
    """The error a field validator raises when its ``problem`` text names the value itself (printed as
    it is, without pydantic's ``(got ...)``)."""
    return PydanticCustomError(_NAMED, problem)


def problems(exc: ValidationError, *, extra: str = "is not a known field",
             prefix: tuple[Any, ...] = ()) -> list[tuple[str, str]]:
    """``(dotted field path, problem)`` of each error of ``exc``: a missing field reads ``missing``,
    an unknown one ``extra``, one raised with :func:`invalid` its own text, any other pydantic's
    message and the value given (cut to 60 characters). ``prefix`` goes before each location (the
    list and index of a row validated alone: ``("verify[2]",)``)."""
    out = []
    for err in exc.errors():
        if err["type"] == "missing":
            problem = "missing"
        elif err["type"] == "extra_forbidden":
            problem = extra
        elif err["type"] == _NAMED:
            problem = err["msg"]
        else:
            problem = f"{err['msg']} (got {shown(err.get('input'), 60)})"
        out.append((_loc((*prefix, *err["loc"])), problem))
    return out


def validation_message(exc: ValidationError, where: str, fix: str = "", *, noun: str = "field",
                       quote: bool = False, extra: str = "is not a known field",
                       prefix: tuple[Any, ...] = ()) -> str:
    """:func:`field_message` of the first of :func:`problems` (and how many more there are)."""
    found = problems(exc, extra=extra, prefix=prefix)
    name, problem = found[0]
    if len(found) > 1:
        problem += f" (and {len(found) - 1} more)"
    return field_message(where, name, problem, fix, noun=noun, quote=quote)


def validate(model: type[M], raw: Any, where: str, fix: str, error: type[Exception], **how: Any) -> M:
    """``model.model_validate(raw)``; a :class:`~pydantic.ValidationError` becomes ``error`` with
    :func:`validation_message` (``how``: its keyword arguments)."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise error(validation_message(exc, where, fix, **how)) from None

