"""``dcut-drafter``: train, evaluate and calibrate the DFlash block drafter of SmolLM2-135M (docs/drafters.md).

``train --out DIR`` writes the checkpoint, the curve, the held-out report and the card
(:mod:`.drafter_card`) into ``DIR``, swapped in whole; its data and resumable checkpoint live in the
locked ``--work-dir``, and a run of other settings is refused naming the field (``--fresh`` starts
over). ``eval DIR`` re-measures tau; ``calibrate --draft DIR`` fits ``DIR/calibration.json``.
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

from ..util.inputs import read_text
from .args import MAX_SEED, check_paths, finite_float, int_at_least, path_arg, seed_type
from .drafter_card import plot_curve, write_card, write_curve
from .errors import CliParser, UsageError, run_cli

PROG = "dcut-drafter"
DEFAULT_OUT = "drafters/smollm2-135m-dflash"


def build_parser() -> CliParser:
    from ..drafters.train import INITS, LOSSES, LR_SCHEDULES, TrainSettings

    d = TrainSettings()
    p = CliParser(prog=PROG, description="Train and evaluate the DFlash block drafter of SmolLM2-135M-Instruct.",
                  formatter_class=argparse.RawDescriptionHelpFormatter,
                  epilog=("examples:\n"
                          f"  dcut-drafter train --out {DEFAULT_OUT}            # the shipped drafter (data: estimated 30-35 min "
                          "on 2 free cores, 67 min measured on shared ones; docs/drafters.md, Budget)\n"
                          "  dcut-drafter train --out /tmp/smoke --steps 20 --max-train-prompts 8 --max-eval-prompts 4 "
                          "--max-new-tokens 32 --eval-max-new-tokens 32\n"
                          f"  dcut-drafter eval {DEFAULT_OUT} --max-eval-prompts 4 --max-new-tokens 16 --threads 1   # tau table, seconds\n"
                          f"  dcut-drafter calibrate --draft {DEFAULT_OUT} --out /tmp/prior.json   # refit its prior "
                          "(~7 min on 2 cores)\n"))
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="generate data from the target, train, write the drafter folder and its card")
    t.add_argument("--out", default=None,
                   help=f"drafter folder to write (default {DEFAULT_OUT}, which must then be new or empty: a drafter "
                        "already there is replaced only when --out names it)")
    t.add_argument("--work-dir", default=None, type=path_arg,
                   help="generated data and resumable checkpoint (default .cache/dcut-drafter/<out folder name>)")
    t.add_argument("--fresh", action="store_true",
                   help="ignore a checkpoint and cached data in --work-dir, and replace a drafter of other settings "
                        "in --out (without it, either of other settings is refused)")
    t.add_argument("--eval-prompts", default=None,
                   help="held-out prompt file (JSON lines id, category, prompt; default dcut_sched/data/traces/prompts.jsonl)")
    t.add_argument("--seed", type=seed_type, default=d.seed,
                   help="seeds the prompt generator, the sampled continuations, the initial weights and the draws of "
                        "sequences and anchors (default: %(default)s)")
    t.add_argument("--steps", type=int_at_least(1, 1_000_000), default=d.steps, help="optimisation steps (default: %(default)s)")
    t.add_argument("--layers", type=int_at_least(1, 64), default=d.num_layers, help="drafter decoder layers (default: %(default)s)")
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
    t.add_argument("--lr", type=finite_float(1e-7, 1.0), default=d.lr,
                   help="peak learning rate, in [1e-7, 1] (below 1e-7 the drafter would not move from its init)")
    t.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=d.lr_schedule,
                   help="after the warm-up: cosine decay to 10 %% at --steps, or constant")
    t.add_argument("--init", choices=INITS, default=d.init,
                   help="drafter layers start random or from the target's top layers")
    t.add_argument("--loss", choices=LOSSES, default=d.loss,
                   help="ce: the target's tokens; kl/tv: distillation against its top-k; lk: kl plus acceptance "
                        "(docs/drafters.md, Losses)")
    t.add_argument("--seqs-per-step", type=int_at_least(1, 4096), default=d.seqs_per_step,
                   help="training sequences per optimisation step (default: %(default)s)")
    t.add_argument("--blocks-per-seq", type=int_at_least(1, 4096), default=d.blocks_per_seq,
                   help="draft blocks (anchors) drawn from each sequence per step (default: %(default)s)")
    t.add_argument("--eval-every", type=int_at_least(1, 1_000_000), default=d.eval_every,
                   help="steps between held-out evaluations on a fixed subset of the eval sequences "
                        "(default: %(default)s)")
    t.add_argument("--max-train-prompts", type=int_at_least(1, 100_000), default=None, help="truncate the train prompts (smoke)")
    t.add_argument("--max-eval-prompts", type=int_at_least(1, 100_000), default=None, help="truncate the eval prompts (smoke)")
    t.add_argument("--threads", type=int_at_least(1, 1024), default=None, help="torch threads (default: torch's)")
    e = sub.add_parser("eval", help="tau of a drafter folder on the held-out prompts",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Continue every held-out prompt greedily with the target, run the drafter at every "
                                   "anchor and count the accepted drafts: tau (mean accepted length per block, the "
                                   "bonus token included) per prompt category, at the drafter's block size and at "
                                   "B = 8. Prints a table (or JSON with --json -) and progress on stderr.",
                       epilog=(f"examples:\n  dcut-drafter eval {DEFAULT_OUT} --max-eval-prompts 4 --max-new-tokens 16"
                               f" --threads 1   # seconds\n  dcut-drafter eval {DEFAULT_OUT} --json out/tau.json --threads 1"
                               "   # all, tens of minutes\n(--threads 1 when other jobs share the cores: torch threads "
                               "that wait on each other make it several times slower)\n"))
    e.add_argument("folder", help="the drafter folder (config.json, model.safetensors), or a drafter's name as "
                                  "--draft dflash:NAME takes it")
    e.add_argument("--eval-prompts", default=None,
                   help="held-out prompt file (JSON lines id, category, prompt; default: the shipped prompt set, "
                        "dcut_sched/data/traces/prompts.jsonl, plus the held-out HumanEval problems: docs/drafters.md, Data)")
    e.add_argument("--max-new-tokens", type=int_at_least(2, 8192), default=d.eval_max_new_tokens,
                   help=f"tokens generated per held-out prompt (default {d.eval_max_new_tokens})")
    e.add_argument("--max-eval-prompts", type=int_at_least(1, 100_000), default=None, metavar="N",
                   help="the first N held-out prompts only (default: all)")
    e.add_argument("--json", default=None, metavar="PATH", type=path_arg,
                   help="also write tau as JSON to PATH (.json, written atomically), or print it instead of the "
                        "table with '-'")
    e.add_argument("--threads", type=int_at_least(1, 1024), default=None, help="torch threads (default: torch's)")
    _add_calibrate(sub)
    return p


def _add_calibrate(sub) -> None:
    """The ``calibrate`` subcommand's parser."""
    c = sub.add_parser("calibrate", help="fit the per-depth calibration prior on training prompts, write calibration.json",
                       description="Fit the drafter's per-depth calibration prior (sigmoid(a_t + b logit(c_t)), "
                                   "docs/design.md 2.7) by maximum likelihood on a split of its TRAINING prompts "
                                   "(never the held-out ones): N training prompts spread evenly over the seeded "
                                   "training list, continued greedily (and every other one also at T = 0.7), the "
                                   "drafter run at every anchor. Writes DIR/calibration.json atomically, with the "
                                   "log-loss and the ECE by depth before and after on that split.")
    c.add_argument("--draft", required=True, metavar="DIR", type=path_arg, help="the drafter folder")
    c.add_argument("--out", default=None, metavar="PATH", type=path_arg,
                   help="where to write the prior (.json; default DIR/calibration.json, which must then be absent: "
                        "a drafter's prior is replaced only when --out names it)")
    c.add_argument("--prompts", type=int_at_least(2, 100_000), default=CALIBRATION_PROMPTS, metavar="N",
                   help=f"training prompts to continue (default {CALIBRATION_PROMPTS})")
    c.add_argument("--seed", type=seed_type, default=None, metavar="S",
                   help="seed of the training prompt list and of the sampled continuations (default: the drafter's "
                        "training seed from its heldout.json, else the training default)")
    c.add_argument("--max-new-tokens", type=int_at_least(2, 8192), default=CALIBRATION_TOKENS,
                   help=f"tokens per continuation (default {CALIBRATION_TOKENS})")
    c.add_argument("--eval-prompts", default=None,
                   help="the held-out prompt file the training split excludes (default: the shipped prompt set)")
    c.add_argument("--threads", type=int_at_least(1, 1024), default=None, help="torch threads (default: torch's)")


