"""The third hostile pass: documented limits on every size flag, devices, flags a run would ignore,
Dask addresses, allocations that fail, closed pipes and output folders (docs/reliability.md).

Each bad input exits 2 with one line naming the flag (and never echoes a 5,000-digit value back);
nothing is written and no folder is left behind.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .test_cli_error_paths import SIM, _main, _run, files  # noqa: F401 (fixture)

HUGE = "9" * 5000

# (id, cli, argv, needles)
CASES = [
    # work sizes with a documented limit
    ("profile-repeats", "profile", ["--cpu", "--repeats", "1000000000", "--out", "{T}/c.json"],
     ["--repeats", "above the limit 10,000"]),
    ("profile-warmups", "profile", ["--cpu", "--warmups", "20000", "--out", "{T}/c.json"], ["--warmups", "10,000"]),
    ("profile-block-size", "profile", ["--cpu", "--block-size", "100000", "--out", "{T}/c.json"],
     ["--block-size", "above the limit 256"]),
    ("profile-context-len", "profile", ["--cpu", "--context-len", "100000000", "--out", "{T}/c.json"],
     ["--context-len", "above the limit 131,072"]),
    ("profile-batch-size", "profile", ["--cpu", "--batch-sizes", "1,100000000", "--out", "{T}/c.json"],
     ["--batch-sizes", "above the limit 4,096"]),
    ("profile-engine-steps", "profile", ["--vllm", "{T}", "--vllm-engine-steps", "-1", "--out", "{T}/c.json"],
     ["--vllm-engine-steps", "must be >= 0"]),
    ("profile-vllm-empty", "profile", ["--vllm", "", "--out", "{T}/c.json"], ["--vllm: empty; give a model folder"]),
    ("profile-out-is-dflash-config", "profile",
     ["--vllm", "{T}", "--vllm-draft", "dflash:{T}/bad-drafter", "--out", "{T}/bad-drafter/config.json"],
     ["--out", "is the --vllm-draft input file"]),
    ("profile-out-is-dflash-weights", "profile",
     ["--vllm", "{T}", "--vllm-draft", "dflash:{T}/bad-drafter", "--out", "{T}/bad-drafter/model.safetensors"],
     ["--out", "is the --vllm-draft input file"]),
    ("engine-max-new-tokens", "engine", ["--max-new-tokens", "100000000"], ["--max-new-tokens", "above the limit 8,192"]),
    ("engine-batch-size", "engine", ["--batch-size", "100000"], ["--batch-size", "above the limit 1,024"]),
    ("record-max-new-tokens", "trace", ["record", "--max-new-tokens", "100000000", "--out", "{T}/r.parquet"],
     ["--max-new-tokens", "8,192"]),
    ("synth-num-requests", "trace",
     ["synth", "--preset", "dflash-qwen3-8b-gsm8k", "--num-requests", "100000000000", "--out", "{T}/s.parquet"],
     ["--num-requests", "above the limit 20,000"]),
    ("fit-max-evals", "trace", ["fit", "{T}/good.parquet", "--max-evals", "100000000000"],
     ["--max-evals", "above the limit 100,000"]),
    ("sim-selection-batches", "sim", ["--selection-curve", "{T}/s.csv", "--selection-batches", "100000000000"],
     ["--selection-batches", "above the limit 100,000"]),
    ("sim-selection-samples", "sim",
     ["--selection-curve", "{T}/s.csv", "--trace", "{T}/good.parquet", "--selection-bs", "4096",
      "--selection-batches", "1000"], ["--selection-bs 4,096 x --selection-batches 1,000", "above the limit 1,000,000"]),
    # times and scales that would overflow a sum to inf (and the table to NaN)
    ("sim-overhead-ms", "sim", [*SIM, "--overhead-ms", "1e308"], ["--overhead-ms", "above the limit 1,000,000"]),
    ("sim-prefill-ms", "sim", [*SIM, "--mode", "open", "--prefill-ms", "1e308"], ["--prefill-ms", "above the limit"]),
    ("sim-draft-scale", "sim", [*SIM, "--draft-scale", "1e308"], ["--draft-scale", "above the limit"]),
    ("sim-draft-scale-nan", "sim", [*SIM, "--draft-scale", "nan"], ["--draft-scale", "is not finite"]),
    ("sim-scheduler-timeout-huge", "sim", [*SIM, "--scheduler-timeout", "1e300"],
     ["--scheduler-timeout", "above the limit 3,600"]),
    ("sim-scheduler-timeout-1e9", "sim", [*SIM, "--scheduler-timeout", "1e9"], ["--scheduler-timeout", "above the limit 3,600"]),
    # numbers too long to echo
    ("sim-requests-5000-digits", "sim", [*SIM, "--requests", HUGE], ["--requests", "is not an integer"]),
    ("sim-seed-huge", "sim", [*SIM, "--seed", "9" * 100], ["--seed", "above the limit 9,223,372,036,854,775,807"]),
    ("engine-seed-negative", "engine", ["--seed", "-1"], ["--seed", "must be >= 0"]),
    ("record-seed-huge", "trace", ["record", "--seed", HUGE, "--out", "{T}/r.parquet"], ["--seed", "is not an integer"]),
    ("sim-float-5000-digits", "sim", [*SIM, "--overhead-ms", "x" + HUGE], ["--overhead-ms", "is not a number"]),
    # devices
    ("engine-device-bogus", "engine", ["--device", "bogus"], ["--device", "'bogus' is not a torch device"]),
    ("engine-device-meta", "engine", ["--device", "meta"], ["--device", "runs on cpu or cuda[:N], not meta"]),
    ("record-device-bogus", "trace", ["record", "--device", "bogus", "--out", "{T}/r.parquet"],
     ["--device", "is not a torch device"]),
    # flags the run would silently ignore
    ("sim-rate-closed-loop", "sim", [*SIM, "--rate", "5"], ["--rate is an open-loop flag", "add --mode open"]),
    ("sim-requests-closed-loop", "sim", [*SIM, "--requests", "5"], ["--requests is an open-loop flag"]),
    ("sim-steps-open-loop", "sim", ["--trace", "{T}/good.parquet", "--cost", "{T}/good-cost.json", "--mode", "open",
                                    "--steps", "5"], ["--steps sizes a closed-loop run"]),
    ("sim-seeds-with-scheduler", "sim", [*SIM, "--seeds", "2", "--scheduler", "dask"],
     ["--scheduler is for --sweep, and --seeds runs here"]),
    ("sim-selection-with-policies", "sim", ["--selection-curve", "{T}/s.csv", "--policies", "dcut"],
     ["--policies has no effect with --selection-curve"]),
    ("sim-selection-with-out", "sim", ["--selection-curve", "{T}/s.csv", "--out", "{T}/x.csv"],
     ["--out has no effect with --selection-curve"]),
    ("sim-selection-bs-alone", "sim", [*SIM, "--selection-bs", "8"], ["--selection-bs is for --selection-curve FILE"]),
    ("sim-jobs-on-dask", "sim", [*SIM, "--sweep", "--scheduler", "dask", "--scheduler-address", "tcp://127.0.0.1:1",
                                 "--jobs", "2"], ["--jobs has no effect with --scheduler dask"]),
    # flags given with their default value are still flags the run would ignore
    ("sim-load-default-closed-loop", "sim", [*SIM, "--load", "0.7"], ["--load is an open-loop flag"]),
    ("sim-requests-default-closed-loop", "sim", [*SIM, "--requests", "400"], ["--requests is an open-loop flag"]),
    ("sim-warmup-not-below-steps", "sim", [*SIM[:4], "--steps", "5", "--warmup", "10", "--batch-sizes", "2", "--quiet"],
     ["--warmup 10 must be less than --steps 5"]),
    ("sim-seeds-past-the-largest-seed", "sim", [*SIM, "--seeds", "3", "--seed", str(2**63 - 2)],
     ["runs seeds up to 9,223,372,036,854,775,808, above the largest seed"]),
    ("sim-limit-printed-exactly", "sim", [*SIM, "--overhead-ms", "1000001"],
     ["1000001.0 is above the limit 1,000,000"]),
    ("sim-newline-in-a-path", "sim", [*SIM[:2], "--cost", "{T}/miss\ning.json", *SIM[4:]], ["miss\\ning.json"]),
    ("profile-analytic-resume", "profile", ["--analytic", "--device", "h200", "--out", "{T}/c.json", "--resume"],
     ["--resume has no effect on a --analytic profile"]),
    ("profile-analytic-repeats", "profile", ["--analytic", "--device", "h200", "--out", "{T}/c.json", "--repeats", "3"],
     ["--repeats has no effect on a --analytic profile"]),
    ("profile-cpu-device", "profile", ["--cpu", "--device", "h200", "--out", "{T}/c.json"],
     ["--device has no effect on a --cpu profile"]),
    ("profile-engine-steps-without-draft", "profile", ["--vllm", "{T}", "--vllm-engine-steps", "4", "--out", "{T}/c.json"],
     ["--vllm-engine-steps times drafted engine steps: add --vllm-draft"]),
    ("synth-list-with-out", "trace", ["synth", "--list", "--out", "{T}/s.parquet"], ["--out has no effect with --list"]),
    ("sim-cost-row-too-large", "sim", [*SIM[:2], "--cost", "{T}/huge-cost.json", *SIM[4:]],
     ["huge-cost.json", "above the limit 1e+07 ms"]),
    # fifth pass: sizes hidden in values, more ignored flags, output suffixes, devices as inputs
    ("sim-batch-size-huge", "sim", [*SIM[:4], "--batch-sizes", "9" * 25, "--quiet"],
     ["--batch-sizes", "above the limit 1,000,000"]),
    ("sim-batch-size-twice", "sim", [*SIM[:4], "--batch-sizes", "2,2", "--quiet"], ["--batch-sizes", "given twice"]),
    ("sim-batch-sizes-too-many", "sim", [*SIM[:4], "--batch-sizes", ",".join(map(str, range(1, 10_002))), "--quiet"],
     ["--batch-sizes", "10,001 items, above the limit 10,000"]),
    ("trace-skip-layers-too-many", "trace", ["record", "--skip-layers", "1," * 10_001],
     ["--skip-layers", "10,001 items, above the limit 10,000"]),
    ("sim-dspark-capture-limit", "sim", [*SIM, "--policies", "dspark", "--param", "dspark.capture_limit=100000000"],
     ["capture_limit=100000000 must be an integer in [1, 1,048,576]"]),
    ("sim-fine-allowed-huge", "sim", [*SIM, "--policies", "fine", "--param", "fine.allowed_num_tokens=[" + "9" * 20 + "]"],
     ["holds an integer beyond 2,147,483,647"]),
    ("sim-fine-allowed-negative", "sim", [*SIM, "--policies", "fine", "--param", "fine.allowed_num_tokens=[-4,8]"],
     ["allowed_num_tokens must be token counts >= 1"]),
    ("sim-param-string-echo", "sim", [*SIM, "--policies", "tetris", "--param", "tetris.draft_capacity=" + "a" * 5000],
     ["draft_capacity: expects an integer"]),
    ("sim-scheduler-without-sweep", "sim", [*SIM, "--scheduler", "local"], ["--scheduler chooses where a --sweep runs"]),
    ("sim-load-with-rate", "sim", [*SIM[:4], "--mode", "open", "--rate", "5", "--load", "0.7", "--batch-sizes", "2",
                                   "--quiet"], ["--load has no effect with --rate"]),
    ("sim-ar-only-calibrate", "sim", [*SIM, "--policies", "ar", "--calibrate"],
     ["--calibrate has no effect with --policies ar"]),
    ("sim-negative-drafted-row", "sim", [*SIM[:2], "--cost", "{T}/negative-cost.json", *SIM[4:]],
     ["negative-cost.json", "a drafted step at batch_size=", "is priced at"]),
    ("engine-cost-unread", "engine", ["--policy", "full", "--cost", "{T}/good-cost.json"],
     ["--cost has no effect with --policy full"]),
    ("drafter-max-new-tokens", "drafter", ["train", "--out", "{T}/d", "--work-dir", "{T}/wd", "--max-new-tokens",
                                           "9" * 20], ["--max-new-tokens", "above the limit 8,192"]),
    ("profile-batch-size-twice", "profile", ["--analytic", "--device", "h200", "--batch-sizes", "2,2", "--out",
                                             "{T}/c.json"], ["a batch size is given twice"]),
    ("profile-dflash-layers-huge", "profile", ["--analytic", "--device", "h200", "--draft", "dflash:" + "9" * 20,
                                               "--out", "{T}/c.json"], ["a DFlash drafter of 1..1024 layers"]),
    ("profile-draft-and-draft-config", "profile", ["--analytic", "--device", "h200", "--draft", "none",
                                                   "--draft-config", "2", "--out", "{T}/c.json"],
     ["--draft and --draft-config both name the draft step"]),
    ("profile-out-not-json", "profile", ["--analytic", "--device", "h200", "--out", "{T}/c.csv"],
     ["--out", "unknown output format '.csv'"]),
    ("sim-trace-block-size-huge", "sim", ["--trace", "{T}/huge-block.parquet", *SIM[2:]],
     ["block_size", "is too large for a trace (at most 32768)"]),
    ("stats-out-not-json", "trace", ["stats", "{T}/good.parquet", "--out", "{T}/s.txt"], ["unknown output format '.txt'"]),
    ("record-prompts-device", "trace", ["record", "--prompts", "/dev/zero", "--out", "{T}/r.parquet"],
     ["/dev/zero: is not a regular file"]),
    # Dask addresses refused before connecting
    ("sim-dask-address-malformed", "sim",
     [*SIM, "--sweep", "--scheduler", "dask", "--scheduler-address", "tcp://::::", "--scheduler-timeout", "1"],
     ["--scheduler-address 'tcp://::::' is not a Dask scheduler address", "brackets"]),
    ("sim-dask-address-no-port", "sim",
     [*SIM, "--sweep", "--scheduler", "dask", "--scheduler-address", "foo", "--scheduler-timeout", "1"],
     ["missing port number"]),
    ("sim-dask-address-protocol", "sim",
     [*SIM, "--sweep", "--scheduler", "dask", "--scheduler-address", "http://x:1", "--scheduler-timeout", "1"],
     ["protocol 'http' is not supported here, only tcp://"]),
    *[(f"sim-dask-address-{name}", "sim",
       [*SIM, "--sweep", "--scheduler", "dask", "--scheduler-address", address, "--scheduler-timeout", "1"], [needle])
      for name, address, needle in (("tls", "tls://127.0.0.1:1", "protocol 'tls'"),
                                    ("inproc", "inproc://foo", "protocol 'inproc'"),
                                    ("ws", "ws://127.0.0.1:1", "protocol 'ws'"),
                                    ("no-host", "tcp://:1", "(no host)"))],
    ("sim-dask-address-port", "sim",
     [*SIM, "--sweep", "--scheduler", "dask", "--scheduler-address", "tcp://a:99999", "--scheduler-timeout", "1"],
     ["port 99999 is not in 1..65535"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refused_in_one_line(case, files, capsys):  # noqa: F811 (fixture)
    _id, cli, argv, needles = case
    if cli == "sim" and "dask" in argv:
        pytest.importorskip("distributed")
    import json

    doc = json.loads((files / "good-cost.json").read_text())
    doc["verify"][0]["median_ms"] = 1e307  # finite, but a run's sums would overflow
    (files / "huge-cost.json").write_text(json.dumps(doc))
    doc = json.loads((files / "good-cost.json").read_text())
    doc["step_overhead"] = [{"kind": "drafted", "batch_size": bs, "median_ms": -5000.0}
                            for bs in sorted({r["batch_size"] for r in doc["verify"]})]
    (files / "negative-cost.json").write_text(json.dumps(doc))  # a drafted step priced below 0 ms
    import pyarrow.parquet as pq

    table = pq.read_table(files / "good.parquet")
    meta = {**table.schema.metadata, b"block_size": b"9" * 23}
    pq.write_table(table.replace_schema_metadata(meta), files / "huge-block.parquet")
    err = _run(cli, argv, files, capsys)
    assert len(err) < 400, err  # a 5,000-digit value is never echoed back
    for needle in needles:
        assert needle in err, (needle, err)


def test_every_sim_flag_has_a_run_that_reads_it():
    """check_flags_used's tables name every flag of dcut-sim: a new flag must say which runs read it."""
    from dcut_sched.cli import sim

    parser = sim.build_parser()
    dests = set(vars(parser.parse_args([])))
    known = sim.SELECTION_FLAGS | sim.RUN_FLAGS | sim.CLOSED_FLAGS | sim.OPEN_FLAGS | {"selection_bs", "selection_batches"}
    assert dests <= known, dests - known


