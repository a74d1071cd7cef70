"""Where the project's files are, in one place (docs/design.md, "Package data and local artifacts").

Two kinds of files, two rules:

- **Shipped inputs** travel inside the package (wheel or checkout alike) and are found with
  :mod:`importlib.resources`: the cost curves (``dcut_sched/profiler/profiles/``), the acceptance
  traces with their cards and the prompt set (``dcut_sched/data/traces/``).
- **Local artifacts** are too large or too machine-specific to ship in a wheel: the vLLM environment,
  the converted-model cache and the trained drafters. Each is looked up as: its environment variable,
  then the user cache directory (``platformdirs.user_cache_dir("dcut-sched")``, the XDG rule on Linux),
  then the checkout the package runs from. The first that exists wins; when none exists, the checkout
  (a source tree) or else the user cache is where one is created.

No other module of the package works out a location from its own file's place: they ask this one.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

import platformdirs

__all__ = [
    "LOCAL_ARTIFACTS",
    "PROMPT_SETS",
    "checkout_root",
    "drafter_dir",
    "local_artifact",
    "profile_path",
    "prompts_path",
    "shipped_file",
    "trace_path",
    "user_cache_dir",
]

#: Local artifacts: name -> (environment variable, folder in the user cache, folder in the checkout).
LOCAL_ARTIFACTS: dict[str, tuple[str, str, str]] = {
    "vllm-venv": ("DCUT_VLLM_VENV", "vllm-venv", ".venv-vllm"),
    "vllm-models": ("DCUT_VLLM_MODELS", "vllm-models", ".cache/vllm-models"),
    "drafters": ("DCUT_DRAFTERS", "drafters", "drafters"),
}

_PROFILES = ("dcut_sched.profiler", "profiles")
_TRACES = ("dcut_sched.data", "traces")


def shipped_file(package: str, *parts: str) -> Path:
    """The file system path of package data ``parts`` of ``package``.

    Raises:
        RuntimeError: the package is not installed as plain files (e.g. imported from a zip), so its
            data has no path to hand to readers that take one.
    """
    resource = files(package).joinpath(*parts)
    if not isinstance(resource, Path):
        raise RuntimeError(f"{package} is not installed as plain files ({resource!r}); install dcut-sched "
                           "from a wheel or a source tree, not a zip")
    return resource


def profile_path(name: str) -> Path:
    """A shipped cost curve, e.g. ``profile_path("h20-qwen3-8b-published.json")``."""
    return shipped_file(*_PROFILES, name)


def trace_path(name: str) -> Path:
    """A shipped acceptance trace (or its ``.md`` card), e.g. ``trace_path("dflash-qwen3-8b-gsm8k-b16.parquet")``."""
    return shipped_file(*_TRACES, name)


#: The shipped prompt sets (docs/traces.md, "Prompt sets"): name -> file in ``dcut_sched/data/traces/``.
#: ``heldout``: the project's 80 prompts of the drafter's training kinds (math, code, chat, rewrite);
#: ``unlike``: 60 prompts of twelve kinds absent from the drafter's training data.
PROMPT_SETS: dict[str, str] = {"heldout": "prompts.jsonl", "unlike": "prompts-unlike.jsonl"}


def prompts_path(name: str = "heldout") -> Path:
    """A shipped prompt set by name (a key of :data:`PROMPT_SETS`; default the project's held-out set
    ``traces/prompts.jsonl``; docs/traces.md).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; known: {', '.join(PROMPT_SETS)}")
    return shipped_file(*_TRACES, PROMPT_SETS[name])


def checkout_root() -> Path | None:
    """The source tree the package runs from (the folder holding ``dcut_sched/`` and a
    ``pyproject.toml``), or None for an installed wheel."""
    root = Path(files("dcut_sched")).resolve().parent  # type: ignore[arg-type]
    return root if (root / "pyproject.toml").is_file() and (root / "dcut_sched").is_dir() else None


def user_cache_dir() -> Path:
    """``platformdirs.user_cache_dir("dcut-sched")`` (``$XDG_CACHE_HOME/dcut-sched`` or
    ``~/.cache/dcut-sched`` on Linux)."""
    return Path(platformdirs.user_cache_dir("dcut-sched"))


def local_artifact(name: str) -> Path:
    """Where local artifact ``name`` (a key of :data:`LOCAL_ARTIFACTS`) is: the environment variable when
    set (even if the folder does not exist yet), else the first existing of the user cache and the
    checkout, else the checkout when running from one, else the user cache."""
    env_var, cache_folder, checkout_folder = LOCAL_ARTIFACTS[name]
    if os.environ.get(env_var):
        return Path(os.environ[env_var])
    candidates = [user_cache_dir() / cache_folder]
    root = checkout_root()
    if root is not None:
        candidates.append(root / checkout_folder)
    for path in candidates:
        if path.exists():
            return path
    return candidates[-1]


def drafter_dir(name: str = "smollm2-135m-dflash") -> Path:
    """A trained drafter's folder (``config.json`` + ``model.safetensors``; docs/drafters.md) under
    :func:`local_artifact` ``("drafters")``."""
    return local_artifact("drafters") / name
