"""Prompt text comparison for the drafter's data: normalised text, word n-grams and template patterns.

Used by the disjointness check between training and held-out prompts and by the self-instruct
filter (docs/drafters.md, "Data"). Two texts are *near duplicates* when their normalised forms are
equal or they share a word n-gram (``n`` words in a row after normalisation). Normalisation: Unicode
NFKC, case-folded, every run of word characters one word (punctuation and spacing dropped). A run of
CJK characters without spaces is one word, so CJK texts are compared as whole phrases.
"""

from __future__ import annotations

import re
import string
import unicodedata
from typing import Iterable

__all__ = ["normalize", "word_ngrams", "NgramIndex", "template_pattern", "template_literals"]

_WORD = re.compile(r"\w+")


def normalize(text: str) -> str:
    """``text`` NFKC-normalised, case-folded, its words joined by single spaces."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The word ``n``-grams of ``normalize(text)`` (empty when it has fewer than ``n`` words)."""
    if n < 1:
        raise ValueError(f"word_ngrams: n must be >= 1, not {n}")
    words = normalize(text).split()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


class NgramIndex:
    """Normalised texts and their word ``n``-grams, to ask whether a new text near-duplicates one of them."""

    def __init__(self, n: int, texts: Iterable[str] = ()) -> None:
        self.n = n
        self._texts: set[str] = set()
        self._grams: set[tuple[str, ...]] = set()
        for t in texts:
            self.add(t)

    def add(self, text: str) -> None:
        self._texts.add(normalize(text))
        self._grams |= word_ngrams(text, self.n)

    def shared(self, text: str) -> set[tuple[str, ...]]:
        """The ``n``-grams ``text`` shares with the index."""
        return word_ngrams(text, self.n) & self._grams

    def near_duplicate(self, text: str) -> bool:
        """Whether ``text`` equals an indexed text after normalisation or shares an ``n``-gram with one."""
        return normalize(text) in self._texts or bool(self.shared(text))


def template_literals(template: str) -> list[str]:
    """The fixed text of a ``str.format`` template, split at its fields."""
    return [lit for lit, *_ in string.Formatter().parse(template) if lit]


def template_pattern(template: str) -> re.Pattern[str]:
    """A regex that fully matches the normalised text of any filling of ``template`` (a ``str.format``
    template): its normalised fixed parts in order, anything between them."""
    parts: list[str] = []
    for lit, field, *_ in string.Formatter().parse(template):
        if normalize(lit):
            parts.append(re.escape(normalize(lit)))
        if field is not None and (not parts or parts[-1] != ".*?"):  # adjacent fields: one wildcard
            parts.append(".*?")
    return re.compile(" ?".join(parts), re.DOTALL)
