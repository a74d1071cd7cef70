"""Simulator fidelity on this CPU: the real SpecEngine vs dcut_sched.simulator on the same runs.

One command regenerates everything (about 32 minutes on a quiet 2-core machine)::

    PYTHONPATH=. nohup nice -n -5 python analysis/fidelity.py all > analysis/results/fidelity.log 2>&1 &

Stages (each can be run alone; ``all`` = profile, overhead, engine, timing-profile, predict):

- ``profile``: re-measure the CPU cost curve of SmolLM2-135M with ``dcut-profile --cpu`` (B = 8,
  bs 1,2,3,4,6,8,12,16, dense grid step 8, self-speculative draft step skipping layers 14-15, one
  torch thread, context length = the engine runs' mean decode context) into
  ``dcut_sched/profiler/profiles/cpu-smollm2-135m-b8.json``.
- ``overhead``: a held-out engine run (prompts 16..31, policies ``ar`` and ``full``, bs 1, 4, 16)
  with every model forward timed, giving the engine's per-step time *outside* the model forwards
  (Python, packing, planning, acceptance) for plain and drafted steps; written to
  ``fidelity_overhead.csv``. It is measured on other prompts than the runs it helps to predict.
- ``engine``: the real engine (`SpecEngine`, real SmolLM2-135M-Instruct weights, greedy) for every
  policy at bs 1, 2, 4, 8, 16 on the first 16 prompts of ``dcut_sched/data/traces/prompts.jsonl`` (24 new tokens,
  B = 8), one torch thread, forwards timed as above; per-step records to ``fidelity_engine_steps.parquet``.
- ``timing-profile``: a second curve at every bs 1..16 and the engine's measured decode context (88)
  into ``dcut_sched/profiler/profiles/cpu-smollm2-135m-b8-allbs.json``; ``predict`` times the simulated steps
  with it (and plans with the engine's curve, so both take the same decisions).
- ``predict`` (reads ``--measurements``, default analysis/results; writes ``--out-dir``, default the
  git-ignored ``build/fidelity-predict/``; ``analysis/make_report.py`` runs it into analysis/results
  so the report and the README quote one run): the engine-matched position-indexed trace (the shipped
  ``dcut_sched/data/traces/smollm2-135m-skip14-15-b8.parquet`` cut to the engine's output lengths, position 0
  dropped because the engine's first token comes from prefill; verified against the engine's
  ``full`` runs), one ``run_open_loop`` per (policy, bs) with every request arriving at t = 0, no
  shuffle, max batch = bs, free prefill; predicted vs measured decode tokens/s and speedup over
  ``ar``, before and after modelling the measured per-step overhead. Writes ``fidelity.csv``,
  ``fidelity.md``, ``fidelity_steps.csv``, ``fidelity.png``.

Machine load (``os.getloadavg``) is logged before and after each stage into ``fidelity_load.csv``.
Method and results: docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
import pandas as pd

#: The policy parameters the committed engine runs (this script's and analysis/fidelity_dflash.py's) were
#: recorded with, where they differ from today's defaults: ``fine`` chose among multiples of 8 (plus both
#: ends) until 2026-12-05 (docs/design.md §2.1).
RECORDED_PARAMS = {"fine": {"granularity": 8}}
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dcut_sched.cost_curve import CostCurve  # noqa: E402
from dcut_sched.engine.observer import EngineObserver  # noqa: E402
from dcut_sched.traces import Trace  # noqa: E402
from dcut_sched.util.atomic import atomic_write_text, atomic_write_with  # noqa: E402
from dcut_sched.util.tables import write_table  # noqa: E402

POLICIES = ("ar", "full", "uniform", "threshold", "topk", "dcut", "fine", "oracle")
BATCH_SIZES = (16, 8, 4, 2, 1)  # cheapest first: a partial run still covers the large batches
PROFILE_BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
BLOCK_SIZE = 8
MAX_NEW_TOKENS = 24
NUM_PROMPTS = 16
HELDOUT = (16, 32)
OVERHEAD_BATCH_SIZES = (16, 4, 1)
OVERHEAD_MAX_NEW_TOKENS = 12
CURVE = ROOT / "dcut_sched/profiler/profiles/cpu-smollm2-135m-b8.json"
TIMING_CURVE = ROOT / "dcut_sched/profiler/profiles/cpu-smollm2-135m-b8-allbs.json"
SHIPPED_TRACE = ROOT / "dcut_sched/data/traces/smollm2-135m-skip14-15-b8.parquet"
PROMPTS = ROOT / "dcut_sched/data/traces/prompts.jsonl"
RESULTS = ROOT / "analysis/results"
#: ``predict``'s default output folder: git-ignored (``build/``), so it never overwrites tracked files.
PREDICT_OUT = ROOT / "build/fidelity-predict"


# ============================================================================ pure parts (tested)
def engine_matched_trace(trace: Trace, output_lengths: Sequence[int], requests: Sequence[int] | None = None) -> Trace:
    """The position-indexed trace of exactly the engine's decode steps.

    The shipped trace's position ``p`` is "``y_0..y_{p-1}`` produced, drafts predict ``y_p..``" and a
    simulated request starts at position 0, so its first step would produce ``y_0``. The engine
    produces ``y_0`` in the prefill and decodes from position 1. For output length ``n`` (the
    engine's, ``<=`` the recorded one) this keeps positions ``1..n-1`` renumbered ``0..n-2``, with
    ``accept_len`` capped at ``n - p - 1`` (the recorder's own cap for an output of length ``n``;
    docs/design.md §3), so the replay produces exactly the ``n - 1`` decode tokens.

    Args:
        trace: position-indexed trace whose request ``j`` is prompt ``j``.
        output_lengths: ``[R']`` the engine's output length (prefill token included) per request.
        requests: trace request ids, in engine order (default ``0..R'-1``).

    Returns:
        A new position-indexed :class:`Trace` whose request ``k`` is the engine's request ``k``.

    Raises:
        ValueError: step-indexed trace, unknown request, an output longer than the recorded one, or
            an output of length < 2 (no decode step to simulate).
    """
    if not trace.exact_replay:
        raise ValueError(f"{trace.name}: engine matching needs a position-indexed trace")
    requests = list(range(len(output_lengths))) if requests is None else list(requests)
    if len(requests) != len(output_lengths):
        raise ValueError("requests and output_lengths differ in length")
    index = {int(r): k for k, r in enumerate(trace.request_ids)}
    rid, pos, acc, conf = [], [], [], []
    for k, (r, n) in enumerate(zip(requests, output_lengths)):
        if int(r) not in index:
            raise ValueError(f"{trace.name}: no request {r}")
        j = index[int(r)]
        recorded = int(trace.num_positions[j])
        n = int(n)
        if n > recorded:
            raise ValueError(f"{trace.name}: request {r} has {recorded} positions, the engine produced {n} tokens")
        if n < 2:
            raise ValueError(f"request {r}: output length {n} leaves no decode step")
        s = int(trace.starts[j])
        p = np.arange(1, n)
        rid.append(np.full(n - 1, k, dtype=np.int32))
        pos.append((p - 1).astype(np.int32))
        acc.append(np.minimum(trace.accept_len[s + p].astype(np.int64), n - p - 1).astype(np.int8))
        conf.append(trace.conf[s + p])
    meta = dict(trace.metadata)
    meta.pop("requests", None)
    meta["derived_from"] = trace.name
    meta["engine_matched"] = json.dumps({"requests": [int(r) for r in requests],
                                         "output_lengths": [int(n) for n in output_lengths]})
    return Trace(np.concatenate(rid), np.concatenate(pos), np.concatenate(acc), np.concatenate(conf), metadata=meta)


def engine_positions(steps: pd.DataFrame, num_requests: int) -> pd.DataFrame:
    """Per (step, request): the request's output position before the step (engine convention).

    The engine's first token comes from prefill, so every request starts its decode at position 1;
    a step commits ``min(accepted + 1, remaining)`` tokens, where ``remaining`` is unknown here, so
    the positions are advanced by ``accepted + 1`` (a finished request leaves the batch).

    Args:
        steps: one row per engine step with list columns ``request_ids`` and ``accepted`` (in step order).

    Returns:
        DataFrame ``step, request, pos, accepted, slot`` (slot = index in the step's batch).
    """
    pos = np.ones(num_requests, dtype=np.int64)
    rows = []
    for step, reqs, accepted in zip(steps["step"], steps["request_ids"], steps["accepted"]):
        for slot, (q, a) in enumerate(zip(reqs, accepted)):
            rows.append((int(step), int(q), int(pos[q]), int(a), slot))
            pos[q] += int(a) + 1
    return pd.DataFrame(rows, columns=["step", "request", "pos", "accepted", "slot"])


def check_trace_matches(matched: Trace, steps: pd.DataFrame, num_requests: int) -> dict[str, int]:
    """Compare a ``full``-policy engine run (every slot verified, no censoring) with the matched trace.

    Args:
        matched: :func:`engine_matched_trace` output.
        steps: the run's steps (``request_ids``, ``accepted``, ``drafted``, ``step``).

    Returns:
        ``{"checked": n, "accept_mismatch": m}``: request-steps compared and how many had an
        ``accepted`` different from the trace's ``accept_len`` at that position.
    """
    drafted = steps[steps["drafted"]]
    at = engine_positions(steps, num_requests)
    at = at[at["step"].isin(drafted["step"])]
    checked = mismatch = 0
    for q, p, a in zip(at["request"], at["pos"], at["accepted"]):
        q_pos, n_pos = int(p) - 1, int(matched.num_positions[q])  # matched position, decode positions
        checked += 1
        if q_pos >= n_pos:
            mismatch += 1
            continue
        # the engine's count is not capped at the output end (commit truncates); the trace's is
        engine_accept = min(int(a), n_pos - q_pos - 1)
        mismatch += int(int(matched.accept_len[int(matched.starts[q]) + q_pos]) != engine_accept)
    return {"checked": checked, "accept_mismatch": mismatch}


def relative_error(predicted: Any, measured: Any) -> np.ndarray:
    """Signed relative error ``(predicted - measured) / measured`` (elementwise, floats)."""
    predicted = np.asarray(predicted, dtype=np.float64)
    measured = np.asarray(measured, dtype=np.float64)
    if np.any(measured <= 0):
        raise ValueError("measured values must be > 0")
    return (predicted - measured) / measured


def error_summary(errors: Any) -> dict[str, float]:
    """Median and mean absolute error, max absolute error and mean signed error of relative errors."""
    e = np.asarray(errors, dtype=np.float64)
    e = e[np.isfinite(e)]
    if e.size == 0:
        return {"median_abs": float("nan"), "mean_abs": float("nan"), "max_abs": float("nan"), "mean_signed": float("nan")}
    a = np.abs(e)
    return {"median_abs": float(np.median(a)), "mean_abs": float(a.mean()), "max_abs": float(a.max()),
            "mean_signed": float(e.mean())}


def with_overhead_rows(curve: CostCurve, table: pd.DataFrame) -> CostCurve:
    """``curve`` plus ``step_overhead`` rows from a measured overhead table (docs/design.md §4).

    Args:
        curve: the cost curve (its forward passes).
        table: ``fidelity_overhead.csv``: ``batch_size``, ``drafted`` (bool), ``overhead_ms`` (median),
            optional ``p20``, ``p80``, ``n``; ``drafted`` False rows become ``plain`` rows, True rows
            ``drafted`` rows. The project's engine skips its drafter on a step without draft, so
            no ``undrafted`` rows: such a step is priced as a plain step.

    Returns:
        A new :class:`CostCurve` (``curve`` is not changed).

    Raises:
        CostCurveError: a negative or non-finite overhead (naming the row).
    """
    from dcut_sched.cost_curve import StepOverheadRow

    rows = []
    for r in table.sort_values(["drafted", "batch_size"]).itertuples(index=False):
        get = r._asdict()
        rows.append(StepOverheadRow("drafted" if bool(get["drafted"]) else "plain", int(get["batch_size"]),
                                    float(get["overhead_ms"]),
                                    float(get["p20"]) if pd.notna(get.get("p20", np.nan)) else None,
                                    float(get["p80"]) if pd.notna(get.get("p80", np.nan)) else None,
                                    int(get["n"]) if pd.notna(get.get("n", np.nan)) else None, "measured"))
    return CostCurve(hardware=curve.hardware, model=curve.model, block_size=curve.block_size,
                     context_len=curve.context_len, verify=curve.verify, draft=curve.draft, ar=curve.ar,
                     draft_first=curve.draft_first, step_overhead=rows, graph_mode=curve.graph_mode,
                     created=curve.created, profile_seconds=curve.profile_seconds,
                     source=curve.source + "; step_overhead rows: the project engine's held-out overhead run",
                     path=curve.path, loaded_schema=curve.loaded_schema)


def step_time_ms(curve: CostCurve, batch_size: Sequence[int], num_tokens: Sequence[int], drafted: Sequence[bool],
                 *, verify_tokens: Sequence[int] | None = None, speculative: bool = True) -> np.ndarray:
    """Per-step time, the simulator's step model (docs/design.md §1), from ``curve``'s
    :class:`~dcut_sched.step_costs.StepCosts`: ``drafted_ms(bs, K)`` for a drafted step,
    ``undrafted_ms(bs)`` for a step without draft (``plain_ms(bs)`` when not ``speculative``), with
    whatever per-step rows the curve holds (:func:`with_overhead_rows`). ``verify_tokens`` (default
    ``num_tokens``) is the K looked up (e.g. ``bs * B`` for an engine that verifies the whole block).

    Returns:
        ``[steps]`` float64 ms.
    """
    from dcut_sched.step_costs import StepCosts

    bs = np.asarray(batch_size, dtype=np.int64)
    k = np.asarray(num_tokens if verify_tokens is None else verify_tokens, dtype=np.int64)
    d = np.asarray(drafted, dtype=bool)
    costs = StepCosts(curve, curve.block_size)
    skip = costs.undrafted_ms if speculative else costs.plain_ms
    out = np.empty(len(bs), dtype=np.float64)
    for i, (b, kk, dd) in enumerate(zip(bs, k, d)):
        out[i] = costs.drafted_ms(int(b), int(kk)) if dd else skip(int(b))
    return out


# ============================================================================ measurement helpers
def _load_sample(phase: str, when: str) -> dict[str, Any]:
    l1, l5, l15 = os.getloadavg()
    return {"phase": phase, "when": when, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "load1": l1, "load5": l5, "load15": l15}


def log_load(phase: str, when: str, out_dir: Path) -> None:
    path = out_dir / "fidelity_load.csv"
    rows = pd.read_csv(path).to_dict("records") if path.exists() else []
    rows.append(_load_sample(phase, when))
    write_table(pd.DataFrame(rows), path)
    print(f"[load] {phase} {when}: {rows[-1]['load1']:.2f} {rows[-1]['load5']:.2f} {rows[-1]['load15']:.2f}", flush=True)


def _write_frame(path: Path, frame: pd.DataFrame) -> None:
    write_table(frame, path)


class ForwardTimer(EngineObserver):
    """Times every model forward and attributes it to the engine phase it runs in.

    An :class:`~dcut_sched.engine.observer.EngineObserver`: the engine tells it each step's phases
    (``draft``, ``oracle_verify``, ``plan``, ``verify``) and torch module hooks on the target model
    (``register_forward_pre_hook`` / ``register_forward_hook``, removed by :meth:`close`) time the
    forwards; the drafter runs the same model instance, so its forwards are seen too. Per step
    ``s`` it sums the forward time inside the draft call (``draft_fwd_ms``), inside the
    verification (``verify_fwd_ms``) and, for ``oracle``, inside the full verification before
    planning (``oracle_fwd_ms``). Timing cost: two ``perf_counter`` calls per forward.
    """

    #: engine phase -> the column prefix its forwards are summed under
    _PHASE_KEY: ClassVar[dict[str, str]] = {"draft": "draft", "oracle_verify": "oracle", "verify": "verify"}

    def __init__(self, model):
        self.phase: str | None = None
        self.step = 0
        self.draft_calls = 0
        self.acc: dict[tuple[str, int], float] = {}
        self.ctx: dict[tuple[str, int], int] = {}
        self._t0 = 0.0
        self._handles = [model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
                         model.register_forward_hook(self._after_forward, with_kwargs=True)]

    # engine hooks
    def phase_started(self, step: int, phase: str) -> None:
        self.phase, self.step = self._PHASE_KEY.get(phase), step
        if phase == "draft":
            self.draft_calls = 0

    def phase_ended(self, step: int, phase: str, elapsed_ms: float) -> None:
        self.phase = None

    # model hooks
    def _before_forward(self, module, args, kwargs) -> None:
        if self.phase is not None:
            self._t0 = time.perf_counter()

    def _after_forward(self, module, args, kwargs, output) -> None:
        if self.phase is None:
            return
        ms = (time.perf_counter() - self._t0) * 1e3
        key = (self.phase, self.step)
        self.acc[key] = self.acc.get(key, 0.0) + ms
        if self.phase == "draft":
            if self.draft_calls == 0:
                # the drafter's first forward feeds what its cache misses (the whole prompt on a
                # request's first draft), padded to [bs, P], and yields the first draft token
                ids = args[0] if args else kwargs["input_ids"]
                self.acc[("draft_first", self.step)] = ms
                self.ctx[("draft_first_len", self.step)] = int(ids.shape[1])
            self.draft_calls += 1
        kv = kwargs.get("kv_len")
        if kv is not None:
            self.ctx[key] = max(self.ctx.get(key, 0), int(kv))

    def close(self) -> None:
        """Remove the model hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def per_step(self, num_steps: int) -> pd.DataFrame:
        """``draft_fwd_ms``, ``oracle_fwd_ms``, ``verify_fwd_ms``, ``verify_kv_len`` per step."""
        rows = []
        for s in range(num_steps):
            rows.append({
                "draft_fwd_ms": self.acc.get(("draft", s), 0.0),
                "draft_first_fwd_ms": self.acc.get(("draft_first", s), 0.0),
                "draft_first_len": self.ctx.get(("draft_first_len", s), 0),
                "oracle_fwd_ms": self.acc.get(("oracle", s), 0.0),
                "verify_fwd_ms": self.acc.get(("verify", s), 0.0),
                "verify_kv_len": self.ctx.get(("verify", s), 0),
            })
        return pd.DataFrame(rows)


def _engine_run(model, prompt_ids, policy: str, bs: int, max_new_tokens: int, curve: CostCurve, eos_id: int | None,
                skip_layers: Sequence[int] = (14, 15)):
    from dcut_sched.controller import RatioController
    from dcut_sched.engine import SpecEngine

    ctrl = RatioController(curve, BLOCK_SIZE, policy=policy)
    eng = SpecEngine(model, ctrl, batch_size=bs, max_new_tokens=max_new_tokens, eos_id=eos_id, skip_layers=skip_layers)
    timer = ForwardTimer(model)
    try:
        t0 = time.perf_counter()
        res = eng.generate(prompt_ids, observer=timer)
        wall = time.perf_counter() - t0
    finally:
        timer.close()
    steps = res.steps_frame()
    steps = pd.concat([steps, timer.per_step(len(steps))], axis=1)
    steps["policy"] = policy
    steps["run_batch_size"] = bs
    summary = res.summary() | {"wall_s": wall, "decode_tokens": res.decode_tokens}
    return res, steps, summary


def _setup(threads: int = 1):
    import torch

    torch.set_num_threads(threads)
    from dcut_sched.engine.trace_backends import NativeBackend
    from dcut_sched.traces.prompts import load_prompt_records

    backend = NativeBackend()
    prompts = load_prompt_records(PROMPTS)
    ids = [backend.encode_prompt(p.text) for p in prompts]
    return backend, ids


# ============================================================================ stages
def stage_profile(args) -> None:
    """Re-measure the CPU cost curve (dcut-profile --cpu) at the engine runs' context length."""
    log_load("profile", "before", args.out_dir)
    cmd = [sys.executable, "-m", "dcut_sched.cli.profile", "--cpu", "--model", "smollm2-135m",
           "--batch-sizes", ",".join(map(str, PROFILE_BATCH_SIZES)), "--block-size", str(BLOCK_SIZE),
           "--grid-step", "8", "--draft", "self-skip:14,15", "--context-len", str(args.context_len),
           "--warmups", "1", "--repeats", "5", "--rounds", "5", "--threads", "1", "--no-progress",
           "--report", str(args.out_dir / "cpu-smollm2-135m-b8-interp.csv"), "--out", str(args.curve)]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)})
    log_load("profile", "after", args.out_dir)


def stage_timing_profile(args) -> None:
    """A second CPU curve for the step-time model: every bs 1..16 (continuous batching visits them
    all and this CPU's cost is not smooth in bs) at the engine's measured decode context."""
    log_load("timing-profile", "before", args.out_dir)
    cmd = [sys.executable, "-m", "dcut_sched.cli.profile", "--cpu", "--model", "smollm2-135m",
           "--batch-sizes", ",".join(str(b) for b in range(1, 17)), "--block-size", str(BLOCK_SIZE),
           "--grid-step", "8", "--draft", "self-skip:14,15", "--context-len", str(args.timing_context_len),
           "--warmups", "1", "--repeats", "5", "--rounds", "5", "--threads", "1", "--no-progress",
           "--out", str(args.timing_curve)]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)})
    log_load("timing-profile", "after", args.out_dir)


