"""The run's summary: ``summary.json`` (every figure and check) and ``summary.md`` (a short table).

Step status, worst first: ``error`` (the step crashed, timed out or a guarded block raised),
``fail`` (a correctness check failed), ``goal missed`` (only performance goals failed), ``pass``,
``skipped`` (nothing ran: no CUDA, a missing package, the whole-run limit). The verdict is ``FAIL``
when any step has ``error`` or ``fail``, else ``PASS``; missed goals are listed, not fatal.
"""

from __future__ import annotations

import json
from typing import Any

SCHEMA = "dcut.gpu-check/1"


def step_status(doc: dict) -> str:
    checks = doc.get("checks", [])
    statuses = [(c["status"], c.get("kind", "check")) for c in checks]
    if any(s == "error" for s, _ in statuses):
        return "error"
    if any(s == "fail" and k != "goal" for s, k in statuses):
        return "fail"
    if any(s == "fail" for s, _ in statuses):
        return "goal missed"
    if any(s == "pass" for s, _ in statuses) or (any(s == "info" for s, _ in statuses) and not doc.get("skipped")):
        return "pass"
    return "skipped"


def verdict(steps: list[dict]) -> str:
    return "FAIL" if any(s["status"] in ("error", "fail") for s in steps) else "PASS"


def counts(steps: list[dict]) -> dict[str, int]:
    out = {"pass": 0, "fail": 0, "error": 0, "skipped": 0, "info": 0, "goal_missed": 0}
    for s in steps:
        for c in s.get("checks", []):
            key = "goal_missed" if c["status"] == "fail" and c.get("kind") == "goal" else c["status"]
            out[key] = out.get(key, 0) + 1
    return out


def _value(c: dict) -> str:
    v = c.get("value")
    if v is None:
        text = ""
    elif isinstance(v, float):
        text = f"{v:.4g}"
    elif isinstance(v, (dict, list)):
        text = json.dumps(v, separators=(",", ":"))
        text = text if len(text) <= 70 else text[:67] + "..."
    else:
        text = str(v)
    unit = c.get("unit")
    return f"{text} {unit}" if unit and text else text


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _env_line(steps: list[dict]) -> str:
    env = next((s for s in steps if s["step"] == "env"), None)
    if env is None:
        return ""
    f = env.get("figures", {})
    gpu = f.get("gpu") or {}
    smi = (f.get("nvidia_smi") or [{}])[0] if isinstance(f.get("nvidia_smi"), list) else {}
    smi = smi if isinstance(smi, dict) else {}
    parts = [f"GPU {gpu.get('name', 'none')}" + (f" (sm {gpu['capability']}, {gpu['memory_gib']} GiB)" if gpu else ""),
             f"driver {smi.get('driver_version', 'n/a')}", f"torch {f.get('torch', 'n/a')}",
             f"CUDA {f.get('torch_cuda') or 'n/a'}", f"python {f.get('python', 'n/a')}"]
    absent = [k for k, v in (f.get("packages") or {}).items() if v is None]
    if absent:
        parts.append("missing packages: " + ", ".join(absent))
    return "; ".join(parts)


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}"


def _curve_tables(steps: list[dict]) -> list[str]:
    """The measured medians per batch size of each profile step, and the interpolation error."""
    out: list[str] = []
    for s in steps:
        rows = s.get("figures", {}).get("median_ms_by_batch_size")
        if not rows:
            continue
        out += ["", f"**{s['step']}** (`{s['figures'].get('command', '')}`), median ms: profile "
                    f"{_ms(s['figures'].get('profile_seconds'))} s, capture {_ms(s['figures'].get('capture_seconds'))} s, "
                    f"model build {_ms(s['figures'].get('model_build_seconds'))} s", "",
                "| bs | ar step | verify K=bs | rho 0.25 | 0.5 | 0.75 | 1.0 | draft |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for bs, r in rows.items():
            buckets = list(r.get("buckets_ms") or []) + [None] * 4
            out.append(f"| {bs} | {_ms(r.get('ar_ms'))} | {_ms(r.get('verify_at_bs_ms'))} | "
                       + " | ".join(_ms(b) for b in buckets[:4]) + f" | {_ms(r.get('draft_ms'))} |")
        interp = s["figures"].get("interpolation_error")
        if interp:
            out += ["", "| bs | dense cells | lookup median % | lookup max % | numpy.interp median % | max % |",
                    "|---:|---:|---:|---:|---:|---:|"]
            for bs, e in interp.items():
                out.append(f"| {bs} | {e['dense_points']} | {e['curve_median_pct']:.2f} | {e['curve_max_pct']:.2f} | "
                           f"{e['linear_median_pct']:.2f} | {e['linear_max_pct']:.2f} |")
    return out


def render_markdown(summary: dict) -> str:
    steps = summary["steps"]
    lines = [f"# GPU check: {summary['verdict']} ({summary['mode']}, {summary['created']})", ""]
    env = _env_line(steps)
    if env:
        lines += [env + ".", ""]
    c = summary["counts"]
    lines += [f"{c['pass']} passed, {c['fail']} failed, {c['error']} errors, {c['goal_missed']} goals missed, "
              f"{c['skipped']} skipped, {c['info']} figures; {summary['total_seconds']:.0f} s of the "
              f"{summary['total_limit_s']:.0f} s limit.", ""]
    lines += ["| step | check | value | goal | status |", "|---|---|---|---|---|"]
    for s in steps:
        head = f"{s['step']} ({s['status']}, {s['seconds']:.0f} s)"
        if s.get("skipped"):
            lines.append(f"| {_cell(head)} | {_cell(s['skipped'])} |  |  | skipped |")
        for ch in s.get("checks", []):
            status = ch["status"] if not (ch["status"] == "fail" and ch.get("kind") == "goal") else "goal missed"
            lines.append(f"| {_cell(head)} | {_cell(ch['name'])} | {_cell(_value(ch))} | {_cell(ch.get('goal') or '')} "
                         f"| {status} |")
            head = ""
    lines += _curve_tables(steps)
    problems = [(s, ch) for s in steps for ch in s.get("checks", []) if ch["status"] in ("fail", "error")]
    if problems:
        lines += ["", "## What failed", ""]
        for s, ch in problems:
            detail = (ch.get("detail") or "").strip().replace("\n", "\n  ")
            lines.append(f"- **{s['step']}: {ch['name']}** ({ch['status']}). {detail}")
            if ch.get("hint"):
                lines.append(f"  Hint: {ch['hint']}.")
            lines.append(f"  Log: `{s['log']}`.")
    skipped = [(s, ch) for s in steps for ch in s.get("checks", []) if ch["status"] == "skipped" and ch.get("detail")]
    if skipped or any(s.get("skipped") for s in steps):
        lines += ["", "## Skipped", ""]
        for s in steps:
            if s.get("skipped"):
                lines.append(f"- {s['step']}: {s['skipped']}")
        for s, ch in skipped:
            lines.append(f"- {s['step']}: {ch['name']}: {ch['detail']}")
    notes = [(s["step"], n) for s in steps for n in s.get("notes", [])]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {st}: {n}" for st, n in notes]
    curves = [a for s in steps for a in s.get("artifacts", []) if a.startswith("curves/") and a.endswith(".json")]
    if curves:
        lines += ["", "## Files", ""]
        for a in curves:
            lines.append(f"- `{a}`" + ("" if summary["mode"] == "dry-run" or "-buckets" in a else
                                       f": the curve to commit as `dcut_sched/profiler/profiles/{a.split('/', 1)[1]}`"))
    lines.append("")
    return "\n".join(lines)
