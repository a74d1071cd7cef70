"""Prompt sets for trace recording: a JSON-lines file, one prompt per line.

Each line is an object ``{"id": str, "category": str, "prompt": str}``. The project's set is
``dcut_sched/data/traces/prompts.jsonl`` (80 prompts written for the project, 20 in each of the categories ``math``,
``code``, ``chat`` and ``rewrite``, interleaved so that any prefix of the file is balanced); a second
set, ``prompts-unlike.jsonl``, holds 60 prompts of twelve kinds absent from the DFlash drafter's
training data (:data:`dcut_sched.paths.PROMPT_SETS`; ``dcut_sched/data/traces/README.md``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..util.inputs import InputFileError, parse_json_strict, read_text

__all__ = ["Prompt", "PromptError", "load_prompt_records", "prompts_digest"]


class PromptError(ValueError):
    """A prompt file is missing or malformed; the message names the file, line and field."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: a unique ``id``, a ``category`` label and the user ``text``."""

    id: str
    category: str
    text: str


def load_prompt_records(path: str | os.PathLike) -> list[Prompt]:
    """Read a prompt set into :class:`Prompt` records (id, category, text; JSON lines, blank lines ignored).

    (:func:`dcut_sched.engine.prompts.load_prompt_texts` reads plain prompt texts for the engine.)

    Raises:
        PromptError: missing file, a line that is not a JSON object, a missing or non-string field,
            an empty prompt or a duplicate id (the message names file, line and field).
    """
    path = Path(path)
    if not path.exists():
        raise PromptError(f"{path}: no such prompt file")
    try:  # read_text refuses a folder, a pipe or a device by name
        text = read_text(path, "a JSON-lines prompt file (id, category, prompt per line)")
    except InputFileError as exc:
        raise PromptError(str(exc)) from None
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = parse_json_strict(line, f"{path}, line {lineno}")  # a key given twice: refused
        except InputFileError as exc:
            raise PromptError(str(exc)) from None
        if not isinstance(obj, dict):
            raise PromptError(f"{path}, line {lineno}: expected a JSON object with id, category, prompt")
        for key in ("id", "category", "prompt"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise PromptError(f"{path}, line {lineno}, field {key!r}: missing or not a non-empty string")
        if obj["id"] in seen:
            raise PromptError(f"{path}, line {lineno}, field 'id': duplicate id {obj['id']!r}")
        seen.add(obj["id"])
        prompts.append(Prompt(obj["id"], obj["category"], obj["prompt"]))
    if not prompts:
        raise PromptError(f"{path}: the prompt file has no prompts")
    return prompts


def prompts_digest(prompts: list[Prompt]) -> str:
    """SHA-256 (hex, first 16 characters) of the prompt set, to tie a trace to its prompts."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([p.id, p.category, p.text]).encode())
    return h.hexdigest()[:16]
