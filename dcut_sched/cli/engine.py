"""``dcut-engine``: batched speculative decoding (greedy or sampled) of SmolLM2-135M with the ratio controller.

Run ``dcut-engine --help``; docs/controller.md and docs/sampling.md have the details. Exit status: 0 on
success, 1 when ``--check`` finds an output that differs from plain (greedy or sampled) decoding, 2 on
bad input (one line on stderr, no partial output file), 130/143 on SIGINT/SIGTERM (no output file
written); see :mod:`dcut_sched.cli.errors`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from .args import (
    SELF_SPEC_SKIP_LAYERS,
    check_json_input,
    check_paths,
    comma_list,
    given_flags,
    int_at_least,
    param_value,
    path_arg,
    seed_type,
    short_value,
    torch_device,
)
from .errors import CliParser, UsageError, run_cli

PROG = "dcut-engine"
#: Documented limits (docs/reliability.md), enforced at parse time: the KV cache is allocated for
#: the batch up front, and SmolLM2-135M was trained for 8,192 positions.
MAX_NEW_TOKENS = 8192
MAX_BATCH_SIZE = 1024
MAX_BLOCK_SIZE = 256
MAX_THREADS = 1024
TABLE_SUFFIXES = (".csv", ".json", ".parquet")
#: Steps after which the run-time estimate is printed (the first steps include the model warm-up).
ESTIMATE_AFTER_STEPS = 5


def _param(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``; VALUE is strict JSON when it parses (numbers, lists), a boolean or None for
    ``True``/``False``/``None`` in any case, else a string (:func:`~dcut_sched.cli.args.param_value`)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text[:80]!r}: expected KEY=VALUE, e.g. rho=0.25")
    return key, param_value(raw, key)


_layer_list = comma_list(item="layer", allow_empty=True)


def _paragraphs(*texts: str) -> str:
    """Help paragraphs wrapped to 100 columns, one after the other (the epilog is raw text)."""
    import textwrap

    return "".join(textwrap.fill(t, 100, subsequent_indent="  ", break_on_hyphens=False) + "\n" for t in texts)


def build_parser() -> CliParser:
    from .. import policies
    from ..engine.default_cost import DEFAULT_PROFILE_TEMPLATE, DFLASH_PROFILE_TEMPLATE

    p = CliParser(
        prog=PROG,
        description=(
            "Generate with batched speculative decoding: SmolLM2-135M-Instruct as the target, its "
            "self-speculative drafter (the same weights without layers 14-15) proposing B-1 greedy tokens per "
            "step, and the ratio controller choosing how many slots of each request the target verifies. "
            "Greedy by default; --temperature T > 0 samples the target (rejection sampling of the greedy "
            "drafts, lossless under every policy; docs/sampling.md). Prints tokens/s, accepted drafts per "
            "step and the step plans; can check the output against plain decoding and record a "
            "step-indexed acceptance trace."
        ),
        epilog=(
            "examples:\n"
            "  dcut-engine --policy fine --batch-size 8\n"
            "  dcut-engine --policy dcut --batch-size 8 --prompts prompts.jsonl --cost curve.json --check\n"
            "  dcut-engine --policy topk --param rho=0.5 --block-size 8 --steps out/steps.csv --out out/summary.json\n"
            "  dcut-engine --policy full --trace out/recorded.parquet --num-prompts 16\n"
            "  dcut-engine --policy dcut --temperature 0.7 --top-p 0.9 --seed 1 --check\n"
            + _paragraphs(
                "cost curve: --cost FILE, else the shipped CPU profile of the drafter "
                f"({DEFAULT_PROFILE_TEMPLATE}, or {DFLASH_PROFILE_TEMPLATE} with --draft dflash:PATH) when it "
                "covers the block and batch size, else a built-in linear CPU estimate (130 ms + 6.4 ms per "
                "verified token; draft = B-1 one-token forwards).",
                "run time: on a 2-core CPU a drafted step of bs 8, B 16 takes seconds with the self-speculative "
                "drafter (B-1 sequential drafter forwards), so a run over many prompts takes minutes to tens of "
                "minutes. The run prints its size, an estimate after the first "
                "steps, and progress: a bar on a terminal, otherwise one status line (rate, ETA) every 30 s "
                "(DCUT_PROGRESS_INTERVAL_S).",
                "sampling: request i draws with key (seed, i), so its output depends only on its prompt and the "
                "seed, not on the policy or the batch; --check compares with plain sampled decoding.",
                "busy machine: pass --threads 1 when other jobs share the cores (two torch threads that wait "
                "on each other slow single forwards many times over).",
            )
            + "policy parameters (--param KEY=VALUE for the chosen --policy), with their defaults:\n"
            + f"{policies.param_help()}\n"
            + "exit status: 0 ok, 1 --check found a difference from plain decoding, 2 bad input,\n"
            + "130/143 interrupted by SIGINT/SIGTERM (no output file is written)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("decoding")
    g.add_argument("--policy", default=policies.DEFAULT_POLICY, choices=policies.names(),
                   help="verification policy (default: %(default)s, the project's default everywhere)")
    g.add_argument("--param", action="append", type=_param, default=[], metavar="KEY=VALUE",
                   help="policy parameter, repeatable (e.g. rho=0.5, tau=0.3, granularity=4, feedback=False; booleans: "
                        "True/False or true/false)")
    g.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=True,
                   help="score per-depth calibrated confidences, learnt online from the drafter's calibration.json "
                        "prior (dflash:PATH) or the identity (default: on; --no-calibrate scores raw confidences)")
    g.add_argument("--batch-size", type=int_at_least(1, MAX_BATCH_SIZE), default=8, help="requests decoded at a time (default: 8)")
    g.add_argument("--block-size", type=int_at_least(2, MAX_BLOCK_SIZE), default=16, help="B: slots per block, B-1 drafts (default: 16)")
    g.add_argument("--max-new-tokens", type=int_at_least(1, MAX_NEW_TOKENS), default=32, help="tokens generated per request (default: 32)")
    g.add_argument("--skip-layers", type=_layer_list, default=list(SELF_SPEC_SKIP_LAYERS), metavar="I,J",
                   help="layers the self-speculative drafter skips (default: 14,15)")
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="target sampling temperature (default 0 = greedy)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus mass in (0, 1] (default 1 = off)")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K most likely tokens (default 0 = off)")
    g.add_argument("--seed", type=seed_type, default=0, metavar="S", help="sampling seed; request i uses key (S, i) (default 0)")
    g.add_argument("--draft", default="greedy", metavar="greedy|sampled|dflash:PATH",
                   help="the drafter: greedy (default) or sampled drafts of the self-speculative drafter (sampled "
                        "drafts are refused at T > 0: they make length rules biased, docs/sampling.md), or "
                        "dflash:PATH, the DFlash block drafter in that folder (greedy drafts, one forward per step; "
                        "the shipped one: dflash:drafters/smollm2-135m-dflash, docs/drafters.md)")
    g = p.add_argument_group("inputs")
    g.add_argument("--prompts", metavar="FILE", type=path_arg,
                   help="JSONL ({\"prompt\": ...} per line) or text (one prompt per line); default: 24 built-in prompts")
    g.add_argument("--num-prompts", type=int_at_least(1), metavar="N", help="use the first N prompts only")
    g.add_argument("--cost", metavar="FILE", type=path_arg, help="cost curve JSON (dcut.cost-curve/2, docs/design.md §4) for the block size")
    g.add_argument("--threads", type=int_at_least(1, MAX_THREADS), metavar="N",
                   help="torch CPU threads (default: torch's choice; use 1 on a busy shared machine)")
    g.add_argument("--device", type=torch_device, default="cpu", help="torch device of the model (default: cpu)")
    g = p.add_argument_group("outputs")
    g.add_argument("--check", action="store_true",
                   help="also run plain greedy (or, at T > 0, sampled, same keys) decoding and compare token for token")
    g.add_argument("--out", metavar="FILE", type=path_arg, help="summary (.json) or summary table (.csv/.parquet)")
    g.add_argument("--steps", metavar="FILE", type=path_arg, help="one row per step with its plan (.csv/.json/.parquet)")
    g.add_argument("--trace", metavar="FILE", type=path_arg, help="record a step-indexed acceptance trace (.parquet)")
    g.add_argument("--show-steps", type=int_at_least(0), default=8, metavar="N", help="print the first N step plans (default: 8)")
    g.add_argument("--show-outputs", type=int_at_least(0), default=2, metavar="N", help="print the first N decoded outputs (default: 2)")
    g.add_argument("--quiet", action="store_true", help="no progress (bar or status lines) and no up-front estimate")
    return p


def _write_table(path: str, frame) -> None:
    from ..util.tables import write_table

    write_table(frame, path)


def _check_outputs(args: argparse.Namespace, draft_spec) -> None:
    """:func:`~dcut_sched.cli.args.check_paths` for ``--out``/``--steps``/``--trace`` against every input:
    ``--prompts``, ``--cost`` (or the shipped default curve it falls back to) and the DFlash drafter's
    ``config.json``, weights and ``calibration.json`` (``--draft dflash:PATH``)."""
    from ..drafters import drafter_files
    from ..engine.default_cost import default_profile_path

    cost = args.cost or str(default_profile_path(args.block_size, draft_spec.kind))
    drafter = drafter_files(draft_spec.path) if draft_spec.kind == "dflash" else None
    check_paths({"--prompts": args.prompts, "--cost": cost, "--draft": drafter},
                {"--out": (args.out, TABLE_SUFFIXES), "--steps": (args.steps, TABLE_SUFFIXES),
                 "--trace": (args.trace, (".parquet",))})


#: The flags only a drafting run reads (argparse dests and the flag that sets each).
_DRAFT_FLAGS = (("draft", "--draft"), ("skip_layers", "--skip-layers"), ("block_size", "--block-size"),
                ("calibrate", "--no-calibrate"))


def _check_no_draft_flags(given: set[str]) -> None:
    """``--policy ar`` decodes without drafts: a drafter, its layers, the block size or the calibration
    flag, given at all (``given``: :func:`~.args.given_flags`), would change nothing, so it is refused before
    any file or model loads."""
    for dest, flag in _DRAFT_FLAGS:
        if dest in given:
            raise UsageError(f"{flag} has no effect with --policy ar (plain decoding: no drafter runs and no block "
                             f"is drafted); drop {flag} or choose a policy that drafts (full, dcut, fine, ...)")


def _load_inputs(args: argparse.Namespace):
    """Load: the drafter, the sampling settings, the policy parameters and the prompt texts, each refused
    with a :class:`UsageError` naming its flag. Returns ``(draft_spec, dflash, sampling, params, texts)``."""
    import torch

    from .. import policies
    from ..drafters import load_dflash, parse_draft_spec
    from ..drafters.checkpoint import DraftCheckpointError, check_target
    from ..engine import DEFAULT_PROMPTS, PromptFileError, load_prompt_texts
    from ..model.config import LlamaConfig
    from ..sampling import SamplingParams

    try:
        draft_spec = parse_draft_spec(args.draft)
    except ValueError as exc:
        raise UsageError(f"--draft {exc}") from None
    _check_outputs(args, draft_spec)  # before any file is loaded: no output may be an input
    dflash = None
    if draft_spec.kind == "dflash":
        try:
            dflash = load_dflash(draft_spec)
            check_target(dflash.config, LlamaConfig.preset("smollm2-135m"))  # before the model is loaded
        except DraftCheckpointError as exc:
            raise UsageError(f"--draft {args.draft} ({draft_spec.path}): {exc}") from None
        if tuple(args.skip_layers) != SELF_SPEC_SKIP_LAYERS:  # not the default: the DFlash drafter skips no target layer
            raise UsageError(f"--skip-layers has no effect with --draft {args.draft} (it sets the self-speculative "
                             f"drafter's layers; the DFlash drafter is its own model): drop --skip-layers")
        if args.block_size > dflash.config.block_size:
            raise UsageError(f"--block-size {args.block_size}: the DFlash drafter in {draft_spec.path} drafts blocks "
                             f"of at most {dflash.config.block_size}")
    try:
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                                  draft="sampled" if draft_spec.sampled else "greedy")
    except ValueError as exc:
        raise UsageError(f"--temperature/--top-p/--top-k/--seed/--draft: {exc}") from None
    if args.trace and not sampling.is_greedy and args.policy != "full":
        raise UsageError(f"--trace at --temperature {args.temperature:g} records the target's probability of every "
                         f"draft token, so every slot must be verified: use --policy full (not {args.policy})")
    if args.trace and args.policy == "ar":
        raise UsageError("--trace records what the drafts of drafted steps were accepted; --policy ar never drafts: "
                         "record with --policy full (every slot verified)")
    check_json_input(args.cost, "--cost", "a cost-curve JSON file (dcut-profile writes one)")
    params: dict[str, Any] = {}
    for key, value in args.param:
        if key in params:
            raise UsageError(f"--param {key} is given twice ({short_value(params[key])} and {short_value(value)}); "
                             f"give it once")
        params[key] = value
    try:
        policies.check_params(args.policy, params)  # names, keys, kinds; RatioController builds it once
    except ValueError as exc:
        raise UsageError(f"--param: {exc}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        texts = load_prompt_texts(args.prompts) if args.prompts else list(DEFAULT_PROMPTS)
    except PromptFileError as exc:
        raise UsageError(f"--prompts: {exc}") from None
    if args.num_prompts is not None:  # >= 1 (its argparse type)
        if args.num_prompts > len(texts):
            where = f"--prompts {args.prompts}" if args.prompts else "the built-in prompts (no --prompts)"
            raise UsageError(f"--num-prompts {args.num_prompts}: {where} hold only {len(texts)}; give at most "
                             f"{len(texts)} or a --prompts file with more")
        texts = texts[: args.num_prompts]
    return draft_spec, dflash, sampling, params, texts


def _build_controller(args: argparse.Namespace, draft_spec, dflash, params: dict[str, Any]):
    """Build: the cost curve (``--cost``, else the shipped default) and the controller, before the model
    loads. Returns ``(controller, cost_source)``."""
    from .. import policies
    from ..controller import RatioController
    from ..cost_curve import CostCurve, CostCurveError, CostCurveRangeError
    from ..engine import default_cost_curve

    policy_cls = policies.policy_class(args.policy)  # its class attributes, without building one
    curve = cost_source = None
    if args.cost and not policy_cls.needs_cost:
        raise UsageError(f"--cost has no effect with --policy {args.policy} (it plans without a cost curve); "
                         f"drop --cost or choose a policy that reads it (dcut, fine, ...)")
    if policy_cls.needs_cost:
        if args.cost:
            try:
                curve = CostCurve.load(args.cost)
            except CostCurveError as exc:
                raise UsageError(f"--cost: {exc}") from None
            cost_source = args.cost
        else:
            curve, cost_source = default_cost_curve(args.block_size, args.batch_size, draft_spec.kind)
    try:
        ctrl = RatioController(curve, args.block_size, policy=args.policy, calibrate=args.calibrate,
                               max_batch_size=args.batch_size,
                               calibration_prior=dflash.calibration_prior if dflash is not None else None, **params)
    except (CostCurveError, CostCurveRangeError) as exc:  # before the model loads: the curve cannot serve the run
        raise UsageError(f"--cost: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"policy {args.policy}: {exc}") from None
    return ctrl, cost_source


def _build_engine(args: argparse.Namespace, ctrl, cost_source, sampling, dflash, texts: list[str]):
    """Build: SmolLM2-135M, its tokenizer and the :class:`~dcut_sched.engine.SpecEngine`.
    Returns ``(engine, model, tokenizer, prompt_ids)``."""
    from ..engine import SpecEngine

    try:
        from ..model import LlamaModel
        from ..model.tokenizer import chat_prompt_ids, load_smollm2_tokenizer

        tokenizer = load_smollm2_tokenizer()
        model = LlamaModel.from_smollm2(device=args.device)
    except (ImportError, FileNotFoundError) as exc:
        raise UsageError(f"cannot load SmolLM2-135M: {exc}") from None
    prompt_ids = [chat_prompt_ids(tokenizer, t) for t in texts]
    try:
        engine = SpecEngine(model, ctrl, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                            eos_id=tokenizer.eos_id, skip_layers=args.skip_layers, sampling=sampling, dflash=dflash)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    engine.cost_source = cost_source or "none (policy needs no cost curve)"
    return engine, model, tokenizer, prompt_ids


def _generate(args: argparse.Namespace, engine, prompt_ids: list):
    """Run: the engine over every prompt, with progress and a run-time estimate after a few steps."""
    import torch

    from ..util.progress import RunProgress, format_duration

    max_tokens = len(prompt_ids) * args.max_new_tokens
    progress = RunProgress(f"{PROG} {args.policy}", max_tokens, "tokens", enabled=not args.quiet)
    state = {"requests": 0, "steps": 0, "tokens": 0}

    def on_request_done(_q: int) -> None:
        state["requests"] += 1

    def on_step(rec) -> None:
        state["steps"] += 1
        state["tokens"] += rec.committed_tokens
        progress.update(completed=state["tokens"],  # decode tokens (the first token of each comes from prefill)
                        detail=f"{state['requests']}/{len(prompt_ids)} requests done, step {state['steps']}")
        if state["steps"] == ESTIMATE_AFTER_STEPS:
            rate = progress.completed / max(progress.elapsed_s, 1e-9)
            progress.note(f"{PROG}: estimate ~{format_duration(max_tokens / rate)} in all at the first "
                          f"{ESTIMATE_AFTER_STEPS} steps' rate ({rate:.1f} tokens/s; EOS can end it sooner)")

    progress.note(f"{PROG}: {len(prompt_ids)} prompts x up to {args.max_new_tokens} new tokens "
                  f"(up to {max_tokens:,} tokens), bs {args.batch_size}, B {args.block_size}, policy "
                  f"{args.policy}, torch threads {torch.get_num_threads()}; an estimate of the run time follows "
                  f"the first {ESTIMATE_AFTER_STEPS} steps")
    progress.update(detail="prefill and first step (the first drafted step includes the drafter's prefill)")
    with progress:
        return engine.generate(prompt_ids, record_trace=bool(args.trace), on_request_done=on_request_done,
                               on_step=on_step)


def _check_reference(args: argparse.Namespace, model, tokenizer, prompt_ids: list, sampling, outputs) -> list[int]:
    """``--check``: decode every prompt without speculation; returns the prompts whose output differs."""
    from ..model import greedy_generate, sample_generate
    from ..util.progress import RunProgress

    num_batches = -(-len(prompt_ids) // args.batch_size)
    check = RunProgress(f"{PROG} --check (plain decoding reference)", num_batches * args.max_new_tokens,
                        "steps", enabled=not args.quiet)
    done_batches = [0]

    def on_ref_step(done: int, total: int) -> None:
        if done == 1 and check.completed > 0:
            done_batches[0] += 1
        check.update(completed=done_batches[0] * total + done,
                     detail=f"batch {done_batches[0] + 1}/{num_batches}")

    with check:
        if sampling.is_greedy:
            reference = greedy_generate(model, prompt_ids, args.max_new_tokens, tokenizer.eos_id,
                                        batch_size=args.batch_size, on_step=on_ref_step)
        else:
            reference = sample_generate(model, prompt_ids, args.max_new_tokens, tokenizer.eos_id, sampling,
                                        batch_size=args.batch_size, on_step=on_ref_step)
    return [i for i, (a, b) in enumerate(zip(outputs, reference)) if a != b]


def _report(args: argparse.Namespace, summary: dict, result, sampling, texts: list[str], tokenizer) -> None:
    """Report: the summary table, the first step plans and the first decoded outputs."""
    from ..util.console import make_console
    from .render import render_engine

    console = make_console()
    render_engine(console, f"dcut-engine: {args.policy}, {sampling.describe()}, B={args.block_size}, "
                           f"bs={args.batch_size}, {len(texts)} prompts x {args.max_new_tokens} tokens",
                  summary, result.steps, args.show_steps)
    for i in range(min(args.show_outputs, len(result.outputs))):
        console.print(f"[bold]prompt {i}:[/bold] {texts[i]!r}\n[bold]output:[/bold] "
                      f"{tokenizer.decode(result.outputs[i], skip_special_tokens=True)!r}")


def _write(args: argparse.Namespace, summary: dict, result, draft_spec, dflash) -> None:
    """Write: ``--out``, ``--steps`` and ``--trace``, together or not at all."""
    import pandas as pd

    from ..util.atomic import all_or_none

    trace = None
    if args.trace:
        try:
            trace = result.trace({
                "target_model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised fp32)",
                "draft_model": (f"DFlash block drafter {draft_spec.path}" if dflash is not None else
                                f"self-speculative, skip layers {','.join(map(str, args.skip_layers))}"),
                "dataset": Path(args.prompts).stem if args.prompts else "dcut-engine built-in prompts",
            })
        except ValueError as exc:
            raise UsageError(f"--trace: {exc}") from None
    with all_or_none():  # --out, --steps and --trace appear together or not at all
        if args.out:
            _write_table(args.out, pd.DataFrame([summary]))
        if args.steps:
            _write_table(args.steps, result.steps_frame())
        if trace is not None:
            trace.save(args.trace)


def run(args: argparse.Namespace) -> int:
    """One ``dcut-engine`` run: load, build, generate, check, report, write. Exit status 1 when ``--check``
    finds an output that differs from plain decoding."""
    draft_spec, dflash, sampling, params, texts = _load_inputs(args)
    ctrl, cost_source = _build_controller(args, draft_spec, dflash, params)
    engine, model, tokenizer, prompt_ids = _build_engine(args, ctrl, cost_source, sampling, dflash, texts)
    result = _generate(args, engine, prompt_ids)
    summary = result.summary()
    summary["drafter"] = draft_spec.describe()
    mismatched: list[int] = []
    if args.check:
        mismatched = _check_reference(args, model, tokenizer, prompt_ids, sampling, result.outputs)
        same = "identical to greedy" if sampling.is_greedy else "identical to sampled decoding"
        summary["check"] = same if not mismatched else f"differs for prompts {mismatched}"
    _report(args, summary, result, sampling, texts, tokenizer)
    _write(args, summary, result, draft_spec, dflash)
    return 1 if mismatched else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dcut-engine``; returns the exit status (module docstring)."""
    def body() -> int:
        args = build_parser().parse_args(argv)
        if args.policy == "ar":
            _check_no_draft_flags(given_flags(build_parser, argv, args))
        return run(args)

    return run_cli(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
