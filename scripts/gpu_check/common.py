"""What every step of the GPU check shares: its result file, guarded checks, package probing.

A step runs in its own process (``python3 scripts/gpu_check --step NAME``) and keeps its result in
``OUT/steps/NAME.json``, rewritten atomically after every check, so a step that is killed at its time
limit still leaves what it had found. Result schema (``dcut.gpu-check-step/1``)::

    {"step", "title", "mode": "gpu" | "dry-run", "started", "seconds", "finished": bool,
     "skipped": reason | null, "checks": [CHECK, ...], "figures": {key: value}, "notes": [text],
     "artifacts": [path relative to OUT]}
    CHECK = {"name", "status": "pass" | "fail" | "skipped" | "error" | "info",
             "kind": "check" | "goal" | "figure", "value", "unit", "goal", "detail", "hint"}

``kind="goal"`` marks a performance goal (a miss is reported, not a correctness failure);
``kind="figure"`` (status ``info``) is a measurement without a pass/fail criterion.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[2]
STEP_SCHEMA = "dcut.gpu-check-step/1"

# What each optional package is needed for (reported by the env step, checked by each step).
PACKAGE_USES = {
    "torch": "every step",
    "numpy": "every step",
    "scipy": "the profile, controller and pytest steps (cost-curve lookups)",
    "pandas": "the profile steps (interpolation error, tables)",
    "rich": "the profile steps' tables and progress (pip's vendored copy is used when missing)",
    "pytest": "the pytest step",
    "simpy": "the simulator only (no step of this check)",
    "pyarrow": "traces only (no step of this check)",
    "matplotlib": "plots only (no step of this check)",
    "hypothesis": "property tests outside the cuda-marked files (no step of this check)",
}


# ---------------------------------------------------------------------------------------- packages
class _HiddenPackages(importlib.abc.MetaPathFinder):
    """Makes named top-level packages unimportable (``--hide-packages``: rehearse a bare image)."""

    def __init__(self, names: set[str]):
        self.names = names
        self.aliased: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        top = fullname.split(".")[0]
        if top in self.names and top not in self.aliased:
            raise ModuleNotFoundError(f"No module named {fullname!r} (hidden by --hide-packages)", name=fullname)
        return None


_HIDER: _HiddenPackages | None = None


def hide_packages(names: list[str]) -> None:
    """Make ``names`` unimportable in this process (they must not be imported yet)."""
    global _HIDER
    if not names:
        return
    hider = _HIDER = _HiddenPackages(set(names))
    sys.meta_path.insert(0, hider)
    # Probes (torch._dynamo asks importlib.util.find_spec about many packages) must see "absent",
    # not an exception: answer None for hidden names before the finders are consulted.
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):
        top = name.split(".")[0]
        if top in hider.names and top not in hider.aliased:
            return None
        return real_find_spec(name, package)

    importlib.util.find_spec = find_spec


def available(name: str) -> bool:
    """Whether ``import name`` would succeed (hidden packages count as missing)."""
    if _HIDER is not None and name in _HIDER.names and name not in _HIDER.aliased:
        return False
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def version_of(name: str) -> str | None:
    """Installed version of ``name`` (``None`` when missing or hidden)."""
    if not available(name):
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        mod = sys.modules.get(name)
        return getattr(mod, "__version__", "unknown")


def missing(*names: str) -> list[str]:
    """The packages among ``names`` this process cannot import."""
    return [n for n in names if not available(n)]


def can_run(res: "StepResult", packages: tuple[str, ...], *, cuda: bool, dry_run: bool, why: str = "") -> bool:
    """Whether a step can run here; records the skip on ``res`` (and returns False) when not.

    Args:
        packages: what the step imports; a missing one skips it.
        cuda: the step needs a CUDA device, unless ``dry_run`` (every step then runs on the CPU).
        why: appended to the skip message (what cannot run without them).
    """
    need = missing(*packages)
    tail = f"; {why}" if why else ""
    if need:
        res.skip(f"needs {', '.join(need)} (not installed on this machine){tail}")
        return False
    if cuda and not dry_run:
        import torch

        if not torch.cuda.is_available():
            res.skip(f"no CUDA device (see the env step){tail}")
            return False
    return True


def ensure_rich() -> str | None:
    """Make ``import rich`` work; returns a note when pip's vendored copy stands in for it.

    The profiler prints its tables and progress with rich. A machine without rich still has pip,
    which vendors rich (``pip._vendor.rich``); its modules are registered under ``rich.*`` so that
    ``from rich.table import Table`` finds them.

    Raises:
        ModuleNotFoundError: neither rich nor pip's copy of it is importable.
    """
    if available("rich"):
        return None
    try:
        vendored = importlib.import_module("pip._vendor.rich")
        for sub in ("console", "progress", "table", "text", "markup"):
            importlib.import_module(f"pip._vendor.rich.{sub}")
    except ImportError:
        raise ModuleNotFoundError("the profile steps need rich, and pip's vendored copy is missing too "
                                  "(python3 -m pip install rich)", name="rich") from None
    prefix = "pip._vendor.rich"
    for key, mod in list(sys.modules.items()):
        if key == prefix or key.startswith(prefix + "."):
            sys.modules["rich" + key[len(prefix):]] = mod
    if _HIDER is not None:
        _HIDER.aliased.add("rich")
    version = getattr(vendored, "__version__", None) or _pip_version()
    return f"rich is not installed: using pip's vendored copy (pip {version})"


def _pip_version() -> str:
    try:
        return importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# ---------------------------------------------------------------------------------------- hints
def hint_for(exc: BaseException) -> str:
    """One sentence on what a known failure usually means and what to do about it."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if "out of memory" in text:
        return ("the GPU ran out of memory: check the env step's nvidia-smi for other processes holding "
                "memory; the profile cells at bs 64 need ~30 GB besides the 16 GB of bf16 weights")
    if "capturing" in text or "capture" in text and "graph" in text:
        return ("an operation that is not allowed inside CUDA-graph capture (a host sync, a CPU tensor, "
                "an allocation outside the pool): the traceback names the line; run the step with "
                "CUDA_LAUNCH_BLOCKING=1 to localise it")
    if "illegal memory access" in text or "device-side assert" in text:
        return ("a CUDA kernel faulted: rerun the step alone with CUDA_LAUNCH_BLOCKING=1 "
                "(scripts/gpu_check.sh --only STEP OUT2) to get the faulting call")
    if isinstance(exc, ModuleNotFoundError):
        return f"package {exc.name!r} is not installed on this machine (python3 -m pip install {exc.name})"
    if "no kernel image" in text or "not compiled" in text:
        return "this torch build has no kernels for this GPU's compute capability: use a torch built for it"
    return "see the traceback in the step's log (logs/STEP.log)"