#: ``calibrate``'s defaults: training prompts and tokens per continuation.
CALIBRATION_PROMPTS = 64
CALIBRATION_TOKENS = 96


def _train(args) -> int:
    from ..drafters.sources import check_sources, sources_used
    from ..drafters.train import TrainSettings
    from ..drafters.workdir import check_drafter_folder, lock_work_dir
    from ..traces.prompts import PromptError, load_prompt_records
    from ..util.atomic import missing_folders, remove_empty_folders

    settings = TrainSettings(seed=args.seed, steps=args.steps, num_layers=args.layers,
                             draft_vocab_size=args.draft_vocab or None, num_generated_prompts=args.num_prompts,
                             num_gsm8k=args.num_gsm8k, num_mtbench=args.num_mtbench,
                             num_self_instruct=args.num_self_instruct, num_followups=args.num_followups,
                             max_new_tokens=args.max_new_tokens, eval_max_new_tokens=args.eval_max_new_tokens, lr=args.lr,
                             lr_schedule=args.lr_schedule, init=args.init, loss=args.loss, seqs_per_step=args.seqs_per_step,
                             blocks_per_seq=args.blocks_per_seq, eval_every=args.eval_every,
                             max_train_prompts=args.max_train_prompts, max_eval_prompts=args.max_eval_prompts)
    out = _check_out_folder(args.out)
    work = Path(args.work_dir) if args.work_dir else Path(".cache") / "dcut-drafter" / out.resolve().name
    if work.exists() and not work.is_dir():
        raise UsageError(f"--work-dir {work} is a file; give a folder for the generated data and checkpoint")
    if work.resolve() == out.resolve() or out.resolve() in work.resolve().parents:
        raise UsageError(f"--work-dir {work} is inside --out {out}: the drafter folder is replaced whole when it is "
                         "written, which would remove the work dir; give a work dir outside --out")
    try:
        load_prompt_records(args.eval_prompts)
    except PromptError as exc:
        raise UsageError(f"--eval-prompts: {exc}") from None
    check_sources(sources_used(settings.num_gsm8k, settings.num_mtbench))  # before the target model loads
    _check_train_outputs(args, out, work)
    check_drafter_folder(out, settings.to_json(), fresh=args.fresh, owned_files=OUT_FILES)
    made = missing_folders(work)  # the folders this run makes for its work dir
    try:
        work.mkdir(parents=True, exist_ok=True)
        with lock_work_dir(work):
            _train_locked(args, settings, out, work)
    except BaseException:
        remove_empty_folders(made)  # a work dir holding resumable state is kept
        raise
    return 0


