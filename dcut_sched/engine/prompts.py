"""Prompts for the engine: a built-in set and a loader for JSONL or plain-text prompt files."""

from __future__ import annotations

import os

from ..util.inputs import InputFileError, parse_json_strict, read_text

__all__ = ["DEFAULT_PROMPTS", "PromptFileError", "load_prompt_texts"]

#: Short chat prompts of mixed kinds (arithmetic, code, facts, writing) used when no file is given.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write a Python function that returns the factorial of n.",
    "Explain what photosynthesis is in two sentences.",
    "List three primary colors.",
    "If I have 12 apples and eat 5, how many are left?",
    "Translate 'good morning' into Spanish.",
    "What is 15 multiplied by 4?",
    "Give me a haiku about the ocean.",
    "What does HTTP stand for?",
    "Name the planets of the solar system in order.",
    "Write a SQL query that counts the rows of a table named users.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "What is the boiling point of water in Celsius?",
    "Suggest a name for a small coffee shop.",
    "How many days are there in a leap year?",
    "Write a JavaScript function that reverses a string.",
    "What is the largest mammal on Earth?",
    "Give two tips for sleeping better.",
    "What is the square root of 81?",
    "Describe a cat in three words.",
    "Who wrote the novel 1984?",
    "Write a short thank-you note to a teacher.",
    "What is the difference between a list and a tuple in Python?",
)


class PromptFileError(ValueError):
    """A prompt file is unreadable or malformed; the message names the file and line."""


def load_prompt_texts(path: str | os.PathLike) -> list[str]:
    """Read prompt texts from a file: one ``str`` per prompt (the engine tokenises them).

    (:func:`dcut_sched.traces.prompts.load_prompt_records` reads the trace recorder's prompt set
    into ``Prompt`` records with ids and categories instead.)

    Formats (by content, not suffix): **JSONL** if the first non-empty line starts with ``{`` or
    ``"``: one JSON object per line with a ``prompt`` (or ``text``, or ``question``) string field,
    or one JSON string per line; otherwise **text**: one prompt per non-empty line.

    Raises:
        PromptFileError: unreadable file, invalid JSON line, a JSON object without a prompt field,
            or no prompts at all (the message names file and line).
    """
    name = str(path)
    try:
        lines = read_text(path, "a prompt file (JSON lines or one prompt per line)").splitlines()
    except InputFileError as exc:
        raise PromptFileError(f"prompt file {exc}") from None
    if lines and lines[0].startswith("\ufeff"):  # else a JSON-lines file read as text: its JSON the prompts
        raise PromptFileError(f"prompt file {name}: starts with a UTF-8 byte-order mark; save it as UTF-8 without one")
    numbered = [(n + 1, line.strip()) for n, line in enumerate(lines) if line.strip()]
    if not numbered:
        raise PromptFileError(f"prompt file {name}: no prompts (empty file)")
    prompts: list[str] = []
    if numbered[0][1][0] in '{"':
        for lineno, line in numbered:
            try:
                item = parse_json_strict(line, f"prompt file {name}, line {lineno}")  # a key given twice: refused
            except InputFileError as exc:
                raise PromptFileError(str(exc)) from None
            if isinstance(item, dict):
                text = next((item[k] for k in ("prompt", "text", "question") if isinstance(item.get(k), str)), None)
                if text is None:
                    raise PromptFileError(
                        f"prompt file {name}, line {lineno}: JSON object has no string field 'prompt' "
                        f"(or 'text', 'question'); keys: {sorted(item)}"
                    )
            elif isinstance(item, str):
                text = item
            else:
                raise PromptFileError(f"prompt file {name}, line {lineno}: expected an object or a string")
            if not text.strip():
                raise PromptFileError(f"prompt file {name}, line {lineno}: empty prompt")
            prompts.append(text)
    else:
        prompts = [line for _, line in numbered]
    return prompts
