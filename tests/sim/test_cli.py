"""dcut-sim: outputs by suffix, and bad input -> one line on stderr, exit 2, no partial file."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dcut_sched import policies
from dcut_sched.cli import sim as cli
from dcut_sched.simulator import defaults

from .conftest import random_trace

FAST = ["--steps", "30", "--warmup", "5", "--quiet"]


@pytest.fixture
def files(tmp_path, make_curve):
    trace = random_trace(num_requests=6, block_size=4, max_len=20, seed=2)
    trace_path = tmp_path / "t.parquet"
    trace.save(trace_path)
    cost_path = tmp_path / "c.json"
    make_curve(block_size=4).save(cost_path)
    return trace_path, cost_path


def run(args, capsys):
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet"])
def test_outputs_by_suffix(files, tmp_path, capsys, suffix):
    trace, cost = files
    out = tmp_path / f"r{suffix}"
    rc, _, err = run(["--trace", trace, "--cost", cost, "--batch-sizes", "2,4", "--out", out, *FAST], capsys)
    assert rc == 0, err
    if suffix == ".csv":
        df = pd.read_csv(out)
    elif suffix == ".parquet":
        df = pd.read_parquet(out)
    else:
        doc = json.loads(out.read_text())
        df = pd.DataFrame(doc["rows"])
        assert doc["attrs"]["approximate"] is False and doc["attrs"]["warmup_steps"] == 5
    assert list(df.columns[:9]) == ["policy", "batch_size", "tokens_per_s", "speedup_vs_ar", "mean_tokens_per_step",
                                    "verified_tokens_per_step", "waste_frac", "mean_ratio", "draft_frac"]
    assert len(df) == len(policies.names()) * 2 and set(df["batch_size"]) == {2, 4}
    assert np.allclose(df.loc[df.policy == "ar", "speedup_vs_ar"], 1.0)
    assert leftovers(tmp_path) == []


def test_table_and_plot(files, tmp_path, capsys):
    trace, cost = files
    plot = tmp_path / "speedup.png"
    rc, out, err = run(["--trace", trace, "--cost", cost, "--batch-sizes", "2,4", "--policies", "full,dcut",
                        "--steps", "30", "--warmup", "5", "--plot", plot], capsys)
    assert rc == 0, err
    assert "speedup over ar" in out and "geomean" in out and "dcut" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_selection_curve_cli(files, tmp_path, capsys):
    trace, _ = files
    csv, png = tmp_path / "sel.csv", tmp_path / "sel.png"
    rc, out, err = run(["--trace", trace, "--selection-curve", csv, "--selection-bs", "2", "--selection-batches", "20"],
                       capsys)
    assert rc == 0, err
    df = pd.read_csv(csv)
    assert set(df["policy"]) == {"uniform", "topk"} and df["budget"].tolist()[:3] == [4, 6, 8]
    assert "selection curve" in out
    rc, _, err = run(["--trace", trace, "--selection-curve", png, "--selection-bs", "2", "--quiet"], capsys)
    assert rc == 0, err and png.exists()


def test_sweep_cli(files, tmp_path, capsys):
    trace, cost = files
    out = tmp_path / "sweep.csv"
    other = tmp_path / "c2.json"  # a second curve, 10 % slower (the same file or a copy is refused: inputs are a set)
    doc = json.loads(cost.read_text())
    for rows in (v for v in doc.values() if isinstance(v, list)):
        for row in rows:
            row.update({k: 1.1 * v for k, v in row.items() if k.endswith("_ms") and isinstance(v, (int, float))})
    other.write_text(json.dumps(doc))
    rc, _, err = run(["--sweep", "--trace", trace, "--cost", cost, "--cost", other, "--batch-sizes", "2,4",
                      "--policies", "dcut", "--jobs", "2", "--out", out, *FAST], capsys)
    assert rc == 0, err
    df = pd.read_csv(out)
    assert len(df) == 2 * 2 * 2  # 2 curves x 2 batch sizes x (ar, dcut)


def bad_case(tmp_path, files, make_curve, which):
    trace, cost = files
    if which == "missing trace":
        return ["--trace", tmp_path / "nope.parquet", "--cost", cost], "nope.parquet"
    if which == "garbage trace":
        bad = tmp_path / "bad.parquet"
        bad.write_bytes(b"not parquet at all")
        return ["--trace", bad, "--cost", cost], "bad.parquet"
    if which == "invalid trace":
        df = pd.read_parquet(trace)
        df.loc[3, "c2"] = 1.5
        bad = tmp_path / "bad2.parquet"
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(df, preserve_index=False)
        table = table.replace_schema_metadata({**pq.read_schema(trace).metadata})
        pq.write_table(table, bad)
        return ["--trace", bad, "--cost", cost], "c2"
    if which == "missing cost":
        return ["--trace", trace, "--cost", tmp_path / "nope.json"], "nope.json"
    if which == "invalid cost":
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        return ["--trace", trace, "--cost", bad], "not valid JSON"
    if which == "block-size mismatch":
        other = tmp_path / "c8.json"
        make_curve(block_size=8).save(other)
        return ["--trace", trace, "--cost", other], "block size"
    if which == "batch size outside curve":
        return ["--trace", trace, "--cost", cost, "--batch-sizes", "2,16"], "batch size 16"
    if which == "unknown policy":
        return ["--trace", trace, "--cost", cost, "--policies", "full,bogus"], "bogus"
    if which == "bad policy param":
        return ["--trace", trace, "--cost", cost, "--param", "uniform.rho=7"], "rho"
    if which == "warmup >= steps":
        return ["--trace", trace, "--cost", cost, "--steps", "10", "--warmup", "10"], "warmup"
    raise AssertionError(which)


CASES = ["missing trace", "garbage trace", "invalid trace", "missing cost", "invalid cost", "block-size mismatch",
         "batch size outside curve", "unknown policy", "bad policy param", "warmup >= steps"]


@pytest.mark.parametrize("which", CASES)
def test_bad_input_exit_2_no_partial_file(files, tmp_path, capsys, make_curve, which):
    args, needle = bad_case(tmp_path, files, make_curve, which)
    out = tmp_path / "out" / "results.csv"
    rc, _, err = run([*args, "--out", out, "--plot", tmp_path / "p.png", "--quiet"], capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dcut-sim: error:") and needle in lines[0], err
    assert "Traceback" not in err
    assert not out.exists() and not (tmp_path / "p.png").exists()
    assert leftovers(tmp_path) == [] and (not out.parent.exists() or list(out.parent.iterdir()) == [])


def test_bad_output_suffix_checked_before_running(files, tmp_path, capsys):
    trace, cost = files
    rc, _, err = run(["--trace", trace, "--cost", cost, "--out", tmp_path / "r.xlsx", *FAST], capsys)
    assert rc == 2 and "r.xlsx" in err and ".csv" in err


def test_failure_mid_write_leaves_old_file(files, tmp_path, capsys, monkeypatch):
    trace, cost = files
    out = tmp_path / "r.csv"
    out.write_text("previous\n")

    def explode(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", explode)
    rc, _, err = run(["--trace", trace, "--cost", cost, "--batch-sizes", "2", "--out", out, *FAST], capsys)
    assert rc == 2 and "disk full" in err
    assert out.read_text() == "previous\n" and leftovers(tmp_path) == []


def test_missing_default_names_the_file_and_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(defaults, "DEFAULT_TRACES", ("no-such-trace.parquet",))
    rc, _, err = run(["--quiet"], capsys)
    assert rc == 2
    assert "no-such-trace.parquet not found" in err and "--trace" in err


def test_several_traces_give_the_mean_over_benchmarks(files, tmp_path, capsys, make_curve):
    trace, cost = files
    other = random_trace(num_requests=5, block_size=4, max_len=16, seed=7)
    other_path = tmp_path / "u.parquet"
    other.save(other_path)
    out = tmp_path / "rows.csv"
    rc, text, err = run(["--trace", trace, "--trace", other_path, "--cost", cost, "--batch-sizes", "2,4",
                         "--policies", "full,dcut", "--steps", "30", "--warmup", "5", "--out", out], capsys)
    assert rc == 0, err
    assert "2 benchmarks" in text and "geomean over all 4" in text
    df = pd.read_csv(out)
    assert len(df) == 2 * 3 * 2 and set(df["benchmark"]) == {"t", "u"}  # (trace, policy, bs)
    mean = df.groupby(["policy", "batch_size"])["speedup_vs_ar"].mean()
    for bs in (2, 4):
        assert f"{mean['dcut', bs]:.2f}x" in text
    rc, _, err = run(["--trace", trace, "--trace", trace, "--selection-curve", tmp_path / "s.csv"], capsys)
    assert rc == 2 and "--selection-curve takes one --trace" in err


def test_calibrate_flag(files, capsys):
    trace, cost = files
    rc, _, err = run(["--trace", trace, "--cost", cost, "--batch-sizes", "2", "--policies", "dcut", "--calibrate",
                      *FAST], capsys)
    try:
        import dcut_sched.calibration  # noqa: F401
    except ImportError:
        assert rc == 2 and "OnlineCalibrator" in err
    else:
        assert rc == 0, err


def test_help_lists_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--trace", "--cost", "--policies", "--batch-sizes", "--mode", "--out", "--plot", "--sweep",
                 "--selection-curve", "--calibrate"):
        assert flag in text
    words = " ".join(text.split())  # argparse wraps to the terminal width
    assert "--out FILE detail results, one row per (trace, policy, batch size) (--sweep: also per cost curve" in words


def test_open_loop_table_shows_batch_goodput_and_percentiles(files, tmp_path, capsys):
    """The open-loop table prints, per (max bs, policy), the frame's mean batch, goodput and latencies."""
    trace, cost = files
    out = tmp_path / "open.json"
    rc, text, err = run(["--trace", trace, "--cost", cost, "--mode", "open", "--batch-sizes", "4",
                         "--policies", "dcut", "--requests", "40", "--out", out], capsys)
    assert rc == 0, err
    assert f"wrote {out}" in err
    df = pd.DataFrame(json.loads(out.read_text())["rows"])
    header = next(line for line in text.splitlines() if "mean batch" in line)
    for col in ("TPOT speedup", "goodput tok/s", "TPOT p50 ms", "TPOT p99 ms", "TTFT p99 ms"):
        assert col in header  # whole headers: piped output is not cut at 80 columns
    assert "TPOT speedup = ar's mean TPOT / the policy's mean TPOT" in text
    for r in df.itertuples():
        row = next(line for line in text.splitlines() if f" {r.policy} " in line)
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert cells[:4] == ["4", f"{r.rate_rps:.2f}", r.policy, f"{r.speedup_vs_ar:.2f}x"]
        assert cells[4:7] == [f"{r.mean_batch_size:.1f}", f"{r.goodput_tokens_per_s:,.0f}", f"{r.tpot_ms_p50:.2f}"]