def _train_locked(args, settings, out: Path, work: Path) -> None:
    """Load the target, then train: ``run_training`` checks the work dir against the settings (the
    data's key holds the feature layers, which come from the target's config) before it writes."""
    import torch

    from ..calibration import PRIOR_NAME
    from ..drafters.checkpoint import SHIP_DTYPE, save_checkpoint
    from ..drafters.dflash import describe
    from ..drafters.train import run_training
    from ..drafters.workdir import replace_folder
    from ..model.llama import LlamaModel
    from ..model.tokenizer import load_smollm2_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    target = LlamaModel.from_smollm2()
    tok = load_smollm2_tokenizer()
    model, state, report = run_training(settings, target=target, tokenizer=tok, work_dir=work,
                                        eval_prompts=args.eval_prompts, fresh=args.fresh)
    wall = time.time() - t0
    prior = report.pop("calibration")
    report["calibration_ece"] = prior["ece"]
    command = " ".join(["dcut-drafter", "train", *(shlex.quote(a) for a in args.argv)])
    meta = {"settings": settings.to_json(), "train_seconds": round(state.elapsed_s, 1), "wall_seconds": round(wall, 1),
            "torch_threads": torch.get_num_threads(), "load_at_end": os.getloadavg()[0],
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
            "command": command, **report, "evals": state.evals, "config": describe(model.config),
            "eval_prompts": _eval_prompts_label(args.eval_prompts)}

    def write(folder: Path) -> None:  # weights, config, curve, report, card and plot: the folder is swapped in whole
        from ..util.atomic import atomic_write_text

        save_checkpoint(model, folder, metadata={"dcut_sched": "dflash drafter", "seed": settings.seed}, dtype=SHIP_DTYPE)
        write_curve(folder / "training_curve.csv", state.history)
        atomic_write_text(folder / "heldout.json", json.dumps(meta, indent=2) + "\n")
        write_card(folder / "README.md", meta)
        plot_curve(folder / "training_curve.png", state.history, state.evals)
        if prior["prior"] is not None:
            prior["prior"].save(folder / PRIOR_NAME)

    replace_folder(out, write)
    print(json.dumps({"out": str(out), "tau": report["tau"], "wall_seconds": round(wall, 1)}, indent=2))


