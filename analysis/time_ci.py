"""Time what CI does, on a fresh clone in a fresh virtual environment, and write the figures docs/benchmarks.md quotes.

    python analysis/time_ci.py                 # clone HEAD of this checkout into a temp folder and time it
    python analysis/time_ci.py --keep DIR      # the same, keeping the clone and its venv in DIR

The steps are ``.ci/run``'s, in its order, plus the README's main job after the install (the
README's first command is the install followed by ``dcut-sim``):

1. ``DCUT_WITH_VLLM=1 bash scripts/install.sh`` (everything from the project's own files, the vLLM
   environment included);
2. ``dcut-sim`` (the main job on the shipped defaults, from the installed package);
3. ``python3 -m ruff check .``;
4. ``python3 -m pytest`` with ``CI=true`` (as CI), plus ``--durations`` through ``PYTEST_ADDOPTS``
   for the per-file times.

Each step's wall time, the 1-minute load before and after, and pytest's counts go to
``analysis/results/ci_run.json``; docs/benchmarks.md's ``ci-time`` and ``test-suite`` blocks and
docs/vllm.md's ``vllm-test-time`` block are regenerated from it. Nothing else may run on the machine
meanwhile: the figures are only worth the quiet they were measured in.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "analysis" / "results" / "ci_run.json"


def _step(name: str, cmd: list[str], cwd: Path, env: dict[str, str], log) -> dict:
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    log.write(f"\n=== {name}: {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log.write(proc.stdout)
    log.flush()
    wall = time.perf_counter() - t0
    print(f"time_ci: {name}: exit {proc.returncode} in {wall:.0f} s", file=sys.stderr, flush=True)
    return {"name": name, "command": " ".join(cmd), "returncode": proc.returncode, "wall_s": round(wall, 1),
            "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2), "output": proc.stdout}


def run(work: Path) -> dict:
    clone, venv = work / "clone", work / "venv"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DCUT_VLLM_VENV", "DCUT_VLLM_MODELS", "DCUT_DRAFTERS")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               PIP_DISABLE_PIP_VERSION_CHECK="1", XDG_CACHE_HOME=str(work / "cache"))
    steps = []
    with open(work / "ci.log", "w") as log:
        steps.append(_step("install", ["bash", "scripts/install.sh"], clone, {**env, "DCUT_WITH_VLLM": "1"}, log))
        if steps[-1]["returncode"] == 0:
            steps.append(_step("main job", ["dcut-sim"], clone, env, log))
            steps.append(_step("lint", ["python3", "-m", "ruff", "check", "."], clone, env, log))
            steps.append(_step("tests", ["python3", "-m", "pytest"], clone,
                               {**env, "CI": "true", "PYTEST_ADDOPTS": "--durations=0 --durations-min=0.5 -rfE"},
                               log))
    return {"commit": head, "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu_count": os.cpu_count(), "steps": steps}


def suite_figures(r: dict) -> dict | None:
    """The tests step as :mod:`measure_suite`'s result dict (its README and docs lines)."""
    from measure_suite import parse_output

    tests = next((s for s in r["steps"] if s["name"] == "tests"), None)
    if tests is None:
        return None
    fig = parse_output(tests["output"])
    fig.update(returncode=tests["returncode"], wall_s=tests["wall_s"], cpu_s=None, cpu_count=r["cpu_count"],
               load_before=[tests["load_before"]], load_after=[tests["load_after"]], ci=True,
               measured_at=r["measured_at"], burners=0, source=f"analysis/time_ci.py (fresh clone of {r['commit']})")
    return fig


def ci_block(r: dict) -> str:
    parts = "; ".join(f"{s['name']} {s['wall_s'] / 60:.1f} min" + ("" if s["returncode"] == 0 else " (FAILED)")
                      for s in r["steps"])
    total = sum(s["wall_s"] for s in r["steps"])
    ok = all(s["returncode"] == 0 for s in r["steps"])
    return (f"- CI (`.ci/run`, plus the README's `dcut-sim`) on a fresh clone of {r['commit']} in a fresh venv: "
            f"**{total / 60:.1f} min** in all ({parts}){'' if ok else ', NOT PASSING'}, on {r['cpu_count']} cores, "
            f"1-min load {r['steps'][0]['load_before']} at the start ({r['measured_at']}; "
            f"`python analysis/time_ci.py` regenerates this line).")


def write_blocks(r: dict) -> None:
    """The ``ci-time`` line, then the suite's lines as :func:`measure_suite.write_readme` writes them."""
    from measure_suite import write_readme
    from readme_blocks import replace_block

    replace_block("ci-time", ci_block(r))
    fig = suite_figures(r)
    if fig is not None:
        write_readme(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", metavar="DIR", help="work in DIR (kept) instead of a temporary folder")
    ap.add_argument("--readme-only", action="store_true", help="regenerate the blocks from the saved result")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "analysis"))
    if args.readme_only:
        r = json.loads(RESULT.read_text())
    else:
        work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dcut-ci-"))
        work.mkdir(parents=True, exist_ok=True)
        try:
            r = run(work)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        for s in r["steps"]:  # keep the tail of each step's output, not megabytes of it
            s["output"] = s["output"][-6000:] if s["name"] != "tests" else s["output"]
        from dcut_sched.util.atomic import atomic_write_text

        atomic_write_text(RESULT, json.dumps(r, indent=1) + "\n")
    write_blocks(r)
    print(ci_block(r))
    return 0 if all(s["returncode"] == 0 for s in r["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