def test_open_loop_footer_states_the_arrivals_the_rows_ran(files, tmp_path, capsys, make_curve):
    """Open loop, one trace and several (the benchmark table): the footer names the arrivals per run, the
    warm-up arrivals and the engine steps the rows carry, never the closed loop's steps per run."""
    trace, cost = files
    other = random_trace(num_requests=5, block_size=4, max_len=16, seed=7)
    other_path = tmp_path / "u.parquet"
    other.save(other_path)
    for traces in (["--trace", trace], ["--trace", trace, "--trace", other_path]):
        out = tmp_path / "open.json"
        rc, text, err = run([*traces, "--cost", cost, "--mode", "open", "--batch-sizes", "2,4",
                             "--policies", "dcut", "--requests", "30", "--out", out], capsys)
        assert rc == 0, err
        df = pd.DataFrame(json.loads(out.read_text())["rows"])
        assert set(df["requests"]) == {30} and set(df["warmup_requests"]) == {3}
        steps = f"{df['steps'].min():,}-{df['steps'].max():,} engine steps per run"
        assert "30 Poisson arrivals per run, first 3 left out of latencies (warm-up); " + steps in text
        assert "steps per run, first" not in text


def test_plot_names_its_inputs_and_is_deterministic(files, tmp_path, capsys):
    """The plot title names trace, model and device; two runs write the same bytes (png and pdf)."""
    from dcut_sched.simulator.plot import describe_inputs

    trace, cost = files
    from dcut_sched import simulate

    df = simulate(trace, cost, batch_sizes=[2, 4], policies=["full", "dcut", "oracle"], num_steps=30,
                      warmup_steps=5)
    assert describe_inputs(df) == "trace t, cost linear-test on test (analytic)"
    for suffix in (".png", ".pdf"):
        a, b = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
        for path in (a, b):
            rc, _, err = run(["--trace", trace, "--cost", cost, "--batch-sizes", "2,4", "--policies", "dcut,oracle",
                              "--plot", path, *FAST], capsys)
            assert rc == 0 and f"wrote {path}" in err
        assert a.read_bytes() == b.read_bytes()