def stage_overhead(args) -> None:
    """Held-out engine runs with timed forwards: the engine's per-step time outside the forwards."""
    log_load("overhead", "before", args.out_dir)
    backend, ids = _setup()
    curve = CostCurve.load(args.curve)
    held = ids[HELDOUT[0]:HELDOUT[1]]
    frames = []
    for bs in OVERHEAD_BATCH_SIZES:
        for policy in ("ar", "full"):
            _, steps, summary = _engine_run(backend.model, held, policy, bs, OVERHEAD_MAX_NEW_TOKENS, curve, backend.eos_id)
            print(f"[overhead] {policy} bs={bs}: {summary['steps']} steps, {summary['wall_s']:.1f} s", flush=True)
            frames.append(steps)
    steps = pd.concat(frames, ignore_index=True)
    steps["step_ms"] = steps["draft_ms"] + steps["plan_ms"] + steps["verify_ms"]
    steps["fwd_ms"] = steps["draft_fwd_ms"] + steps["oracle_fwd_ms"] + steps["verify_fwd_ms"]
    steps["overhead_ms"] = steps["step_ms"] - steps["fwd_ms"]
    table = (steps.groupby(["batch_size", "drafted"])["overhead_ms"]
             .agg(overhead_ms="median", p20=lambda x: np.percentile(x, 20), p80=lambda x: np.percentile(x, 80), n="size")
             .reset_index())
    _write_frame(args.out_dir / "fidelity_overhead.csv", table)
    print(table.to_string(index=False), flush=True)
    log_load("overhead", "after", args.out_dir)


