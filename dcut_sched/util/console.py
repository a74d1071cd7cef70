"""The rich console every CLI prints its tables on.

On a terminal rich uses the terminal's width. Anywhere else (a pipe, a log file, CI) rich would
assume 80 columns and wrap or truncate wide tables (``batch_...``); there the console is as wide as
``COLUMNS`` says, or :data:`PIPE_WIDTH`, so a table keeps its natural width and its full headers.
"""

from __future__ import annotations

import os

from rich.console import Console


class _Console(Console):
    """rich's console, whose closed output pipe is a ``BrokenPipeError`` for
    :func:`dcut_sched.cli.errors.run_cli` (quiet, exit 141) instead of rich's ``SystemExit(1)``."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError("the output pipe was closed")


#: Width of a console that is not a terminal and has no ``COLUMNS``: wider than any table here.
PIPE_WIDTH = 250


def make_console(*, stderr: bool = False) -> Console:
    """A ``rich.console.Console`` on stdout (or stderr) that does not wrap tables when piped."""
    console = _Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = _Console(stderr=stderr, width=PIPE_WIDTH)
    return console
