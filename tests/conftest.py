"""Shared fixtures: small synthetic cost curves built in code (values chosen by hand); the
project-wide hypothesis profiles.

Hypothesis profiles: no test has a per-example deadline (a loaded machine must not turn a slow
example into a failure; speed goals live in analysis/ benchmarks). Under CI (``CI`` set) examples
are derandomized, so a CI run is reproducible; ``HYPOTHESIS_PROFILE`` picks a profile by name.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

from dcut_sched import CostCurve


def pytest_configure(config):
    # a hook, so it runs once even where a test imports this module by name for its helpers
    settings.register_profile("dev", deadline=None)
    settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(autouse=True)
def _no_timed_progress_lines(monkeypatch):
    """Progress logs print a line every ``DCUT_PROGRESS_INTERVAL_S`` seconds; under load a run can
    outlast the 30 s default and add a line a test did not expect. Tests see only the lines that do
    not depend on the clock (a test of the timed lines sets its own interval)."""
    monkeypatch.setenv("DCUT_PROGRESS_INTERVAL_S", "1e9")


def linear_curve(
    batch_sizes=(1, 2, 4, 8), block_size: int = 4, base_ms: float = 10.0, per_token_ms: float = 0.5,
    draft_base_ms: float = 2.0, draft_per_request_ms: float = 0.25, step: int = 1, ar_ms=None,
) -> CostCurve:
    """C_verify = base + per_token * num_tokens on every token count 1..bs*B (every ``step``);
    C_draft = draft_base + draft_per_request * bs; C_ar = ``ar_ms`` (a dict bs -> ms, or a number for
    every bs; default: the same value as C_verify(bs, bs), so hand computations need not care;
    ``ar_ms=False``: no ar rows, the plain step is assumed)."""
    verify = []
    for bs in batch_sizes:
        counts = sorted(set(range(bs, bs * block_size + 1, step)) | {bs, bs * block_size})
        for k in counts:
            verify.append({"batch_size": bs, "num_tokens": k, "median_ms": base_ms + per_token_ms * k})
    draft = [{"batch_size": bs, "median_ms": draft_base_ms + draft_per_request_ms * bs} for bs in batch_sizes]
    if ar_ms is False:
        ar = []
    else:
        per_bs = (ar_ms if isinstance(ar_ms, dict) else
                  {bs: (base_ms + per_token_ms * bs if ar_ms is None else float(ar_ms)) for bs in batch_sizes})
        ar = [{"batch_size": bs, "median_ms": ms} for bs, ms in sorted(per_bs.items())]
    return CostCurve(
        hardware={"device_name": "test", "backend": "analytic"},
        model={"name": "linear-test", "config": {}},
        block_size=block_size,
        context_len=0,
        verify=verify,
        draft=draft,
        ar=ar,
    )


@pytest.fixture
def make_curve():
    """The :func:`linear_curve` factory, for tests that need other shapes."""
    return linear_curve


@pytest.fixture
def curve4() -> CostCurve:
    return linear_curve()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