def stage_engine(args) -> None:
    """The measured runs: every policy x batch size on the first 16 prompts, per-step records."""
    from tqdm import tqdm

    log_load("engine", "before", args.out_dir)
    backend, ids = _setup()
    curve = CostCurve.load(args.curve)
    prompt_ids = ids[: args.num_prompts]
    steps_path = args.out_dir / "fidelity_engine_steps.parquet"
    runs_path = args.out_dir / "fidelity_engine_runs.csv"
    outputs_path = args.out_dir / "fidelity_engine_outputs.json"
    all_steps, runs, outputs = [], [], {}
    cells = [(bs, p) for bs in args.batch_sizes for p in args.policies]
    for bs, policy in tqdm(cells, desc="engine runs", file=sys.stdout):
        res, steps, summary = _engine_run(backend.model, prompt_ids, policy, bs, args.max_new_tokens, curve, backend.eos_id)
        summary["load1_after"] = os.getloadavg()[0]
        all_steps.append(steps)
        runs.append(summary)
        outputs[f"{policy}/{bs}"] = res.outputs
        print(f"[engine] {policy} bs={bs}: {summary['steps']} steps, decode {summary['decode_tokens_per_s']:.2f} tok/s, "
              f"wall {summary['wall_s']:.1f} s, load {summary['load1_after']:.2f}", flush=True)
        frame = pd.concat(all_steps, ignore_index=True)
        for col in ("request_ids", "lengths", "accepted", "graph_cell"):
            frame[col] = frame[col].map(lambda v: json.dumps([int(x) for x in v]))
        _write_frame(steps_path, frame)
        _write_frame(runs_path, pd.DataFrame(runs))
        atomic_write_text(outputs_path, json.dumps({"prompt_ids": prompt_ids, "outputs": outputs}) + "\n")
    log_load("engine", "after", args.out_dir)


