"""The project as a package: a wheel built from this tree, installed (``--no-deps``) into a fresh venv
over this environment's packages, runs the main job and the profiler's help from a folder that is not
a checkout. The shipped curves, traces and prompt set must travel in the wheel (issue: a real package).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("build", reason="the wheel test needs the 'build' package (the dev extra)")
    out = tmp_path_factory.mktemp("dist")
    # a copy of what the wheel is built from, so the build leaves nothing (build/, egg-info) in the tree
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(ROOT / "dcut_sched", src / "dcut_sched", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    # no isolation: the build backend (setuptools) comes from this environment, so no index is needed
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, src], cwd=src)
    (path,) = out.glob("dcut_sched-*.whl")
    return path


def test_wheel_holds_the_shipped_inputs_and_no_local_artifacts(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("dcut_sched/profiler/profiles/h20-qwen3-8b-published.json",
                 "dcut_sched/profiler/profiles/cpu-smollm2-135m-b8.json",
                 "dcut_sched/data/traces/prompts.jsonl",
                 "dcut_sched/data/traces/prompts-unlike.jsonl",
                 *(f"dcut_sched/data/traces/dflash-qwen3-8b-{b}-b16.parquet"
                   for b in ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench"))):
        assert data in names, data
    assert "dcut_sched/cli/profile.py" in names
    assert not [n for n in names if n.startswith(("drafters/", "tests/", "dcut_profiler"))]
    assert not [n for n in names if n.endswith(".safetensors")]


def test_installed_wheel_runs_the_main_job_outside_a_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv])
    _run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-deps",
          "--no-index", wheel])
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DCUT_VLLM_VENV", "DCUT_VLLM_MODELS")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    where = _run([venv / "bin" / "python", "-c",
                  "import dcut_sched, dcut_sched.paths as p; print(dcut_sched.__file__); print(p.checkout_root())"],
                 cwd=work, env=env).stdout.split("\n")
    assert where[0].startswith(str(venv)), where  # the wheel's copy, not this checkout
    assert where[1] == "None"
    sim = _run([venv / "bin" / "dcut-sim", "--quiet", "--jobs", "1", "--out", work / "rows.csv"], cwd=work, env=env)
    assert "125 rows" in sim.stderr
    import pandas as pd

    rows = pd.read_csv(work / "rows.csv")  # one row per (benchmark, policy, batch size)
    assert len(rows) == 5 * 5 * 5
    assert sorted(rows["policy"].unique()) == ["ar", "dcut", "fine", "full", "oracle"]
    assert rows["trace"].map(lambda t: Path(t).parent.name).unique().tolist() == ["traces"]
    assert all(str(venv) in t for t in rows["trace"])  # read from the installed package data
    prof = _run([venv / "bin" / "dcut-profile", "--help"], cwd=work, env=env)
    assert "dcut-profile" in prof.stdout
    assert sorted(p.name for p in work.iterdir()) == ["rows.csv"]
