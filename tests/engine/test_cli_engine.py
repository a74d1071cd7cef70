"""dcut-engine: bad input exits 2 with one line; a small real run writes its outputs."""

from __future__ import annotations

import importlib.util
import json

import pytest

from dcut_sched.cli.engine import main
from dcut_sched.model import smollm2_available


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--prompts", "{tmp}/missing.txt"], "--prompts: prompt file {tmp}/missing.txt: no such file"),
        (["--out", "{tmp}/x.txt"], "--out {tmp}/x.txt: unknown output format"),
        (["--trace", "{tmp}/x.csv"], "--trace {tmp}/x.csv: unknown output format"),
        (["--policy", "topk", "--param", "nope=1"], "policy topk"),
        (["--policy", "uniform", "--param", "rho=2"], "rho=2"),
        (["--policy", "dcut", "--cost", "{tmp}/missing.json"], "--cost {tmp}/missing.json: no such file"),
        (["--batch-size", "0"], "--batch-size"),
        (["--num-prompts", "0"], "--num-prompts"),
        (["--num-prompts", "1000"], "--num-prompts 1000: the built-in prompts (no --prompts) hold only"),
        (["--temperature", "-1"], "temperature"),
        (["--temperature", "0.7", "--top-p", "0"], "top_p"),
        (["--temperature", "0.7", "--draft", "sampled"], "sampled drafts"),
        (["--temperature", "0.7", "--policy", "dcut", "--trace", "{tmp}/t.parquet"], "--policy full"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dcut-engine: error:") and message.replace("{tmp}", str(tmp_path)) in err
    assert err.count("\n") == 1


def test_cost_curve_for_another_block_size_is_refused(tmp_path, capsys, make_curve):
    path = tmp_path / "c.json"
    make_curve(block_size=4).save(path)
    assert main(["--policy", "fine", "--cost", str(path), "--block-size", "8"]) == 2
    assert "block size 4, not 8" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(
    not smollm2_available() or importlib.util.find_spec("transformers") is None,
    reason="needs the SmolLM2 weights and transformers (for the chat template)",
)
def test_small_real_run(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "What is 2 + 2?"}\n{"prompt": "Name a color."}\n')
    out, steps, trace = tmp_path / "s.json", tmp_path / "steps.csv", tmp_path / "t.parquet"
    code = main([
        "--policy", "full", "--block-size", "4", "--batch-size", "2", "--max-new-tokens", "6",
        "--prompts", str(prompts), "--check", "--quiet", "--threads", "1",
        "--out", str(out), "--steps", str(steps), "--trace", str(trace),
    ])
    assert code == 0
    summary = json.loads(out.read_text())["rows"][0]  # the one table JSON shape: {"attrs", "rows"}
    assert summary["check"] == "identical to greedy" and summary["requests"] == 2
    assert steps.read_text().startswith("step,")
    from dcut_sched.traces import Trace

    assert Trace.load(trace).indexing == "step"


@pytest.mark.slow
@pytest.mark.skipif(
    not smollm2_available() or importlib.util.find_spec("transformers") is None,
    reason="needs the SmolLM2 weights and transformers (for the chat template)",
)
def test_small_real_sampled_run(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "What is 2 + 2?"}\n{"prompt": "Name a color."}\n')
    out, trace = tmp_path / "s.json", tmp_path / "t.parquet"
    code = main([
        "--policy", "full", "--block-size", "4", "--batch-size", "2", "--max-new-tokens", "6",
        "--prompts", str(prompts), "--check", "--quiet", "--threads", "1", "--temperature", "0.8",
        "--top-p", "0.95", "--seed", "3", "--out", str(out), "--trace", str(trace),
    ])
    assert code == 0
    summary = json.loads(out.read_text())["rows"][0]  # the one table JSON shape: {"attrs", "rows"}
    assert summary["check"] == "identical to sampled decoding" and summary["sampling"] == "T=0.8 top_p=0.95 seed=3"
    from dcut_sched.traces import Trace

    t = Trace.load(trace)
    assert t.sampled and t.metadata["temperature"] == "0.8"


def test_unwritable_steps_path_fails_before_the_run(tmp_path, capsys):
    from dcut_sched.cli.engine import main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["--policy", "fine", "--steps", str(blocker / "s.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "--steps" in err and "cannot write" in err