def _load_engine(out_dir: Path):
    steps = pd.read_parquet(out_dir / "fidelity_engine_steps.parquet")
    for col in ("request_ids", "lengths", "accepted", "graph_cell"):
        steps[col] = steps[col].map(json.loads)
    runs = pd.read_csv(out_dir / "fidelity_engine_runs.csv")
    doc = json.loads((out_dir / "fidelity_engine_outputs.json").read_text())
    return steps, runs, doc


def drafter_prefill_ms(steps: pd.DataFrame, block_size: int) -> np.ndarray:
    """Per engine step: the time the drafter spent on prompts, i.e. its own prefill, in ms.

    ``SelfSpecDrafter.draft`` feeds whatever its cache misses in the first forward of a draft call,
    padded to ``[bs, P]``: on a request's first drafted step that is its whole prompt. That forward
    also yields the first draft token, so the prompt part is the first forward's time minus one
    ordinary draft forward (the mean of the same call's other ``B - 2`` forwards). Counted only on
    steps where some request drafts for the first time (elsewhere ``P`` is the 1-2 tokens accepted
    since the last draft, which is decode work and stays in).

    Args:
        steps: one run's steps in order, with ``step``, ``request_ids``, ``drafted``,
            ``draft_fwd_ms`` (all drafter forwards of the step) and ``draft_first_fwd_ms``.
        block_size: B (``B - 1`` forwards per draft call).

    Returns:
        ``[steps]`` float64 ms (>= 0).
    """
    seen: set[int] = set()
    out = np.zeros(len(steps), dtype=np.float64)
    for i, (reqs, drafted, total, first) in enumerate(zip(steps["request_ids"], steps["drafted"],
                                                          steps["draft_fwd_ms"], steps["draft_first_fwd_ms"])):
        if not drafted:
            continue
        new = [q for q in reqs if q not in seen]
        seen.update(reqs)
        if new and block_size > 2:
            one = (float(total) - float(first)) / (block_size - 2)
            out[i] = max(0.0, float(first) - one)
    return out


