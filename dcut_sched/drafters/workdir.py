"""The files of ``dcut-drafter train`` as inputs with owners (docs/drafters.md, "Work dir and drafter folder").

:func:`read_work_dir` reads and checks the work dir's ``data.pt`` and ``state.pt`` before anything is
written: a file that cannot be read, or of other settings, is one :class:`WorkDirError` naming the file,
the field and the fix (``--fresh``). :func:`lock_work_dir` refuses a second run at once;
:func:`check_drafter_folder` and :func:`replace_folder` write a drafter folder only over its own, all or none.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch
from torch.torch_version import TorchVersion

from ..util.atomic import _signals_held, _umask, missing_folders, remove_empty_folders
from ..util.inputs import read_text
from .data import DraftSequence

__all__ = ["TrainState", "TrainingDivergedError", "WorkDir", "WorkDirError", "check_drafter_folder", "finite_or_raise",
           "check_optimizer_state", "first_difference", "lock_work_dir", "read_data", "read_work_dir", "replace_folder", "safe_types"]

FRESH = "pass --fresh to start over (it replaces the file)"


class WorkDirError(ValueError):
    """A work-dir file or drafter folder that a run may not use: names the file, the field and the fix."""


@dataclass
class TrainState:
    """What a resumed run continues from: the step reached and the curves so far (``state.pt``'s ``state``)."""

    step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0


# state.pt pickles the class under this name (the one every checkpoint so far holds); train re-exports it.
TrainState.__module__ = "dcut_sched.drafters.train"


@dataclass
class WorkDir:
    """What :func:`read_work_dir` found: the checked ``data.pt`` and ``state.pt`` contents (None when
    absent or ignored with ``fresh``)."""

    data: dict | None = None
    state: dict | None = None


def first_difference(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    """The first field (in ``wanted``'s order, then ``saved``'s) whose values differ, or None; in a
    field that is a mapping on both sides, the differing field inside it (``settings.seed``)."""
    for key in [*wanted, *(k for k in saved if k not in wanted)]:
        if key not in saved or key not in wanted:
            return key
        a, b = saved[key], wanted[key]
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            inner = first_difference(a, b)
            if inner is not None:
                return f"{key}.{inner}"
        elif _norm(a) != _norm(b):
            return key
    return None


def _norm(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _shown(mapping: Mapping[str, Any], field: str) -> str:
    """``repr`` of ``field`` (a :func:`first_difference` name, dotted into mappings) in ``mapping``."""
    for part in field.split("."):
        if not isinstance(mapping, Mapping) or part not in mapping:
            return "(none)"
        mapping = mapping[part]
    return repr(mapping)


def safe_types() -> list[type]:
    """The classes a work-dir file holds besides tensors and plain containers, allowed to
    ``torch.load(weights_only=True)``: the data's :class:`~dcut_sched.drafters.data.DraftSequence`,
    the checkpoint's :class:`TrainState`, and ``TorchVersion`` (a ``str``
    subclass: the ``torch`` field of keys written before it was stored as a plain string)."""
    return [DraftSequence, TrainState, TorchVersion]


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _load(path: Path, what: str) -> Any:
    """``torch.load`` of a work-dir file with ``weights_only=True``: tensors, plain containers and
    :func:`safe_types` only, so a crafted pickle runs no code; anything unreadable, or holding any
    other object, is one :class:`WorkDirError`."""
    try:
        with warnings.catch_warnings():  # torch warns of a pickle protocol it may not read: the error says it
            warnings.simplefilter("ignore")
            if hasattr(torch.serialization, "safe_globals"):  # torch >= 2.5: allowed for this load only
                with torch.serialization.safe_globals(safe_types()):
                    return torch.load(path, weights_only=True, map_location="cpu")
            torch.serialization.add_safe_globals(safe_types())
            return torch.load(path, weights_only=True, map_location="cpu")
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - pickle/zip/torch raise many types for a damaged file
        found = _GLOBAL.search(str(exc))
        if found:
            raise WorkDirError(f"{path}: refers to {found.group(1)}, which no {what} holds; refused without "
                               f"loading it (the file may have been crafted to run code); {FRESH}") from None
        raise WorkDirError(f"{path}: not a readable {what} ({type(exc).__name__}); {FRESH}") from None


def _check_data(path: Path, data: Any, key: dict) -> dict:
    if not isinstance(data, dict) or not isinstance(data.get("key"), dict):
        raise WorkDirError(f"{path}: not generated data of dcut-drafter train (no 'key' with its settings); {FRESH}")
    for split in ("train", "eval"):
        seqs = data.get(split)
        if not isinstance(seqs, list) or not seqs or not all(
                isinstance(s, DraftSequence) and isinstance(s.features, torch.Tensor) and s.features.dim() == 2
                for s in seqs):
            raise WorkDirError(f"{path}: field {split!r} is not a list of sequences with features; {FRESH}")
    field = first_difference(data["key"], key)
    if field is not None:
        raise WorkDirError(f"{path}: data generated with {field}={_shown(data['key'], field)}, not "
                           f"{_shown(key, field)}; pass --fresh to regenerate it (or the same settings to reuse it)")
    for name, kind in (("sha256", str), ("stats", dict)):
        if not isinstance(data.get(name), kind):
            raise WorkDirError(f"{path}: field {name!r} is missing or not a {kind.__name__}; {FRESH}")
    return data


def read_data(path: Path, key: dict) -> dict | None:
    """The generated data in ``path`` when its ``key`` is ``key`` (None when there is no file).
    The one place that decides whether cached data may be reused: data of other settings is refused,
    never regenerated in its place.

    Raises:
        WorkDirError: ``path`` is not a file, cannot be read, is not generated data, or holds data of
            another key (the message names the first differing field, e.g. ``settings.seed``).
    """
    if path.exists() and not path.is_file():
        raise WorkDirError(f"{path}: is not a file; remove it or give another --work-dir")
    if not path.is_file():
        return None
    return _check_data(path, _load(path, "dcut-drafter train data file"), key)


def _check_state(path: Path, state: Any, settings: dict) -> dict:
    if not isinstance(state, dict) or not isinstance(state.get("settings"), dict):
        raise WorkDirError(f"{path}: not a dcut-drafter train checkpoint (no 'settings'); {FRESH}")
    field = first_difference(state["settings"], settings)
    if field is not None:
        why = (" (another number of steps is another learning-rate schedule, so the checkpoint cannot be "
               "continued into it)" if field == "steps" else "")
        raise WorkDirError(f"{path}: checkpoint trained with {field}={_shown(state['settings'], field)}, not "
                           f"{_shown(settings, field)}{why}; pass --fresh to start over (or the same settings "
                           "to resume)")
    for name, kind in (("model", dict), ("optimizer", dict), ("state", TrainState)):
        if not isinstance(state.get(name), kind):
            raise WorkDirError(f"{path}: field {name!r} is missing or not a {kind.__name__}; {FRESH}")
    step = state["state"].step
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= settings["steps"]:
        raise WorkDirError(f"{path}: field state.step is {step!r}, not a step in 0..{settings['steps']}; {FRESH}")
    _check_curves(path, state["state"])
    for name, t in state["model"].items():
        if not isinstance(t, torch.Tensor):
            raise WorkDirError(f"{path}: model weight {name} is not a tensor; {FRESH}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise WorkDirError(f"{path}: model weight {name} holds non-finite values; {FRESH}")
    return state


def _check_curves(path: Path, state: Any) -> None:
    """The curves a resumed run continues and ships (``training_curve.csv``, the card): ``history``
    one row per step taken (``step`` 1..N in order, a finite ``loss``), ``evals`` a list of rows,
    ``elapsed_s`` a finite number >= 0."""
    history = state.history
    if not isinstance(history, list) or len(history) != state.step:
        shown = f"{len(history)} rows" if isinstance(history, list) else type(history).__name__
        raise WorkDirError(f"{path}: field state.history is {shown}, not one row per step taken ({state.step}); "
                           f"{FRESH}")
    for n, row in enumerate(history, 1):
        loss = row.get("loss") if isinstance(row, dict) else None
        if (not isinstance(row, dict) or row.get("step") != n or isinstance(loss, bool)
                or not isinstance(loss, (int, float)) or not math.isfinite(loss)):
            raise WorkDirError(f"{path}: field state.history[{n - 1}] is not step {n}'s row with a finite loss; "
                               f"{FRESH}")
    if not isinstance(state.evals, list) or not all(isinstance(e, dict) for e in state.evals):
        raise WorkDirError(f"{path}: field state.evals is not a list of rows; {FRESH}")
    elapsed = state.elapsed_s
    if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or not 0 <= elapsed < math.inf:
        raise WorkDirError(f"{path}: field state.elapsed_s is {elapsed!r}, not a number of seconds >= 0; {FRESH}")


def read_work_dir(work_dir: Path, data_name: str, state_name: str, *, settings: dict, data_key: dict,
                  fresh: bool) -> WorkDir:
    """Read and check ``data_name`` and ``state_name`` in ``work_dir`` against the run's settings
    (``settings``: every ``TrainSettings`` field; ``data_key``: the data's key,
    :meth:`~dcut_sched.drafters.datagen.DataSettings.key`). Writes nothing.

    Raises:
        WorkDirError: a file that cannot be read or is not what ``train`` writes, or one made with
            other settings (the message names the field; ``fresh`` ignores both files).
    """
    found = WorkDir()
    if fresh:
        return found
    state_path, data_path = work_dir / state_name, work_dir / data_name
    for path in (state_path, data_path):
        if path.exists() and not path.is_file():
            raise WorkDirError(f"{path}: is not a file; remove it or give another --work-dir")
    if state_path.is_file():  # first: it names any field, the data only the data settings
        found.state = _check_state(state_path, _load(state_path, "dcut-drafter train checkpoint"), settings)
    found.data = read_data(data_path, data_key)
    return found


@contextlib.contextmanager
def lock_work_dir(work_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on the folder ``work_dir`` (which exists) for the block.

    Raises:
        WorkDirError: another process holds it (a live run on the same work dir); never waits.
    """
    fd = os.open(work_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkDirError(f"--work-dir {work_dir}: another dcut-drafter train is running on it; wait for it "
                               "to end, or give another --work-dir") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def check_drafter_folder(out: Path, settings: dict, *, fresh: bool, owned_files: tuple[str, ...]) -> None:
    """``--out`` may be written: a new or empty folder, or a drafter folder ``dcut-drafter train``
    wrote (``heldout.json`` holds its settings) with these ``settings`` (any settings with ``fresh``).

    Raises:
        WorkDirError: a file; a folder holding files other than ``owned_files`` (they would be lost);
            a drafter another command wrote, or one of other settings, without ``fresh``.
    """
    if out.exists() and not out.is_dir():
        raise WorkDirError(f"--out {out} is a file; give a folder for the drafter")
    if not out.is_dir() or not any(out.iterdir()):
        return
    others = sorted(p.name for p in out.iterdir() if p.name not in owned_files)
    if others:
        raise WorkDirError(f"--out {out} holds files dcut-drafter train does not write ({', '.join(others[:3])}); "
                           "replacing the folder would lose them: give a new or empty folder")
    card = out / "heldout.json"
    try:
        saved = json.loads(read_text(card, "a drafter's heldout.json"))  # a pipe refused, not read (it would block)
        saved_settings = saved["settings"]
        if not isinstance(saved_settings, dict) or not str(saved.get("command", "")).startswith("dcut-drafter train"):
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):
        if fresh:
            return
        raise WorkDirError(f"--out {out}: {card} is missing or unreadable, so this folder was not written by "
                           "dcut-drafter train (or was damaged); pass --fresh to replace it, or give another --out"
                           ) from None
    field = first_difference(saved_settings, settings)
    if field is not None and not fresh:
        raise WorkDirError(f"--out {out} holds a drafter trained with {field}={_shown(saved_settings, field)}, not "
                           f"{_shown(settings, field)}; pass --fresh to replace it, or give another --out")


def replace_folder(out: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(stage)`` on a new sibling folder of ``out``, then put it in ``out``'s place: the
    old folder is renamed aside, the staged one renamed in, the old one removed. ``out`` is the old
    folder or the complete new one, never a mix; on any failure the staged folder is removed (a
    symlinked ``out`` is replaced where it points).

    Raises:
        OSError: the parent folder cannot be written (the message names ``out``).
    """
    dest = out.resolve()  # absolute (``.`` has no name to rename) and, for a symlink, where it points
    made = missing_folders(dest.parent)
    stage: Path | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{dest.name[:80]}.", suffix=".staged", dir=dest.parent))
        os.chmod(stage, 0o777 & ~_umask())
        write(stage)
        with _signals_held():
            if dest.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{dest.name[:80]}.", suffix=".old", dir=dest.parent))
                os.rename(dest, old)  # over the empty temp folder: atomic
                try:
                    os.rename(stage, dest)
                except BaseException:
                    os.rename(old, dest)
                    raise
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(stage, dest)
        stage = None
    except OSError as exc:
        raise OSError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
            remove_empty_folders(made)


def check_optimizer_state(opt: torch.optim.Optimizer, model: torch.nn.Module, path: Path) -> None:
    """Every tensor of the loaded optimizer state (AdamW's ``exp_avg``, ``exp_avg_sq``) has its weight's
    shape and finite values, its ``step`` one finite number: ``load_state_dict`` checks none of it,
    and a moment of another shape failed only at the first resumed step.

    Raises:
        WorkDirError: a moment of another shape, or a non-finite value (names ``path`` and the weight).
    """
    names = {id(p): name for name, p in model.named_parameters()}
    for param, slots in opt.state.items():
        for slot, value in slots.items():
            if not isinstance(value, torch.Tensor):
                continue
            where = f"{path}: optimizer state {slot} of {names.get(id(param), 'a weight')}"
            if slot == "step":
                if value.numel() != 1 or not bool(torch.isfinite(value.float()).all()):
                    raise WorkDirError(f"{where} is not one finite step count; {FRESH}")
            elif tuple(value.shape) != tuple(param.shape):
                raise WorkDirError(f"{where} has shape {tuple(value.shape)}, the weight {tuple(param.shape)}; {FRESH}")
            elif value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise WorkDirError(f"{where} holds non-finite values; {FRESH}")


class TrainingDivergedError(ValueError):
    """The loss or a weight went non-finite: the run stops, nothing is shipped or checkpointed."""


def finite_or_raise(loss: float, model: torch.nn.Module | None, step: int, lr: float) -> None:
    """Raise :class:`TrainingDivergedError` when ``loss`` (or, given ``model``, any weight) is not finite."""
    bad = None if math.isfinite(loss) else f"the loss is {loss}"
    if bad is None and model is not None:
        for name, p in model.named_parameters():
            if not bool(torch.isfinite(p).all()):
                bad = f"weight {name} is not finite"
                break
    if bad is not None:
        raise TrainingDivergedError(f"training diverged at step {step}: {bad} (lr {lr:.3g}); lower --lr and rerun "
                                 "(the work dir keeps the last finite checkpoint)")
