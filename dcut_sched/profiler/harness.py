"""The measuring loop shared by every timed mode (CPU eager, CUDA eager, CUDA graphs).

The cells (:mod:`dcut_sched.profiler.grid`) are visited in ``rounds`` passes, each in a fresh shuffled order
(seeded). On its first visit a cell gets ``warmups`` untimed calls; each visit then takes
``ceil(repeats / rounds)`` timed calls until the cell has ``repeats`` samples. Its row keeps the median
and the 20th/80th percentiles (``numpy.percentile``, linear method) of all its samples.
``rounds=1`` times each cell's repeats back to back (GPU graphs: stable clocks, cheap replays);
``rounds=repeats`` spreads every cell's samples over the whole run, so a machine whose load drifts
(a shared CPU) slows all cells alike instead of whichever cells ran during a busy minute.

After every visit the samples so far are written atomically to a partial file, so an interrupted run
keeps what it measured and ``resume=True`` continues where it stopped. A cell that runs out of
memory is reported and skipped, not fatal.

Timers implement ``prepare(cells, progress)`` (e.g. capture CUDA graphs; returns ``{cell: reason}``
for cells it could not prepare) and ``time(cell, warmups, repeats) -> ms samples``;
:class:`EagerTimer` calls a workload's callables and reads ``time.perf_counter`` (synchronising the
device around each call where there is one).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Mapping, Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from dcut_sched.cost_curve.schema import MAX_MS
from dcut_sched.util.atomic import atomic_write_text
from dcut_sched.util.inputs import InputFileError, parse_json_strict, read_text, shown
from dcut_sched.util.validation import field_message, validate

from .grid import Cell

__all__ = ["EagerTimer", "NoCudaError", "PARTIAL_SCHEMA", "PartialMismatch", "ProfileRun", "is_oom", "load_partial",
           "partial_path_for", "run_profile", "summarise"]

PARTIAL_SCHEMA = "dcut.profile-partial/1"


class NoCudaError(RuntimeError):
    """``--gpu`` was asked for but no CUDA device is usable (raised by :func:`dcut_sched.profiler.cuda_graphs.require_cuda`;
    defined here so the CLI can catch it without importing torch)."""



class PartialMismatch(ValueError):
    """``--resume`` found a partial file made with other settings (names the differing fields), or one
    that is unreadable or has a field of the wrong type (names the file and the field)."""


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (CUDA ``OutOfMemoryError``, ``MemoryError`` or a
    ``RuntimeError`` saying the allocator could not allocate)."""
    if isinstance(exc, MemoryError):
        return True
    try:
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover - torch always present here
        pass
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                              or "not enough memory" in text)


def summarise(samples_ms: Sequence[float]) -> dict[str, float | int]:
    """``{"median_ms", "p20_ms", "p80_ms", "repeats"}`` of timing samples (ms).

    Raises:
        ValueError: no samples, or a non-finite / non-positive one.
    """
    x = np.asarray(samples_ms, dtype=np.float64)
    if x.size == 0 or not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"timing samples must be positive and finite, got {x.tolist()}")
    p20, med, p80 = np.percentile(x, [20, 50, 80])
    return {"median_ms": float(med), "p20_ms": float(p20), "p80_ms": float(p80), "repeats": int(x.size)}