def _eval_prompts_label(path: str) -> str:
    """``--eval-prompts`` as the card names it: the shipped set by its place in the package, any
    other file by its path, each with its prompt count."""
    from ..paths import prompts_path
    from ..traces.prompts import load_prompt_records

    count = len(load_prompt_records(path))
    if Path(path).resolve() == prompts_path().resolve():
        return f"dcut_sched/data/traces/prompts.jsonl ({count} hand-written prompts)"
    return f"{path} ({count} prompts, --eval-prompts)"


#: What ``train`` writes into ``--out`` (the checkpoint, the curve, the report, the card, the plot).
OUT_FILES = ("config.json", "model.safetensors", "training_curve.csv", "heldout.json", "README.md",
             "training_curve.png", "calibration.json")


def _check_train_outputs(args, out: Path, work: Path) -> None:
    """:func:`~dcut_sched.cli.args.check_paths` for every file ``train`` writes -- the drafter files in
    ``--out`` and the data and checkpoint in ``--work-dir`` -- against the ``--eval-prompts`` input and
    each other, before the target model is loaded."""
    from ..drafters.train import DATA_NAME, STATE_NAME

    outputs = {f"--out {name}": (str(out / name), None) for name in OUT_FILES}
    data_files = (DATA_NAME, str(Path(DATA_NAME).with_suffix(".json")))  # the data and its sidecar
    outputs.update({f"--work-dir {name}": (str(work / name), None) for name in (*data_files, STATE_NAME)})
    check_paths({"--eval-prompts": args.eval_prompts}, outputs)


def _check_out_folder(text: str | None) -> Path:
    """``--out``: a new or empty folder, or one that already holds a DFlash drafter (a retrain), never
    another folder whose README.md or config.json the card and checkpoint would overwrite. Without
    ``--out``, the default folder must be new or empty: a shipped drafter is replaced only when named."""
    if text is None:
        out = Path(DEFAULT_OUT)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise UsageError(f"--out is not given and its default {DEFAULT_OUT} already holds a drafter; name --out "
                             f"explicitly to retrain it there (--out {DEFAULT_OUT}), or give another folder")
        return out
    if not text.strip():
        raise UsageError("--out is empty; give a folder for the drafter, e.g. drafters/my-dflash")
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the drafter")
    if out.is_dir() and any(out.iterdir()):
        try:  # read_text refuses a pipe or device by name: reading one would block
            ours = json.loads(read_text(out / "config.json")).get("architectures") == ["DFlashDraftModel"]
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise UsageError(f"--out {out} is a folder that holds other files and no DFlash drafter; writing the "
                             "checkpoint and its README.md there would overwrite them: give a new or empty folder")
    return out


def _resolve_drafter(text: str) -> Path:
    """A drafter folder, or a bare drafter name resolved as ``--draft dflash:NAME`` does; a name
    with no drafter is kept as given, so the checks that follow name its missing file."""
    from ..drafters import parse_draft_spec

    try:
        return Path(parse_draft_spec(f"dflash:{text}").path)
    except ValueError:
        return Path(text)


