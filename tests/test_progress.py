"""Progress lines for logs: hand-computed rate, ETA and durations; the timer prints while idle."""

import io
import time

from dcut_sched.util.progress import RunProgress, format_duration, status_line


def test_format_duration():
    assert format_duration(8.2) == "8s"
    assert format_duration(75.0) == "1m15s"
    assert format_duration(3725.0) == "1h02m"
    assert format_duration(float("inf")) == "?"
    assert format_duration(float("nan")) == "?"


def test_status_line_rate_and_eta():
    # 30 of 120 tokens in 15 s: 2 tokens/s, 90 left -> 45 s.
    line = status_line("run", 30, 120, "tokens", 15.0, detail="step 4")
    assert line == "run: 30/120 tokens (25%), 2.00 tokens/s, elapsed 15s, ETA ~45s; step 4"


def test_status_line_resumed_and_unknown_total():
    # Resumed at 10 of 20 requests, 2 more in 60 s: rate 1/30 per s, 8 left -> 240 s.
    assert status_line("rec", 12, 20, "requests", 60.0, initial=10) == (
        "rec: 12/20 requests (60%), 2.00 requests/min, elapsed 1m00s, ETA ~4m00s")
    # Nothing done yet: no rate, no ETA.
    assert status_line("rec", 0, 20, "requests", 5.0) == "rec: 0/20 requests (0%), elapsed 5s"
    assert status_line("x", 7, None, "steps", 7.0) == "x: 7 steps, 1.00 steps/s, elapsed 7s"


def test_log_lines_while_idle_and_final_line():
    out = io.StringIO()  # not a TTY: log lines
    with RunProgress("job", 4, "requests", interval_s=0.05, stream=out) as p:
        p.note("job: 4 requests to go")
        p.update(advance=1, detail="decoding")
        time.sleep(0.3)  # the main thread is "stuck" in one long call: the timer still prints
        p.update(advance=3)
    lines = out.getvalue().splitlines()
    assert lines[0] == "job: 4 requests to go"
    assert any(line.startswith("job: 1/4 requests (25%)") and line.endswith("; decoding") for line in lines[1:-1])
    assert lines[-1].startswith("job: 4/4 requests (100%)") and lines[-1].endswith("(done)")


def test_disabled_prints_nothing():
    out = io.StringIO()
    with RunProgress("job", 4, "requests", enabled=False, interval_s=0.01, stream=out) as p:
        p.note("hidden")
        p.update(advance=4)
        time.sleep(0.05)
    assert out.getvalue() == ""
