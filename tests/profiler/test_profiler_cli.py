"""dcut-profile end to end (CPU and analytic modes), bad input, and the --gpu guard."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from dcut_sched import CostCurve
from dcut_sched.cli.profile import main
from dcut_sched.profiler.grid import build_cells

SHIPPED = Path(__file__).resolve().parents[2] / "dcut_sched" / "profiler" / "profiles" / "h20-qwen3-8b-published.json"


def test_cpu_tiny_default_command(tmp_path, capsys):
    out = tmp_path / "X.json"
    assert main(["--cpu", "--model", "tiny", "--out", str(out), "--no-progress", "--quiet"]) == 0
    curve = CostCurve.load(out)
    assert curve.hardware["backend"] == "cpu-eager" and curve.hardware["threads"] == 1
    assert curve.model["name"] == "tiny" and curve.model["draft"] == "dflash:1"
    cells = build_cells([1, 2, 4, 8], 16, grid_step=16)
    assert len(curve.verify) + len(curve.ar) + len(curve.draft) == len(cells)
    assert all(r.provenance == "measured" and r.repeats == 5 and r.p20_ms <= r.median_ms <= r.p80_ms
               for r in [*curve.verify, *curve.ar])
    # the plain decode step is its own measured family, one row per batch size
    assert curve.ar_batch_sizes == [1, 2, 4, 8] and curve.ar_provenance == "measured"
    assert json.loads(out.read_text())["schema"] == "dcut.cost-curve/2"
    load = curve.hardware["load_average"]
    assert load["cpu_count"] >= 1 and load["end_1min"] >= 0 and load["start_1min"] >= 0
    from dcut_sched.cli.profile_run import _load_warnings, _monotone_warnings, _spread_warnings

    expected = (_load_warnings(load, load["cpu_count"], 1, curve.profile_seconds) + _spread_warnings(curve)
                + _monotone_warnings(curve))
    assert curve.hardware.get("warnings", []) == expected  # what was warned is kept in the file
    assert not (tmp_path / "X.json.partial").exists()
    text = capsys.readouterr().out
    assert "wrote" in text and "4 ar" in text and "p20-p80 spread median" in text and "plain step: measured" in text


def test_cpu_small_grid_self_skip_and_report(tmp_path, capsys):
    out, report = tmp_path / "c.json", tmp_path / "interp.csv"
    argv = ["--cpu", "--model", "tiny", "--batch-sizes", "1,2", "--block-size", "4", "--context-len", "8",
            "--grid-step", "1", "--draft", "self-skip:1,2", "--warmups", "0", "--repeats", "2",
            "--out", str(out), "--report", str(report), "--no-progress"]
    assert main(argv) == 0
    curve = CostCurve.load(out)
    assert curve.token_counts(1) == [1, 2, 3, 4] and curve.token_counts(2) == [2, 3, 4, 5, 6, 7, 8]
    assert curve.model["draft"] == "self-skip:1,2" and curve.has_draft()
    frame = pd.read_csv(report)
    assert frame["batch_size"].tolist() == [2] and frame.loc[0, "dense_points"] == 3  # 3, 5, 7 between 2,4,6,8
    text = capsys.readouterr().out
    assert "coarse grid" in text and "at each rho" in text


def test_analytic_h200(tmp_path):
    out = tmp_path / "Y.json"
    assert main(["--analytic", "--device", "h200", "--model", "qwen3-8b", "--out", str(out), "--quiet"]) == 0
    curve = CostCurve.load(out)
    assert curve.hardware["backend"] == "analytic" and curve.hardware["device_name"] == "NVIDIA H200"
    assert curve.hardware["peak_bf16_tflops"] == 989.0 and {r.provenance for r in curve.verify} == {"analytic"}
    assert curve.batch_sizes == [1, 2, 4, 8, 16, 32, 64] and curve.token_counts(64)[:3] == [64, 80, 96]
    assert curve.ar_ms(1) < curve.verify_ms(64, 1024) and curve.draft_ms(64) > curve.draft_ms(1)
    moe = tmp_path / "moe.json"
    assert main(["--analytic", "--device", "h20", "--model", "qwen3.5-35b-a3b", "--grid-step", "0",
                 "--out", str(moe), "--quiet"]) == 0
    assert CostCurve.load(moe).model["config"]["num_experts"] == 256


def test_analytic_fit_fills_gaps(tmp_path, capsys):
    out = tmp_path / "fit.json"
    assert main(["--analytic", "--device", "h20", "--model", "qwen3-8b", "--fit", str(SHIPPED), "--batch-sizes",
                 "4,12,64", "--grid-step", "64", "--out", str(out)]) == 0
    curve = CostCurve.load(out, check_hardware=False)
    src = CostCurve.load(SHIPPED, check_hardware=False)
    rows = {(r.batch_size, r.num_tokens): r for r in curve.verify}
    for r in src.verify:  # every source row kept as it was
        assert rows[(r.batch_size, r.num_tokens)] == r
    assert rows[(12, 12)].provenance == "fitted" and rows[(64, 128)].provenance == "fitted"
    ar = {r.batch_size: r for r in curve.ar}
    assert ar[12].provenance == "fitted" and ar[64] == {r.batch_size: r for r in src.ar}[64]
    text = capsys.readouterr().out
    assert "efficiency fit" in text and "verify: 20 rows" in text and "ar: 5 rows" in text


def test_analytic_fit_derives_b8_or_refuses_larger(tmp_path, capsys):
    out = tmp_path / "b8.json"
    assert main(["--analytic", "--device", "h20", "--fit", str(SHIPPED), "--block-size", "8", "--out", str(out),
                 "--quiet"]) == 0
    curve = CostCurve.load(out, check_hardware=False)
    assert curve.block_size == 8 and all(r.num_tokens <= 8 * r.batch_size for r in curve.verify)
    assert curve.token_range(64) == (64, 512) and curve.has_draft() and curve.ar_ms(64) == pytest.approx(17.8055, abs=1e-4)
    b16 = CostCurve.load(SHIPPED, check_hardware=False)
    assert curve.draft_ms(64) < b16.draft_ms(64)  # a block of 8 slots drafts cheaper than one of 16
    assert main(["--analytic", "--device", "h20", "--fit", str(SHIPPED), "--block-size", "32", "--out",
                 str(tmp_path / "b32.json")]) == 2
    err = capsys.readouterr().err
    assert "--block-size 32" in err and "measured for block size 16" in err and not (tmp_path / "b32.json").exists()


def test_analytic_models_the_decode_path_on_its_own(tmp_path):
    from dcut_sched.profiler.analytic import DEFAULT_AR_EFFICIENCY, ar_step_ms
    from dcut_sched.profiler.devices import get_device
    from dcut_sched.profiler.shapes import resolve_model

    out = tmp_path / "a.json"
    assert main(["--analytic", "--device", "h20", "--grid-step", "0", "--out", str(out), "--quiet"]) == 0
    curve = CostCurve.load(out)
    shape, _ = resolve_model("qwen3-8b")
    for row in curve.ar:
        assert row.provenance == "analytic"
        assert row.median_ms == pytest.approx(float(ar_step_ms(shape, get_device("h20"), DEFAULT_AR_EFFICIENCY,
                                                               row.batch_size, 1024)), abs=1e-4)
    assert curve.ar_ms(64) < curve.verify_ms(64, 64)  # the decode path's own factors, not the verify cell


@pytest.mark.parametrize("argv, message", [
    (["--analytic", "--device", "h200", "--fit", str(SHIPPED)], "measured on 'NVIDIA H20', not 'NVIDIA H200'"),
    (["--analytic", "--model", "qwen3-8b"], "--analytic needs --device"),
    (["--analytic", "--device", "tpu"], "unknown device 'tpu'"),
    (["--cpu", "--model", "qwen9"], "not a preset"),
    (["--cpu", "--model", "qwen3.5-35b-a3b"], "is MoE"),
    (["--cpu", "--model", "tiny", "--draft", "self-skip:14,15"], "out of range for tiny"),
    (["--cpu", "--draft", "eagle"], "draft spec 'eagle'"),
    (["--cpu", "--device", "h20"], "--device has no effect on a --cpu profile"),
    (["--gpu", "--fit", "x.json"], "--fit has no effect on a --gpu profile"),
    (["--analytic", "--device", "h20", "--fit", "/nonexistent.json"], "--fit /nonexistent.json: no such file"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    assert main([*argv, "--out", str(tmp_path / "o.json"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dcut-profile: error: ") and message in err and err.count("\n") == 1
    assert "Traceback" not in err and not (tmp_path / "o.json").exists()


def test_existing_partial_needs_resume(tmp_path, capsys):
    (tmp_path / "o.json.partial").write_text(json.dumps({"schema": "dcut.profile-partial/1"}))
    assert main(["--cpu", "--out", str(tmp_path / "o.json"), "--no-progress"]) == 2
    assert "add --resume" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_gpu_without_cuda(tmp_path, capsys):
    assert main(["--gpu", "--model", "tiny", "--out", str(tmp_path / "g.json")]) == 2
    assert "--gpu needs a CUDA device" in capsys.readouterr().err


def test_load_and_spread_warnings_by_hand():
    from dcut_sched.cli.profile_run import _load_warnings, _spread_warnings

    quiet = {"start_1min": 0.9, "end_1min": 1.1, "end_5min": 1.0}
    assert _load_warnings(quiet, cpu_count=2, threads=1) == []
    busy = {"start_1min": 0.5, "end_1min": 7.5, "end_5min": 6.0}
    (msg,) = _load_warnings(busy, cpu_count=2, threads=1)
    assert "load average reached 7.5 on 2 cores" in msg and "inflated" in msg
    before = {"start_1min": 1.5, "end_1min": 1.8, "end_5min": 6.0}  # a busy time before a short profile
    assert _load_warnings(before, cpu_count=2, threads=1, seconds=100) == []
    assert "reached 6 on 2 cores" in _load_warnings(before, cpu_count=2, threads=1, seconds=400)[0]

    def curve(p20, p80):
        return CostCurve(hardware={"backend": "cpu-eager"}, model={"name": "t"}, block_size=2, context_len=0,
                         verify=[{"batch_size": 1, "num_tokens": k, "median_ms": 10.0, "p20_ms": p20, "p80_ms": p80}
                                 for k in (1, 2)],
                         ar=[{"batch_size": 1, "median_ms": 10.0, "p20_ms": 9.9, "p80_ms": 10.1}])

    assert _spread_warnings(curve(9.8, 10.2)) == []  # 4 % spread
    (msg,) = _spread_warnings(curve(8.0, 12.0))  # 40 % on both verify cells, median over the 3 cells 40 %
    assert "median 40.0%, max 40.0%" in msg and "verify:1:1" in msg

    from dcut_sched.cli.profile_run import _monotone_warnings

    c = CostCurve(hardware={"backend": "cpu-eager"}, model={"name": "t"}, block_size=1, context_len=0,
                  verify=[{"batch_size": b, "num_tokens": b, "median_ms": 1.0} for b in (4, 8)],
                  ar=[{"batch_size": 4, "median_ms": 11.9}, {"batch_size": 8, "median_ms": 9.9}])
    assert _monotone_warnings(c) == ["ar step not monotone in batch size (bs 4 11.9 ms > bs 8 9.9 ms): noise, load "
                                     "drift or a real shape effect (matmul blocking at some batch sizes); the lookup "
                                     "interpolates these medians as they are"]