def stage_predict(args) -> None:
    """Simulate the measured runs and compare (no model needed; seconds)."""
    from dcut_sched import policies
    from dcut_sched.simulator import run_open_loop

    steps, runs, doc = _load_engine(args.measurements)
    outputs = doc["outputs"]
    ref = next(iter(outputs.values()))
    lossless_bad = [k for k, v in outputs.items() if v != ref]
    out_len = [len(o) for o in ref]
    shipped = Trace.load(SHIPPED_TRACE)
    matched = engine_matched_trace(shipped, out_len)
    matched.save(args.out_dir / "fidelity_trace.parquet")
    curve = CostCurve.load(args.curve)  # the engine's controller planned with it, so the simulator plans with it
    timing = CostCurve.load(args.timing_curve) if Path(args.timing_curve).exists() else curve
    ov_path = args.measurements / "fidelity_overhead.csv"
    ov = pd.read_csv(ov_path) if ov_path.exists() else pd.DataFrame(columns=["batch_size", "drafted", "overhead_ms"])
    # the measured per-step overhead as the curves' step_overhead rows: StepCosts sums it
    curve_ov, timing_ov = with_overhead_rows(curve, ov), with_overhead_rows(timing, ov)
    nreq = len(out_len)
    checks = []
    for bs in sorted(runs["batch_size"].unique()):
        sub = steps[(steps["policy"] == "full") & (steps["run_batch_size"] == bs)]
        if len(sub):
            checks.append({"batch_size": int(bs)} | check_trace_matches(matched, sub.reset_index(drop=True), nreq))
    rows, diag = [], []
    for _, run in runs.iterrows():
        policy, bs = run["policy"], int(run["batch_size"])
        es = steps[(steps["policy"] == policy) & (steps["run_batch_size"] == bs)].reset_index(drop=True)
        recorded = policies.get(policy, **RECORDED_PARAMS.get(policy, {}))
        sim = run_open_loop(matched, curve, recorded, bs, rate_rps=1.0, num_requests=nreq,
                            shuffle=False, arrival_ms=np.zeros(nreq))
        st = sim.steps
        sim_tokens = int(st.tokens.sum())
        # the engine's oracle verifies the whole block to learn the acceptance (its step costs full's)
        verify_k = np.where(st.drafted, st.batch_size * BLOCK_SIZE, st.num_tokens) if policy == "oracle" else st.num_tokens
        sim_ms = float(st.step_ms.sum())
        spec = policies.get(policy).speculative
        model1_ms = float(step_time_ms(curve_ov, st.batch_size, st.num_tokens, st.drafted, verify_tokens=verify_k,
                                       speculative=spec).sum())
        model_ms = float(step_time_ms(timing_ov, st.batch_size, st.num_tokens, st.drafted, verify_tokens=verify_k,
                                      speculative=spec).sum())
        e_drafted = es["drafted"].to_numpy(bool)
        e_bs = es["batch_size"].to_numpy(np.int64)
        e_verify_k = np.where(e_drafted, e_bs * BLOCK_SIZE, es["num_tokens"]) if policy == "oracle" else es["num_tokens"].to_numpy()
        own_curve_ms = step_time_ms(curve, e_bs, es["num_tokens"], e_drafted, verify_tokens=e_verify_k, speculative=spec)
        own_model_ms = step_time_ms(timing_ov, e_bs, es["num_tokens"], e_drafted, verify_tokens=e_verify_k,
                                    speculative=spec)
        dpre = drafter_prefill_ms(es, BLOCK_SIZE)
        # the first drafter forward's excess over an ordinary draft forward on every drafted step:
        # prompt prefill (counted above) or catching up on tokens committed since the last draft
        catchup = np.where(e_drafted, np.maximum(0.0, es["draft_first_fwd_ms"] - (es["draft_fwd_ms"] - es["draft_first_fwd_ms"])
                                                 / (BLOCK_SIZE - 2)), 0.0)
        catchup = np.where(dpre > 0, 0.0, catchup)
        measured_ms = float(run["decode_ms"])
        dec_tokens = int(run["decode_tokens"])
        rows.append({
            "policy": policy, "batch_size": bs,
            "measured_tokens_per_s": dec_tokens / measured_ms * 1e3,
            "measured_excl_drafter_prefill_tokens_per_s": dec_tokens / (measured_ms - dpre.sum()) * 1e3,
            "sim_tokens_per_s": sim_tokens / sim_ms * 1e3,
            "model1_tokens_per_s": sim_tokens / model1_ms * 1e3,
            "model_tokens_per_s": sim_tokens / model_ms * 1e3,
            "curve_at_engine_plans_tokens_per_s": dec_tokens / own_curve_ms.sum() * 1e3,
            "model_at_engine_plans_tokens_per_s": dec_tokens / own_model_ms.sum() * 1e3,
            "engine_steps": len(es), "sim_steps": len(st), "engine_decode_tokens": dec_tokens, "sim_tokens": sim_tokens,
            "engine_drafted_steps": int(e_drafted.sum()), "sim_drafted_steps": int(st.drafted.sum()),
            "engine_num_tokens": int(es["num_tokens"].sum()), "sim_num_tokens": int(st.num_tokens.sum()),
            "measured_decode_ms": measured_ms, "drafter_prefill_ms": float(dpre.sum()),
            "drafter_catchup_ms": float(catchup.sum()),
            "sim_decode_ms": sim_ms, "model1_decode_ms": model1_ms, "model_decode_ms": model_ms,
            "engine_draft_ms": float(es["draft_ms"].sum()), "engine_verify_ms": float(es["verify_ms"].sum()),
            "engine_plan_ms": float(es["plan_ms"].sum()),
            "engine_draft_fwd_ms": float(es["draft_fwd_ms"].sum()),
            "engine_verify_fwd_ms": float((es["verify_fwd_ms"] + es["oracle_fwd_ms"]).sum()),
            "load1_after": run.get("load1_after", np.nan),
        })
        e_draft_curve = np.array([curve.draft_ms(int(b)) if d else 0.0 for b, d in zip(e_bs, e_drafted)])
        e_verify_curve = np.array([float(curve.verify_ms(int(b), int(k))) for b, k in zip(e_bs, e_verify_k)])
        t_draft_curve = np.array([timing.draft_ms(int(b)) if d else 0.0 for b, d in zip(e_bs, e_drafted)])
        t_verify_curve = np.array([float(timing.verify_ms(int(b), int(k))) for b, k in zip(e_bs, e_verify_k)])
        diag.append(pd.DataFrame({
            "policy": policy, "run_batch_size": bs, "step": es["step"].to_numpy(), "batch_size": e_bs,
            "drafted": e_drafted, "num_tokens": es["num_tokens"].to_numpy(),
            "packed_tokens": es["packed_tokens"].to_numpy(), "verify_kv_len": es["verify_kv_len"].to_numpy(),
            "draft_ms": es["draft_ms"].to_numpy(), "draft_fwd_ms": es["draft_fwd_ms"].to_numpy(),
            "draft_first_fwd_ms": es["draft_first_fwd_ms"].to_numpy(), "draft_first_len": es["draft_first_len"].to_numpy(),
            "drafter_prefill_ms": dpre, "drafter_catchup_ms": catchup, "curve_draft_ms": e_draft_curve, "timing_curve_draft_ms": t_draft_curve,
            "plan_ms": es["plan_ms"].to_numpy(), "oracle_fwd_ms": es["oracle_fwd_ms"].to_numpy(),
            "verify_ms": es["verify_ms"].to_numpy(), "verify_fwd_ms": es["verify_fwd_ms"].to_numpy(),
            "curve_verify_ms": e_verify_curve, "timing_curve_verify_ms": t_verify_curve,
            "step_ms": (es["draft_ms"] + es["plan_ms"] + es["verify_ms"]).to_numpy(),
            "curve_step_ms": own_curve_ms, "model_step_ms": own_model_ms,
        }))
    res = pd.DataFrame(rows)
    ar = res[res["policy"] == "ar"].set_index("batch_size")
    for col in ("measured", "measured_excl_drafter_prefill", "sim", "model1", "model"):
        res[f"{col}_speedup"] = res[f"{col}_tokens_per_s"] / res["batch_size"].map(ar[f"{col}_tokens_per_s"])
    # before: the simulator as is vs the engine's own decode accounting;
    # after: curve + measured overhead + oracle's full verification vs decode without the drafter's prefill
    res["error_before"] = relative_error(res["sim_tokens_per_s"], res["measured_tokens_per_s"])
    res["error_sim_vs_excl_prefill"] = relative_error(res["sim_tokens_per_s"], res["measured_excl_drafter_prefill_tokens_per_s"])
    res["error_model1"] = relative_error(res["model1_tokens_per_s"], res["measured_excl_drafter_prefill_tokens_per_s"])
    res["error_after"] = relative_error(res["model_tokens_per_s"], res["measured_excl_drafter_prefill_tokens_per_s"])
    res["speedup_error_before"] = relative_error(res["sim_speedup"], res["measured_speedup"])
    res["speedup_error_after"] = relative_error(res["model_speedup"], res["measured_excl_drafter_prefill_speedup"])
    res["error_curve_at_engine_plans"] = relative_error(res["curve_at_engine_plans_tokens_per_s"], res["measured_tokens_per_s"])
    res["error_model_at_engine_plans"] = relative_error(res["model_at_engine_plans_tokens_per_s"],
                                                        res["measured_excl_drafter_prefill_tokens_per_s"])
    order = {p: i for i, p in enumerate(POLICIES)}
    res = res.sort_values(["policy", "batch_size"], key=lambda c: c.map(order) if c.name == "policy" else c).reset_index(drop=True)
    _write_frame(args.out_dir / "fidelity.csv", res)
    diag_frame = pd.concat(diag, ignore_index=True)
    _write_frame(args.out_dir / "fidelity_steps.csv", diag_frame)
    phase = _phase_table(diag_frame)
    _write_frame(args.out_dir / "fidelity_phases.csv", phase)
    drafting = res["policy"] != "ar"
    summary = {
        "tokens_per_s_before": error_summary(res["error_before"]),
        "tokens_per_s_sim_vs_excl_prefill": error_summary(res["error_sim_vs_excl_prefill"]),
        "tokens_per_s_model1": error_summary(res["error_model1"]),
        "tokens_per_s_after": error_summary(res["error_after"]),
        "speedup_before": error_summary(res.loc[drafting, "speedup_error_before"]),
        "speedup_after": error_summary(res.loc[drafting, "speedup_error_after"]),
        "curve_at_engine_plans": error_summary(res["error_curve_at_engine_plans"]),
        "model_at_engine_plans": error_summary(res["error_model_at_engine_plans"]),
        "replay_step_mismatch_runs": res.loc[res["engine_steps"] != res["sim_steps"], ["policy", "batch_size"]].values.tolist(),
        "trace_checks": checks, "lossless_mismatch_runs": lossless_bad,
        "output_lengths": out_len, "overhead_table": ov.to_dict("records"),
    }
    atomic_write_text(args.out_dir / "fidelity_summary.json", json.dumps(summary, indent=1, default=float) + "\n")
    _write_markdown(res, summary, phase, args.out_dir / "fidelity.md")
    _plot(res, args.out_dir / "fidelity.png")
    _print(res, summary)


