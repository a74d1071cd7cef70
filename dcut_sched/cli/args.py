"""Argument types and path guards shared by every command-line tool.

- Number types for ``argparse`` (``type=``): :func:`int_at_least`, :func:`finite_float`: a value
  that would make results meaningless (``--overhead-ms inf``, ``--jobs 0``, ``--seed -1``) is
  refused at parse time with a message naming the flag.
- :func:`check_paths`: before any work, every output path must be writable, of an accepted suffix,
  distinct from every other output and never one of the input files (compared as resolved paths,
  and with ``os.path.samefile`` where both exist, so links and ``./a/../a`` spellings are caught);
  a path that is a symlink loop, input or output, is refused naming its flag.
- :func:`read_text_input`: a text input (JSON, JSONL, config) read as UTF-8, with a one-line error
  naming the flag, the file and the fix when it is missing, binary (e.g. a Parquet file given by
  mistake) or not UTF-8 (:mod:`dcut_sched.util.inputs`).
- :func:`check_json_input`: a JSON input refused before any work unless it reads under
  :func:`dcut_sched.util.inputs.parse_json_strict` (no repeated key, no number longer than 64 digits,
  bounded nesting).
- :func:`param_value`: the value of a ``--param`` flag: strict JSON, ``True``/``False``/``None`` in any
  case, or else a plain string.
- :func:`comma_list`: the one comma-separated list type (batch sizes, layers, ratios, policy names),
  at most :data:`MAX_LIST_ITEMS` items.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..util.atomic import check_writable
from .errors import UsageError

__all__ = ["MAX_LIST_ITEMS", "MAX_SEED", "SELF_SPEC_SKIP_LAYERS", "check_json_input", "check_paths", "comma_list", "finite_float", "flag_of",
           "given_flags", "int_at_least", "param_value",
           "read_text_input", "same_file", "seed_type", "short_value", "torch_device"]

#: ``--skip-layers`` unless given: the SmolLM2 layers the self-speculative drafter skips. A run with another
#: drafter (DFlash, an hf draft model) refuses any other value, since it would not read it.
SELF_SPEC_SKIP_LAYERS: tuple[int, ...] = (14, 15)

#: The largest ``--seed`` any tool takes: seeds are stored as int64 in result files.
MAX_SEED = 2**63 - 1


def int_at_least(minimum: int, maximum: int | None = None) -> "callable":
    """An ``argparse`` type: an integer >= ``minimum`` (and <= ``maximum``, a documented limit, when given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{short_value(text)!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{short_value(f'{value:,}')} is above the limit {maximum:,} (docs/reliability.md); "
                                             f"split the work into several runs")
        return value

    parse.__name__ = f"integer >= {minimum}" if maximum is None else f"integer in [{minimum}, {maximum}]"
    return parse


#: The most items one comma-separated flag value holds (docs/reliability.md): far above any real list
#: of batch sizes, layers or policies; it bounds the work of one parse.
MAX_LIST_ITEMS = 10_000


def comma_list(kind: Callable[[str], Any] = int, *, what: str = "integers", item: str = "value",
               minimum: float | None = None, maximum: float | None = None, open_low: bool = False,
               need: str = "", limit: int | None = None, unique: bool = False, allow_empty: bool = False,
               max_items: int = MAX_LIST_ITEMS) -> "callable":
    """An ``argparse`` type: a comma-separated list of ``kind`` values (empty items are skipped).

    Refused, in this order: more than ``max_items`` items; an item ``kind`` cannot read ("not a
    comma-separated list of ``what``"); an empty list unless ``allow_empty``; a value outside
    [``minimum``, ``maximum``] (``minimum`` excluded with ``open_low``; "need ``need``"); a value
    above ``limit``, a documented work limit; a repeated value when ``unique``.
    """

    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if len(parts) > max_items:
            raise argparse.ArgumentTypeError(f"{len(parts):,} items, above the limit {max_items:,} "
                                             f"(docs/reliability.md)")
        try:
            values = [kind(p) for p in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{short_value(text)!r} is not a comma-separated list of {what}") from None
        if not values and not allow_empty:
            raise argparse.ArgumentTypeError(f"empty {item} list")
        low = (lambda v: not v > minimum) if open_low else (lambda v: not v >= minimum)
        if (minimum is not None and any(low(v) for v in values)) or \
                (maximum is not None and any(not v <= maximum for v in values)):
            raise argparse.ArgumentTypeError(f"{short_value(text)!r}: need {need}")
        if limit is not None and values and max(values) > limit:
            raise argparse.ArgumentTypeError(f"{item} {short_value(str(max(values)))} is above the limit {limit:,} "
                                             f"(docs/reliability.md)")
        if unique and len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"{short_value(text)!r}: a {item} is given twice")
        return values

    parse.__name__ = f"comma-separated {what}"
    return parse


def finite_float(minimum: float | None = None, maximum: float | None = None, *, open_low: bool = False) -> "callable":
    """An ``argparse`` type: a finite float ``>= minimum`` (``> minimum`` with ``open_low``) and
    ``<= maximum`` (a documented limit, when given: e.g. a time that would overflow a sum)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{short_value(text)!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{short_value(text)!r} is not finite; give a finite number")
        if minimum is not None and (value <= minimum if open_low else value < minimum):
            raise argparse.ArgumentTypeError(f"{value:g} must be {'>' if open_low else '>='} {minimum:g}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{short_value(repr(value))} is above the limit {maximum:,.10g} "
                                             f"(docs/reliability.md)")
        return value

    parse.__name__ = "finite number"
    return parse


def path_arg(text: str) -> str:
    """A path flag's value: any text but an empty one (``--json ''`` would otherwise be read as the
    flag not given: the run wrote nothing, or read its default input instead)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty; give a file name")
    return text


