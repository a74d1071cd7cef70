"""Which CLI error lines no test reaches (coverage.py), for the command-line modules (``dcut_sched/cli/``,
the profiler's CLI among them) and the vLLM plugin's config.

    python analysis/cli_error_coverage.py              # run the CLI-facing tests under coverage, then report
    python analysis/cli_error_coverage.py --report-only  # report from the saved .coverage data

An *error line* is a ``raise`` statement or a call of something named ``*error`` (``p.error(...)``,
``UsageError(...)``) in the files of ``MODULES``. The script runs ``TESTS`` (the fast tests that drive
the CLIs, the broken-input corpus and the config checks; subprocesses included through coverage's
``patch = subprocess``) and lists each error line that was never executed, with its source. The list
should be empty: every bad input a CLI names has a test that feeds it. Writes
``analysis/results/cli_error_coverage.json``; exit 1 when the list is not empty.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "analysis" / "results" / "cli_error_coverage.json"
DATA = ROOT / ".coverage-cli"

#: The files whose error lines must all be reached.
MODULES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "dcut_sched" / "cli").glob("*.py")) + [
    "dcut_sched/integrations/vllm/config.py",
]
#: The tests that drive them (fast; no real-model or vLLM-environment test).
TESTS = ["tests/reliability", "tests/sim", "tests/traces", "tests/profiler", "tests/engine/test_cli_engine.py",
         "tests/drafters", "tests/integrations/test_vllm_config.py", "tests/test_cost_curve.py"]


def error_lines(path: Path) -> dict[int, str]:
    """``{line: source}`` of the error lines of one file (module docstring)."""
    source = path.read_text()
    lines = source.splitlines()
    found: dict[int, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise):
            found[node.lineno] = lines[node.lineno - 1].strip()
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name.lower().endswith("error"):
                found[node.lineno] = lines[node.lineno - 1].strip()
    return found


def run_tests(extra: list[str]) -> int:
    """The tests under coverage (parallel data files, combined afterwards); returns pytest's status."""
    for old in ROOT.glob(".coverage-cli*"):
        old.unlink()
    rc = ROOT / ".coveragerc-cli"
    rc.write_text("[run]\nbranch = false\nparallel = true\npatch = subprocess\n"
                  f"data_file = {DATA}\nsource = dcut_sched\n")
    try:
        env = dict(os.environ, COVERAGE_RCFILE=str(rc))
        status = subprocess.run([sys.executable, "-m", "coverage", "run", "-m", "pytest", "-q",
                                 "-m", "not slow", *TESTS, *extra], cwd=ROOT, env=env).returncode
        subprocess.run([sys.executable, "-m", "coverage", "combine", "-q"], cwd=ROOT, env=env, check=True)
    finally:
        rc.unlink()
    return status


def missing_error_lines() -> list[dict]:
    import coverage

    cov = coverage.Coverage(data_file=str(DATA))
    cov.load()
    data = cov.get_data()
    out = []
    for rel in MODULES:
        path = ROOT / rel
        executed = set(data.lines(str(path)) or ())
        for line, text in sorted(error_lines(path).items()):
            if line not in executed:
                out.append({"file": rel, "line": line, "source": text})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report-only", action="store_true", help="report from the saved coverage data")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    load = os.getloadavg()
    status = None if args.report_only else run_tests(args.pytest_args)
    missing = missing_error_lines()
    total = sum(len(error_lines(ROOT / m)) for m in MODULES)
    result = {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": round(load[0], 2),
              "modules": MODULES, "tests": TESTS, "pytest_status": status, "error_lines": total,
              "missing": missing}
    from dcut_sched.util.atomic import atomic_write_text

    atomic_write_text(RESULT, json.dumps(result, indent=2) + "\n")
    for m in missing:
        print(f"{m['file']}:{m['line']}: {m['source']}")
    print(f"{len(missing)} of {total} error lines not reached by a test ({RESULT.relative_to(ROOT)})")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