def _eval(args) -> int:
    import torch

    from ..drafters import drafter_files
    from ..drafters.checkpoint import DraftTargetError, check_target, load_checkpoint, read_config
    from ..drafters.data import (
        HUMANEVAL_EVAL_EVERY,
        continue_prompts,
        humaneval_prompts,
        sequence_features,
    )
    from ..drafters.heldout import acceptance, tau_summary
    from ..model.config import LlamaConfig
    from ..model.llama import LlamaModel
    from ..model.tokenizer import load_smollm2_tokenizer
    from ..traces.prompts import PromptError, load_prompt_records
    from ..util.atomic import atomic_write_text
    from ..util.progress import RunProgress
    from .render import render_tau

    args.folder = str(_resolve_drafter(args.folder))
    json_out = None if args.json in (None, "-") else args.json
    check_paths({"folder": [*drafter_files(args.folder), str(Path(args.folder) / "heldout.json")],  # calibrate reads it
                 "--eval-prompts": args.eval_prompts},
                {"--json": (json_out, (".json",))} if json_out else {})
    cfg = read_config(args.folder)
    try:  # before the weights and the target are read
        check_target(cfg, LlamaConfig.preset("smollm2-135m"))
    except DraftTargetError as exc:
        raise UsageError(f"{args.folder}: {exc} (dcut-drafter eval measures drafters of SmolLM2-135M-Instruct)"
                         ) from None
    model = load_checkpoint(args.folder)
    try:
        records = load_prompt_records(args.eval_prompts)
    except PromptError as exc:
        raise UsageError(f"--eval-prompts: {exc}") from None
    he = humaneval_prompts()
    prompts = records + [p for i, p in enumerate(he) if i % HUMANEVAL_EVAL_EVERY == 0]
    if args.max_eval_prompts:
        prompts = prompts[: args.max_eval_prompts]
    if args.threads:
        torch.set_num_threads(args.threads)
    target = LlamaModel.from_smollm2()
    tok = load_smollm2_tokenizer()
    with RunProgress(f"{PROG} eval {Path(args.folder).name}", len(prompts), "prompts") as bar:
        seqs = continue_prompts(target, tok, prompts, max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0,
                                on_batch=lambda n: bar.update(advance=n, detail="target continuations"))
        bar.update(detail="target features and drafts")
        bar.note(f"{bar.label}: {len(seqs)} target continuations done; next: the target's features and the drafts")
        sequence_features(target, seqs, model.config.target_layer_ids)
        embed = target.embed_tokens.weight
        out = {}
        for b in sorted({model.config.block_size, 8} - {0}, reverse=True):
            if b <= model.config.block_size:
                out[f"B{b}/greedy"] = tau_summary(acceptance(model, seqs, b, embed, embed))
    text = json.dumps(out, indent=2)
    if json_out:
        atomic_write_text(json_out, text + "\n")
    if args.json == "-":
        print(text)
    else:
        render_tau(out, len(prompts), args.max_new_tokens)
        if json_out:
            print(f"wrote {json_out}")
    return 0


def calibration_blocks(model, target, seqs):
    """:func:`~dcut_sched.drafters.heldout.calibration_blocks` at the drafter's block size; no anchor
    is a usage error."""
    from ..drafters.heldout import calibration_blocks as blocks

    embed = target.embed_tokens.weight.detach()
    lm_head = embed if target.lm_head is None else target.lm_head.weight.detach()
    try:
        return blocks(model, seqs, model.config.block_size, embed, lm_head)
    except ValueError:
        raise UsageError("no anchor to draft from: the continuations are empty (raise --max-new-tokens)") from None


