"""What buys tau: the DFlash drafter's training choices compared on one fixed short budget.

Every arm trains from the same cached data (one ``data.pt``, generated once with the default data
settings) for the same number of steps and seed, then reports tau on both held-out sets (the
project's held-out prompts and the ``unlike`` kinds) on greedy continuations at B = 16 and 8, the
mean training loss of the last 20 steps (each arm's own loss, so comparable only between arms of
one loss) and the draft step's ms (one block forward at bs 8, B = 16, 256 tokens of context). One arm changes one setting from the base.

    python analysis/drafter_ablation.py --steps 240            # all arms, ~4 min each on 2 cores
    python analysis/drafter_ablation.py --arms base,init-target --steps 240
    python analysis/drafter_ablation.py --stage data           # only generate the shared data

Writes ``analysis/results/drafter_ablation.{csv,md,json}`` (all or none), one row per arm.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from dcut_sched.drafters.datagen import load_or_generate
from dcut_sched.drafters.heldout import acceptance, tau_summary
from dcut_sched.drafters.train import DATA_NAME, TrainSettings, data_config, run_training
from dcut_sched.model.llama import LlamaModel
from dcut_sched.model.tokenizer import load_smollm2_tokenizer
from dcut_sched.paths import prompts_path
from dcut_sched.util.atomic import all_or_none, atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "analysis" / "results"

#: arm name -> the settings it changes from the base (TrainSettings defaults, the run's --steps)
ARMS: dict[str, dict] = {
    "base": {},
    "init-target": {"init": "target"},
    "kl": {"loss": "kl"},
    "lk": {"loss": "lk"},
    "tv": {"loss": "tv"},
    "vocab-4096": {"draft_vocab_size": 4096},
    "layers-3": {"num_layers": 3},
    "lr-3e-3": {"lr": 3e-3},
    "constant-lr": {"lr_schedule": "constant"},
    "init-target+kl": {"init": "target", "loss": "kl"},
    "init-target+lk": {"init": "target", "loss": "lk"},
}


def log(msg: str) -> None:
    print(f"[ablation {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def draft_step_ms(model, target, bs: int = 8, block_size: int = 16, context: int = 256, reps: int = 15) -> float:
    """Median ms of one block forward (context K/V of ``context`` tokens included) at ``bs``."""
    feats = torch.randn(bs, context, model.config.feature_size)
    tokens = torch.randint(0, model.config.vocab_size, (bs, context))
    anchors = torch.full((bs, 1), context - 1)
    embed = target.embed_tokens.weight.detach()
    times = []
    with torch.inference_mode():
        for _ in range(reps):
            t0 = time.perf_counter()
            model.training_logits(feats, tokens, anchors, block_size, embed, embed)
            times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times[3:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--stage", choices=("data", "arms"), default="arms")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated arm names (default all)")
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work-root", default=str(ROOT / ".cache" / "dcut-drafter" / "ablation"))
    ap.add_argument("--out-stem", default=str(RESULTS / "drafter_ablation"))
    args = ap.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"--arms: unknown {unknown}; known: {', '.join(ARMS)}")
    root = Path(args.work_root)
    root.mkdir(parents=True, exist_ok=True)
    target = LlamaModel.from_smollm2()
    tok = load_smollm2_tokenizer()
    base = TrainSettings(seed=args.seed, steps=args.steps)
    shared = root / DATA_NAME
    t0 = time.time()
    data = load_or_generate(data_config(base, prompts_path(), target.config), target, tok, shared, log=log)
    log(f"data ready ({time.time() - t0:.0f} s): {len(data['train'])} train sequences")
    if args.stage == "data":
        return 0
    rows = []
    for arm in arms:
        settings = dataclasses.replace(base, **ARMS[arm], eval_every=args.steps)
        work = root / arm
        if work.exists():
            shutil.rmtree(work)  # a fresh arm: the budget is the same for every arm
        work.mkdir()
        os.link(shared, work / DATA_NAME)
        shutil.copy(shared.with_suffix(".json"), work / Path(DATA_NAME).with_suffix(".json"))
        log(f"arm {arm}: {ARMS[arm] or 'the base'}")
        t_arm = time.time()
        model, state, _ = run_training(settings, target=target, tokenizer=tok, work_dir=work,
                                       eval_prompts=prompts_path(), fresh=False, log=log, evaluate=False)
        ce = [h["loss"] for h in state.history[-20:]]
        row = {"arm": arm, "change": json.dumps(ARMS[arm]) if ARMS[arm] else "-", "steps": args.steps,
               "train_s": round(state.elapsed_s, 1), "final_loss_20": round(statistics.mean(ce), 3)}
        embed = target.embed_tokens.weight.detach()
        for b in (16, 8):
            for name, split in (("heldout", "eval"), ("unlike", "eval_unlike")):
                greedy = [q for q in data[split] if q.mode == "greedy"]
                row[f"tau_b{b}_{name}"] = round(tau_summary(acceptance(model, greedy, b, embed, embed))["all"], 3)
        row["draft_ms_bs8_b16"] = round(draft_step_ms(model, target), 2)
        row["arm_wall_s"] = round(time.time() - t_arm, 1)
        row["load_1m"] = round(os.getloadavg()[0], 2)
        rows.append(row)
        log(f"arm {arm}: {row}")
        shutil.rmtree(work)
    df = pd.DataFrame(rows)
    stem = Path(args.out_stem)
    meta = {"command": " ".join(["python", "analysis/drafter_ablation.py", *(argv or sys.argv[1:])]),
            "data_sha256": data["sha256"], "base": base.to_json(), "torch_threads": torch.get_num_threads(),
            "machine": f"{os.cpu_count()} cpus", "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "rows": rows}
    with all_or_none():
        atomic_write_text(stem.with_suffix(".csv"), df.to_csv(index=False))
        atomic_write_text(stem.with_suffix(".json"), json.dumps(meta, indent=2) + "\n")
        atomic_write_text(stem.with_suffix(".md"), "# DFlash drafter ablation\n\n" + f"`{meta['command']}`, "
                          f"{meta['finished']}, data {data['sha256'][:12]}, seed {args.seed}.\n\n"
                          + df.to_markdown(index=False) + "\n")
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
