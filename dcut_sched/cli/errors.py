"""The one error-and-exit convention of every command-line tool (dcut-sim, dcut-trace, dcut-engine,
dcut-profile).

- Bad input (a flag, a file, a path) is a :class:`UsageError` -- or any ``ValueError``/``OSError`` a
  loader raises (``TraceError``, ``CostCurveError``, ...): one line ``PROG: error: MESSAGE`` on
  stderr, exit status :data:`EXIT_USAGE` (2), no traceback and no partial output.
- SIGINT (Ctrl-C) and SIGTERM are handled alike: the running command unwinds (temp files are
  removed by the atomic writers, resumable partial files are kept), one line
  ``PROG: interrupted (SIGINT)`` is printed and the status is 128 + signal number (130 / 143).
- An allocation that fails (``MemoryError``, torch's out-of-memory errors) is one line naming the
  sizes to lower, exit 2; a closed output pipe (``dcut-trace stats | head``) ends quietly with
  128 + SIGPIPE (141).
- Anything else is a bug and keeps its traceback.

- A flag argparse rejects (a bad number, an unknown choice) is reported the same way by
  :class:`CliParser`: one line naming the flag, exit 2.

Usage::

    def build_parser():
        p = CliParser(prog=PROG, ...)

    def main(argv=None) -> int:
        return run_cli(PROG, lambda: _run(build_parser().parse_args(argv)))
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Callable

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_USAGE", "CliParser", "Interrupted", "UsageError", "exit_status_of", "handle_signals", "run_cli"]

EXIT_USAGE = 2
#: A closed output pipe ends the command quietly with 128 + SIGPIPE, as shell tools do.
EXIT_BROKEN_PIPE = 128 + 13


class UsageError(ValueError):
    """Bad command-line input: printed as one line, exit status 2.

    The message names the flag or file and says how to fix it.
    """


class CliParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are :class:`UsageError` (one line, exit 2 under
    :func:`run_cli`) instead of a usage block and ``SystemExit``; subcommand parsers inherit it."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise UsageError(f"{message} (see {self.prog} --help)")


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``signum`` says which. A ``KeyboardInterrupt``, so code that
    keeps resumable state on Ctrl-C does the same on SIGTERM."""

    def __init__(self, signum: int | str = signal.SIGINT):
        # Also rebuilt from its args (copy, pickle, re-raise as type(exc)(*exc.args)): the name.
        sig = signal.Signals[signum] if isinstance(signum, str) else signal.Signals(signum)
        super().__init__(sig.name)
        self.signum = int(sig)


_OWNER_PID: int | None = None


def _raise_interrupted(signum, _frame) -> None:
    if os.getpid() != _OWNER_PID:  # a forked worker stopped before its initializer ran: leave quietly
        os._exit(128 + int(signum))
    raise Interrupted(signum)


class handle_signals:
    """Context manager: SIGINT and SIGTERM raise :class:`Interrupted` in the main thread.

    The previous handlers come back on exit. Outside the main thread it does nothing (Python only
    delivers signals there). A process forked meanwhile that has not set its own handlers exits
    with 128 + the signal, without a traceback.
    """

    def __enter__(self) -> "handle_signals":
        global _OWNER_PID
        self._old: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            _OWNER_PID = os.getpid()
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, _raise_interrupted)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def exit_status_of(exc: KeyboardInterrupt) -> int:
    """128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    else:
        text = str(exc) or type(exc).__name__
    # one line whatever the message holds: a newline (in a file name, a library's message) is shown
    # escaped, so the error stays one line and a path is shown as it is
    text = text.strip().replace("\r", "\\r").replace("\n", "\\n")
    if len(text) > MAX_MESSAGE_CHARS:  # a value echoed at length (a 100,000-character field, a huge path):
        cut = len(text) - MAX_MESSAGE_CHARS  # keep the start (what and where) and the end (the fix)
        text = f"{text[:MAX_MESSAGE_CHARS - 200]} [... {cut:,} characters cut ...] {text[-200:]}"
    return text


#: The longest error line a CLI prints; longer messages keep their first and last characters.
MAX_MESSAGE_CHARS = 600


def run_cli(prog: str, body: Callable[[], int | None], *, errors: tuple[type[BaseException], ...] = ()) -> int:
    """Run ``body()`` under the convention of the module docstring; return the exit status.

    Args:
        prog: the command name used in messages (``dcut-sim``, ``dcut-trace stats``, ...).
        body: the command; returns its exit status (``None`` = 0).
        errors: further exception types that mean bad input here (reported like ``UsageError``).
    """
    bad_input = (ValueError, OSError, *errors)
    try:
        with handle_signals():
            status = body()
    except KeyboardInterrupt as exc:
        print(f"{prog}: interrupted ({signal.Signals(exit_status_of(exc) - 128).name})", file=sys.stderr)
        return exit_status_of(exc)
    except RecursionError:
        print(f"{prog}: error: an input file is nested too deeply to read (RecursionError); check the files given",
              file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # stdout's reader went away (``dcut-trace stats | head``): stop quietly, as a shell tool does;
        # stdout is pointed at /dev/null so the interpreter's final flush cannot raise again.
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        # A signal that lands inside a C extension's import or a library's except-and-reraise comes
        # back as another exception (ImportError: initialization failed, ValueError ... from None)
        # with the Interrupted in its chain: it is still an interruption.
        interrupt = _interrupt_in_chain(exc)
        if interrupt is not None:
            print(f"{prog}: interrupted ({signal.Signals(exit_status_of(interrupt) - 128).name})", file=sys.stderr)
            return exit_status_of(interrupt)
        if _out_of_memory(exc):
            print(f"{prog}: error: not enough memory for this run ({_one_line(exc)[:200]}); lower the sizes given "
                  f"(batch size, tokens, context length, requests)", file=sys.stderr)
            return EXIT_USAGE
        if not isinstance(exc, bad_input):
            raise
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    return 0 if status is None else int(status)


def _out_of_memory(exc: BaseException) -> bool:
    """An allocation that failed: ``MemoryError``, torch's ``OutOfMemoryError`` (CUDA), or torch's CPU
    allocator failure (a plain ``RuntimeError`` whose message says it cannot allocate memory)."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _silence_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _interrupt_in_chain(exc: BaseException) -> KeyboardInterrupt | None:
    seen: set[int] = set()
    todo = [exc.__cause__, exc.__context__]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt):
            return e
        todo += [e.__cause__, e.__context__]
    return None


