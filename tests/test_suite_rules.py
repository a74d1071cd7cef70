"""Rules of the test suite itself: no wall-clock deadline, no assertion on elapsed time.

A test that depends on the machine's speed fails under load (CI runs on a shared 2-core machine);
speed goals are measured by the benchmarks under analysis/, not asserted here.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import settings

TESTS = Path(__file__).resolve().parent
_DEADLINE = re.compile(r"deadline\s*=\s*(?!None\b)")
_TIMED_ASSERT = re.compile(r"assert\b.*\b(perf_counter|monotonic|process_time|time\.time)\s*\(")


def _test_sources():
    return sorted(p for p in TESTS.rglob("*.py") if p.name != Path(__file__).name)


def test_hypothesis_profile_has_no_deadline():
    assert settings.default.deadline is None


def test_no_test_sets_a_deadline_or_asserts_on_elapsed_time():
    offenders = []
    for path in _test_sources():
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if _DEADLINE.search(line) or _TIMED_ASSERT.search(line):
                offenders.append(f"{path.relative_to(TESTS)}:{lineno}: {line.strip()}")
    assert not offenders, "tests must not depend on the machine's speed:\n" + "\n".join(offenders)


def test_the_rule_catches_what_it_names():
    assert _DEADLINE.search("@settings(deadline=200)") and not _DEADLINE.search("@settings(deadline=None)")
    assert _TIMED_ASSERT.search("assert time.perf_counter() - t0 < 300")
    assert not _TIMED_ASSERT.search("t0 = time.perf_counter()")
