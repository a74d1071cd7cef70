"""Steps ``profile-buckets`` and ``profile-curve``: ``dcut-profile --gpu`` (``--cpu`` in the dry run).

``profile-buckets`` times the profile a D-Cut deployment needs (the AR point, the 4 buckets, the
draft step and the plain decode step at bs 4/8/16/32/64) against the 10 s goal. ``profile-curve``
writes the full curve (bs 1..64, every multiple of the grid step as well) and judges how well the
coarse grid predicts the dense cells at two batch sizes (goal: median error <= 3 %).

Both run ``dcut_sched.cli.profile.main`` in this process (the code behind the ``dcut-profile`` console script)
and then check the file it wrote: schema version 2, ``ar`` rows (the plain decode step, on a GPU a
captured full CUDA graph), ``draft`` rows, every cell measured, the hardware fingerprint.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from pathlib import Path

from common import StepResult, can_run, device_slug, ensure_rich
from settings import Settings

TIME_GOAL_S = 10.0
INTERP_GOAL_PCT = 3.0
SCHEMA_V2 = "dcut.cost-curve/2"
GPU_FINGERPRINT = ("device_name", "backend", "torch_version", "cuda_version", "driver_version", "compute_capability",
                   "memory_gb")
CPU_FINGERPRINT = ("device_name", "backend", "torch_version")


class _Tee(io.TextIOBase):
    """Writes to a stream and keeps a copy (the profiler's one-line errors go into the check)."""

    def __init__(self, stream):
        self.stream, self.buf = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.buf.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def curve_path(res: StepResult, cfg: Settings, suffix: str = "") -> Path:
    if cfg.dry_run:
        name = f"cpu-{cfg.model}-b{cfg.block_size}{suffix}.json"
    else:
        import torch

        name = f"{device_slug(torch.cuda.get_device_name())}-{cfg.model}-b{cfg.block_size}{suffix}.json"
    path = res.out / "curves" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _prepare(res: StepResult, cfg: Settings) -> bool:
    if not can_run(res, ("torch", "numpy", "scipy", "pandas"), cuda=False, dry_run=cfg.dry_run,
                   why="dcut-profile cannot run"):
        return False
    note = ensure_rich()
    if note:
        res.note(note)
    return can_run(res, (), cuda=True, dry_run=cfg.dry_run, why="--gpu cannot run")


def _profile(res: StepResult, cfg: Settings, out: Path, args: list[str]) -> dict | None:
    """Run dcut-profile; returns the written file as JSON, or ``None`` after recording the failure."""
    from dcut_sched.cli.profile import main

    argv = [*args, "--out", str(out)]
    command = "dcut-profile " + " ".join(argv)
    res.figure("command", command)
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    tee = _Tee(sys.stderr)
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(tee):
        rc = main(argv)
    res.figure("wall_seconds", round(time.perf_counter() - t0, 2))
    if rc != 0 or not out.exists():
        err = [ln for ln in tee.buf.getvalue().splitlines() if ln.strip()]
        res.check("dcut-profile exits 0 and writes the curve", False, value=rc, detail=err[-1] if err else "",
                  hint=f"rerun: PYTHONPATH=. python3 -m dcut_sched.cli.profile {' '.join(argv)}"
                       + (f" --resume (measured cells are kept in {partial.name})" if partial.exists() else ""))
        return None
    res.check("dcut-profile exits 0 and writes the curve", True, value=rc)
    res.artifact(out)
    return json.loads(out.read_text(encoding="utf-8"))


def _check_file(res: StepResult, cfg: Settings, doc: dict, batch_sizes) -> None:
    """Schema, ar/draft rows, cells, fingerprint of a profile the profiler wrote."""
    from dcut_sched.profiler.grid import verify_tokens

    schema = doc.get("schema")
    res.check("cost-curve schema v2", schema == SCHEMA_V2, value=schema,
              detail="" if schema == SCHEMA_V2 else f"expected {SCHEMA_V2!r} (the ar rows: the plain decode step)")
    want = sorted(batch_sizes)
    ar = doc.get("ar") or []
    ar_bs = sorted(int(r["batch_size"]) for r in ar)
    res.check("ar rows (plain decode step) at every batch size", ar_bs == want, value=len(ar),
              detail="" if ar_bs == want else (f"ar rows at {ar_bs}, expected {want}" if ar else
                                               "the file has no 'ar' rows: this profiler does not measure the "
                                               "plain decode step"))
    draft_bs = sorted(int(r["batch_size"]) for r in doc.get("draft") or [])
    res.check(f"draft rows ({cfg.draft}) at every batch size", draft_bs == want, value=len(draft_bs),
              detail="" if draft_bs == want else f"draft rows at {draft_bs}, expected {want}")
    prof = doc.get("hardware", {}).get("profile", {})
    grid, ratios = int(prof.get("grid_step", 0)), prof.get("ratios") or (0.25, 0.5, 0.75, 1.0)
    expected_cells = {(bs, k) for bs in want for k in verify_tokens(bs, cfg.block_size, ratios, grid)}
    got_cells = {(int(r["batch_size"]), int(r["num_tokens"])) for r in doc.get("verify", [])}
    skipped = doc.get("hardware", {}).get("profile", {}).get("skipped") or {}
    lost = sorted(expected_cells - got_cells)
    res.check("every verify cell measured", not lost and not skipped, value=f"{len(got_cells)} of {len(expected_cells)}",
              detail=(f"missing {lost[:6]}; " if lost else "") + "; ".join(f"{k}: {v}" for k, v in list(skipped.items())[:4]))
    hw = doc.get("hardware", {})
    keys = CPU_FINGERPRINT if cfg.dry_run else GPU_FINGERPRINT
    absent = [k for k in keys if hw.get(k) in (None, "")]
    res.check("hardware fingerprint", not absent, value={k: hw.get(k) for k in keys},
              detail=f"missing {absent}" if absent else "")
    import warnings

    from dcut_sched import CostCurve

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        curve = CostCurve.from_dict(doc)
        same = curve.check_hardware(dtype=cfg.dtype, context_len=cfg.context_len)
    res.check("the curve's fingerprint matches this machine (CostCurve.check_hardware)", same,
              value=curve.fingerprint, detail="; ".join(str(w.message)[:300] for w in caught))
    backend = hw.get("backend")
    want_backend = "cpu-eager" if cfg.dry_run else "cuda-graph"
    res.check(f"backend {want_backend}", backend == want_backend, value=backend)
    if cfg.dry_run:
        res.check("verify cells replayed from CUDA graphs (graph_mode full)", None, value=doc.get("graph_mode"),
                  skip_reason="dry run: eager CPU forwards stand in for graph replays")
    else:
        res.check("verify cells replayed from CUDA graphs (graph_mode full)", doc.get("graph_mode") == "full",
                  value=doc.get("graph_mode"))
    for key in ("model_build_seconds", "capture_seconds"):
        res.figure(key, prof.get(key))
    res.figure("profile_seconds", doc.get("profile_seconds"))
    res.figure("cells", {"verify": len(doc.get("verify", [])), "ar": len(ar), "draft": len(draft_bs)})
    by_bs = {}
    verify = {(int(r["batch_size"]), int(r["num_tokens"])): r["median_ms"] for r in doc.get("verify", [])}
    from dcut_sched.profiler.grid import bucket_tokens

    for bs in want:
        by_bs[str(bs)] = {
            "verify_at_bs_ms": verify.get((bs, bs)),
            "buckets_ms": [verify.get((bs, k)) for k in bucket_tokens(bs, cfg.block_size)],
            "ar_ms": next((r["median_ms"] for r in ar if int(r["batch_size"]) == bs), None),
            "draft_ms": next((r["median_ms"] for r in doc.get("draft", []) if int(r["batch_size"]) == bs), None),
        }
    res.figure("median_ms_by_batch_size", by_bs)
    if ar:
        full = {bs: verify.get((bs, bs * cfg.block_size)) for bs in want}
        worse = [bs for bs, row in by_bs.items() if row["ar_ms"] and full[int(bs)] and row["ar_ms"] > full[int(bs)]]
        name = "plain decode step <= verifying every slot (C_ar(bs) <= C_verify(bs, bs*B))"
        detail = f"C_ar above full verification at bs {worse}" if worse else ""
        if cfg.dry_run:  # a tiny model's 1- and 16-token forwards are within the noise of a shared CPU
            res.measure(name, f"{len(want) - len(worse)} of {len(want)} batch sizes", detail=detail)
        else:
            res.check(name, not worse, value=len(want) - len(worse), unit=f"of {len(want)} batch sizes", detail=detail)


def run_buckets(res: StepResult, cfg: Settings) -> None:
    """The timed D-Cut profile (module docstring)."""
    if not _prepare(res, cfg):
        return
    out = curve_path(res, cfg, "-buckets")
    doc = None
    with res.guard("dcut-profile (AR point + buckets + draft + ar step)"):
        doc = _profile(res, cfg, out, cfg.profile_args(cfg.bucket_batch_sizes, grid_step=0))
    if doc is None:
        return
    with res.guard("checks of the written curve"):
        _check_file(res, cfg, doc, cfg.bucket_batch_sizes)
    seconds = doc.get("profile_seconds")
    goal = f"<= {TIME_GOAL_S:g} s"
    label = f"profile time, buckets + AR at bs {'/'.join(map(str, cfg.bucket_batch_sizes))} (capture + measure)"
    if cfg.dry_run:
        res.check(label, None, value=seconds, unit="s", goal=goal, kind="goal",
                  skip_reason="dry run: a CPU time, the goal is for the H200")
    else:
        res.check(label, seconds is not None and seconds <= TIME_GOAL_S, value=seconds, unit="s", goal=goal, kind="goal",
                  detail=f"capture {doc['hardware']['profile'].get('capture_seconds')} s, model build "
                         f"{doc['hardware']['profile'].get('model_build_seconds')} s (not counted)")


def run_curve(res: StepResult, cfg: Settings) -> None:
    """The full curve and its interpolation error (module docstring)."""
    if not _prepare(res, cfg):
        return
    out = curve_path(res, cfg)
    doc = None
    with res.guard("dcut-profile (full curve)"):
        doc = _profile(res, cfg, out, cfg.profile_args(cfg.curve_batch_sizes, grid_step=cfg.grid_step)
                       + ["--report", str(out.with_suffix(".interp.csv"))])
    if doc is None:
        return
    with res.guard("checks of the written curve"):
        _check_file(res, cfg, doc, cfg.curve_batch_sizes)
    with res.guard("interpolation error"):
        _interp(res, cfg, out)


def _interp(res: StepResult, cfg: Settings, path: Path) -> None:
    import numpy as np

    from dcut_sched import CostCurve
    from dcut_sched.profiler.interp_error import interpolation_points

    curve = CostCurve.load(path, check_hardware=False)
    pts = interpolation_points(curve)
    figures = {}
    for bs in cfg.interp_batch_sizes:
        g = pts[pts.batch_size == bs]
        name = f"interpolation error at bs {bs}: median |C_verify lookup from AR + buckets - measured| / measured"
        if g.empty:
            res.check(name, False, detail=f"no dense cells at bs {bs} in {path.name}")
            continue
        measured = g.measured_ms.to_numpy()
        curve_err = 100 * np.abs(g.curve_ms.to_numpy() - measured) / measured
        linear_err = 100 * np.abs(g.linear_ms.to_numpy() - measured) / measured
        figures[str(bs)] = {"dense_points": int(len(g)), "curve_median_pct": float(np.median(curve_err)),
                            "curve_max_pct": float(curve_err.max()), "linear_median_pct": float(np.median(linear_err)),
                            "linear_max_pct": float(linear_err.max())}
        med = float(np.median(curve_err))
        goal = f"<= {INTERP_GOAL_PCT:g} %"
        detail = (f"{len(g)} dense cells; max {curve_err.max():.1f} %; numpy.interp between the same points: "
                  f"median {np.median(linear_err):.1f} %")
        if cfg.dry_run:
            res.check(name, None, value=med, unit="%", goal=goal, kind="goal", detail=detail,
                      skip_reason="dry run: CPU timings of a tiny model, the goal is for the H200")
        else:
            res.check(name, med <= INTERP_GOAL_PCT, value=med, unit="%", goal=goal, kind="goal", detail=detail)
    res.figure("interpolation_error", figures)
