"""Cases of the tenth hostile pass (docs/reliability.md): a fit budget below what a fit runs; top-p/top-k
at greedy decoding and --skip-layers with a DFlash drafter, settings that changed nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcut_sched.cli import engine as engine_cli
from dcut_sched.cli import profile as profile_cli
from dcut_sched.cli.trace import main
from dcut_sched.sampling import SamplingParams
from dcut_sched.traces.fit import FIT_BOUNDS, fit_moments, min_evals, moments
from dcut_sched.traces.synth import SynthParams, generate

ROOT = Path(__file__).resolve().parents[2]


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


def _refused(status: int, capsys, words: str, out) -> None:
    """Exit 2, one error line holding ``words``, and no output written."""
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.count("\n") == 0 and words in err, err
    assert not out.exists()


@pytest.mark.parametrize("kwargs, field", [({"top_p": 0.5}, "top_p=0.5"), ({"top_k": 3}, "top_k=3")])
def test_top_p_and_top_k_at_greedy_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=f"{field} has no effect at temperature=0"):
        SamplingParams(temperature=0.0, **kwargs)
    assert SamplingParams(temperature=0.7, **kwargs).describe().startswith("T=0.7")


@pytest.mark.parametrize("argv, words", [
    (["--top-p", "0.5"], "top_p=0.5 has no effect at temperature=0"),
    (["--top-k", "3"], "top_k=3 has no effect at temperature=0"),
    (["--draft", "dflash:drafters/smollm2-135m-dflash", "--skip-layers", "3,4"], "--skip-layers has no effect"),
])
def test_engine_settings_without_effect_are_refused(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "s.json"
    _refused(engine_cli.main([*argv, "--num-prompts", "1", "--threads", "1", "--out", str(out)]), capsys, words, out)


def test_analytic_profile_refuses_dtype(tmp_path, capsys):
    # the roofline is bf16 only: --dtype float32 wrote a curve identical to bf16's, labelled bfloat16
    out = tmp_path / "c.json"
    _refused(profile_cli.main(["--analytic", "--device", "h200", "--model", "tiny", "--dtype", "float32",
                               "--out", str(out)]), capsys, "--dtype has no effect on a --analytic profile", out)


@pytest.mark.parametrize("argv, words", [
    (["--dtype", "float16"], "--dtype has no effect with --backend native"),
    (["--target", "."], "--target has no effect with --backend native"),
    (["--draft", "dflash:drafters/smollm2-135m-dflash", "--skip-layers", "1,2"], "--skip-layers has no effect"),
])
def test_record_settings_without_effect_are_refused(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "r.parquet"
    _refused(main(["record", *argv, "--limit", "1", "--max-new-tokens", "2", "--threads", "1", "--block-size", "4",
                   "--no-progress", "--out", str(out)]), capsys, words, out)
    assert list(tmp_path.iterdir()) == []
