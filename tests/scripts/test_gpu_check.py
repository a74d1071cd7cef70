"""scripts/gpu_check.sh: the CPU dry run end to end, the step guard, usage errors, the summary rules."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=REPO)


def _checks(summary: dict, step: str) -> list[dict]:
    return next(s for s in summary["steps"] if s["step"] == step)["checks"]


def _status(summary: dict, step: str, prefix: str) -> list[str]:
    return [c["status"] for c in _checks(summary, step) if c["name"].startswith(prefix)]


@pytest.mark.slow
def test_dry_run_every_step(tmp_path):
    """The whole dry run on a rehearsed bare image (no simpy, rich, pyarrow): every step runs, every
    check that can run on a CPU passes, the CUDA-only ones are skipped with a reason."""
    out = tmp_path / "check"
    proc = _run("--dry-run", "--hide-packages", "simpy,rich,pyarrow", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema"] == "dcut.gpu-check/1" and summary["mode"] == "dry-run" and summary["verdict"] == "PASS"
    assert [s["step"] for s in summary["steps"]] == ["env", "pytest", "profile-buckets", "profile-curve", "bank",
                                                     "controller"]
    by_step = {s["step"]: s for s in summary["steps"]}
    assert {k: s["status"] for k, s in by_step.items()} == {
        "env": "pass", "pytest": "skipped", "profile-buckets": "pass", "profile-curve": "pass", "bank": "pass",
        "controller": "pass"}
    assert summary["counts"]["fail"] == summary["counts"]["error"] == 0
    # every skipped check says why
    assert all(c["detail"] for s in summary["steps"] for c in s["checks"] if c["status"] == "skipped")
    # the packages were really missing, and the profiler ran on pip's copy of rich
    assert by_step["env"]["figures"]["packages"]["simpy"] is None
    assert any("pip's vendored copy" in n for n in by_step["profile-curve"]["notes"])
    # pytest collected the cuda-marked tests, which skip themselves without CUDA
    assert by_step["pytest"]["figures"]["tests"] >= 2 and by_step["pytest"]["figures"]["failures"] == 0
    # profile: v2 curves with ar and draft rows at every batch size, the fingerprint, both goals reported
    for name in ("dcut-profile exits 0", "cost-curve schema v2", "ar rows", "draft rows", "every verify cell",
                 "hardware fingerprint", "backend cpu-eager"):
        assert _status(summary, "profile-curve", name) == ["pass"], name
        assert _status(summary, "profile-buckets", name) == ["pass"], name
    assert _status(summary, "profile-buckets", "profile time") == ["skipped"]
    assert _status(summary, "profile-curve", "interpolation error") == ["skipped", "skipped"]
    interp = by_step["profile-curve"]["figures"]["interpolation_error"]
    assert set(interp) == {"2", "4"} and all(v["dense_points"] > 0 for v in interp.values())
    from dcut_sched import CostCurve

    curve = CostCurve.load(out / "curves" / "cpu-tiny-b16.json", check_hardware=False)
    assert curve.batch_sizes == [1, 2, 4] and sorted(r.batch_size for r in curve.ar) == [1, 2, 4]
    assert curve.hardware["backend"] == "cpu-eager" and curve.block_size == 16
    # bank: 8 request shapes (exact, token-padded, batch-padded, rows longer than the first cell) equal the eager
    # forward; context intact; refusal
    replay = _status(summary, "bank", "")
    assert replay.count("pass") == 10 and "fail" not in replay
    assert _status(summary, "bank", "bank captured CUDA graphs") == ["skipped"]
    # controller: 2 policies x 3 batch sizes, plans equal, syncs skipped, a time each
    assert _status(summary, "controller", "dcut bs 64: CPU-tensor plans equal") == ["pass"]
    assert sum(c["status"] == "pass" for c in _checks(summary, "controller")) == 6
    assert sum(c["status"] == "info" for c in _checks(summary, "controller")) == 6
    md = (out / "summary.md").read_text()
    assert md.startswith("# GPU check: PASS (dry-run") and "| step | check | value | goal | status |" in md


def test_a_step_past_its_limit_is_recorded_and_the_run_goes_on(tmp_path):
    out = tmp_path / "check"
    proc = _run("--dry-run", "--only", "env,bank", "--time-limit", "bank=0.5", str(out), timeout=120)
    assert proc.returncode == 1
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert steps["env"]["status"] == "pass" and steps["bank"]["status"] == "error"
    assert steps["bank"]["timed_out"] and steps["controller"]["status"] == "skipped"
    err = steps["bank"]["checks"][-1]
    assert err["name"] == "step finished within its 0.5 s limit"
    assert "--only bank --time-limit bank=SECONDS" in err["hint"]
    md = (out / "summary.md").read_text()
    assert md.startswith("# GPU check: FAIL") and "## What failed" in md and "logs/bank.log" in md


def test_usage_errors_exit_2(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text("{}")
    proc = _run("--dry-run", str(tmp_path / "old"), timeout=60)
    assert proc.returncode == 2 and "holds summary.json of an earlier run" in proc.stderr
    proc = _run("--dry-run", "--only", "nope", str(tmp_path / "new"), timeout=60)
    assert proc.returncode == 2 and "unknown steps ['nope']" in proc.stderr
    proc = _run("--dry-run", "--time-limit", "bank", str(tmp_path / "new"), timeout=60)
    assert proc.returncode == 2 and "expected STEP=SECONDS" in proc.stderr


def _summary_module():
    spec = importlib.util.spec_from_file_location("gpu_check_summary", REPO / "scripts" / "gpu_check" / "summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _doc(*statuses, skipped=None):
    return {"checks": [{"status": s, "kind": k} for s, k in statuses], "skipped": skipped}


def test_step_status_and_verdict_rules():
    m = _summary_module()
    assert m.step_status(_doc(("pass", "check"), ("error", "check"), ("fail", "check"))) == "error"
    assert m.step_status(_doc(("pass", "check"), ("fail", "check"), ("fail", "goal"))) == "fail"
    assert m.step_status(_doc(("pass", "check"), ("fail", "goal"))) == "goal missed"
    assert m.step_status(_doc(("pass", "check"), ("skipped", "check"))) == "pass"
    assert m.step_status(_doc(("info", "figure"))) == "pass"
    assert m.step_status(_doc(("skipped", "check"))) == "skipped"
    assert m.step_status(_doc(skipped="needs pytest")) == "skipped"
    steps = [{"status": "pass"}, {"status": "goal missed"}, {"status": "skipped"}]
    assert m.verdict(steps) == "PASS"
    assert m.verdict(steps + [{"status": "fail"}]) == "FAIL"
    counted = m.counts([{"checks": [{"status": "fail", "kind": "goal"}, {"status": "pass", "kind": "check"},
                                    {"status": "info", "kind": "figure"}]}])
    assert counted == {"pass": 1, "fail": 0, "error": 0, "skipped": 0, "info": 1, "goal_missed": 1}