def test_flags_that_a_run_reads_are_accepted():
    from dcut_sched.cli import sim
    from dcut_sched.cli.args import given_flags

    parser = sim.build_parser()
    for argv in (["--mode", "open", "--rate", "5", "--requests", "10", "--prompt-len", "4"],
                 ["--steps", "10", "--warmup", "2", "--seeds", "2", "--jobs", "1"],
                 ["--selection-curve", "x.csv", "--selection-bs", "8", "--selection-batches", "3", "--seed", "4"],
                 ["--sweep", "--scheduler", "dask", "--scheduler-address", "tcp://h:1", "--scheduler-timeout", "2"]):
        args = parser.parse_args(argv)
        sim.check_flags_used(args, given_flags(sim.build_parser, argv, args))


def test_given_flags_sees_flags_given_with_their_default_value():
    from dcut_sched.cli import sim
    from dcut_sched.cli.args import given_flags

    argv = ["--load", "0.7", "--param", "dcut.ratios=[1.0]", "--param", "fine.granularity=4", "--quiet"]
    args = sim.build_parser().parse_args(argv)
    assert given_flags(sim.build_parser, argv, args) == {"load", "param", "quiet"}
    assert given_flags(sim.build_parser, [], sim.build_parser().parse_args([])) == set()


@pytest.mark.parametrize("text, ok", [("cpu", True), ("cuda", False), ("cuda:7", False), ("meta", False),
                                      ("bogus", False), ("", False)])
def test_torch_device_type(text, ok):
    import argparse

    import torch

    from dcut_sched.cli.args import torch_device

    if text.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("a CUDA machine: cuda is a valid device here")
    if ok:
        assert torch_device(text) == text
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            torch_device(text)


def test_a_gpu_index_this_machine_lacks(monkeypatch):
    import argparse

    import torch

    from dcut_sched.cli.args import torch_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert torch_device("cuda:0") == "cuda:0"
    with pytest.raises(argparse.ArgumentTypeError, match=r"'cuda:3': this machine has 1 CUDA GPU\(s\), cuda:0..cuda:0"):
        torch_device("cuda:3")


@pytest.mark.parametrize("exc", [MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: "
                                                             "can't allocate memory: you tried to allocate 9 bytes")])
def test_an_allocation_that_fails_is_one_line(exc, capsys):
    from dcut_sched.cli.errors import run_cli

    def body():
        raise exc

    assert run_cli("dcut-x", body) == 2
    err = capsys.readouterr().err
    assert err.startswith("dcut-x: error: not enough memory for this run") and err.count("\n") == 1, err


def test_any_other_runtime_error_keeps_its_traceback():
    from dcut_sched.cli.errors import run_cli

    def body():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_cli("dcut-x", body)


def test_a_closed_pipe_ends_quietly(files):  # noqa: F811 (fixture)
    """``dcut-sim ... | head -1``: exit 141 (128 + SIGPIPE) and nothing on stderr, as shell tools do."""
    argv = [a.replace("{T}", str(files)) for a in SIM if a != "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "dcut_sched.cli.sim", *argv, "--policies", "dcut"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader goes away before the table is printed
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "error" not in err, err


def test_no_output_folder_is_left_after_an_error(files, capsys):  # noqa: F811 (fixture)
    out = files / "new" / "sub" / "x.csv"
    err = _run("sim", [*SIM, "--trace", "{T}/missing.parquet", "--out", str(out)], files, capsys)
    assert "missing.parquet" in err
    assert not (files / "new").exists()


def test_check_writable_makes_no_folder(tmp_path):
    from dcut_sched.util.atomic import check_writable

    check_writable(tmp_path / "a" / "b" / "c.json")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(OSError, match="is a file, not a folder"):
        check_writable(tmp_path / "f" / "g" / "c.json")


def test_folders_made_for_a_failed_write_are_removed(tmp_path):
    from dcut_sched.util.atomic import all_or_none, atomic_write_text

    with pytest.raises(KeyError):
        with all_or_none():
            atomic_write_text(tmp_path / "a" / "b" / "one.txt", "1")
            atomic_write_text(tmp_path / "c" / "two.txt", "2")
            raise KeyError("late failure")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "keep").mkdir()
    with all_or_none():
        atomic_write_text(tmp_path / "keep" / "x" / "one.txt", "1")
    assert (tmp_path / "keep" / "x" / "one.txt").read_text() == "1"


