"""PEP 562 lazy attributes for package ``__init__`` modules (one implementation for every package).

A package lists ``{public name: submodule}``; a name is imported from its submodule on first access and
then cached in the package's globals, so importing the package itself loads nothing heavy (the
controller import does not pull in the simulator; ``--help`` does not pull in torch).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_exports(package: str, namespace: dict[str, Any], exports: Mapping[str, str],
                 submodules: tuple[str, ...] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``.

    Args:
        package: the package's ``__name__``.
        namespace: the package's ``globals()`` (where resolved names are cached).
        exports: public name -> relative submodule that defines it (e.g. ``".engine"``).
        submodules: relative names of submodules exposed as attributes themselves.

    Raises (from ``__getattr__``):
        AttributeError: a name that is neither exported nor a listed submodule.
    """
    names = sorted([*exports, *submodules])

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f".{name}", package)
        if name in exports:
            value = getattr(importlib.import_module(exports[name], package), name)
            namespace[name] = value  # later lookups skip this hook
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
