"""Cases of the eleventh hostile pass (docs/reliability.md): a flag one recording backend or one policy
reads and another would ignore."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcut_sched.cli import engine as engine_cli
from dcut_sched.cli.trace import main

DFLASH = "dflash:drafters/smollm2-135m-dflash"


def test_record_hf_refuses_skip_layers_before_loading(tmp_path, capsys):
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    draft.mkdir()
    out = tmp_path / "r.parquet"
    code = main(["record", "--backend", "hf", "--target", str(target), "--draft", str(draft),
                 "--skip-layers", "3,4", "--limit", "1", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "--skip-layers has no effect with --backend hf" in err and "drop --skip-layers" in err
    assert sorted(tmp_path.iterdir()) == [draft, target]  # no trace, no partial recording


@pytest.mark.parametrize(("extra", "flag"), [
    (["--skip-layers", "3,4"], "--skip-layers"),
    (["--block-size", "4"], "--block-size"),
    (["--block-size", "16"], "--block-size"),  # given, even at its default value
    (["--no-calibrate"], "--no-calibrate"),
    (["--draft", "sampled"], "--draft"),
    (["--draft", DFLASH], "--draft"),
])
def test_engine_plain_decoding_refuses_drafter_flags(tmp_path, capsys, monkeypatch, extra, flag):
    from dcut_sched import model

    def never(*a, **k):  # the refusal comes before the model loads
        raise AssertionError("the model was loaded")

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    monkeypatch.setattr(model.LlamaModel, "from_smollm2", classmethod(never))
    out = tmp_path / "s.json"
    assert engine_cli.main(["--policy", "ar", *extra, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{flag} has no effect with --policy ar" in err and f"drop {flag}" in err
    assert not out.exists()


def test_analytic_fit_refuses_context_len(tmp_path, capsys):
    from dcut_sched.cli import profile as profile_cli

    src = Path(__file__).resolve().parents[2] / "dcut_sched/profiler/profiles/h20-qwen3-8b-published.json"
    before = src.read_bytes()
    out = tmp_path / "c.json"
    code = profile_cli.main(["--analytic", "--device", "h20", "--model", "qwen3-8b", "--fit", str(src),
                             "--context-len", "4096", "--out", str(out), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--context-len has no effect with --fit" in err
    assert not out.exists() and src.read_bytes() == before


@pytest.mark.parametrize(("doc", "words"), [
    ({"policy": "full", "cost_curve": "{tmp}/c.json"}, "key 'cost_curve' has no effect with policy 'full'"),
    ({"policy": "fine", "cost_curve": "{tmp}/c.json", "profile_cache_dir": "{tmp}/p"},
     "key 'profile_cache_dir' has no effect: 'cost_curve' is given"),
    ({"policy": "uniform", "profile_cache_dir": "{tmp}/p"},
     "key 'profile_cache_dir' has no effect: policy 'uniform' needs no cost curve"),
    ({"policy": "ar", "calibrate": False}, "key 'calibrate' has no effect with policy 'ar'"),
])
def test_vllm_config_refuses_keys_its_policy_never_reads(tmp_path, doc, words):
    from dcut_sched.integrations.vllm.config import DCutConfigError, DCutVllmConfig

    doc = {k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v for k, v in doc.items()}
    with pytest.raises(DCutConfigError) as info:
        DCutVllmConfig.from_mapping(doc, "additional_config['dcut']")
    assert words in str(info.value) and "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []
