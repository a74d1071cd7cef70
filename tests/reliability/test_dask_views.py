"""Dask sweeps: a worker gets absolute paths and says whose view of a path failed; an address that
answers garbage is one error line, with no client destructor traceback after it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

from dcut_sched.simulator import SimulationError, sweep

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "dcut_sched" / "data" / "traces" / "smollm2-135m-skip14-15-b8.parquet"
COST = ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-b8.json"
OPTIONS = {"policies": ["full"], "num_steps": 20, "warmup_steps": 2}


@pytest.fixture
def relative_inputs(tmp_path, monkeypatch):
    (tmp_path / "in").mkdir()
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(TRACE, tmp_path / "in" / "t.parquet")
    shutil.copy(COST, tmp_path / "in" / "c.json")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_workers_in_another_working_folder_get_absolute_paths(relative_inputs):
    """A worker started elsewhere (its own working folder) reads the files dcut-sim was given
    relative to its own; the rows keep the names as given."""
    with ProcessPoolExecutor(1, initializer=os.chdir, initargs=(str(relative_inputs / "elsewhere"),)) as pool:
        df = sweep(["in/t.parquet"], ["in/c.json"], [2], executor=pool, **OPTIONS)
    assert df["trace"].unique().tolist() == ["in/t.parquet"] and df["cost"].unique().tolist() == ["in/c.json"]
    here = sweep(["in/t.parquet"], ["in/c.json"], [2], jobs=1, **OPTIONS)
    pd.testing.assert_frame_equal(df, here)


class _OtherFileSystem:
    """An executor whose worker does not see the trace (removed before the job runs), as a Dask
    worker on a host without the shared file system."""

    def __init__(self, hide: Path):
        self.hide = hide

    def submit(self, fn, *args):
        self.hide.unlink(missing_ok=True)
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except Exception as exc:
            fut.set_exception(exc)
        return fut


def test_a_path_the_worker_cannot_see_names_the_worker_view(relative_inputs):
    trace = relative_inputs / "in" / "t.parquet"
    with pytest.raises(SimulationError) as info:
        sweep(["in/t.parquet"], ["in/c.json"], [2], executor=_OtherFileSystem(trace), **OPTIONS)
    message = str(info.value)
    assert message.startswith(f"--trace {trace}: no such file in the view of the sweep worker on "
                              f"{socket.gethostname()} (pid {os.getpid()}, working folder {relative_inputs})")
    assert "though dcut-sim itself read it; the workers must see the --trace/--cost paths" in message


def _garbage_server(payload: bytes):
    """Accepts and answers every connection with ``payload`` (not the Dask protocol)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)

    def loop():
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            try:
                conn.sendall(payload)
            except OSError:
                pass

    threading.Thread(target=loop, daemon=True).start()
    return s


@pytest.mark.parametrize("payload", [b"\xff" * 4096, bytes(range(256)) * 16, b"\x00\x00\x00\x00\x00\x00\x00\x30" * 512],
                         ids=["ff", "ramp", "huge-frame-length"])
def test_an_address_answering_garbage_is_one_line_and_no_destructor_traceback(tmp_path, payload):
    pytest.importorskip("distributed")
    server = _garbage_server(payload)
    address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
    out = tmp_path / "s.csv"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "dcut_sched.cli.sim", "--sweep", "--trace", str(TRACE), "--cost", str(COST),
             "--batch-sizes", "2", "--steps", "20", "--warmup", "2", "--policies", "ar,full", "--scheduler", "dask",
             "--scheduler-address", address, "--scheduler-timeout", "5", "--quiet", "--out", str(out)],
            capture_output=True, text=True, timeout=120, cwd=ROOT)
    finally:
        server.close()
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # no "Exception ignored in: Client.__del__" traceback after it
    assert lines[0].startswith(f"dcut-sim: error: no Dask scheduler answered at '{address}' within 5 s")
    assert "not a Dask scheduler: its reply is not the Dask protocol" in lines[0], lines[0]
    assert "EiB" not in lines[0] and "dimension" not in lines[0]
    assert not out.exists()