def flag_of(dest: str) -> str:
    """The command-line flag of an ``argparse`` dest (``selection_bs`` -> ``--selection-bs``)."""
    return "--" + dest.replace("_", "-")


def given_flags(make_parser, argv, args: argparse.Namespace) -> set[str]:
    """The dests of the flags given on the command line ``argv`` (a flag given with its default value
    included), for checks of flags a run would ignore: ``argv`` parsed again by a fresh parser from
    ``make_parser``, into a namespace whose every dest starts at a marker."""
    # argparse sets a default only where the namespace lacks the attribute: start every dest at a marker
    # (an empty list subclass, so ``append`` actions can extend it) and see which ones the flags replaced
    ns = argparse.Namespace(**{dest: _NotGiven() for dest in vars(args)})
    parsed = make_parser().parse_args(argv, namespace=ns)
    return {dest for dest, value in vars(parsed).items() if not (type(value) is _NotGiven and not value)}


class _NotGiven(list):
    """The marker of :func:`given_flags`: a flag argparse left at its start value."""


def seed_type(text: str) -> int:
    """An ``argparse`` type for ``--seed``: an integer in ``[0, MAX_SEED]``."""
    return int_at_least(0, MAX_SEED)(text)


seed_type.__name__ = "seed"


def torch_device(text: str) -> str:
    """An ``argparse`` type for ``--device`` (a torch model's device): ``cpu``, or ``cuda``/``cuda:N``
    when torch sees that GPU. Anything else (a typo, ``meta``, a GPU this machine lacks) is refused
    at parse time, naming the devices there are, instead of failing inside the model build."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{short_value(text)!r} is not a torch device; give cpu or cuda[:N]") from None
    if device.type == "cpu":
        return text
    if device.type != "cuda":
        raise argparse.ArgumentTypeError(f"{text!r}: the model runs on cpu or cuda[:N], not {device.type}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: torch sees no CUDA GPU on this machine"
                                         f"{'' if torch.version.cuda else ' (this torch is a CPU build)'}; use cpu")
    if device.index is not None and device.index >= count:
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA GPU(s), cuda:0..cuda:{count - 1}")
    return text


torch_device.__name__ = "torch device"


def _resolved(path: str | os.PathLike, flag: str) -> Path:
    """``Path(path).resolve()``, or a :class:`UsageError` naming ``flag`` and the path when it cannot be
    resolved: a non-strict resolve fails only on a symlink loop (``RuntimeError`` before Python 3.13,
    ``OSError`` ELOOP from 3.13)."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):
        raise UsageError(_loop_message(flag, path)) from None


def _loop_message(flag: str, path: str | os.PathLike, *, output: bool = False) -> str:
    fix = f"give {flag or 'it'} {'another path' if output else 'a real file'}"
    return f"{flag} {path}: is a symlink loop (a link on the path leads back to itself); {fix}".lstrip()


def same_file(a: str | os.PathLike, b: str | os.PathLike, *, flags: tuple[str, str] = ("", "")) -> bool:
    """Whether two paths name one file: ``os.path.samefile`` when both exist, else equal resolved paths.

    Raises:
        UsageError: a path cannot be resolved (a symlink loop), naming it and its flag from ``flags``.
    """
    pa, pb = Path(a), Path(b)
    try:
        if pa.exists() and pb.exists():
            return os.path.samefile(pa, pb)
    except OSError:
        pass
    return _resolved(pa, flags[0]) == _resolved(pb, flags[1])


