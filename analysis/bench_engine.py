"""The project's engine with the DFlash block drafter: every policy at bs 1, 2, 4, 8, 16 on this CPU.

One command (about 15 minutes on a quiet 2-core machine)::

    python analysis/bench_engine.py            # writes analysis/results/bench_engine_dflash.{csv,md}

Real SmolLM2-135M-Instruct (fp32), the shipped drafter ``drafters/smollm2-135m-dflash``, greedy,
B = 16, the first 16 prompts of ``dcut_sched/data/traces/prompts.jsonl`` (held out from the drafter's training),
``--max-new-tokens`` each. The cost-aware policies plan with the CPU curve of this drafter
(``dcut_sched/profiler/profiles/cpu-smollm2-135m-dflash-b16.json``, ``dcut-profile --cpu --draft dflash:...``).
Per run: decode tokens/s (decode tokens / decode wall time), accepted drafts per drafted step,
tokens per request-step, the keep ratio (verified slots / (bs x B)), and ``cpu_share`` = the
process's CPU time / wall time (2.0 = both cores the whole run; a run that shared the machine shows
less). The load average is recorded before and after every run; the table says whether the goal
shape (``full`` > 1.2x ``ar`` at bs 1, ``full`` below ``ar`` at some bs, ``dcut`` or ``fine`` within
2 % of max(ar, full) at every bs) is reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DRAFTER = ROOT / "drafters" / "smollm2-135m-dflash"
CURVE = ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-dflash-b16.json"
PROMPTS = ROOT / "dcut_sched" / "data" / "traces" / "prompts.jsonl"
OUT = ROOT / "analysis" / "results" / "bench_engine_dflash"
POLICIES = ("ar", "full", "dcut", "fine", "oracle", "topk", "threshold", "uniform", "smartspec", "tetris",
            "dspark", "vllm_adaptive", "dense_fallback")
BATCH_SIZES = (1, 2, 4, 8, 16)


def goal_shape(table: pd.DataFrame) -> dict[str, object]:
    """The floor benchmark's goal on a (policy x bs) table of decode tokens/s: each clause and whether it holds."""
    t = table
    bss = sorted(t.columns)
    full_over_ar_bs1 = float(t.loc["full", bss[0]] / t.loc["ar", bss[0]])
    full_below = [bs for bs in bss if t.loc["full", bs] < t.loc["ar", bs]]
    best = {bs: max(t.loc["ar", bs], t.loc["full", bs]) for bs in bss}
    adaptive = {bs: max(t.loc[p, bs] for p in ("dcut", "fine") if p in t.index) / best[bs] for bs in bss}
    return {
        "full_over_ar_at_bs1": round(full_over_ar_bs1, 3),
        "full_over_ar_at_bs1_ok": full_over_ar_bs1 > 1.2,
        "full_below_ar_at_bs": full_below,
        "full_below_ar_ok": bool(full_below),
        "best_of_dcut_fine_over_max_ar_full": {int(k): round(float(v), 3) for k, v in adaptive.items()},
        "dcut_or_fine_within_2pct_ok": all(v >= 0.98 for v in adaptive.values()),
    }