def test_failed_vllm_profile_leaves_no_file(tmp_path, monkeypatch):
    """``dcut-profile --vllm``: the profile process writes into a private folder; a curve that does not
    load (or a failed run) leaves neither --out nor its engine-step records, nor the folder."""
    from dcut_sched.integrations.vllm_tools import venv
    from dcut_sched.profiler import vllm_engine

    fake = tmp_path / "fake_python"
    # writes a steps file and a curve that is not a curve, then exits 0
    fake.write_text("#!/bin/sh\nwhile [ \"$1\" != --out ]; do shift; done\nout=\"$2\"\n"
                    "echo '{}' > \"${out%.json}.steps.jsonl\"\necho '{\"schema\": 1}' > \"$out\"\n")
    fake.chmod(0o755)
    monkeypatch.setattr(venv, "vllm_available", lambda: (True, ""))
    monkeypatch.setattr(venv, "venv_python", lambda: fake)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = tmp_path / "out" / "c.json"
    with pytest.raises(Exception):
        vllm_engine.profile_vllm(str(model), str(out), draft="d", block_size=8, batch_sizes=[1], context_len=8,
                                 warmups=0, repeats=1, dtype="float32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake_python", "model"]
    assert Path(vllm_engine.steps_path_for(out)).name == "c.steps.jsonl"