class EagerTimer:
    """Times a workload's callables directly (no graphs).

    Args:
        workload: object with ``fn_for(cell) -> callable``.
        synchronize: called before starting and after each call (``torch.cuda.synchronize`` on a
            GPU so that the time covers the kernels, ``None`` on the CPU).
        clock: seconds clock (``time.perf_counter``; injectable for tests).
    """

    def __init__(self, workload: Any, synchronize: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.workload = workload
        self.synchronize = synchronize or (lambda: None)
        self.clock = clock

    def prepare(self, cells: Sequence[Cell], progress: Callable[[Cell], None] | None = None) -> dict[Cell, str]:
        return {}

    def time(self, cell: Cell, warmups: int, repeats: int) -> np.ndarray:
        fn = self.workload.fn_for(cell)
        for _ in range(warmups):
            fn()
        self.synchronize()
        out = np.empty(repeats)
        for i in range(repeats):
            t0 = self.clock()
            fn()
            self.synchronize()
            out[i] = (self.clock() - t0) * 1e3
        return out


@dataclass
class ProfileRun:
    """What a run measured.

    Attributes:
        verify: rows ``{batch_size, num_tokens, median_ms, p20_ms, p80_ms, repeats}``.
        ar: plain decode rows ``{batch_size, median_ms, p20_ms, p80_ms, repeats}``.
        draft: rows ``{batch_size, median_ms, p20_ms, p80_ms, repeats}``.
        skipped: ``{cell key: reason}`` (out of memory, failed capture).
        measure_seconds: wall time spent measuring in this and earlier (resumed) runs.
        prepare_seconds: wall time of ``timer.prepare`` (graph capture) in this run.
        resumed_cells: cells the partial file already had all repeats of.
    """

    verify: list[dict[str, Any]] = field(default_factory=list)
    draft: list[dict[str, Any]] = field(default_factory=list)
    ar: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    measure_seconds: float = 0.0
    prepare_seconds: float = 0.0
    resumed_cells: int = 0


def partial_path_for(out: str | Path) -> Path:
    """The partial file beside an output file: ``X.json`` -> ``X.json.partial``."""
    out = Path(out)
    return out.with_name(out.name + ".partial")


#: The fix a refused partial names: ``--fresh`` ignores it and replaces it with a new measurement.
PARTIAL_FIX = "fix the file or rerun with --fresh to ignore and replace it"

#: A partial file's sample: what a curve row may hold.
_Sample = Annotated[float, Field(gt=0, le=MAX_MS, allow_inf_nan=False)]


class PartialProfile(BaseModel):
    """Strict pydantic model of the partial file :func:`_write_partial` writes (contract: :func:`load_partial`)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    schema_: Literal[PARTIAL_SCHEMA] = Field(alias="schema")
    settings: dict[str, Any]
    samples_ms: dict[str, list[_Sample]]
    skipped: dict[str, str]
    measure_seconds: float = Field(ge=0, allow_inf_nan=False)


def load_partial(path: str | Path) -> dict[str, Any]:
    """The partial file at ``path``, every field strictly typed, as a plain dict.

    Contract: ``schema`` is :data:`PARTIAL_SCHEMA`; ``settings`` an object; ``samples_ms`` an object
    of lists of positive finite numbers (booleans, strings, nulls, nested lists refused);
    ``skipped`` an object of strings; ``measure_seconds`` a finite number >= 0; no other field. The
    JSON itself is read by :func:`dcut_sched.util.inputs.parse_json_strict` (a repeated key, a
    200-digit number or deep nesting refused). Reading never writes: a refused file is left
    byte-identical.

    Raises:
        PartialMismatch: one line naming the file and the first bad field, and ``--fresh``.
    """
    path = Path(path)
    try:
        raw = parse_json_strict(read_text(path, "a dcut-profile partial file"), f"partial file {path}",
                                allow_nonfinite=True)
    except InputFileError as exc:
        where = str(exc) if str(exc).startswith("partial file") else f"partial file {exc}"
        raise PartialMismatch(f"{where}; {PARTIAL_FIX}") from None
    doc = validate(PartialProfile, raw, f"partial file {path}", PARTIAL_FIX, PartialMismatch,
                   extra="is not a field of a partial file")
    return doc.model_dump(by_alias=True)


def _load_partial(path: Path, settings: Mapping[str, Any]) -> dict[str, Any]:
    doc = load_partial(path)
    old = doc["settings"]
    diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
    if diff:
        changed = "; ".join(f"{str(k)[:60]}: {shown(old.get(k), 60)} -> {shown(settings.get(k), 60)}" for k in diff[:4])
        raise PartialMismatch(f"partial file {path}: made with other settings ({changed}); rerun with the same "
                              f"options, or with --fresh to ignore and replace it")
    return doc


def _write_partial(path: Path, settings: Mapping[str, Any], samples: Mapping[str, list], skipped: Mapping[str, str],
                   seconds: float) -> None:
    doc = {"schema": PARTIAL_SCHEMA, "settings": dict(settings), "samples_ms": {k: v for k, v in samples.items() if v},
           "skipped": dict(skipped), "measure_seconds": seconds}
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")


def _default_settings_json(settings: Mapping[str, Any]) -> dict[str, Any]:
    # JSON round trip so that tuples compare equal to the lists read back from the file.
    return json.loads(json.dumps(dict(settings)))


def run_profile(timer: Any, cells: Sequence[Cell], *, warmups: int, repeats: int, rounds: int = 1, seed: int = 0,
                partial_path: str | Path | None = None, settings: Mapping[str, Any] | None = None,
                resume: bool = False, progress: bool = True, console: Any = None,
                on_visit: Callable[[Cell, list], None] | None = None) -> ProfileRun:
    """Measure ``cells`` with ``timer`` (module docstring).

    Args:
        timer: :class:`EagerTimer`, :class:`dcut_sched.profiler.cuda_graphs.GraphTimer` or compatible.
        cells: what to measure.
        warmups: untimed calls on a cell's first visit.
        repeats: timed calls per cell in total (>= 1).
        rounds: passes over the cells (1 <= rounds <= repeats); see the module docstring.
        seed: shuffles the visiting order of every pass.
        partial_path: where to keep progress (written atomically after each visit); ``None`` = nowhere.
        settings: what identifies the profile (model, backend, block size, ...); a resumed partial
            file must have been written with equal settings.
        resume: continue from ``partial_path`` if it exists (typed by :func:`load_partial` first; a
            refused file is not rewritten). Without it the partial file is replaced at the first write.
        progress: show a rich progress bar.
        on_visit: called after each visit with the cell and its samples so far (logging, tests).

    Returns:
        :class:`ProfileRun`.

    Raises:
        PartialMismatch: ``resume`` with a partial file of other settings, of a wrong type in any field,
            or an unreadable one (raised before anything is measured or written).
        ValueError: ``repeats < 1``, ``warmups < 0`` or ``rounds`` outside ``[1, repeats]``.
    """
    if repeats < 1 or warmups < 0 or not 1 <= rounds <= repeats:
        raise ValueError(f"need repeats >= 1, warmups >= 0 and 1 <= rounds <= repeats, got {repeats}, {warmups}, "
                         f"{rounds}")
    settings = _default_settings_json(settings or {})
    path = Path(partial_path) if partial_path is not None else None
    samples: dict[str, list[float]] = {c.key: [] for c in cells}
    skipped: dict[str, str] = {}
    seconds = 0.0
    run = ProfileRun()
    if resume and path is not None and path.exists():
        seconds = _resume_samples(path, settings, samples, repeats)
        run.resumed_cells = sum(1 for v in samples.values() if len(v) >= repeats)
    per_visit = -(-repeats // rounds)
    rng = np.random.default_rng(seed)
    orders = [[cells[i] for i in rng.permutation(len(cells))] for _ in range(rounds)]
    todo = [c for c in orders[0] if len(samples[c.key]) < repeats]

    total = len(cells) * repeats
    with _progress_bar(console, progress) as bar:
        t_prep = time.perf_counter()
        prep_task = bar.add_task("prepare (largest first)", total=len(todo))
        failed = timer.prepare(todo, lambda cell: bar.advance(prep_task))
        bar.update(prep_task, completed=len(todo))
        run.prepare_seconds = time.perf_counter() - t_prep
        for cell, reason in failed.items():
            skipped[cell.key] = reason
        task = bar.add_task("measure", total=total, completed=sum(min(len(v), repeats) for v in samples.values()))
        for order in orders:
            for cell in order:
                have = samples[cell.key]
                need = min(per_visit, repeats - len(have))
                if need <= 0 or cell.key in skipped:
                    continue
                bar.update(task, description=f"measure {cell.key:<16}")
                t0 = time.perf_counter()
                reason = _visit(timer, cell, have, warmups if not have else 0, need)
                if reason is not None:
                    skipped[cell.key] = reason
                    if console is not None:
                        console.print(f"[yellow]skipped {cell.key}: out of memory[/]")
                    release = getattr(timer, "release_memory", None)
                    if release is not None:
                        release()
                    bar.advance(task, repeats - len(have))
                else:
                    bar.advance(task, need)
                    if on_visit is not None:
                        on_visit(cell, list(have))
                seconds += time.perf_counter() - t0
                if path is not None:
                    _write_partial(path, settings, samples, skipped, seconds)
    run.measure_seconds = seconds
    run.skipped = skipped
    _add_rows(run, cells, samples)
    return run


def _resume_samples(path: Path, settings: dict[str, Any], samples: dict[str, list[float]], repeats: int) -> float:
    """Fill ``samples`` from the partial file ``path`` (written with ``settings``) and return its
    measure seconds; :class:`PartialMismatch` names a cell this profile lacks or one with more than
    ``repeats`` samples."""
    doc = _load_partial(path, settings)
    for key, vals in doc["samples_ms"].items():
        if key not in samples:
            raise PartialMismatch(field_message(f"partial file {path}", f"samples_ms.{key[:60]}",
                                                "not a cell of this profile", PARTIAL_FIX))
        if len(vals) > repeats:
            raise PartialMismatch(field_message(f"partial file {path}", f"samples_ms.{key[:60]}",
                                                f"{len(vals):,} samples, more than --repeats {repeats}", PARTIAL_FIX))
        samples[key] = list(vals)
    return doc["measure_seconds"]


def _progress_bar(console: Any, progress: bool):
    """The rich progress display of a profile (description, bar, count, elapsed, remaining)."""
    # rich is optional where the device check runs (pip's vendored copy stands in): imported here
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    return Progress(*columns, console=console, disable=not progress, transient=False)


def _visit(timer: Any, cell: Cell, have: list[float], warmups: int, need: int) -> str | None:
    """Time ``need`` more calls of ``cell`` into ``have``; an out-of-memory error is returned as the
    skip reason (anything else is raised)."""
    try:
        got = timer.time(cell, warmups, need)
    except Exception as exc:  # noqa: BLE001 - OOM is reported and skipped, anything else re-raised
        if not is_oom(exc):
            raise
        return f"out of memory: {str(exc).splitlines()[0][:120]}"
    have.extend(float(x) for x in got)
    return None


def _add_rows(run: ProfileRun, cells: Sequence[Cell], samples: dict[str, list[float]]) -> None:
    """The summary row of every measured cell not skipped, into ``run``'s verify, ar and draft rows (sorted)."""
    for cell in cells:
        vals = samples[cell.key]
        if cell.key in run.skipped or not vals:
            continue
        stats = summarise(vals)
        if cell.kind == "verify":
            run.verify.append({"batch_size": cell.batch_size, "num_tokens": cell.num_tokens, **stats})
        elif cell.kind == "ar":
            run.ar.append({"batch_size": cell.batch_size, **stats})
        else:
            run.draft.append({"batch_size": cell.batch_size, **stats})
    run.verify.sort(key=lambda r: (r["batch_size"], r["num_tokens"]))
    run.ar.sort(key=lambda r: r["batch_size"])
    run.draft.sort(key=lambda r: r["batch_size"])
