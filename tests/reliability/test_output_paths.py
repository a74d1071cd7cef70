"""An output path never overwrites an input: the --seeds path, the benchmark path, dcut-drafter."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from dcut_sched.cli import sim

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "dcut_sched" / "data" / "traces" / "smollm2-135m-skip14-15-b8.parquet"
COST = ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-b8.json"


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("which", ["trace", "cost"])
def test_seeds_out_equal_to_an_input_is_refused(tmp_path, capsys, which):
    trace, cost = tmp_path / "t.parquet", tmp_path / "c.json"
    shutil.copy(TRACE, trace)
    shutil.copy(COST, cost)
    before = {p: _digest(p) for p in (trace, cost)}
    out = trace if which == "trace" else cost
    status = sim.main(["--trace", str(trace), "--cost", str(cost), "--seeds", "2", "--steps", "20", "--warmup", "2",
                       "--batch-sizes", "2", "--policies", "ar,full", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    assert "--out" in err and "input" in err
    assert {p: _digest(p) for p in (trace, cost)} == before


def test_drafter_out_that_is_a_file_is_refused(tmp_path, capsys):
    from dcut_sched.cli import drafter

    f = tmp_path / "f.txt"
    f.write_text("keep me")
    assert drafter.main(["train", "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert f.read_text() == "keep me"


def test_drafter_eval_of_a_missing_folder_names_it(tmp_path, capsys):
    from dcut_sched.cli import drafter

    assert drafter.main(["eval", str(tmp_path / "nope")]) == 2
    assert "nope/config.json: not found" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--temperature", "-1"], ["--top-p", "1.5", "--temperature", "0.7"],
                                   ["--temperature", "0.7", "--backend", "hf"]])
def test_trace_record_bad_sampling_flags_are_usage_errors(tmp_path, capsys, flags):
    from dcut_sched.cli import trace

    status = trace.main(["record", "--out", str(tmp_path / "t.parquet"), *flags])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and "--temperature" in err
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("spec, match", [("dflash:/nowhere", "no DFlash drafter folder"),
                                         ("medusa", "expected greedy, sampled or dflash:PATH")])
def test_engine_bad_draft_spec_is_a_usage_error(capsys, spec, match):
    from dcut_sched.cli import engine

    assert engine.main(["--draft", spec, "--policy", "full"]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


@pytest.mark.parametrize("make, match", [
    (lambda d: "", "--out is empty"),
    (lambda d: str(d), "holds other files and no DFlash drafter"),
])
def test_drafter_out_never_overwrites_another_folder(tmp_path, capsys, make, match):
    from dcut_sched.cli import drafter

    (tmp_path / "README.md").write_text("the project's readme")
    assert drafter.main(["train", "--out", make(tmp_path)]) == 2
    assert match in capsys.readouterr().err
    assert (tmp_path / "README.md").read_text() == "the project's readme"


@pytest.mark.parametrize("flags, match", [
    (["--eval-prompts", "/nonexistent.jsonl"], "--eval-prompts"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "-5"], "--lr"),
])
def test_drafter_train_checks_its_inputs_before_loading_anything(tmp_path, capsys, flags, match):
    from dcut_sched.cli import drafter

    assert drafter.main(["train", "--out", str(tmp_path / "new"), *flags]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


# One output-path guard (check_paths) on every writing path of every CLI: an output equal to an input
# is refused with exit 2 before any work, naming both flags, and the input is byte-identical.

PROMPT_LINES = ('{"id": "math-01", "category": "math", "prompt": "What is 2 + 2?"}\n'
                '{"id": "code-01", "category": "code", "prompt": "Write hello world in Python."}\n')


def _refused(status: int, err: str, out_flag: str, in_flag: str) -> None:
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{out_flag} " in err and f"is the {in_flag} input file" in err, err


@pytest.fixture
def sim_inputs(tmp_path):
    trace, cost = tmp_path / "t.parquet", tmp_path / "c.json"
    shutil.copy(TRACE, trace)
    shutil.copy(COST, cost)
    return trace, cost


@pytest.mark.parametrize("extra, out_flag, in_flag", [
    (lambda t, c: ["--out", str(c)], "--out", "--cost"),
    (lambda t, c: ["--plot", str(t)], "--plot", "--trace"),
    (lambda t, c: ["--out", str(t), "--plot", str(t.with_suffix(".png"))], "--out", "--trace"),
    (lambda t, c: ["--sweep", "--jobs", "1", "--out", str(t)], "--out", "--trace"),
    (lambda t, c: ["--seeds", "2", "--out", str(c)], "--out", "--cost"),
    (lambda t, c: ["--selection-curve", str(t)], "--selection-curve", "--trace"),
])
def test_sim_outputs_never_overwrite_an_input(sim_inputs, capsys, extra, out_flag, in_flag):
    trace, cost = sim_inputs
    before = {p: _digest(p) for p in (trace, cost)}
    run = [] if "--selection-curve" in extra(trace, cost) else [  # the flags a selection curve does not read
        "--cost", str(cost), "--steps", "20", "--warmup", "2", "--batch-sizes", "2", "--policies", "ar,full"]
    status = sim.main(["--trace", str(trace), *run, *extra(trace, cost)])
    _refused(status, capsys.readouterr().err, out_flag, in_flag)
    assert {p: _digest(p) for p in (trace, cost)} == before


@pytest.mark.parametrize("make_argv, out_flag", [
    # --out equal to the prompt file
    (lambda d, p: ["--prompts", str(p), "--out", str(p)], "--out"),
    # the resumable OUT.partial.parquet equal to the prompt file
    (lambda d, p: ["--prompts", str(p), "--out", str(d / "t.parquet")], "--out's resumable partial"),
])
def test_trace_record_outputs_never_overwrite_the_prompts(tmp_path, capsys, monkeypatch, make_argv, out_flag):
    from dcut_sched.cli import trace

    prompts = tmp_path / "t.partial.parquet"  # a JSON-lines prompt file, named where the partial goes
    prompts.write_text(PROMPT_LINES)
    monkeypatch.setattr("dcut_sched.traces.record.record_trace",
                        lambda *a, **k: pytest.fail("recorded: the output check came too late"))
    status = trace.main(["record", *make_argv(tmp_path, prompts)])
    _refused(status, capsys.readouterr().err, out_flag, "--prompts")
    assert prompts.read_text() == PROMPT_LINES


@pytest.mark.parametrize("sub", ["stats", "fit"])
def test_trace_stats_and_fit_out_never_overwrite_the_trace(sim_inputs, capsys, sub):
    from dcut_sched.cli import trace

    t, _ = sim_inputs
    before = _digest(t)
    status = trace.main([sub, str(t), "--out", str(t)])
    _refused(status, capsys.readouterr().err, "--out", "FILE")
    assert _digest(t) == before


@pytest.mark.parametrize("flag, which", [("--out", "prompts"), ("--steps", "cost"), ("--steps", "drafter"),
                                         ("--trace", "drafter-weights")])
def test_engine_outputs_never_overwrite_an_input(tmp_path, capsys, monkeypatch, flag, which):
    from dcut_sched.cli import engine

    prompts, cost, drafter = tmp_path / "p.json", tmp_path / "c.json", tmp_path / "dflash"
    prompts.write_text('["What is 2 + 2?"]')
    shutil.copy(COST, cost)
    drafter.mkdir()
    shutil.copy(ROOT / "drafters" / "smollm2-135m-dflash" / "config.json", drafter / "config.json")
    (drafter / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr("dcut_sched.drafters.load_dflash", lambda *a, **k: pytest.fail("loaded the drafter first"))
    target = {"prompts": prompts, "cost": cost, "drafter": drafter / "config.json",
              "drafter-weights": drafter / "model.safetensors"}[which]
    files = [prompts, cost, drafter / "config.json", drafter / "model.safetensors"]
    before = {p: _digest(p) for p in files}
    status = engine.main(["--prompts", str(prompts), "--cost", str(cost), "--draft", f"dflash:{drafter}",
                          "--policy", "full", "--block-size", "8", flag, str(target)])
    in_flag = {"prompts": "--prompts", "cost": "--cost"}.get(which, "--draft")
    _refused(status, capsys.readouterr().err, flag, in_flag)
    assert {p: _digest(p) for p in files} == before


def test_engine_out_never_overwrites_the_default_cost_curve(capsys):
    from dcut_sched.cli import engine

    default = ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-b8.json"
    before = _digest(default)
    status = engine.main(["--policy", "fine", "--block-size", "8", "--out", str(default)])
    _refused(status, capsys.readouterr().err, "--out", "--cost")
    assert _digest(default) == before


def test_profile_out_never_overwrites_the_fit_curve(tmp_path, capsys):
    from dcut_sched.cli import profile as cli

    fit = tmp_path / "h20.json"
    shutil.copy(ROOT / "dcut_sched" / "profiler" / "profiles" / "h20-qwen3-8b-published.json", fit)
    before = _digest(fit)
    status = cli.main(["--analytic", "--device", "h20", "--fit", str(fit), "--out", str(fit)])
    _refused(status, capsys.readouterr().err, "--out", "--fit")
    assert _digest(fit) == before


def test_profile_partial_never_overwrites_the_model_config(tmp_path, capsys, monkeypatch):
    from dcut_sched.cli import profile as cli

    monkeypatch.setattr("dcut_sched.profiler.workload.ForwardWorkload", lambda *a, **k: pytest.fail("built the model"))
    config = tmp_path / "o.json.partial"  # a model config where --out's resumable partial would go
    config.write_text('{"hidden_size": 64}')
    status = cli.main(["--cpu", "--model", str(config), "--out", str(tmp_path / "o.json"), "--no-progress"])
    _refused(status, capsys.readouterr().err, "--out's resumable partial", "--model")
    assert config.read_text() == '{"hidden_size": 64}'


@pytest.mark.parametrize("where", ["work-dir state.pt", "work-dir data.pt", "out training_curve.csv",
                                   "out README.md"])
def test_drafter_outputs_never_overwrite_the_eval_prompts(tmp_path, capsys, monkeypatch, where):
    from dcut_sched.cli import drafter

    monkeypatch.setattr("dcut_sched.drafters.train.run_training", lambda *a, **k: pytest.fail("trained"))
    monkeypatch.setattr("dcut_sched.model.llama.LlamaModel.from_smollm2",
                        classmethod(lambda *a, **k: pytest.fail("loaded the target")))
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    shutil.copy(ROOT / "drafters" / "smollm2-135m-dflash" / "config.json", out / "config.json")  # a retrain
    folder, name = where.split()
    prompts = (work if folder == "work-dir" else out) / name
    prompts.write_text(PROMPT_LINES)
    status = drafter.main(["train", "--out", str(out), "--work-dir", str(work), "--eval-prompts", str(prompts)])
    _refused(status, capsys.readouterr().err, f"--{folder} {name}", "--eval-prompts")
    assert prompts.read_text() == PROMPT_LINES