def _short(exc: BaseException, limit: int = 400) -> str:
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0][:limit] if first else ''}"


# ---------------------------------------------------------------------------------------- results
class StepResult:
    """The result file of one step (module docstring); every change is written at once."""

    def __init__(self, out: Path, step: str, title: str, dry_run: bool):
        self.out = Path(out)
        self.path = self.out / "steps" / f"{step}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.perf_counter()
        self.doc: dict[str, Any] = {
            "schema": STEP_SCHEMA, "step": step, "title": title, "mode": "dry-run" if dry_run else "gpu",
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "seconds": 0.0,
            "finished": False, "skipped": None, "checks": [], "figures": {}, "notes": [], "artifacts": [],
        }
        self.write()

    # -- recording
    def check(self, name: str, ok: bool | None, *, value: Any = None, unit: str | None = None,
              goal: str | None = None, detail: str = "", kind: str = "check", skip_reason: str | None = None,
              hint: str | None = None) -> bool:
        """Record one check; ``ok=None`` records it as skipped (``skip_reason`` says why).

        Returns ``ok`` (``False`` when skipped), so callers can branch on it.
        """
        status = "skipped" if ok is None else ("pass" if ok else "fail")
        if ok is None and skip_reason:
            detail = skip_reason if not detail else f"{skip_reason}; {detail}"
        self.doc["checks"].append({"name": name, "status": status, "kind": kind, "value": _jsonable(value),
                                   "unit": unit, "goal": goal, "detail": detail, "hint": hint})
        self.write()
        print(f"[{self.doc['step']}] {status.upper():7s} {name}"
              + (f" = {_fmt(value)}{' ' + unit if unit else ''}" if value is not None else "")
              + (f" (goal {goal})" if goal else "") + (f": {detail}" if detail and status != "pass" else ""),
              flush=True)
        return bool(ok)

    def measure(self, name: str, value: Any, unit: str | None = None, detail: str = "") -> None:
        """Record a measurement without a criterion (status ``info``; shown in the summary table)."""
        self.doc["checks"].append({"name": name, "status": "info", "kind": "figure", "value": _jsonable(value),
                                   "unit": unit, "goal": None, "detail": detail, "hint": None})
        self.write()
        print(f"[{self.doc['step']}] INFO    {name} = {_fmt(value)}{' ' + unit if unit else ''}"
              + (f" ({detail})" if detail else ""), flush=True)

    def figure(self, key: str, value: Any) -> None:
        self.doc["figures"][key] = _jsonable(value)
        self.write()

    def note(self, text: str) -> None:
        self.doc["notes"].append(text)
        print(f"[{self.doc['step']}] note: {text}", flush=True)
        self.write()

    def artifact(self, path: Path) -> None:
        self.doc["artifacts"].append(os.path.relpath(path, self.out))
        self.write()

    def skip(self, reason: str) -> None:
        """The whole step did not run (missing package, no CUDA in a check that needs it)."""
        self.doc["skipped"] = reason
        print(f"[{self.doc['step']}] SKIPPED: {reason}", flush=True)
        self.write()

    def error(self, name: str, exc: BaseException) -> None:
        """Record an exception as a failed (``error``) check, with its traceback tail and a hint."""
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        tail = "".join(tb[-3:]).strip()
        self.doc["checks"].append({"name": name, "status": "error", "kind": "check", "value": None, "unit": None,
                                   "goal": None, "detail": f"{_short(exc)}\n{tail}", "hint": hint_for(exc)})
        self.write()
        print(f"[{self.doc['step']}] ERROR   {name}: {_short(exc)}\n{''.join(tb)}", flush=True)

    @contextlib.contextmanager
    def guard(self, name: str) -> Iterator[None]:
        """Run a block; an exception in it becomes an ``error`` check named ``name`` and the step goes on."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the step
            self.error(name, exc)

    def finish(self) -> None:
        self.doc["finished"] = True
        self.write()

    def write(self) -> None:
        self.doc["seconds"] = round(time.perf_counter() - self._t0, 2)
        atomic_write_json(self.path, self.doc)


def atomic_write_json(path: Path, doc: Any) -> None:
    """Write JSON to ``path`` atomically (temporary file in the same folder, then rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, default=str)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    try:
        return _jsonable(value.item())  # numpy / torch scalars
    except (AttributeError, ValueError):
        return str(value)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def device_slug(name: str) -> str:
    """File-name part for a device: ``"NVIDIA H200"`` -> ``"h200"``, ``"NVIDIA H200 NVL"`` -> ``"h200-nvl"``."""
    words = [w for w in name.lower().replace("nvidia", " ").replace("_", " ").split() if w]
    slug = "-".join("".join(ch for ch in w if ch.isalnum()) for w in words)
    return slug or "gpu"
