"""Tenth hostile pass: a fit budget below what a fit runs (docs/reliability.md, "Tenth pass")."""

from __future__ import annotations

import pytest

from dcut_sched.cli.trace import main
from dcut_sched.traces.fit import FIT_BOUNDS, fit_moments, min_evals, moments
from dcut_sched.traces.synth import SynthParams, generate


def test_fit_budget_below_two_generations_is_refused(tmp_path, capsys):
    src = tmp_path / "src.parquet"
    generate(SynthParams(block_size=6), num_requests=4, seed=2).save(src)
    out = tmp_path / "p.json"
    assert min_evals(len(FIT_BOUNDS)) == 84
    assert main(["fit", str(src), "--max-evals", "5", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--max-evals 5" in err and "at least 84" in err
    assert not out.exists()


@pytest.mark.parametrize("budget", [24, 30, 31])
def test_fit_moments_runs_no_more_than_its_budget(budget):
    base = SynthParams(block_size=6, accept_logit=1.0, separation=1.0)
    target = moments(generate(base, num_requests=8, seed=1), num_batches=10, seed=1)
    result = fit_moments(target, base, ["accept_logit", "separation"], num_requests=8, num_batches=10,
                         max_evals=budget)
    assert result.evaluations == budget
    with pytest.raises(ValueError, match="below the 24 evaluations"):
        fit_moments(target, base, ["accept_logit", "separation"], max_evals=23)