def check_paths(
    inputs: Mapping[str, str | os.PathLike | Sequence[str | os.PathLike] | None],
    outputs: Mapping[str, tuple[str | os.PathLike | None, Iterable[str] | None]],
) -> None:
    """Refuse bad output paths before any work is done.

    Args:
        inputs: flag -> input path(s) (``None`` entries are skipped), e.g. ``{"--trace": [a, b]}``.
        outputs: flag -> ``(path or None, accepted suffixes or None for any)``.

    Raises:
        UsageError: an input or output path that is a symlink loop, an output that is an input or
            another output (both flags named), an unknown suffix, a folder, or a place that cannot
            be written.
    """
    from ..util.inputs import is_symlink_loop

    ins: list[tuple[str, str]] = []
    for flag, value in inputs.items():
        if value is None:
            continue
        for p in ([value] if isinstance(value, (str, os.PathLike)) else value):
            if p is not None:
                ins.append((flag, str(p)))
    outs = [(flag, str(path)) for flag, (path, _suffixes) in outputs.items() if path is not None]
    for (flag, path), output in [*((io, False) for io in ins), *((io, True) for io in outs)]:
        if is_symlink_loop(path):
            raise UsageError(_loop_message(flag, path, output=output))
    seen: list[tuple[str, str]] = []
    for flag, (path, suffixes) in outputs.items():
        if path is None:
            continue
        path = str(path)
        for in_flag, in_path in ins:
            if same_file(path, in_path, flags=(flag, in_flag)):
                raise UsageError(f"{flag} {path} is the {in_flag} input file; writing it would destroy the input: "
                                 f"give {flag} another path")
        for out_flag, out_path in seen:
            if same_file(path, out_path, flags=(flag, out_flag)):
                raise UsageError(f"{flag} and {out_flag} are the same file {path}; give each output its own path")
        seen.append((flag, path))
        if suffixes is not None:
            suffix = Path(path).suffix.lower()
            if suffix not in suffixes:
                raise UsageError(f"{flag} {path}: unknown output format {suffix or '(no suffix)'!r}; "
                                 f"use one of {', '.join(suffixes)}")
        try:
            check_writable(path)
        except OSError as exc:
            raise UsageError(f"{flag}: {exc}") from None


def read_text_input(path: str | os.PathLike, flag: str, what: str) -> str:
    """The UTF-8 text of an input file, or a :class:`UsageError` naming ``flag``, the file and the fix
    (:func:`dcut_sched.util.inputs.read_text`)."""
    from ..util.inputs import InputFileError, read_text

    try:
        return read_text(path, what)
    except InputFileError as exc:
        raise UsageError(f"{flag} {exc}") from None


def check_json_input(path: str | os.PathLike | None, flag: str, what: str) -> None:
    """Refuse before any work a JSON input that is missing, a symlink loop, binary, not UTF-8, not
    JSON, or breaks a rule of :func:`dcut_sched.util.inputs.parse_json_strict` (a key repeated in one
    object, a number longer than its digit limit, nesting too deep), with a one-line
    :class:`UsageError` naming ``flag`` and the file. ``NaN``/``Infinity`` pass here: the loader
    then checks the fields and names the one that holds them."""
    if path is None:
        return
    from ..util.inputs import InputFileError, parse_json_strict

    text = read_text_input(path, flag, what)
    try:
        parse_json_strict(text, str(path), allow_nonfinite=True)
    except InputFileError as exc:
        raise UsageError(f"{flag} {exc}; give {what}") from None


#: ``--param`` spellings of the booleans and of ``None`` besides JSON's ``true``/``false``/``null``, in
#: any case: the spellings ``--help`` prints the defaults in and a result's label holds
#: (``fine(feedback=False)``). Numbers stay numbers: ``1``/``0`` are not booleans (a policy's
#: parameter check keeps booleans and numbers apart).
PARAM_WORDS = {"true": True, "false": False, "none": None, "null": None}


def param_value(raw: str, where: str) -> Any:
    """The value of a ``--param KEY=VALUE`` flag: ``raw`` as strict JSON (numbers, booleans, lists,
    objects; ``NaN``/``Infinity`` parse as floats for the policy's check, which names the key), a
    boolean or ``None`` for a word of :data:`PARAM_WORDS` in any case (``True``, ``false``, ``None``),
    or ``raw`` itself when it is not JSON at all (``--param dcut.mode=fast``).

    Raises:
        argparse.ArgumentTypeError: JSON that breaks a rule of
            :func:`dcut_sched.util.inputs.parse_json_strict` (a number longer than its digit limit, a
            repeated key, nesting too deep), one short line naming ``where`` (``uniform.rho``).
    """
    from ..util.inputs import InputFileError, JSONSyntaxError, parse_json_strict

    word = raw.strip().lower()
    if word in PARAM_WORDS:
        return PARAM_WORDS[word]
    try:
        return parse_json_strict(raw, where, allow_nonfinite=True)
    except JSONSyntaxError:
        return raw
    except InputFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def short_value(value: Any, limit: int = 40) -> str:
    """A flag value for a message: strings as they are, anything else as JSON, cut to ``limit``
    characters (a 5,000-digit number is not echoed back)."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
