"""One run of every GPU check, each step in its own process with its own time limit.

Usage (from the repository root; ``scripts/gpu_check.sh`` sets PYTHONPATH and calls this)::

    scripts/gpu_check.sh OUT                 # on a CUDA machine: the real checks (<= 6 minutes)
    scripts/gpu_check.sh --dry-run OUT       # on any CPU: every step with a tiny model, CUDA parts skipped
    scripts/gpu_check.sh --only bank,controller --time-limit bank=120 OUT

Steps: env, pytest, profile-buckets, profile-curve, bank, controller (docs/profiler.md, "The GPU
check"). Each writes ``OUT/steps/STEP.json`` as it goes and logs to ``OUT/logs/STEP.log``; a step that
crashes, fails or runs past its limit is recorded and the next one starts. The run ends with
``OUT/summary.json`` and ``OUT/summary.md`` (also printed). Exit status: 0 when nothing failed (missed
performance goals are reported, not fatal), 1 when a check failed or a step errored, 2 on bad usage.

Only the standard library and the package's own error type (``dcut_sched.cli.errors``, itself
standard-library only) are imported here, so the orchestration works on any python3 the package
supports; what each step needs is checked by the step itself.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import REPO, StepResult, atomic_write_json, hide_packages  # noqa: E402
from summary import SCHEMA, counts, render_markdown, step_status, verdict  # noqa: E402

from dcut_sched.cli.errors import UsageError  # noqa: E402


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    target: str  # module:function
    gpu_limit_s: float
    dry_limit_s: float


STEPS = (
    Step("env", "environment: GPU, driver, CUDA, torch, packages", "step_env:run_env", 45, 30),
    Step("pytest", "pytest -m cuda (the CUDA-marked tests)", "step_env:run_pytest", 90, 60),
    Step("profile-buckets", "dcut-profile --gpu: AR point + 4 buckets + draft + ar step at bs 4..64 (time goal)",
         "step_profile:run_buckets", 75, 45),
    Step("profile-curve", "dcut-profile --gpu: the curve at bs 1..64 with the dense grid (interpolation goal)",
         "step_profile:run_curve", 150, 45),
    Step("bank", "VerifyGraphBank: capture, replay = eager, padding", "step_bank:run_bank", 60, 45),
    Step("controller", "RatioController on CUDA: plans = CPU plans, one sync per step, plan() time",
         "step_controller:run_controller", 60, 45),
)
TOTAL_LIMIT_S = {"gpu": 345.0, "dry-run": 240.0}
RESERVE_S = 5.0  # kept for the summary
MIN_STEP_S = 5.0


def _limits(values: list[str]) -> dict[str, float]:
    names = {s.name for s in STEPS}
    out = {}
    for text in values:
        name, sep, secs = text.partition("=")
        if not sep or name not in names:
            raise UsageError(f"--time-limit {text!r}: expected STEP=SECONDS with STEP one of {sorted(names)}")
        try:
            out[name] = float(secs)
        except ValueError:
            raise UsageError(f"--time-limit {text!r}: {secs!r} is not a number of seconds") from None
        if out[name] <= 0:
            raise UsageError(f"--time-limit {text!r}: seconds must be > 0")
    return out


def _step_list(text: str | None, flag: str) -> list[str]:
    if not text:
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {s.name for s in STEPS}
    bad = [n for n in names if n not in known]
    if bad:
        raise UsageError(f"{flag} {text!r}: unknown steps {bad}; steps are {[s.name for s in STEPS]}")
    return names


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh",
        description="Every CUDA check of dcut-sched in one run: environment, pytest -m cuda, dcut-profile --gpu "
                    "(Qwen3-8B shape, bf16, B=16), VerifyGraphBank replay, RatioController on CUDA. Writes "
                    "OUT/summary.json, OUT/summary.md, OUT/curves/, OUT/steps/, OUT/logs/.",
        epilog="Examples: scripts/gpu_check.sh /tmp/gpu-check ;  scripts/gpu_check.sh --dry-run /tmp/dry ;  "
               "scripts/gpu_check.sh --only profile-curve --time-limit profile-curve=300 /tmp/curve. "
               "See docs/profiler.md, section 'The GPU check'.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("out", metavar="OUT", help="output folder (created; must not hold an earlier summary.json)")
    ap.add_argument("--dry-run", action="store_true",
                    help="run every step on the CPU with a tiny model; CUDA-only checks are marked skipped")
    ap.add_argument("--only", help="comma-separated steps to run (default: all)")
    ap.add_argument("--skip", help="comma-separated steps not to run")
    ap.add_argument("--time-limit", action="append", default=[], metavar="STEP=SECONDS",
                    help="override one step's time limit (repeatable)")
    ap.add_argument("--total-limit", type=float, help="whole-run limit in seconds [gpu: 345, dry run: 240]")
    ap.add_argument("--hide-packages", default="",
                    help="comma-separated packages the steps must treat as missing (rehearse a bare image, "
                         "e.g. simpy,rich,pyarrow)")
    ap.add_argument("--step", help=argparse.SUPPRESS)
    return ap


# ------------------------------------------------------------------------------------------ one step
def run_step_here(name: str, out: Path, dry_run: bool, hidden: list[str]) -> int:
    """Body of a step process: run the step function, record anything it raises."""
    hide_packages(hidden)
    from settings import settings_for

    step = next(s for s in STEPS if s.name == name)
    res = StepResult(out, step.name, step.title, dry_run)
    try:
        module, func = step.target.split(":")
        getattr(importlib.import_module(module), func)(res, settings_for(dry_run))
    except Exception as exc:  # noqa: BLE001 - recorded in the result; the orchestrator goes on
        res.error(f"{name} step raised", exc)
    res.finish()
    return 0


# ------------------------------------------------------------------------------------------ orchestration
def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _launch(step: Step, out: Path, dry_run: bool, hidden: list[str], limit: float) -> dict:
    log = out / "logs" / f"{step.name}.log"
    cmd = [sys.executable, str(HERE), "--step", step.name, str(out)] + (["--dry-run"] if dry_run else [])
    if hidden:
        cmd += ["--hide-packages", ",".join(hidden)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               PYTHONUNBUFFERED="1")
    if dry_run:
        env.setdefault("OMP_NUM_THREADS", "1")
    print(f"[gpu-check] {step.name}: {step.title} (limit {limit:g} s)", flush=True)
    t0 = time.perf_counter()
    timed_out = False
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, start_new_session=True, errors="replace")

        def pump() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                fh.write(line)
                fh.flush()
                if line.startswith(f"[{step.name}]"):
                    print("  " + line, end="", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                rc = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
        reader.join(timeout=10)
    seconds = time.perf_counter() - t0
    path = out / "steps" / f"{step.name}.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {"step": step.name, "title": step.title, "checks": [], "figures": {}, "notes": [], "artifacts": [],
               "skipped": None, "finished": False}
    rel_log = os.path.relpath(log, out)
    tail = _tail(log) or "(empty: the step printed nothing; it was still importing or building its model)"
    if timed_out:
        partial = sorted(os.path.relpath(p, out) for p in (out / "curves").glob("*.partial"))
        kept = f"; measured cells kept in {', '.join(partial)} (dcut-profile ... --resume continues them)" if partial else ""
        doc["checks"].append({"name": f"step finished within its {limit:g} s limit", "status": "error",
                              "kind": "check", "value": round(seconds, 1), "unit": "s", "goal": None,
                              "detail": f"killed after {seconds:.0f} s{kept}; the last lines of {rel_log}:\n{tail}",
                              "hint": f"rerun it alone with a longer limit: scripts/gpu_check.sh --only {step.name} "
                                      f"--time-limit {step.name}=SECONDS OUT2"})
    elif rc != 0 or not doc.get("finished"):
        doc["checks"].append({"name": "step process ended normally", "status": "error", "kind": "check",
                              "value": rc, "unit": None, "goal": None,
                              "detail": f"exit status {rc}{' (killed by signal %d)' % -rc if rc < 0 else ''}; "
                                        f"the last lines of {rel_log}:\n{tail}",
                              "hint": "a crash outside Python (segfault, CUDA driver abort) or the OOM killer"})
    doc.update({"log": rel_log, "seconds": round(seconds, 2), "limit_s": limit, "exit_status": rc,
                "timed_out": timed_out})
    doc["status"] = step_status(doc)
    atomic_write_json(path, doc)
    print(f"[gpu-check] {step.name}: {doc['status']} in {seconds:.1f} s", flush=True)
    return doc


def _not_run(step: Step, out: Path, reason: str) -> dict:
    doc = {"step": step.name, "title": step.title, "checks": [], "figures": {}, "notes": [], "artifacts": [],
           "skipped": reason, "log": "", "seconds": 0.0, "limit_s": 0.0, "exit_status": None, "timed_out": False,
           "status": "skipped"}
    print(f"[gpu-check] {step.name}: skipped ({reason})", flush=True)
    return doc


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def orchestrate(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        raise UsageError(f"OUT {out} exists and is not a folder; give a new or empty folder")
    if (out / "summary.json").exists():
        raise UsageError(f"OUT {out} holds summary.json of an earlier run; give a new or empty folder")
    only, skip = _step_list(args.only, "--only"), _step_list(args.skip, "--skip")
    limits = _limits(args.time_limit)
    hidden = [p.strip() for p in args.hide_packages.split(",") if p.strip()]
    mode = "dry-run" if args.dry_run else "gpu"
    total = args.total_limit if args.total_limit is not None else TOTAL_LIMIT_S[mode]
    if total <= 0:
        raise UsageError("--total-limit must be > 0")
    for sub in ("logs", "steps", "curves"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    deadline = t0 + total
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    print(f"[gpu-check] {mode} run into {out}; whole-run limit {total:.0f} s", flush=True)
    steps = []
    for step in STEPS:
        if (only and step.name not in only) or step.name in skip:
            steps.append(_not_run(step, out, "not selected (--only/--skip)"))
            continue
        own = limits.get(step.name, step.dry_limit_s if args.dry_run else step.gpu_limit_s)
        left = deadline - time.perf_counter() - RESERVE_S
        if left < MIN_STEP_S:
            steps.append(_not_run(step, out, f"the whole-run limit of {total:.0f} s was reached"))
            continue
        steps.append(_launch(step, out, args.dry_run, hidden, min(own, left)))
    summary = {"schema": SCHEMA, "mode": mode, "created": created, "commit": _commit(), "repo": str(REPO),
               "python": sys.executable, "hidden_packages": hidden, "total_seconds": round(time.perf_counter() - t0, 2),
               "total_limit_s": total, "steps": steps, "counts": counts(steps), "verdict": verdict(steps)}
    atomic_write_json(out / "summary.json", summary)
    md = render_markdown(summary)
    (out / "summary.md").write_text(md, encoding="utf-8")
    print("\n" + md, flush=True)
    print(f"[gpu-check] {summary['verdict']}: {out / 'summary.md'}", flush=True)
    return 0 if summary["verdict"] == "PASS" else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.step:
            hidden = [p.strip() for p in args.hide_packages.split(",") if p.strip()]
            return run_step_here(args.step, Path(args.out).resolve(), args.dry_run, hidden)
        return orchestrate(args)
    except UsageError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