def test_a_long_message_is_cut_to_one_short_line(capsys):
    from dcut_sched.cli.errors import MAX_MESSAGE_CHARS, run_cli

    def body():
        raise ValueError("bad field x: " + "y" * 100_000 + " ; give a real value")

    assert run_cli("dcut-x", body) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < MAX_MESSAGE_CHARS + 100, len(err)
    assert "bad field x" in err and "give a real value" in err and "characters cut" in err


def test_controller_refuses_a_timedelta_count_and_a_meta_tensor(make_curve):
    import numpy as np
    import torch

    from dcut_sched.controller import RatioController

    ctrl = RatioController(make_curve(block_size=8), 8, "dcut")
    ctrl.plan(np.full((2, 7), 0.5))
    with pytest.raises(TypeError, match="accept_len must be an integer array"):
        ctrl.observe(np.array([1, 2], dtype="timedelta64[s]"))
    with pytest.raises(TypeError, match="meta tensor"):
        ctrl.plan(torch.ones(2, 7, device="meta"))


def test_drafter_leaves_no_work_folder_it_made(tmp_path, monkeypatch, capsys):
    """A training run that fails leaves no empty work folder behind (one holding resumable state is kept)."""
    from dcut_sched import model
    from dcut_sched.cli import drafter
    from dcut_sched.drafters import train

    monkeypatch.setattr(model.LlamaModel, "from_smollm2", classmethod(lambda cls, **k: object()))
    monkeypatch.setattr("dcut_sched.model.tokenizer.load_smollm2_tokenizer", lambda: object())

    def fail(settings, *, work_dir, **kw):
        assert work_dir.is_dir()  # made (and locked) by the command before training
        raise ValueError("training failed")

    monkeypatch.setattr(train, "run_training", fail)
    assert drafter.main(["train", "--out", str(tmp_path / "d"), "--work-dir", str(tmp_path / "a" / "wd")]) == 2
    assert "training failed" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# The seventh pass (docs/reliability.md): a policy parameter out of its range names --param, and
# dcut-drafter train's --lr is bounded to [1e-7, 1].
@pytest.mark.parametrize("cli, argv, needles", [
    ("sim", ["--trace", "{T}/good.parquet", "--policies", "uniform", "--param", "uniform.rho=1.5"],
     ["--param: policy 'uniform' with parameters {'rho': 1.5}: uniform: rho=1.5 must be in (0, 1]",
      "give a value in the range dcut-sim --help lists"]),
    ("drafter", ["train", "--lr", "1e-300"], ["argument --lr: 1e-300 must be >= 1e-07"]),
    ("drafter", ["train", "--lr", "10"], ["argument --lr: 10.0 is above the limit 1"]),
], ids=["sim-param-range", "drafter-lr-tiny", "drafter-lr-huge"])
def test_seventh_pass_flag_ranges(files, capsys, cli, argv, needles):  # noqa: F811 (fixture)
    err = _run(cli, argv, files, capsys)  # exit 2, one line, nothing written
    assert all(n in err for n in needles), err
