"""What an undrafted step costs inside a speculative engine, against a plain-decoding engine's step.

A speculative engine whose policy decides not to draft (``fine``'s plain stretches) must not pay for
speculation: the goal is an undrafted step of at most 1.02x the plain-decoding engine's step at the
same batch size (docs/vllm.md, "The undrafted step"; docs/drafters.md, "In the engine"). Both engines,
real SmolLM2-135M-Instruct (fp32), the shipped DFlash drafter, greedy, B = 8, one wave of ``bs``
held-out prompts (dcut_sched/data/traces/prompts.jsonl) per run:

- **vLLM 0.32.0** (its own environment): ``plain`` = vLLM without speculation; ``context`` = vLLM +
  D-Cut with ``fine`` made never to draft after its first step, the undrafted steps running the
  context-only drafter pass, deferred to the next drafted pass or a full KV-cache block (the defaults);
  ``context-write`` = the same pass written on every undrafted step (``defer_undrafted_context:
  false``); ``block`` = vLLM's own pass (``skip_undrafted_block: false``: the context update and a
  drafter forward over every anchor).
  Step times from :class:`~dcut_sched.integrations.vllm_tools.engine_steps.StepTimer`.
- **The project's engine**: ``plain`` = ``ar`` (plain decoding, no drafter context); ``context`` =
  the same never-drafting ``fine`` with the DFlash drafter, whose undrafted step runs the target
  forward with feature capture and the drafter's context update (``upkeep_ms``: the time in
  :func:`~dcut_sched.engine.decode_step.committed_features` and
  :meth:`~dcut_sched.drafters.runtime.DFlashDrafter.extend_flat`).

Noise is handled by the protocol, not by hope: ``--rounds`` interleaved rounds, the configurations of
a batch size in rotating order in each round, a throwaway warm-up run first; per run the median
decode step (undrafted steps only for ``context``/``block``); per round the ratio to that round's
``plain``; reported: the median ratio over rounds and its min-max spread, each run's ``cpu_share``
(process CPU time / wall time; 2.0 = both cores) and the 1-min load before and after. The same
ratio of each run's fastest decile (10th-percentile step) is reported beside it: robust to stalls
inside a run, not to the host's speed drifting between runs. The goal per cell: met when every
round's median ratio is within it, missed when none is, undecided otherwise.

    python analysis/bench_undrafted.py                     # both engines, bs 1,2,4,8,16, 3 rounds
    python analysis/bench_undrafted.py --engines own --rounds 5 --batch-sizes 1,16

Writes, replacing them, ``undrafted_step.md`` (the tables), ``undrafted_step.csv`` (per cell) and
``undrafted_step_runs.csv`` (per run) under ``--out-dir`` [analysis/results]. ``vllm`` needs the vLLM
environment (``DCUT_WITH_VLLM=1 bash scripts/install.sh``). Both engines at 5 rounds take about 20 min
on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DRAFTER = REPO / "drafters" / "smollm2-135m-dflash"
PROMPTS = REPO / "dcut_sched" / "data" / "traces" / "prompts.jsonl"
VLLM_CURVE = REPO / "analysis" / "results" / "vllm-dflash" / "vllm-cpu-smollm2-135m-dflash-b8.json"
OWN_CURVE = REPO / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-dflash-b16.json"
BLOCK_SIZE = 8
#: ``fine`` that drafts its first step and then never again (the margin is out of reach, no probe)
NEVER_DRAFT = {"speculate_margin": 1000.0, "probe_budget": 1e-6}
GOAL = 1.02


def _rotate(items: Sequence[str], k: int) -> list[str]:
    k %= len(items)
    return list(items[k:]) + list(items[:k])


def _p10(step_ms: Sequence[float]) -> float:
    """The 10th-percentile step (NaN for a run without the kind of step asked for)."""
    return float(np.percentile(step_ms, 10)) if len(step_ms) else float("nan")


def _verdict(ratio: np.ndarray) -> str:
    """The goal per cell: ``met`` when every round is within it, ``missed`` when none is."""
    return "met" if (ratio <= GOAL).all() else "missed" if (ratio > GOAL).all() else "undecided"


def _loadavg() -> float:
    return round(os.getloadavg()[0], 2)


# ------------------------------------------------------------------ vLLM
def vllm_wave(target: Path, bs: int, max_tokens: int, runs: list[dict]) -> dict:
    """Run the engines ``runs`` in order, each over one wave of ``bs`` held-out prompts x ``max_tokens``
    greedy tokens (B = ``BLOCK_SIZE``, step-timed), in one process of the vLLM environment; return the
    driver's result. Raises ``RuntimeError`` with the driver's stderr when it fails."""
    from dcut_sched.integrations.vllm_tools.venv import cpu_env, venv_python

    job = {"target": str(target), "draft": f"dflash:{DRAFTER}", "block_size": BLOCK_SIZE,
           "prompts": {"file": str(PROMPTS), "n": bs, "chat": True}, "max_tokens": max_tokens,
           "max_num_seqs": bs, "max_model_len": 1024, "runs": runs, "step_timing": True}
    with tempfile.TemporaryDirectory() as tmp:
        jf, rf = Path(tmp) / "job.json", Path(tmp) / "out.json"
        jf.write_text(json.dumps(job))
        proc = subprocess.run([str(venv_python()), "-m", "dcut_sched.cli.vllm_run", "--job", str(jf),
                               "--out", str(rf)], cwd=REPO, env=cpu_env(), capture_output=True, text=True,
                              timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM bs {bs}: driver exited {proc.returncode}\n{proc.stderr[-3000:]}")
        return json.loads(rf.read_text())


def vllm_rows(batch_sizes: Sequence[int], rounds: int, max_tokens: int) -> list[dict]:
    from dcut_sched.integrations.vllm_tools.checkpoint import write_pair

    target, _ = write_pair()
    configs = ("plain", "context", "context-write", "block")
    settings = {"context": {}, "context-write": {"defer_undrafted_context": False},
                "block": {"skip_undrafted_block": False}}
    rows: list[dict] = []
    for bs in batch_sizes:
        runs = [{"name": "warmup", "dcut": None}]
        for r in range(rounds):
            for name in _rotate(configs, r + bs):
                dcut = None if name == "plain" else {
                    "policy": "fine", "policy_params": NEVER_DRAFT, "cost_curve": str(VLLM_CURVE),
                    "log_interval_s": 600.0, **settings[name]}
                runs.append({"name": f"{name}#{r}", "dcut": dcut})
        load0 = _loadavg()
        res = vllm_wave(target, bs, max_tokens, runs)
        load1 = _loadavg()
        base = res["runs"][0]["token_ids"]
        for run in res["runs"][1:]:
            if "error" in run:
                raise RuntimeError(f"vLLM bs {bs} {run['name']}: {run['error']['message']}")
            name, r = run["name"].split("#")
            kind = "plain" if name == "plain" else "undrafted"
            steps = [s for s in run["steps"] if s["kind"] == kind and s["num_requests"] == bs]
            rows.append({"engine": "vllm", "batch_size": bs, "round": int(r), "config": name,
                         "step_ms": float(np.median([s["step_ms"] for s in steps])),
                         "step_p10_ms": _p10([s["step_ms"] for s in steps]), "steps": len(steps),
                         "upkeep_ms": float(np.median([s["propose_ms"] for s in steps])) if kind != "plain" else 0.0,
                         "cpu_share": run["generate_cpu_s"] / run["generate_s"], "lossless": run["token_ids"] == base,
                         "load_start": load0, "load_end": load1})
        print(f"vllm bs {bs}: done (load {load0} -> {load1})", flush=True)
    return rows


# ------------------------------------------------------------------ the project's engine
def own_rows(batch_sizes: Sequence[int], rounds: int, max_tokens: int, threads: int) -> list[dict]:
    import torch

    from dcut_sched.controller import RatioController
    from dcut_sched.cost_curve import CostCurve
    from dcut_sched.drafters import runtime
    from dcut_sched.drafters.checkpoint import load_checkpoint
    from dcut_sched.engine import SpecEngine, decode_step
    from dcut_sched.model import LlamaModel
    from dcut_sched.model.tokenizer import chat_prompt_ids, load_smollm2_tokenizer
    from dcut_sched.traces.prompts import load_prompt_records

    torch.set_num_threads(threads)
    model = LlamaModel.from_smollm2()
    tok = load_smollm2_tokenizer()
    drafter = load_checkpoint(DRAFTER)
    curve = CostCurve.load(OWN_CURVE)
    prompts = [chat_prompt_ids(tok, p.text) for p in load_prompt_records(PROMPTS)[: max(batch_sizes)]]
    upkeep = {"ms": 0.0}

    def timed(fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                upkeep["ms"] += (time.perf_counter() - t) * 1e3
        return wrapper

    # the upkeep of a step: picking the committed slots' features and the drafter's context update
    runtime.DFlashDrafter.extend_flat = timed(runtime.DFlashDrafter.extend_flat)
    decode_step.committed_features = timed(decode_step.committed_features)

    def run(name: str, bs: int) -> dict:
        policy, params = ("ar", {}) if name == "plain" else ("fine", NEVER_DRAFT)
        ctrl = RatioController(curve, 16, policy, **params)
        per_step: list[float] = []

        def on_step(rec):
            per_step.append(upkeep["ms"])
            upkeep["ms"] = 0.0

        eng = SpecEngine(model, ctrl, batch_size=bs, max_new_tokens=max_tokens, dflash=drafter)
        c0, t0 = time.process_time(), time.perf_counter()
        res = eng.generate(prompts[:bs], on_step=on_step)
        cpu_share = (time.process_time() - c0) / (time.perf_counter() - t0)
        keep = [i for i, s in enumerate(res.steps) if not s.drafted and s.batch_size == bs]
        step = [res.steps[i].draft_ms + res.steps[i].plan_ms + res.steps[i].verify_ms for i in keep]
        return {"step_ms": float(np.median(step)), "step_p10_ms": _p10(step), "steps": len(keep),
                "upkeep_ms": float(np.median([per_step[i] for i in keep])), "cpu_share": cpu_share,
                "outputs": res.outputs}

    run("plain", 1)  # warm-up (a first run can be slow)
    rows: list[dict] = []
    for bs in batch_sizes:
        load0 = _loadavg()
        base = None
        for r in range(rounds):
            for name in _rotate(("plain", "context"), r + bs):
                out = run(name, bs)
                base = out["outputs"] if base is None and name == "plain" else base
                rows.append({"engine": "own", "batch_size": bs, "round": r, "config": name,
                             **{k: v for k, v in out.items() if k != "outputs"}, "outputs": out["outputs"],
                             "load_start": load0})
        for row in rows:
            if row["engine"] == "own" and row["batch_size"] == bs:
                row["lossless"] = row.pop("outputs") == base
                row["load_end"] = _loadavg()
        print(f"own bs {bs}: done (load {load0} -> {_loadavg()})", flush=True)
    return rows


# ------------------------------------------------------------------ report
def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, bs, config): the median over rounds of the step ratio to the round's ``plain``,
    its min and max, and the median step and upkeep ms; the goal verdict for ``context``."""
    by_round = frame[frame.config == "plain"].set_index(["engine", "batch_size", "round"]).sort_index()
    plain, plain_p10 = by_round["step_ms"], by_round["step_p10_ms"]
    out = []
    for (engine, bs, config), g in frame[frame.config != "plain"].groupby(["engine", "batch_size", "config"]):
        ratio = np.array([row.step_ms / plain[(engine, bs, row["round"])] for _, row in g.iterrows()])
        ratio_p10 = np.array([row.step_p10_ms / plain_p10[(engine, bs, row["round"])] for _, row in g.iterrows()])
        base = plain.loc[(engine, bs)]
        out.append({"engine": engine, "batch_size": bs, "config": config,
                    "plain_step_ms": float(np.median(base)), "step_ms": float(g.step_ms.median()),
                    "ratio_median": float(np.median(ratio)), "ratio_min": float(ratio.min()),
                    "ratio_max": float(ratio.max()), "ratio_p10_median": float(np.median(ratio_p10)),
                    "ratio_p10_min": float(ratio_p10.min()), "ratio_p10_max": float(ratio_p10.max()), "upkeep_ms": float(g.upkeep_ms.median()),
                    "upkeep_share": float(g.upkeep_ms.median() / np.median(base)),
                    "rounds": int(len(g)), "goal": _verdict(ratio) if config == "context" else None})
    return pd.DataFrame(out)


