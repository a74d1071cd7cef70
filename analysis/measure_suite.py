"""Measure the test suite and write the figure docs/benchmarks.md quotes (a generated block, never hand-edited).

    python analysis/measure_suite.py            # runs `python -m pytest`, then rewrites the docs/benchmarks.md block
    python analysis/measure_suite.py --burn 2   # the same with a CPU-spinning process per core beside it
                                                # (its own result file and line: the suite under load)

Records the wall time, the CPU time of pytest and its children, the 1-minute load average before
and after, the counts pytest printed, and the slowest tests (``--durations``) into
``analysis/results/test_suite.json``; the docs/benchmarks.md block between ``<!-- generated:test-suite -->``
markers is regenerated from that file (``--readme-only`` rewrites it without running the suite), and
so is docs/vllm.md's ``vllm-test-time`` block (the vLLM test files' seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "analysis" / "results" / "test_suite.json"
RESULT_LOADED = ROOT / "analysis" / "results" / "test_suite_loaded.json"


def _burner() -> None:
    """Spin one core until killed (the --burn load)."""
    while True:
        pass


def run_suite(extra: list[str], burn: int = 0) -> dict:
    """Run the suite (with ``burn`` CPU-spinning processes for its whole duration) and return the figures."""
    import multiprocessing

    burners = [multiprocessing.Process(target=_burner, daemon=True) for _ in range(burn)]
    for b in burners:
        b.start()
    try:
        r = _run_suite(extra)
    finally:
        for b in burners:
            b.kill()
    r["burners"] = burn
    return r


def _run_suite(extra: list[str]) -> dict:
    load0 = os.getloadavg()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--durations=0", "--durations-min=0.5", "-rfE", *extra],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = proc.stdout + proc.stderr
    return {"returncode": proc.returncode, "wall_s": round(wall, 1),
            "cpu_s": round((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime), 1),
            "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in os.getloadavg()],
            "cpu_count": os.cpu_count(), "ci": bool(os.environ.get("CI")),
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **parse_output(out)}


def parse_output(out: str) -> dict:
    """pytest's output (with ``--durations`` and ``-rfE``) -> counts, slowest phases, seconds per file,
    failed tests and the summary line."""
    lines = out.strip().splitlines() or [""]
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line)), lines[-1])
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    slow = []
    for line in lines:
        m = re.match(r"\s*([\d.]+)s (call|setup|teardown)\s+(\S+)", line)
        if m:
            slow.append({"seconds": float(m.group(1)), "phase": m.group(2), "test": m.group(3)})
    per_file: dict[str, float] = {}
    for s in slow:
        name = s["test"].split("::")[0]
        per_file[name] = round(per_file.get(name, 0.0) + s["seconds"], 1)
    slow.sort(key=lambda s: -s["seconds"])
    return {"counts": counts, "slowest": slow[:12],
            "seconds_by_file": dict(sorted(per_file.items(), key=lambda kv: -kv[1])),
            "failed_tests": [line.split()[1] for line in lines if line.startswith(("FAILED ", "ERROR "))],
            "last_line": summary}


def _command(r: dict) -> str:
    """The command that regenerates a result (this script, with --burn, or a fresh-clone CI timing)."""
    if r.get("source"):
        return "python analysis/time_ci.py"
    return "python analysis/measure_suite.py" + (f" --burn {r['burners']}" if r.get("burners") else "")


def readme_block(r: dict) -> str:
    c = r["counts"]
    slow = ", ".join(f"`{s['test'].split('::')[0].removeprefix('tests/')}` {s['seconds']:.0f} s" for s in r["slowest"][:5])
    burn = (f" with {r['burners']} CPU-spinning processes beside it for the whole run"
            if r.get("burners") else "")
    command = _command(r)
    failed = f" Failed: {', '.join(f'`{t}`' for t in r['failed_tests'])}." if r.get("failed_tests") else ""
    cpu = f", {r['cpu_s'] / 60:.1f} min CPU" if r.get("cpu_s") is not None else ""
    where = f" in {r['source']}" if r.get("source") else ""
    return (f"- Tests: `python -m pytest`{where}: {r['wall_s'] / 60:.1f} min wall{cpu} "
            f"({c.get('passed', 0)} passed, {c.get('skipped', 0)} skipped, {c.get('failed', 0)} failed) on "
            f"{r['cpu_count']} cores{burn}, 1-min load {r['load_before'][0]} before and {r['load_after'][0]} after "
            f"({r['measured_at']}; `{command}` regenerates this line).{failed} The slowest "
            f"(marked `slow`: the real-model and real-vLLM tests): {slow}.")


def vllm_block(r: dict) -> str:
    """docs/vllm.md's line on the vLLM tests' share of the suite (test files ``tests/integrations/test_vllm_*``)."""
    files = {f: sec for f, sec in r.get("seconds_by_file", {}).items() if "/test_vllm_" in f}
    total = sum(files.values())
    parts = ", ".join(f"`{f.removeprefix('tests/integrations/')}` {sec:.0f} s" for f, sec in files.items())
    return (f"The vLLM tests took {total / 60:.1f} min of the suite's {r['wall_s'] / 60:.1f} min wall ({parts}; "
            f"every test phase over 0.5 s summed per file), 1-min load {r['load_before'][0]} before the suite and "
            f"{r['load_after'][0]} after ({r['measured_at']}; `{_command(r)}` regenerates this "
            f"line).")


def write_readme(r: dict) -> None:
    """Regenerate the blocks: a quiet run owns ``test-suite`` and the vLLM line, a ``--burn`` run owns
    ``test-suite-loaded`` (the suite passing under load)."""
    from readme_blocks import replace_block

    if r.get("burners"):
        replace_block("test-suite-loaded", readme_block(r))
        return
    replace_block("test-suite", readme_block(r))
    if r.get("seconds_by_file"):
        replace_block("vllm-test-time", vllm_block(r), ROOT / "docs" / "vllm.md")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme-only", action="store_true", help="rewrite the docs/benchmarks.md block from the saved result")
    ap.add_argument("--burn", type=int, default=0, metavar="N",
                    help="run N CPU-spinning processes for the whole suite (the suite must pass under load)")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "analysis"))
    result = RESULT_LOADED if args.burn else RESULT
    if args.readme_only:
        r = json.loads(result.read_text())
    else:
        r = run_suite(args.pytest_args, args.burn)
        from dcut_sched.util.atomic import atomic_write_text

        result.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(result, json.dumps(r, indent=2) + "\n")
        print(json.dumps(r, indent=2))
    write_readme(r)
    return 0 if r["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
