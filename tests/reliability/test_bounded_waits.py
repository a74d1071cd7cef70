"""No unbounded wait: a Dask address that does not answer is an error within --scheduler-timeout, and
work sized by --seeds/--steps/--requests has a limit, a size line, an estimate and progress."""

from __future__ import annotations

import http.server
import socket
import threading
from pathlib import Path

import pytest

from dcut_sched.cli import sim

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "dcut_sched" / "data" / "traces" / "smollm2-135m-skip14-15-b8.parquet")
COST = str(ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-b8.json")
FAST = ["--trace", TRACE, "--cost", COST, "--batch-sizes", "2", "--steps", "20", "--warmup", "2",
        "--policies", "ar,full"]


def _silent_listener():
    """A socket on 127.0.0.1 that listens and never accepts: the connect succeeds, nothing answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    return s, s.getsockname()[1], s.close


def _accept_and_close():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                conn, _ = s.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=loop, daemon=True).start()

    def close():
        stop.set()
        s.close()

    return s, s.getsockname()[1], close


def _http_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    def close():
        srv.shutdown()
        srv.server_close()

    return srv, srv.server_address[1], close


@pytest.mark.parametrize("make", [_silent_listener, _accept_and_close, _http_server],
                         ids=["listens-never-answers", "accepts-and-closes", "http-server"])
def test_dask_address_that_does_not_answer_is_an_error_naming_it(tmp_path, capsys, make):
    pytest.importorskip("distributed")
    _, port, close = make()
    address = f"tcp://127.0.0.1:{port}"
    out = tmp_path / "s.csv"
    try:
        status = sim.main(["--sweep", *FAST, "--scheduler", "dask", "--scheduler-address", address,
                           "--scheduler-timeout", "1", "--quiet", "--out", str(out)])
    finally:
        close()
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"dcut-sim: error: no Dask scheduler answered at '{address}' within 1 s")
    assert "--scheduler-timeout" in lines[0]
    assert not out.exists()


def test_dask_executor_refuses_a_timeout_that_is_no_bound():
    pytest.importorskip("distributed")
    from dcut_sched.simulator import dask_executor

    for bad in (0, -1, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="give a finite number of seconds > 0"):
            with dask_executor("tcp://127.0.0.1:9", timeout_s=bad):
                pass


@pytest.mark.parametrize("value", ["0", "-2", "inf", "nan"])
def test_scheduler_timeout_flag_must_be_finite_and_positive(capsys, value):
    assert sim.main(["--scheduler-timeout", value]) == 2
    assert "argument --scheduler-timeout" in capsys.readouterr().err


def test_scheduler_timeout_is_for_dask_only(capsys):
    assert sim.main([*FAST, "--scheduler-timeout", "5", "--quiet"]) == 2
    assert "--scheduler-timeout is for --scheduler dask" in capsys.readouterr().err


@pytest.mark.parametrize("flag, limit", [("--seeds", sim.MAX_SEEDS), ("--steps", sim.MAX_STEPS),
                                         ("--requests", sim.MAX_REQUESTS)])
def test_work_size_flags_have_a_documented_limit(capsys, flag, limit):
    assert sim.build_parser().parse_args([flag, str(limit)]).__dict__[flag[2:]] == limit
    assert sim.main([flag, str(limit + 1)]) == 2
    err = capsys.readouterr().err
    assert err == (f"dcut-sim: error: argument {flag}: {limit + 1:,} is above the limit {limit:,} "
                   f"(docs/reliability.md); split the work into several runs (see dcut-sim --help)\n")
    assert f"at most {limit:,}" in " ".join(sim.build_parser().format_help().split())
    assert f"`{flag}` | {limit:,}" in (ROOT / "docs" / "reliability.md").read_text()


def test_seeds_print_size_estimate_and_progress(capsys):
    # one worker: the runs finish in order, so the last line names the last run (with --jobs 2 any
    # of the final runs may finish last)
    assert sim.main([*FAST, "--seeds", "3", "--jobs", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "dcut-sim: size: 3 seeds x 2 policies x 1 batch sizes = 6 runs, 20 steps per run"
    assert err[1].startswith("dcut-sim: estimate: the first run took ") and "all 6 ~" in err[1]
    assert err[2].startswith("dcut-sim: 6/6 runs (100%)") and err[2].endswith("seed 2: full bs=2 (done)")


def test_open_loop_size_names_the_arrivals(capsys):
    assert sim.main(["--trace", TRACE, "--cost", COST, "--batch-sizes", "2", "--policies", "ar", "--mode", "open",
                     "--requests", "30"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "dcut-sim: size: 1 policies x 1 batch sizes = 1 runs, 30 arrivals per run"


def test_quiet_prints_no_size_line(capsys):
    assert sim.main([*FAST, "--seeds", "2", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_bad_input_is_refused_before_the_size_line(capsys):
    assert sim.main([*FAST, "--seeds", "2", "--batch-sizes", "64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dcut-sim: error: batch size 64")