def _table(summary: pd.DataFrame, batch_sizes: Sequence[int], cell) -> list[str]:
    """Markdown rows: one per (engine, pass), ``cell(row)`` per batch size (blank where none)."""
    lines = ["| engine | pass | " + " | ".join(f"bs {bs}" for bs in batch_sizes) + " |",
             "|---|---|" + "---:|" * len(batch_sizes)]
    for (engine, config), g in summary.groupby(["engine", "config"], sort=False):
        cells = [cell(hit.iloc[0]) if not (hit := g[g.batch_size == bs]).empty else "" for bs in batch_sizes]
        lines.append(f"| {engine} | `{config}` | " + " | ".join(cells) + " |")
    return lines


def markdown(summary: pd.DataFrame, frame: pd.DataFrame, args) -> str:
    lines = [f"Undrafted step / plain-decoding step, median over {args.rounds} interleaved rounds (min-max), "
             f"B = {BLOCK_SIZE} (vLLM) and 16 (the project's engine, its curve), {args.max_tokens} new tokens per request, greedy; goal <= {GOAL}x for `context`.", ""]
    lines += _table(summary, args.batch_sizes, lambda h: f"{h.ratio_median:.3f} ({h.ratio_min:.3f}-{h.ratio_max:.3f})")
    lines += ["", "The same ratio of each run's fastest decile (10th-percentile step: robust to stalls inside a "
              "run, not to the host's speed drifting between runs):", ""]
    lines += _table(summary, args.batch_sizes,
                    lambda h: f"{h.ratio_p10_median:.3f} ({h.ratio_p10_min:.3f}-{h.ratio_p10_max:.3f})")
    lines += ["", "Plain step and the undrafted step's context upkeep (median ms; share of the plain step):", ""]
    lines += _table(summary, args.batch_sizes,
                    lambda h: f"{h.plain_step_ms:.1f} / {h.upkeep_ms:.2f} ({100 * h.upkeep_share:.1f} %)")
    lines += ["", "`upkeep` is, for vLLM, the drafter's whole `propose` in an undrafted step; for the project's "
              "engine, the committed slots' feature gather and the drafter's context update.", "",
              f"cpu_share per run: min {frame.cpu_share.min():.2f}, median {frame.cpu_share.median():.2f}; "
              f"1-min load {frame.load_start.min():.2f}-{frame.load_end.max():.2f}; every run lossless: "
              f"{bool(frame.lossless.all())}; {args.measured}; `{args.command}` regenerates this file."]
    goal = summary[summary.config == "context"]
    lines.append(f"Goal (<= {GOAL}x at every bs, both engines; per cell met when every round is within it, "
                 f"missed when none is, otherwise undecided): "
                 + "; ".join(f"**{v}** at " + ", ".join(f"{r.engine} bs {r.batch_size} ({r.ratio_median:.3f} "
                                                       f"[{r.ratio_min:.3f}-{r.ratio_max:.3f}])"
                                                       for r in goal.itertuples() if r.goal == v)
                             for v in ("met", "undecided", "missed") if (goal.goal == v).any()))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: python analysis/bench_undrafted.py --engines own --rounds 5")
    ap.add_argument("--engines", default="vllm,own", help="comma list of vllm, own [vllm,own]")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16", help="comma list [1,2,4,8,16]")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 2) [3]")
    ap.add_argument("--max-tokens", type=int, default=48, help="new tokens per request [48]")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the project's engine [2]")
    ap.add_argument("--out-dir", type=Path, default=REPO / "analysis" / "results", help="[analysis/results]")
    args = ap.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - {"vllm", "own"}:
        ap.error(f"--engines: give vllm and/or own, not {args.engines!r}")
    try:
        args.batch_sizes = sorted({int(x) for x in args.batch_sizes.split(",")})
    except ValueError:
        ap.error(f"--batch-sizes: comma-separated integers, not {args.batch_sizes!r}")
    if min(args.batch_sizes) < 1 or max(args.batch_sizes) > 64:
        ap.error("--batch-sizes: each in 1..64")
    if args.rounds < 2 or args.max_tokens < 8:
        ap.error("--rounds must be >= 2 and --max-tokens >= 8")
    argv_used = list(sys.argv[1:] if argv is None else argv)
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    rows = []
    if "vllm" in engines:
        rows += vllm_rows(args.batch_sizes, args.rounds, args.max_tokens)
    if "own" in engines:
        rows += own_rows(args.batch_sizes, args.rounds, args.max_tokens, args.threads)
    args.measured = f"{started}-{time.strftime('%H:%M UTC', time.gmtime())}"
    args.command = "python analysis/bench_undrafted.py" + ("" if not argv_used else " " + shlex.join(argv_used))
    frame = pd.DataFrame(rows)
    summary = summarize(frame)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out_dir / "undrafted_step_runs.csv", index=False)
    summary.to_csv(args.out_dir / "undrafted_step.csv", index=False)
    text = markdown(summary, frame, args)
    (args.out_dir / "undrafted_step.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
