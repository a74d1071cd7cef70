"""Progress for long runs that reads well on a terminal and in a log.

On a terminal :class:`RunProgress` draws a rich progress bar (completed/total, rate, elapsed, ETA).
Anywhere else (a pipe, a log file, CI) it prints one self-contained line to stderr every
``interval_s`` seconds and one at the end, e.g.::

    dcut-engine fine: 12/80 requests (15%), 410 tokens, 6.2 tokens/s, elapsed 1m06s, ETA ~5m58s; step 97

The lines come from a background timer, so a run stays visibly alive while the main thread sits in
one long call (a batched target decode, a model load). The rate and ETA are ``completed / elapsed``
and ``(total - completed) / rate`` from the work counted so far (an extrapolation, labelled ``~``).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import IO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

#: Seconds between log lines when not on a terminal; ``DCUT_PROGRESS_INTERVAL_S`` overrides it.
DEFAULT_INTERVAL_S = 30.0


def format_duration(seconds: float) -> str:
    """``75.0 -> '1m15s'``, ``3725 -> '1h02m'``, ``8.2 -> '8s'``; ``nan``/``inf`` -> ``'?'``."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def status_line(label: str, completed: float, total: float | None, unit: str, elapsed_s: float,
                detail: str = "", initial: float = 0.0) -> str:
    """One progress line: counts, percentage, rate, elapsed and ETA.

    The rate is ``(completed - initial) / elapsed_s`` (``initial``: work already done when the run
    started, e.g. a resumed recording); the ETA is ``(total - completed) / rate``.
    """
    parts = [f"{completed:,.0f}/{total:,.0f} {unit} ({100.0 * completed / total:.0f}%)" if total
             else f"{completed:,.0f} {unit}"]
    rate = (completed - initial) / elapsed_s if elapsed_s > 0 else 0.0
    if completed > initial:
        if rate < 0.1:  # slow work (a request per minute): per minute reads better than 0.01/s
            parts.append(f"{60 * rate:,.2f} {unit}/min")
        else:
            parts.append(f"{rate:,.2f} {unit}/s" if rate < 10 else f"{rate:,.0f} {unit}/s")
    parts.append(f"elapsed {format_duration(elapsed_s)}")
    if total and rate > 0:
        parts.append(f"ETA ~{format_duration((total - completed) / rate)}")
    line = f"{label}: " + ", ".join(parts)
    return f"{line}; {detail}" if detail else line


class RunProgress:
    """A progress display for one run (context manager).

    Args:
        label: what runs (first word of every line), e.g. ``"dcut-engine fine"``.
        total: units of work expected (None: unknown; no percentage or ETA).
        unit: name of the unit (``"requests"``, ``"tokens"``).
        enabled: False shows nothing at all (``--quiet``).
        interval_s: seconds between log lines when not on a terminal (default
            ``DCUT_PROGRESS_INTERVAL_S`` or 30).
        stream: where lines and the bar go (default ``sys.stderr``).
        force_lines: print log lines even on a terminal (tests).
    """

    def __init__(self, label: str, total: float | None, unit: str, *, enabled: bool = True,
                 interval_s: float | None = None, stream: IO[str] | None = None, force_lines: bool = False):
        self.label, self.total, self.unit, self.enabled = label, total, unit, enabled
        self.interval_s = float(interval_s if interval_s is not None
                                else os.environ.get("DCUT_PROGRESS_INTERVAL_S", DEFAULT_INTERVAL_S))
        self.stream = stream if stream is not None else sys.stderr
        self.completed = 0.0
        self.initial = 0.0
        self.detail = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._task = None
        self._t0 = time.perf_counter()
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.lines = enabled and (force_lines or not is_tty)

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "RunProgress":
        self._t0 = time.perf_counter()
        self.initial = self.completed
        if not self.enabled:
            return self
        if self.lines:
            self._thread = threading.Thread(target=self._tick, name="dcut-progress", daemon=True)
            self._thread.start()
        else:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn(self.unit), TimeElapsedColumn(), TextColumn("ETA"),
                                 TimeRemainingColumn(), TextColumn("{task.fields[detail]}"),
                                 console=Console(file=self.stream), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.completed,
                                            detail=self.detail)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    # ------------------------------------------------------------------ updates
    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._t0

    def update(self, *, completed: float | None = None, advance: float = 0.0, total: float | None = None,
               detail: str | None = None) -> None:
        """Count work done (``completed`` absolute or ``advance`` relative) and set the detail text."""
        with self._lock:
            if completed is not None:
                self.completed = float(completed)
            self.completed += advance
            if total is not None:
                self.total = total
            if detail is not None:
                self.detail = detail
        if self._bar is not None:
            self._bar.update(self._task, completed=self.completed, total=self.total, detail=self.detail)

    def line(self) -> str:
        """The current status line."""
        with self._lock:
            return status_line(self.label, self.completed, self.total, self.unit, self.elapsed_s, self.detail,
                               self.initial)

    def note(self, text: str) -> None:
        """Print one line now (an estimate, a phase change): above the bar, or as a log line."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)

    def close(self, failed: bool = False) -> None:
        """Stop the timer or bar; in log mode print the final line."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            print(self.line() + (" (stopped)" if failed else " (done)"), file=self.stream, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            print(self.line(), file=self.stream, flush=True)