def _phase_table(diag: pd.DataFrame) -> pd.DataFrame:
    """Per batch size: engine phase times vs the curve (medians over steps; ratios engine / curve)."""
    rows = []
    for bs, g in diag.groupby("batch_size"):
        d = g[g["drafted"] & (g["drafter_prefill_ms"] == 0)]
        pl = g[~g["drafted"]]
        vr = g[g["oracle_fwd_ms"] == 0]
        rows.append({
            "batch_size": int(bs), "steps": len(g),
            "draft_fwd_over_curve": float(np.median(d["draft_fwd_ms"] / d["curve_draft_ms"])) if len(d) else np.nan,
            "draft_fwd_ms": float(np.median(d["draft_fwd_ms"])) if len(d) else np.nan,
            "curve_draft_ms": float(np.median(d["curve_draft_ms"])) if len(d) else np.nan,
            "verify_fwd_over_curve": float(np.median(vr["verify_fwd_ms"] / vr["curve_verify_ms"])) if len(vr) else np.nan,
            "draft_fwd_over_timing_curve": float(np.median(d["draft_fwd_ms"] / d["timing_curve_draft_ms"])) if len(d) else np.nan,
            "verify_fwd_over_timing_curve": float(np.median(vr["verify_fwd_ms"] / vr["timing_curve_verify_ms"])) if len(vr) else np.nan,
            "plain_verify_fwd_over_curve": float(np.median(pl["verify_fwd_ms"] / pl["curve_verify_ms"])) if len(pl) else np.nan,
            "nonforward_ms_drafted": float(np.median((d["step_ms"] - d["draft_fwd_ms"] - d["verify_fwd_ms"] - d["oracle_fwd_ms"]))) if len(d) else np.nan,
            "nonforward_ms_plain": float(np.median(pl["step_ms"] - pl["verify_fwd_ms"])) if len(pl) else np.nan,
            "first_draft_steps": int((g["drafter_prefill_ms"] > 0).sum()),
            "drafter_prefill_ms_median": float(np.median(g.loc[g["drafter_prefill_ms"] > 0, "drafter_prefill_ms"])) if (g["drafter_prefill_ms"] > 0).any() else 0.0,
            "verify_kv_len_median": float(np.median(g["verify_kv_len"])),
        })
    return pd.DataFrame(rows)


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _write_markdown(res: pd.DataFrame, summary: dict, phase: pd.DataFrame, path: Path) -> None:
    lines = ["| policy | bs | measured tok/s (engine) | simulator tok/s | error before | measured tok/s excl. drafter prefill | model tok/s | error after | speedup measured / sim / model | speedup error before / after |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for _, r in res.iterrows():
        lines.append(f"| {r.policy} | {r.batch_size} | {r.measured_tokens_per_s:.2f} | {r.sim_tokens_per_s:.2f} | {_pct(r.error_before)} | "
                     f"{r.measured_excl_drafter_prefill_tokens_per_s:.2f} | {r.model_tokens_per_s:.2f} | {_pct(r.error_after)} | "
                     f"{r.measured_speedup:.2f}x / {r.sim_speedup:.2f}x / {r.model_speedup:.2f}x | "
                     f"{_pct(r.speedup_error_before)} / {_pct(r.speedup_error_after)} |")
    s = summary
    lines += ["", "| error over all (policy, bs) | median abs | mean abs | max abs | mean signed |", "|---|---:|---:|---:|---:|"]
    for key, label in (("tokens_per_s_before", "before: simulator vs engine decode tok/s"),
                       ("tokens_per_s_sim_vs_excl_prefill", "simulator vs engine decode tok/s without the drafter's prefill"),
                       ("tokens_per_s_model1", "+ measured overhead and oracle's full verify, engine's curve, vs the same"),
                       ("tokens_per_s_after", "after: the same timed with the all-bs curve at the engine's context"),
                       ("speedup_before", "speedup over ar, before (ar rows left out)"),
                       ("speedup_after", "speedup over ar, after"),
                       ("curve_at_engine_plans", "curve at the engine's own plans vs engine decode tok/s"),
                       ("model_at_engine_plans", "model at the engine's own plans vs decode without drafter prefill")):
        e = s[key]
        lines.append(f"| {label} | {100 * e['median_abs']:.1f}% | {100 * e['mean_abs']:.1f}% | {100 * e['max_abs']:.1f}% | {_pct(e['mean_signed'])} |")
    lines += ["", "| bs | steps | draft fwd / C_draft | draft fwd ms | C_draft ms | verify fwd / C_verify | draft / all-bs C_draft | verify / all-bs C_verify | plain verify fwd / C_verify | non-forward ms (drafted) | non-forward ms (plain) | first-draft steps | drafter prefill ms (median) | kv len |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for _, r in phase.iterrows():
        lines.append(f"| {r.batch_size} | {r.steps} | {r.draft_fwd_over_curve:.2f} | {r.draft_fwd_ms:.0f} | {r.curve_draft_ms:.0f} | "
                     f"{r.verify_fwd_over_curve:.2f} | {r.draft_fwd_over_timing_curve:.2f} | {r.verify_fwd_over_timing_curve:.2f} | "
                     f"{r.plain_verify_fwd_over_curve:.2f} | {r.nonforward_ms_drafted:.1f} | "
                     f"{r.nonforward_ms_plain:.2f} | {r.first_draft_steps} | {r.drafter_prefill_ms_median:.0f} | {r.verify_kv_len_median:.0f} |")
    atomic_write_text(path, "\n".join(lines) + "\n")


def _plot(res: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2))
    panels = (("sim_tokens_per_s", "measured_tokens_per_s", "before: simulator vs engine"),
              ("model_tokens_per_s", "measured_excl_drafter_prefill_tokens_per_s",
               "after: + overhead, drafter prefill excluded"))
    for ax, (pcol, mcol, label) in zip(axes, panels):
        for policy, sub in res.groupby("policy", sort=False):
            ax.scatter(sub[mcol], sub[pcol], label=policy, s=25)
        lo = min(res[mcol].min(), res[pcol].min()) * 0.8
        hi = max(res[mcol].max(), res[pcol].max()) * 1.2
        xs = np.array([lo, hi])
        ax.plot(xs, xs, "k-", lw=0.8)
        ax.fill_between(xs, xs * 0.9, xs * 1.1, color="grey", alpha=0.2, label="+-10%")
        ax.set_xscale("log"); ax.set_yscale("log")
        ax.set_xlabel("measured decode tokens/s (SpecEngine)"); ax.set_ylabel("predicted decode tokens/s")
        ax.set_title(label, fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle("SmolLM2-135M self-speculative (B=8), this 2-core CPU, bs 1..16, 16 prompts x 24 tokens", fontsize=10)
    fig.tight_layout()
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), suffix=".png")
    plt.close(fig)