def _calibrate(args) -> int:
    import torch

    from ..calibration import PRIOR_NAME, calibration_report, fit_prior
    from ..drafters.calibration_split import calibration_prompts, calibration_training_list
    from ..drafters.checkpoint import CONFIG_NAME, WEIGHTS_NAME, load_checkpoint
    from ..drafters.data import continue_prompts, sequence_features
    from ..drafters.sources import check_sources, sources_used
    from ..drafters.train import TrainSettings
    from ..model.llama import LlamaModel
    from ..model.tokenizer import load_smollm2_tokenizer
    from ..traces.prompts import PromptError, load_prompt_records
    from ..util.inputs import InputFileError, parse_json_strict, read_text

    folder = _resolve_drafter(args.draft)
    out = folder / PRIOR_NAME if args.out is None else Path(args.out)
    check_paths({"--draft": [str(folder / name) for name in (CONFIG_NAME, WEIGHTS_NAME, "heldout.json")],  # read here
                 "--eval-prompts": args.eval_prompts},
                {"--out" if args.out is not None else "calibration.json": (str(out), (".json",))})
    if args.out is None and out.exists():
        raise UsageError(f"--draft {folder} already holds {PRIOR_NAME} (the drafter's prior); name it to replace it "
                         f"(--out {out}) or write the new prior elsewhere (--out PATH.json)")
    model = load_checkpoint(folder, calibration=False)  # a malformed calibration.json is what this replaces
    settings = TrainSettings()
    trained = settings.to_json()
    report_path = folder / "heldout.json"
    if report_path.is_file():  # the drafter's own training settings: the same training prompt list
        try:
            trained = parse_json_strict(read_text(report_path, "the drafter's training report"), str(report_path))["settings"]
            if isinstance(trained["seed"], bool) or not 0 <= int(trained["seed"]) <= MAX_SEED:
                raise ValueError(f"{trained['seed']!r} is not a seed in 0..{MAX_SEED}")
        except (InputFileError, KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"--draft {report_path}: no settings.seed ({exc}); re-save the drafter with "
                             "dcut-drafter train") from None
    seed = int(trained["seed"]) if args.seed is None else args.seed
    try:
        load_prompt_records(args.eval_prompts)  # before the target is loaded
    except PromptError as exc:
        raise UsageError(f"--eval-prompts: {exc}") from None
    try:
        make_list = calibration_training_list(trained, seed, args.eval_prompts)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"--draft {report_path}: its settings are not a drafter's training settings ({exc}); "
                         "re-save the drafter with dcut-drafter train") from None
    # the prompt sources the training list reads, before the target model loads (no flag turns one off here)
    check_sources(["humaneval"] if "num_gsm8k" not in trained else
                  sources_used(trained["num_gsm8k"], trained.get("num_mtbench", 0)), off_flags={})
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()

    def log(stage: str) -> None:
        print(f"[{PROG} calibrate {time.time() - t0:5.0f} s] {stage}", file=sys.stderr, flush=True)

    log("loading the target")
    target = LlamaModel.from_smollm2()
    tok = load_smollm2_tokenizer()
    log("rebuilding the drafter's training list (the target writes its self-instruct requests again)")
    train, source = make_list(target, tok)
    prompts = calibration_prompts(train, args.prompts)
    log(f"continuing {len(prompts)} training prompts greedily and {len(prompts[::2])} at T = {settings.temperature:g}")
    seqs = continue_prompts(target, tok, prompts, max_new_tokens=args.max_new_tokens, temperature=0.0, seed=seed)
    seqs += continue_prompts(target, tok, prompts[::2], max_new_tokens=args.max_new_tokens,
                             temperature=settings.temperature, seed=seed)
    log(f"drafting at every anchor of {len(seqs)} continuations")
    sequence_features(target, seqs, model.config.target_layer_ids)
    conf, accept, slots = calibration_blocks(model, target, seqs)
    command = " ".join(["dcut-drafter", "calibrate", *(shlex.quote(a) for a in args.argv)])
    try:
        prior = fit_prior(conf, accept, slots)
    except ValueError as exc:
        raise UsageError(f"{exc} (--prompts {args.prompts}, --max-new-tokens {args.max_new_tokens})") from None
    report = calibration_report(conf, accept, slots, prior)
    provenance = {
        "command": command, "seed": seed, "prompts": len(prompts), "prompt_split": (
            f"{source}, {len(prompts)} spread evenly over the list; never the held-out prompts"),
        "continuations": {"greedy": len(prompts), f"t{settings.temperature:g}": len(prompts[::2]),
                          "max_new_tokens": args.max_new_tokens},
        "block_size": model.config.block_size, "blocks": int(conf.shape[0]), "seconds": round(time.time() - t0, 1),
        **report}
    prior = prior.model_copy(update={"provenance": provenance})
    prior.save(out)
    print(json.dumps({"out": str(out), "intercepts": prior.intercepts, "slope": prior.slope,
                      "log_loss": [report["log_loss_raw"], report["log_loss_calibrated"]],
                      "ece": [report["ece_raw"], report["ece_calibrated"]]}, indent=2))
    return 0


_COMMANDS = {"train": _train, "eval": _eval, "calibrate": _calibrate}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dcut-drafter``; returns the exit code (:mod:`dcut_sched.cli.errors`)."""
    from ..drafters.checkpoint import DraftCheckpointError

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
