"""``dcut-drafter``: train and evaluate the DFlash block drafter of SmolLM2-135M (docs/drafters.md).

``dcut-drafter train --out DIR`` generates the data from the target, trains, and writes ``DIR``:
``config.json`` + ``model.safetensors`` (the checkpoint vLLM's ``DFlashDraftModel`` reads),
``training_curve.csv``, ``heldout.json`` and the card ``README.md``. Working state (the generated
data, the resumable checkpoint) lives in ``--work-dir``; a second run with the same settings
resumes, ``--fresh`` starts over. ``dcut-drafter eval DIR`` re-measures tau on the held-out prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

from .args import check_paths, finite_float, int_at_least, seed_type
from .errors import CliParser, UsageError, run_cli

PROG = "dcut-drafter"
DEFAULT_OUT = "drafters/smollm2-135m-dflash"


def build_parser() -> CliParser:
    from ..drafters.train import TrainSettings

    d = TrainSettings()
    p = CliParser(prog=PROG, description="Train and evaluate the DFlash block drafter of SmolLM2-135M-Instruct.",
                  formatter_class=argparse.RawDescriptionHelpFormatter,
                  epilog=("examples:\n"
                          f"  dcut-drafter train --out {DEFAULT_OUT}            # the shipped drafter (data 30-35 min on 2 cores)\n"
                          "  dcut-drafter train --out /tmp/smoke --steps 20 --max-train-prompts 8 --max-eval-prompts 4 "
                          "--max-new-tokens 32 --eval-max-new-tokens 32\n"
                          f"  dcut-drafter eval {DEFAULT_OUT}\n"))
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="generate data from the target, train, write the drafter folder and its card")
    t.add_argument("--out", default=DEFAULT_OUT, help=f"drafter folder to write (default {DEFAULT_OUT})")
    t.add_argument("--work-dir", default=None,
                   help="generated data and resumable checkpoint (default .cache/dcut-drafter/<out folder name>)")
    t.add_argument("--fresh", action="store_true", help="ignore a checkpoint and cached data in --work-dir")
    t.add_argument("--eval-prompts", default=None,
                   help="held-out prompt file (JSON lines id, category, prompt; default dcut_sched/data/traces/prompts.jsonl)")
    t.add_argument("--seed", type=seed_type, default=d.seed)
    t.add_argument("--steps", type=int_at_least(1, 1_000_000), default=d.steps)
    t.add_argument("--layers", type=int_at_least(1, 64), default=d.num_layers, help="drafter decoder layers")
    t.add_argument("--draft-vocab", type=int_at_least(0, 1_000_000), default=d.draft_vocab_size,
                   help="draft vocabulary size (0 = the target's whole vocabulary and LM head)")
    t.add_argument("--num-prompts", type=int_at_least(0, 100_000), default=d.num_generated_prompts,
                   help="templated training prompts (plus 131 HumanEval problems; docs/drafters.md, Data)")
    t.add_argument("--num-gsm8k", type=int_at_least(0, 1319), default=d.num_gsm8k, help="GSM8K training problems")
    t.add_argument("--num-mtbench", type=int_at_least(0, 40), default=d.num_mtbench,
                   help="MT-Bench two-turn training questions (math, coding, stem, humanities)")
    t.add_argument("--num-self-instruct", type=int_at_least(0, 720), default=d.num_self_instruct,
                   help="training requests the target writes from seed topics and kinds")
    t.add_argument("--num-followups", type=int_at_least(0, 100_000), default=d.num_followups,
                   help="training prompts that get a second user turn after the target's answer")
    t.add_argument("--max-new-tokens", type=int_at_least(2, 8192), default=d.max_new_tokens,
                   help="tokens generated per training prompt turn")
    t.add_argument("--eval-max-new-tokens", type=int_at_least(2, 8192), default=d.eval_max_new_tokens,
                   help="tokens generated per held-out prompt")
    t.add_argument("--lr", type=finite_float(0.0, open_low=True), default=d.lr, help="peak learning rate (> 0)")
    t.add_argument("--seqs-per-step", type=int_at_least(1, 4096), default=d.seqs_per_step)
    t.add_argument("--blocks-per-seq", type=int_at_least(1, 4096), default=d.blocks_per_seq)
    t.add_argument("--eval-every", type=int_at_least(1, 1_000_000), default=d.eval_every)
    t.add_argument("--max-train-prompts", type=int_at_least(1, 100_000), default=None, help="truncate the train prompts (smoke)")
    t.add_argument("--max-eval-prompts", type=int_at_least(1, 100_000), default=None, help="truncate the eval prompts (smoke)")
    t.add_argument("--threads", type=int_at_least(1, 1024), default=None, help="torch threads (default: torch's)")
    e = sub.add_parser("eval", help="tau of a drafter folder on the held-out prompts")
    e.add_argument("folder")
    e.add_argument("--eval-prompts", default=None,
                   help="held-out prompt file (default: the shipped prompt set, dcut_sched/data/traces/prompts.jsonl)")
    e.add_argument("--max-new-tokens", type=int_at_least(2, 8192), default=d.eval_max_new_tokens)
    e.add_argument("--max-eval-prompts", type=int_at_least(1, 100_000), default=None)
    return p


def _train(args) -> int:
    import torch

    from ..drafters.dflash import describe, save_checkpoint
    from ..drafters.train import TrainSettings, run_training
    from ..model.llama import LlamaModel
    from ..model.tokenizer import load_smollm2_tokenizer
    from ..traces.prompts import PromptError, load_prompt_records

    out = _check_out_folder(args.out)
    work = Path(args.work_dir) if args.work_dir else Path(".cache") / "dcut-drafter" / out.resolve().name
    if work.exists() and not work.is_dir():
        raise UsageError(f"--work-dir {work} is a file; give a folder for the generated data and checkpoint")
    try:
        load_prompt_records(args.eval_prompts)
    except PromptError as exc:
        raise UsageError(f"--eval-prompts: {exc}") from None
    _check_train_outputs(args, out, work)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = TrainSettings(seed=args.seed, steps=args.steps, num_layers=args.layers,
                             draft_vocab_size=args.draft_vocab or None, num_generated_prompts=args.num_prompts,
                             num_gsm8k=args.num_gsm8k, num_mtbench=args.num_mtbench,
                             num_self_instruct=args.num_self_instruct, num_followups=args.num_followups,
                             max_new_tokens=args.max_new_tokens, eval_max_new_tokens=args.eval_max_new_tokens, lr=args.lr, seqs_per_step=args.seqs_per_step,
                             blocks_per_seq=args.blocks_per_seq, eval_every=args.eval_every,
                             max_train_prompts=args.max_train_prompts, max_eval_prompts=args.max_eval_prompts)
    t0 = time.time()
    target = LlamaModel.from_smollm2()
    tok = load_smollm2_tokenizer()
    from ..atomic import missing_folders, remove_empty_folders

    made = missing_folders(work)  # the folders this run makes for its work dir
    try:
        model, state, report = run_training(settings, target=target, tokenizer=tok, work_dir=work,
                                            eval_prompts=args.eval_prompts, fresh=args.fresh)
    except BaseException:
        remove_empty_folders(made)  # a work dir holding resumable state is kept
        raise
    wall = time.time() - t0
    command = " ".join(["dcut-drafter", "train", *(shlex.quote(a) for a in args.argv)])
    meta = {"settings": settings.to_json(), "train_seconds": round(state.elapsed_s, 1), "wall_seconds": round(wall, 1),
            "torch_threads": torch.get_num_threads(), "load_at_end": os.getloadavg()[0],
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
            "command": command, **report, "evals": state.evals, "config": describe(model.config)}
    from ..atomic import all_or_none, atomic_write_text

    with all_or_none():  # weights, config, curve, report, card and plot appear together or not at all
        save_checkpoint(model, out, metadata={"dcut_sched": "dflash drafter", "seed": settings.seed})
        _write_curve(out / "training_curve.csv", state.history)
        atomic_write_text(out / "heldout.json", json.dumps(meta, indent=2) + "\n")
        _write_card(out / "README.md", meta)
        _plot_curve(out / "training_curve.png", state.history, state.evals)
    print(json.dumps({"out": str(out), "tau": report["tau"], "wall_seconds": round(wall, 1)}, indent=2))
    return 0


#: What ``train`` writes into ``--out`` (the checkpoint, the curve, the report, the card, the plot).
OUT_FILES = ("config.json", "model.safetensors", "training_curve.csv", "heldout.json", "README.md",
             "training_curve.png")


def _check_train_outputs(args, out: Path, work: Path) -> None:
    """:func:`~dcut_sched.cli.args.check_paths` for every file ``train`` writes -- the drafter files in
    ``--out`` and the data and checkpoint in ``--work-dir`` -- against the ``--eval-prompts`` input and
    each other, before the target model is loaded."""
    from ..drafters.train import DATA_NAME, STATE_NAME

    outputs = {f"--out {name}": (str(out / name), None) for name in OUT_FILES}
    data_files = (DATA_NAME, str(Path(DATA_NAME).with_suffix(".json")))  # the data and its sidecar
    outputs.update({f"--work-dir {name}": (str(work / name), None) for name in (*data_files, STATE_NAME)})
    check_paths({"--eval-prompts": args.eval_prompts}, outputs)


def _check_out_folder(text: str) -> Path:
    """``--out``: a new or empty folder, or one that already holds a DFlash drafter (a retrain), never
    another folder whose README.md or config.json the card and checkpoint would overwrite."""
    if not text.strip():
        raise UsageError("--out is empty; give a folder for the drafter, e.g. drafters/my-dflash")
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the drafter")
    if out.is_dir() and any(out.iterdir()):
        cfg = out / "config.json"
        try:
            ours = json.loads(cfg.read_text()).get("architectures") == ["DFlashDraftModel"]
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise UsageError(f"--out {out} is a folder that holds other files and no DFlash drafter; writing the "
                             "checkpoint and its README.md there would overwrite them: give a new or empty folder")
    return out


def _write_curve(path: Path, history) -> None:
    import pandas as pd

    from ..atomic import atomic_write_text

    atomic_write_text(path, pd.DataFrame(history).to_csv(index=False))


def _plot_curve(path: Path, history, evals) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from ..atomic import atomic_path

    h = pd.DataFrame(history)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    for b, g in h.groupby("block_size"):
        ax[0].plot(g["step"], g["loss"].rolling(20, min_periods=1).mean(), label=f"B={b} (20-step mean)")
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("weighted block cross-entropy (train)")
    ax[0].legend()
    if evals:
        e = pd.DataFrame(evals)
        for c in [c for c in e.columns if c.startswith("tau_")]:
            ax[1].plot(e["step"], e[c], marker="o", label=c.replace("tau_b", "B="))
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("held-out tau (subset)")
    ax[1].legend()
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def _write_card(path: Path, meta: dict) -> None:
    from ..atomic import atomic_write_text

    s, c = meta["settings"], meta["config"]
    lines = [
        "# DFlash drafter for SmolLM2-135M-Instruct",
        "",
        "Written by `dcut-drafter train`; docs/drafters.md explains the architecture and the objective.",
        "",
        "## Command",
        "",
        f"    {meta['command']}",
        "",
        f"seed {s['seed']}; {meta['torch_threads']} torch threads on {meta['machine']}; "
        f"data {meta['data_seconds']} s, training {meta['train_seconds']} s, whole command {meta['wall_seconds']} s "
        f"(1-min load average at the end {meta['load_at_end']:.2f}).",
        "",
        "## Model",
        "",
        f"- {c['num_layers']} Qwen3-type decoder layers, width {c['hidden_size']}, {c['num_heads']} heads "
        f"({c['num_kv_heads']} KV), MLP {c['intermediate_size']}; {c['params'] / 1e6:.2f} M own parameters.",
        f"- context features: target layers {c['target_layer_ids']} (their output hidden states), "
        f"{c['feature_size']} wide, projected by `fc`.",
        f"- mask token id {c['mask_token_id']}; trained at block sizes {s['block_sizes']}.",
        "- token embedding: the target's (read at run time, not stored); LM head: "
        + ("the target's." if not c.get("draft_vocab_size") else
           f"the drafter's own over a {c['draft_vocab_size']}-token draft vocabulary (the most frequent tokens of "
           "the training continuations; `d2t` maps them to target ids), started from the target's rows."),
        "",
        "## Data",
        "",
        f"- train: {meta['train_sequences']} continuations ({meta['train_tokens']} tokens, prompt included) of "
        f"conversations by source {meta['data_stats']['by_source']} ({meta['data_stats']['two_turn']} of two turns; "
        "docs/drafters.md, \"Data\"), each turn continued by the target greedily and at "
        f"T = {s['temperature']} for up to {s['max_new_tokens']} tokens; data sha256 {meta['data_sha256'][:16]}.",
        f"- held out: {meta['eval_sequences']} continuations of dcut_sched/data/traces/prompts.jsonl (80 hand-written prompts) "
        "and the 33 HumanEval problems whose index is a multiple of 5, and those of the 60 prompts of "
        "prompts-unlike.jsonl (twelve kinds absent from training), greedy and sampled the same way for up to "
        f"{s['eval_max_new_tokens']} tokens. No training prompt shares text or a template with them.",
        "",
        "## Training",
        "",
        f"{s['steps']} AdamW steps, lr {s['lr']} (warm-up {s['warmup_steps']}, cosine to 10 %), "
        f"{s['seqs_per_step']} sequences x {s['blocks_per_seq']} random anchors per step, DFlash's per-slot "
        "cross-entropy with decaying slot weights. Curve: `training_curve.csv`, `training_curve.png`.",
        "",
        "## Held-out tau (1 + mean accepted drafts per block, every anchor of every held-out continuation)",
        "",
    ]
    for title, taus in (("held-out set", meta["tau"]), ("unlike set", meta.get("tau_unlike", {}))):
        if not taus:
            continue
        cats = sorted({k for v in taus.values() for k in v})
        lines += [f"{title}:", "", "| block / continuation | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
        for key, v in taus.items():
            lines.append(f"| {key} | " + " | ".join(f"{v.get(k, float('nan')):.3f}" for k in cats) + " |")
        lines.append("")
    lines += ["", "Greedy continuations give greedy verification's acceptance; T = 0.7 continuations that of "
              "sampled verification with the same draws.", ""]
    atomic_write_text(path, "\n".join(lines))


def _eval(args) -> int:

    from ..drafters.data import (
        HUMANEVAL_EVAL_EVERY,
        continue_prompts,
        humaneval_prompts,
        sequence_features,
    )
    from ..drafters.dflash import load_checkpoint
    from ..drafters.train import acceptance, tau_summary
    from ..model.llama import LlamaModel
    from ..model.tokenizer import load_smollm2_tokenizer
    from ..traces.prompts import PromptError, load_prompt_records

    model = load_checkpoint(args.folder)
    try:
        records = load_prompt_records(args.eval_prompts)
    except PromptError as exc:
        raise UsageError(f"--eval-prompts: {exc}") from None
    he = humaneval_prompts()
    prompts = records + [p for i, p in enumerate(he) if i % HUMANEVAL_EVAL_EVERY == 0]
    target = LlamaModel.from_smollm2()
    tok = load_smollm2_tokenizer()
    if args.max_eval_prompts:
        prompts = prompts[: args.max_eval_prompts]
    seqs = continue_prompts(target, tok, prompts, max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0)
    sequence_features(target, seqs, model.config.target_layer_ids)
    embed = target.embed_tokens.weight
    out = {}
    for b in sorted({model.config.block_size, 8} - {0}, reverse=True):
        if b <= model.config.block_size:
            out[f"B{b}/greedy"] = tau_summary(acceptance(model, seqs, b, embed, embed))
    print(json.dumps(out, indent=2))
    return 0


_COMMANDS = {"train": _train, "eval": _eval}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dcut-drafter``; returns the exit code (:mod:`dcut_sched.cli.errors`)."""
    from ..drafters.dflash import DraftCheckpointError

    try:
        args = build_parser().parse_args(argv)
    except UsageError:
        return run_cli(PROG, lambda: build_parser().parse_args(argv))
    args.argv = list(sys.argv[2:] if argv is None else argv[1:])
    if getattr(args, "eval_prompts", "") is None:
        from ..paths import prompts_path

        args.eval_prompts = str(prompts_path())
    return run_cli(f"{PROG} {args.command}", lambda: _COMMANDS[args.command](args), errors=(DraftCheckpointError,))


if __name__ == "__main__":
    sys.exit(main())