def run(args) -> int:
    import torch

    from dcut_sched.controller import RatioController
    from dcut_sched.cost_curve import CostCurve
    from dcut_sched.drafters.checkpoint import load_checkpoint
    from dcut_sched.engine import SpecEngine
    from dcut_sched.model import LlamaModel
    from dcut_sched.model.tokenizer import chat_prompt_ids, load_smollm2_tokenizer
    from dcut_sched.traces.prompts import load_prompt_records

    torch.set_num_threads(args.threads)
    model = LlamaModel.from_smollm2()
    tok = load_smollm2_tokenizer()
    drafter = load_checkpoint(args.drafter)
    curve = CostCurve.load(args.curve)
    prompts = [chat_prompt_ids(tok, p.text) for p in load_prompt_records(PROMPTS)[: args.num_prompts]]
    rows = []
    for bs in args.batch_sizes:
        for policy in args.policies:
            ctrl = RatioController(curve, args.block_size, policy=policy)
            eng = SpecEngine(model, ctrl, batch_size=bs, max_new_tokens=args.max_new_tokens, eos_id=tok.eos_id,
                             dflash=drafter)
            load0 = os.getloadavg()[0]
            c0, t0 = time.process_time(), time.perf_counter()
            res = eng.generate(prompts)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            s = res.summary()
            drafted = [st for st in res.steps if st.drafted]
            row = {"policy": policy, "batch_size": bs, "block_size": args.block_size,
                   "decode_tokens_per_s": round(s["decode_tokens_per_s"], 2), "tokens_per_s": round(s["tokens_per_s"], 2),
                   "accepted_per_drafted_step": round(float(np.mean([np.mean(st.accepted) for st in drafted])), 3)
                   if drafted else 0.0,
                   "tokens_per_request_step": round(s["tokens_per_request_step"], 3),
                   "keep_ratio": round(float(np.mean([st.ratio for st in drafted])), 3) if drafted else 0.0,
                   "drafted_steps": s["drafted_steps"], "steps": s["steps"],
                   "draft_ms": round(s["draft_ms"], 1), "verify_ms": round(s["verify_ms"], 1),
                   "plan_ms": round(s["plan_ms"], 1), "decode_ms": round(s["decode_ms"], 1),
                   "wall_s": round(wall, 2), "cpu_share": round(cpu / wall, 3),
                   "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    frame = pd.DataFrame(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from dcut_sched.util.atomic import all_or_none, atomic_write_text

    table = frame.pivot(index="policy", columns="batch_size", values="decode_tokens_per_s")
    goal = goal_shape(table)
    with all_or_none():
        atomic_write_text(out.with_suffix(".csv"), frame.to_csv(index=False))
        atomic_write_text(out.with_suffix(".json"), json.dumps({"goal": goal, "settings": {
            "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
            "block_size": args.block_size, "drafter": str(args.drafter), "curve": str(args.curve)}}, indent=2) + "\n")
        atomic_write_text(out.with_suffix(".md"), markdown(frame, goal, args))
    print(markdown(frame, goal, args))
    if args.readme:
        sys.path.insert(0, str(ROOT / "analysis"))
        from readme_blocks import replace_block

        replace_block("engine-dflash", markdown(frame, goal, args))
    return 0


#: Prompt sets of ``--rounds``: the held-out prompts, and prompts of kinds unlike the drafter's training
PROMPT_SETS = {"heldout": PROMPTS, "unlike": ROOT / "dcut_sched" / "data" / "traces" / "prompts-unlike.jsonl"}
ROUND_POLICIES = ("ar", "full", "dcut", "fine")


def repo_relative(path: str | Path) -> str:
    """``path`` relative to the repository where it lies inside it (as result files name inputs), else
    absolute."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def engine_wave(model, drafter, curve, policy, prompts, max_new_tokens: int, block_size: int):
    """One wave of ``prompts`` (token ids) in the project's engine with the DFlash ``drafter``, planned by
    ``policy`` (a name or a policy) on ``curve``, calibration from the drafter's prior. Returns (decode
    tokens/s, drafted steps, steps, accepted drafts per step, cpu_share = process CPU / wall time, and
    the outputs, as a dict; the controller, for its policy's state)."""
    from dcut_sched.controller import RatioController
    from dcut_sched.engine import SpecEngine

    ctrl = RatioController(curve, block_size, policy=policy, calibration_prior=drafter.calibration_prior)
    eng = SpecEngine(model, ctrl, batch_size=len(prompts), max_new_tokens=max_new_tokens, dflash=drafter)
    c0, t0 = time.process_time(), time.perf_counter()
    res = eng.generate(prompts)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = res.summary()
    return ({"tokens_per_s": s["decode_tokens_per_s"], "drafted_steps": s["drafted_steps"], "steps": s["steps"],
             "accepted_per_step": s["accepted_per_step"], "cpu_share": cpu / wall, "outputs": res.outputs}, ctrl)


def run_rounds(args) -> int:
    """The floor benchmark (analysis/rounds.py): per prompt set and bs, one wave of the set's first bs
    prompts x ``--max-new-tokens`` per run, ``--rounds`` interleaved rounds of ``--policies`` (``ar``,
    plain decoding, in every round), a warm-up run first. Writes ``bench_engine_rounds{_runs}.csv``
    and ``bench_engine_rounds.md`` beside ``--out``."""
    policies = [p for p in args.policies if p in POLICIES] or list(ROUND_POLICIES)
    missing = [p for p in ("ar", "full", "fine") if p not in policies]
    if missing:  # the summary compares fine with ar and full: refuse before the first run, not after the last
        raise SystemExit(f"bench_engine.py --rounds: --policies must include ar, full and fine (missing {missing})")
    import torch

    from dcut_sched.cost_curve import CostCurve
    from dcut_sched.drafters.checkpoint import load_checkpoint
    from dcut_sched.model import LlamaModel
    from dcut_sched.model.tokenizer import chat_prompt_ids, load_smollm2_tokenizer
    from dcut_sched.traces.prompts import load_prompt_records

    sys.path.insert(0, str(ROOT / "analysis"))
    from rounds import floor_summary, rotated, summary_markdown

    torch.set_num_threads(args.threads)
    model = LlamaModel.from_smollm2()
    tok = load_smollm2_tokenizer()
    drafter = load_checkpoint(args.drafter)
    curve = CostCurve.load(args.curve)
    curve_path = Path(args.curve).resolve()
    curve_name = repo_relative(curve_path)

    def one(policy: str, prompts) -> dict:
        return engine_wave(model, drafter, curve, policy, prompts, args.max_new_tokens, args.block_size)[0]

    rows = []
    for pset in args.prompt_sets:
        records = load_prompt_records(PROMPT_SETS[pset])
        for bs in args.batch_sizes:
            prompts = [chat_prompt_ids(tok, p.text) for p in records[:bs]]
            one("ar", prompts[:1])  # warm-up
            load0 = round(os.getloadavg()[0], 2)
            base = None
            for r in range(args.rounds):
                for policy in rotated(policies, r):
                    out = one(policy, prompts)
                    base = out["outputs"] if base is None and policy == "ar" else base
                    rows.append({"prompt_set": pset, "batch_size": bs, "round": r, "config": policy,
                                 **{k: v for k, v in out.items() if k != "outputs"}, "outputs": out["outputs"],
                                 "load_start": load0, "curve": curve_name})
            for row in rows:
                if row["prompt_set"] == pset and row["batch_size"] == bs and "outputs" in row:
                    row["lossless"] = row.pop("outputs") == base
                    row["load_end"] = round(os.getloadavg()[0], 2)
            print(f"rounds {pset} bs {bs}: done (load {load0} -> {os.getloadavg()[0]:.2f})", flush=True)
    frame = pd.DataFrame(rows)
    summary = floor_summary(frame, "fine", ("ar", "full"), "ar")
    out = Path(args.out).parent
    from dcut_sched.util.atomic import all_or_none, atomic_write_text

    md = ["# The project's engine: D-Cut against plain decoding and full verification", "",
          f"SmolLM2-135M fp32, the DFlash drafter ({args.drafter.name}), B = {args.block_size}, one wave of bs "
          f"prompts x {args.max_new_tokens} greedy tokens, {args.threads} torch threads, {args.rounds} interleaved "
          f"rounds (policies in rotating order, `ar` = plain decoding in every round, a warm-up run first); defaults "
          f"of every policy (calibration on, from the drafter's prior where it has one); the cost-aware policies "
          f"plan with the curve `{curve_name}` ({curve.hardware.get('device_name', 'device not recorded')}).", "",
          summary_markdown(summary, "fine", ("ar", "full"), policies),
          f"cpu_share per run: min {frame.cpu_share.min():.2f}, median {frame.cpu_share.median():.2f}; 1-min load "
          f"{frame.load_start.min():.2f}-{frame.load_end.max():.2f}; every run lossless: {bool(frame.lossless.all())}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; `python analysis/bench_engine.py --rounds "
          f"{args.rounds} --max-new-tokens {args.max_new_tokens}"
          f"{'' if curve_path == CURVE.resolve() else f' --curve {curve_name}'}` regenerates this file."]
    with all_or_none():
        atomic_write_text(out / "bench_engine_rounds_runs.csv", frame.to_csv(index=False))
        atomic_write_text(out / "bench_engine_rounds.csv", summary.to_csv(index=False))
        atomic_write_text(out / "bench_engine_rounds.md", "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def markdown(frame: pd.DataFrame, goal: dict, args) -> str:
    order = [p for p in POLICIES if p in set(frame["policy"])]
    tps = frame.pivot(index="policy", columns="batch_size", values="decode_tokens_per_s").loc[order]
    ar = tps.loc["ar"]
    lines = [f"Decode tokens/s (speedup over `ar`), B = {args.block_size}, {args.num_prompts} held-out prompts x "
             f"{args.max_new_tokens} new tokens, {args.threads} torch threads:", "",
             "| policy | " + " | ".join(f"bs {b}" for b in tps.columns) + " |",
             "|---|" + "---:|" * len(tps.columns)]
    for p, r in tps.iterrows():
        lines.append(f"| `{p}` | " + " | ".join(f"{v:.1f} ({v / ar[b]:.2f}x)" for b, v in r.items()) + " |")
    acc = frame.pivot(index="policy", columns="batch_size", values="accepted_per_drafted_step").loc[order]
    keep = frame.pivot(index="policy", columns="batch_size", values="keep_ratio").loc[order]
    lines += ["", "Accepted drafts per drafted request-step / keep ratio (verified slots / (bs x B)):", "",
              "| policy | " + " | ".join(f"bs {b}" for b in tps.columns) + " |", "|---|" + "---:|" * len(tps.columns)]
    for p in order:
        lines.append(f"| `{p}` | " + " | ".join(f"{acc.loc[p, b]:.2f} / {keep.loc[p, b]:.2f}" for b in tps.columns) + " |")
    share = frame["cpu_share"]
    lines += ["", f"cpu_share per run: min {share.min():.2f}, median {share.median():.2f}, max {share.max():.2f}; "
              f"load average before the runs {frame['load_before'].min():.2f}-{frame['load_before'].max():.2f}.", "",
              "Goal shape: " + json.dumps(goal), ""]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", type=Path, default=DRAFTER)
    p.add_argument("--curve", type=Path, default=CURVE)
    p.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(BATCH_SIZES))
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(OUT), help="output stem (.csv, .json, .md are written)")
    p.add_argument("--readme", action="store_true", help="also regenerate the engine-dflash block (docs/benchmarks.md)")
    p.add_argument("--rounds", type=int, default=0,
                   help="run the interleaved floor benchmark instead (>= 2 rounds; policies default to "
                        f"{','.join(ROUND_POLICIES)}; analysis/rounds.py) [0: the one-pass table]")
    p.add_argument("--prompt-sets", type=lambda s: [x for x in s.split(",") if x], default=list(PROMPT_SETS),
                   help=f"--rounds: comma list of {', '.join(PROMPT_SETS)} [all]")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rounds:
        if args.rounds < 2 or set(args.prompt_sets) - set(PROMPT_SETS) or not args.prompt_sets:
            parser.error(f"--rounds must be >= 2 and --prompt-sets from {', '.join(PROMPT_SETS)}")
        if args.policies == list(POLICIES):
            args.policies = list(ROUND_POLICIES)
        return run_rounds(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