def _print(res: pd.DataFrame, summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="simulator vs SpecEngine, decode tokens/s")
    for c in ("policy", "bs", "measured", "sim", "error", "meas. excl. prefill", "model", "error", "speedup m/s/m"):
        t.add_column(c, justify="right")
    for _, r in res.iterrows():
        t.add_row(r.policy, str(r.batch_size), f"{r.measured_tokens_per_s:.2f}", f"{r.sim_tokens_per_s:.2f}",
                  _pct(r.error_before), f"{r.measured_excl_drafter_prefill_tokens_per_s:.2f}", f"{r.model_tokens_per_s:.2f}",
                  _pct(r.error_after), f"{r.measured_speedup:.2f}/{r.sim_speedup:.2f}/{r.model_speedup:.2f}")
    Console(width=150).print(t)
    keys = ("tokens_per_s_before", "tokens_per_s_sim_vs_excl_prefill", "tokens_per_s_model1", "tokens_per_s_after", "speedup_before",
            "speedup_after", "curve_at_engine_plans", "model_at_engine_plans", "replay_step_mismatch_runs",
            "trace_checks", "lossless_mismatch_runs")
    print(json.dumps({k: summary[k] for k in keys}, indent=1, default=float))


# ============================================================================ CLI
def _csv_ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="analysis/fidelity.py",
        description="Measure the real SpecEngine on this CPU and predict the same runs with the simulator.",
        epilog="example: PYTHONPATH=. nohup nice -n -5 python analysis/fidelity.py all > analysis/results/fidelity.log 2>&1 &",
    )
    p.add_argument("stage", choices=("all", "profile", "overhead", "engine", "timing-profile", "predict"),
                   help="all = profile, overhead, engine, timing-profile, predict (predict needs only their files)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="results folder (default: analysis/results for the measuring stages; "
                        f"{PREDICT_OUT.relative_to(ROOT)} for `predict`, so a comparison run never overwrites "
                        "the committed files; analysis/make_report.py passes analysis/results)")
    p.add_argument("--measurements", type=Path, default=RESULTS,
                   help="where `predict` reads the engine measurements (default: analysis/results)")
    p.add_argument("--curve", type=Path, default=CURVE, help="CPU cost curve written by `profile`, read by the others")
    p.add_argument("--context-len", type=int, default=72,
                   help="profile context length: the engine runs' mean decode context (default 72)")
    p.add_argument("--timing-curve", type=Path, default=TIMING_CURVE,
                   help="curve of every bs 1..16 at the engine's decode context, written by `timing-profile`; "
                        "the step-time model of `predict` (default: %(default)s; absent: --curve)")
    p.add_argument("--timing-context-len", type=int, default=88,
                   help="context of the timing curve: the engine steps' median kv length minus T (default 88)")
    p.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    p.add_argument("--batch-sizes", type=_csv_ints, default=list(BATCH_SIZES))
    p.add_argument("--num-prompts", type=int, default=NUM_PROMPTS)
    p.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.out_dir is None:
        args.out_dir = PREDICT_OUT if args.stage == "predict" else RESULTS
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stages = ["profile", "overhead", "engine", "timing-profile", "predict"] if args.stage == "all" else [args.stage]
    for stage in stages:
        t0 = time.time()
        {"profile": stage_profile, "overhead": stage_overhead, "engine": stage_engine,
         "timing-profile": stage_timing_profile, "predict": stage_predict}[stage](args)
        print(f"[stage] {stage} done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
