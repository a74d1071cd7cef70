"""Training a DFlash drafter for the project's target (``dcut-drafter train``; docs/drafters.md, "Training").

Blocks are cut at random anchors of the target's own continuations and the drafter is trained on
every draft slot, slot ``j`` weighted by :func:`~dcut_sched.drafters.dflash.block_loss_weights`; each
step's sequences and anchors come from one seeded generator, the block size alternates over
``block_sizes``, and a resumed run takes the same batches as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..model.config import LlamaConfig
from ..util.atomic import atomic_write_with
from .checkpoint import SHIP_DTYPE
from .data import DraftSequence, token_counts
from .datagen import DataSettings, generate_and_save, write_sidecar
from .dflash import DFlashConfig, DFlashDraftModel, block_loss_weights, default_target_layer_ids
from .heldout import acceptance, calibrate_on_split, depth_acceptance, tau_summary
from .workdir import TrainState, WorkDir, WorkDirError, check_optimizer_state, finite_or_raise, read_work_dir

__all__ = ["TrainSettings", "TrainState", "block_batch", "check_work_dir", "data_config", "data_settings",
           "in_calibration_split", "train_step", "run_training"]

#: Files of ``run_training``'s ``work_dir``: the generated data and the resumable checkpoint.
DATA_NAME = "data.pt"
STATE_NAME = "state.pt"


LR_SCHEDULES = ("cosine", "constant")
INITS = ("random", "target")
LOSSES = ("ce", "kl", "tv", "lk")


@dataclass(frozen=True)
class TrainSettings:
    """Everything that decides the trained weights (stored with the checkpoint and in the card).

    Attributes:
        seed: seeds the prompt generator, the sampled continuations, the initial weights and every
            draw of sequences and anchors.
        num_generated_prompts, num_gsm8k, num_mtbench, num_self_instruct, num_followups: training
            prompts by source (plus 131 HumanEval problems; :class:`~dcut_sched.drafters.datagen.DataSettings`).
        max_new_tokens, eval_max_new_tokens: tokens the target generates per training / held-out prompt turn.
        temperature: the sampled continuations' temperature (each prompt is continued greedily and sampled).
        instruct_temperature: the self-instruct requests' sampling temperature.
        num_layers, num_target_features, draft_vocab_size: the drafter's shape (:class:`DFlashConfig`).
        block_sizes: block sizes the steps alternate over.
        steps, seqs_per_step, blocks_per_seq: optimisation steps; sequences and anchors per step.
        lr, warmup_steps, weight_decay, grad_clip: AdamW with linear warm-up, then ``lr_schedule``:
            ``cosine`` (decay to 10 % at ``steps``) or ``constant``.
        init: ``random`` (N(0, 0.02)) or ``target`` (the decoder layers and final norm start from the
            target's top ``num_layers`` layers; the feature projection stays random).
        loss: ``ce`` (hard labels: the target's continuation), ``kl`` (distillation against the
            target's top-k next-token distribution), ``tv`` (its total variation, one minus the
            sampling acceptance rate) or ``lk`` (``kl`` plus one minus the expected accepted fraction
            of the block); every term weighted per slot as DFlash does (docs/drafters.md, "Losses").
        calibration_every: one training conversation in this many (by a hash of its id, both turns
            together) is held back from training: the calibration split the drafter's per-depth
            calibration prior is fitted on (``calibration.json``).
        eval_every: steps between held-out evaluations (a fixed subset of the eval sequences).
        checkpoint_every: steps between resumable checkpoints.
        max_train_prompts, max_eval_prompts: truncate the prompt sets (smoke runs).
    """

    seed: int = 0
    num_generated_prompts: int = 48
    num_gsm8k: int = 56
    num_mtbench: int = 40
    num_self_instruct: int = 96
    num_followups: int = 32
    max_new_tokens: int = 256
    eval_max_new_tokens: int = 128
    temperature: float = 0.7
    instruct_temperature: float = 0.8
    num_layers: int = 2
    num_target_features: int = 4
    draft_vocab_size: int | None = 4096
    block_sizes: tuple[int, ...] = (16, 8)
    steps: int = 2400
    seqs_per_step: int = 4
    blocks_per_seq: int = 16
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lr_schedule: str = "cosine"
    init: str = "random"
    loss: str = "lk"
    calibration_every: int = 10
    eval_every: int = 250
    checkpoint_every: int = 100
    max_train_prompts: int | None = None
    max_eval_prompts: int | None = None

    def __post_init__(self) -> None:
        if not self.block_sizes or any(b < 2 for b in self.block_sizes):
            raise ValueError("TrainSettings.block_sizes: each block size must be >= 2")
        for name in ("steps", "seqs_per_step", "blocks_per_seq", "max_new_tokens", "eval_every",
                     "checkpoint_every", "num_layers", "calibration_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainSettings.{name} must be >= 1")
        for name in ("max_train_prompts", "max_eval_prompts"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"TrainSettings.{name} must be >= 1 or None (no truncation), not {getattr(self, name)}")
        for name, allowed in (("lr_schedule", LR_SCHEDULES), ("init", INITS), ("loss", LOSSES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"TrainSettings.{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["block_sizes"] = list(self.block_sizes)
        return d


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warm-up over ``warmup_steps``, then ``lr`` (constant) or cosine decay to 10 % of ``lr`` at ``steps``."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    if s.lr_schedule == "constant":
        return s.lr
    frac = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def block_batch(seqs: Sequence[DraftSequence], anchors: Sequence[Sequence[int]], block_size: int,
                target_to_draft: torch.Tensor | None, soft: bool = False) -> dict[str, torch.Tensor]:
    """Padded tensors of one batch: features, tokens, anchors, labels ``[N, nb, B-1]`` (draft ids,
    -100 where the slot lies past the sequence or its token is outside the draft vocabulary); with
    ``soft``, also ``soft_ids`` / ``soft_p`` ``[N, nb, B-1, k]``: the target's top-k next tokens
    before each slot (draft ids, -1 outside the draft vocabulary) and their probabilities (0 there
    and on unlabelled slots)."""
    n = len(seqs)
    t = max(s.length for s in seqs)
    nb = max(len(a) for a in anchors)
    feat = torch.zeros(n, t, seqs[0].features.shape[-1], dtype=torch.float32)
    tok = torch.zeros(n, t, dtype=torch.long)
    anc = torch.zeros(n, nb, dtype=torch.long)
    labels = torch.full((n, nb, block_size - 1), -100, dtype=torch.long)
    for i, (s, a) in enumerate(zip(seqs, anchors)):
        feat[i, : s.length] = s.features.float()
        tok[i, : s.length] = s.tokens
        for b in range(nb):
            p = int(a[b % len(a)])
            anc[i, b] = p
            if b >= len(a):
                continue  # padding block: repeats an anchor, no labels
            for j in range(1, block_size):
                if p + j < s.length:
                    labels[i, b, j - 1] = int(s.tokens[p + j])
    out = {"features": feat, "tokens": tok, "anchors": anc}
    if soft:
        if any(s.top_ids is None for s in seqs):
            raise ValueError("block_batch: soft labels need every sequence's top_ids / top_logp (data of top_k > 0)")
        k = seqs[0].top_ids.shape[-1]
        top_ids = torch.zeros(n, t, k, dtype=torch.long)
        top_p = torch.zeros(n, t, k, dtype=torch.float32)
        for i, s in enumerate(seqs):
            top_ids[i, : s.length] = s.top_ids.long()
            top_p[i, : s.length] = s.top_logp.float().exp()
        # slot j (1..B-1) predicts the token at p + j from the target's distribution at p + j - 1
        at = (anc[:, :, None] + torch.arange(block_size - 1)).clamp(max=t - 1)  # [N, nb, B-1]
        rows = torch.arange(n)[:, None, None]
        ids, prob = top_ids[rows, at], top_p[rows, at]
        if target_to_draft is not None:
            ids = target_to_draft[ids]
        prob = torch.where((ids >= 0) & (labels >= 0)[..., None], prob, torch.zeros_like(prob))
        out["soft_ids"], out["soft_p"] = ids, prob
    if target_to_draft is not None:
        mapped = torch.where(labels >= 0, target_to_draft[labels.clamp(min=0)], torch.full_like(labels, -1))
        labels = torch.where(mapped >= 0, mapped, torch.full_like(labels, -100))
    out["labels"] = labels
    return out


def block_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean cross-entropy over the labelled slots (``-100`` = no label)."""
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 2), labels.flatten().clamp(min=0),
                                           reduction="none").view(labels.shape)
    w = weights.view(1, 1, -1) * (labels >= 0)
    return (ce * w).sum() / w.sum().clamp(min=1e-9)


def soft_losses(logits: torch.Tensor, soft_ids: torch.Tensor, soft_p: torch.Tensor, weights: torch.Tensor
                ) -> dict[str, torch.Tensor]:
    """Distillation terms of ``logits [N, nb, B-1, V]`` against the target's top-k (``soft_ids`` /
    ``soft_p`` from :func:`block_batch`), slot-weighted like :func:`block_loss`:

    - ``kl``: cross-entropy against the top-k distribution renormalised (KL up to its entropy);
    - ``tv``: one minus the sampling acceptance rate ``alpha_j = sum_x min(p(x), q(x))`` over the top-k;
    - ``accepted``: the expected accepted fraction of the block, ``sum_j prod_{t<=j} alpha_t / (B-1)``.
    """
    logq = logits.log_softmax(-1)
    q_at = logq.gather(-1, soft_ids.clamp(min=0))  # [N, nb, B-1, k]
    mass = soft_p.sum(-1)
    valid = mass > 0
    w = weights.view(1, 1, -1) * valid
    norm = w.sum().clamp(min=1e-9)
    p = soft_p / mass.clamp(min=1e-9)[..., None]
    kl = (-(p * q_at).sum(-1) * w).sum() / norm
    alpha = torch.minimum(soft_p, q_at.exp()).sum(-1) * valid  # [N, nb, B-1]
    tv = ((1 - alpha) * w).sum() / norm
    blocks = valid[..., 0]
    accepted = (alpha.cumprod(-1).sum(-1) / alpha.shape[-1])[blocks].mean() if bool(blocks.any()) else alpha.sum() * 0
    return {"kl": kl, "tv": tv, "accepted": accepted}


def step_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor], block_size: int, loss: str) -> torch.Tensor:
    """The training loss ``loss`` (:class:`TrainSettings`) of one batch's logits."""
    weights = block_loss_weights(block_size)
    if loss == "ce":
        return block_loss(logits, batch["labels"], weights)
    terms = soft_losses(logits, batch["soft_ids"], batch["soft_p"], weights)
    if loss == "lk":
        return terms["kl"] + (1 - terms["accepted"])
    return terms[loss]


def init_from_target(model: DFlashDraftModel, target) -> None:
    """Start ``model``'s decoder layers and final norm from the target's top layers (same shapes;
    the target has no q/k norms, so theirs stay 1)."""
    top = list(target.layers)[-len(model.layers):]
    with torch.no_grad():
        for mine, theirs in zip(model.layers, top):
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(mine, name).weight.copy_(getattr(theirs.self_attn, name).weight)
            mine.input_layernorm.load_state_dict(theirs.input_layernorm.state_dict())
            mine.post_attention_layernorm.load_state_dict(theirs.post_attention_layernorm.state_dict())
            mine.mlp.load_state_dict(theirs.mlp.state_dict())
        model.norm.load_state_dict(target.norm.state_dict())


def train_step(model: DFlashDraftModel, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor], block_size: int,
               embed: torch.Tensor, lm_head: torch.Tensor, lr: float, grad_clip: float, loss_name: str = "ce") -> float:
    """One optimisation step; returns the loss."""
    model.train()
    for g in opt.param_groups:
        g["lr"] = lr
    logits = model.training_logits(batch["features"], batch["tokens"], batch["anchors"], block_size, embed, lm_head)
    loss = step_loss(logits, batch, block_size, loss_name)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return float(loss.detach())


def sample_anchors(rng: random.Random, s: DraftSequence, count: int) -> list[int]:
    """``count`` distinct anchors of the continuation (``prompt_len <= p <= length - 2``), fewer if short."""
    lo, hi = s.prompt_len, s.length - 2
    if hi < lo:
        return []
    pool = range(lo, hi + 1)
    return sorted(rng.sample(pool, min(count, len(pool))))


def in_calibration_split(prompt_id: str, every: int) -> bool:
    """Whether the training sequence ``prompt_id`` belongs to the calibration split: its conversation
    id (``prompt_id`` without ``/turnN``) hashes (CRC-32) to 0 modulo ``every``."""
    return zlib.crc32(prompt_id.split("/turn")[0].encode()) % every == 0


def _log(msg: str) -> None:
    print(f"[dcut-drafter {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def data_config(settings: TrainSettings, eval_prompts: str | Path, target_config: LlamaConfig) -> DataSettings:
    """The data settings of a run: ``settings``' data fields, the held-out file, and as context
    features the target layers the drafter reads (:func:`~dcut_sched.drafters.dflash.default_target_layer_ids`
    of ``target_config``)."""
    layers = default_target_layer_ids(target_config.num_layers, settings.num_target_features)
    return DataSettings.from_train(settings, eval_prompts, layers)


def data_settings(settings: TrainSettings, eval_prompts: str | Path, target_config: LlamaConfig,
                  model_file: str | Path | None = None) -> dict[str, Any]:
    """``data.pt``'s ``key``: :meth:`~dcut_sched.drafters.datagen.DataSettings.key` of
    :func:`data_config` (``model_file``: the target's weights, default the SmolLM2 GGUF)."""
    return data_config(settings, eval_prompts, target_config).key(_model_file(model_file))


def _model_file(model_file: str | Path | None) -> str | Path:
    if model_file is not None:
        return model_file
    from ..model.gguf_weights import smollm2_gguf_path

    return smollm2_gguf_path()


def check_work_dir(settings: TrainSettings, work_dir: Path, data_key: dict[str, Any], fresh: bool = False) -> WorkDir:
    """Read and check ``work_dir``'s checkpoint (against ``settings``) and data (against
    ``data_key``, :func:`data_settings`); writes nothing (:func:`~dcut_sched.drafters.workdir.read_work_dir`)."""
    return read_work_dir(work_dir, DATA_NAME, STATE_NAME, settings=settings.to_json(), data_key=data_key, fresh=fresh)


def run_training(settings: TrainSettings, *, target, tokenizer, work_dir: Path, eval_prompts: str | Path,
                 fresh: bool = False, log: Callable[[str], None] = _log, model_file: str | Path | None = None,
                 evaluate: bool = True) -> tuple[DFlashDraftModel, TrainState, dict]:
    """Generate the data (cached in ``work_dir``), train (checkpointed in ``work_dir``, resumed
    unless ``fresh``), evaluate on the held-out prompts (unless not ``evaluate``: the report's
    ``tau`` is then empty). Returns (model, state, held-out report).

    ``work_dir``'s files are checked (:func:`check_work_dir`) before anything is written: data of
    the same key is reused, none (or ``fresh``) is generated, any other is refused. ``model_file``:
    the target's weights file, part of the data's key (default the SmolLM2 GGUF). The caller holds
    the work dir's lock (:func:`~dcut_sched.drafters.workdir.lock_work_dir`) when runs may overlap.

    Raises:
        WorkDirError: ``work_dir`` holds a file that cannot be read, or data or a checkpoint of other
            settings (the message names the file and the field; ``fresh=True`` starts over).
        TrainingDivergedError: the loss or a weight went non-finite (no checkpoint of it is written).
    """
    data_cfg = data_config(settings, eval_prompts, target.config)
    data_key = data_cfg.key(_model_file(model_file))
    found = check_work_dir(settings, work_dir, data_key, fresh)  # before anything is written
    work_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(settings.seed)
    cfg = DFlashConfig.for_target(target.config, num_layers=settings.num_layers,
                                  block_size=max(settings.block_sizes),
                                  num_target_features=settings.num_target_features,
                                  draft_vocab_size=settings.draft_vocab_size)
    data_path, state_path = work_dir / DATA_NAME, work_dir / STATE_NAME
    data = found.data
    if data is None:
        data = generate_and_save(data_cfg, data_key, target, tokenizer, data_path, log=log)
        if fresh:  # the checkpoint --fresh ignored: left beside the new data, a stop before the first new
            state_path.unlink(missing_ok=True)  # checkpoint would have a rerun refuse it (and regenerate the data)
    else:
        write_sidecar(data_path, data)  # in case a stop came between the data and its sidecar
        log(f"data: {data_path} holds data of these settings (sha256 {data['sha256'][:16]}); reusing it")
    train_seqs, calib_seqs = _split_data(settings, cfg, data, data_path, log)
    embed = target.embed_tokens.weight.detach()
    lm_head = embed if target.lm_head is None else target.lm_head.weight.detach()
    model, opt, state = _start_model(settings, cfg, target, train_seqs, embed, found, state_path, log)
    _train_loop(settings, model, opt, state, train_seqs, data["eval"], embed, lm_head, state_path, log)
    model.eval()
    with torch.no_grad():  # evaluate the weights as shipped (rounded to SHIP_DTYPE)
        for prm in model.parameters():
            prm.copy_(prm.to(SHIP_DTYPE).float())
    report: dict[str, Any] = {"data_seconds": round(float(data.get("seconds", 0.0)), 1),
                              "train_sequences": len(train_seqs), "eval_sequences": len(data["eval"]),
                              "train_tokens": int(sum(s.length for s in train_seqs)), "tau": {},
                              "data_sha256": data["sha256"], "data_stats": data["stats"]}
    if evaluate:
        _heldout_report(report, settings, model, data, calib_seqs, embed, lm_head, log)
    return model, state, report


def _split_data(settings: TrainSettings, cfg: DFlashConfig, data: dict[str, Any], data_path: Path,
                log: Callable[[str], None]) -> tuple[list[DraftSequence], list[DraftSequence]]:
    """The training sequences and the calibration split held back from them (``calibration_every``);
    refuses data whose features are not the width this target's drafter reads."""
    calib_seqs = [q for q in data["train"] if in_calibration_split(q.prompt_id, settings.calibration_every)]
    train_seqs = [q for q in data["train"] if not in_calibration_split(q.prompt_id, settings.calibration_every)]
    log(f"data: {len(train_seqs)} training sequences, {len(calib_seqs)} held back for calibration")
    if not train_seqs:
        raise ValueError(f"no training sequence is left after holding back the calibration split "
                         f"(calibration_every {settings.calibration_every}); train on more prompts")
    width = {int(s.features.shape[-1]) for s in (*train_seqs, *data["eval"])}
    if width != {cfg.feature_size}:
        raise WorkDirError(f"{data_path}: features {sorted(width)} wide, this target's drafter reads {cfg.feature_size} "
                           "(data of another target); pass --fresh to regenerate it")
    return train_seqs, calib_seqs


def _start_model(settings: TrainSettings, cfg: DFlashConfig, target, train_seqs: Sequence[DraftSequence],
                 embed: torch.Tensor, found: WorkDir, state_path: Path, log: Callable[[str], None]
                 ) -> tuple[DFlashDraftModel, torch.optim.Optimizer, TrainState]:
    """The initial weights (``init``, the draft vocabulary of the most frequent continuation tokens)
    and the optimizer, or both as the work dir's checkpoint left them."""
    model = DFlashDraftModel.random_init(cfg, seed=settings.seed)
    if settings.init == "target":
        init_from_target(model, target)
    if cfg.draft_vocab_size is not None:
        counts = token_counts(train_seqs, cfg.vocab_size)
        top = np.argsort(-counts, kind="stable")[: cfg.draft_vocab_size]
        model.set_draft_vocab(torch.from_numpy(np.sort(top)), embed)
        covered = counts[top].sum() / max(1, counts.sum())
        log(f"draft vocabulary: the {cfg.draft_vocab_size} most frequent continuation tokens cover "
            f"{100 * covered:.2f} % of the training continuations' tokens")
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    if found.state is None:
        return model, opt, TrainState()
    saved = found.state
    try:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise WorkDirError(f"{state_path}: its weights or optimizer state do not fit this drafter "
                           f"({type(exc).__name__}); pass --fresh to start over") from None
    check_optimizer_state(opt, model, state_path)  # torch does not compare the moments with the weights
    state = saved["state"]
    log(f"resumed from {state_path} at step {state.step}")
    return model, opt, state


def _train_loop(settings: TrainSettings, model: DFlashDraftModel, opt: torch.optim.Optimizer, state: TrainState,
                train_seqs: Sequence[DraftSequence], eval_seqs: Sequence[DraftSequence], embed: torch.Tensor,
                lm_head: torch.Tensor, state_path: Path, log: Callable[[str], None]) -> None:
    """The steps from ``state.step`` to ``settings.steps``: logged, evaluated on a held-out subset
    every ``eval_every`` and checkpointed to ``state_path`` every ``checkpoint_every`` steps."""
    rng = random.Random(settings.seed)
    for _ in range(state.step):  # replay the draws so a resumed run takes the same batches
        _draw(rng, train_seqs, settings)
    eval_subset = eval_seqs[:: max(1, len(eval_seqs) // 24)][:24]
    t_start = time.time() - state.elapsed_s
    while state.step < settings.steps:
        step = state.step
        bsz = settings.block_sizes[step % len(settings.block_sizes)]
        picked, anchors = _draw(rng, train_seqs, settings)
        to_draft = None if model.config.draft_vocab_size is None else model.target_to_draft()
        batch = block_batch(picked, anchors, bsz, to_draft, soft=settings.loss != "ce")
        lr = lr_at(step, settings)
        loss = train_step(model, opt, batch, bsz, embed, lm_head, lr, settings.grad_clip, settings.loss)
        finite_or_raise(loss, None, step + 1, lr)
        state.step += 1
        state.elapsed_s = time.time() - t_start
        state.history.append({"step": state.step, "block_size": bsz, "loss": loss, "lr": lr,
                              "elapsed_s": round(state.elapsed_s, 2)})
        if state.step % 20 == 0 or state.step == 1:
            recent = [h["loss"] for h in state.history[-20:]]
            rate = state.step / max(state.elapsed_s, 1e-9)
            log(f"step {state.step}/{settings.steps} loss {np.mean(recent):.3f} lr {lr:.2e} "
                f"{state.elapsed_s:.0f} s, ETA {(settings.steps - state.step) / max(rate, 1e-9):.0f} s")
        if state.step % settings.eval_every == 0 or state.step == settings.steps:
            taus = {b: tau_summary(acceptance(model, eval_subset, b, embed, lm_head))["all"]
                    for b in sorted(set(settings.block_sizes), reverse=True)}
            state.evals.append({"step": state.step, **{f"tau_b{b}": round(v, 4) for b, v in taus.items()}})
            log(f"held-out subset ({len(eval_subset)} sequences) at step {state.step}: "
                + ", ".join(f"tau@B{b} {v:.3f}" for b, v in taus.items()))
        if state.step % settings.checkpoint_every == 0 or state.step == settings.steps:
            finite_or_raise(loss, model, state.step, lr)  # a non-finite checkpoint is never written
            checkpoint = {"settings": settings.to_json(), "model": model.state_dict(), "optimizer": opt.state_dict(),
                          "state": state}
            # the temp file is removed on any stop (Ctrl-C, SIGTERM) as the checkpoint is written
            atomic_write_with(state_path, lambda tmp: torch.save(checkpoint, tmp))


def _heldout_report(report: dict[str, Any], settings: TrainSettings, model: DFlashDraftModel, data: dict[str, Any],
                    calib_seqs: Sequence[DraftSequence], embed: torch.Tensor, lm_head: torch.Tensor,
                    log: Callable[[str], None]) -> None:
    """Add to ``report`` tau and the per-depth acceptance on both held-out sets, per block size and
    continuation mode, and the calibration prior fitted on the calibration split."""
    eval_seqs = data["eval"]
    for b in sorted(set(settings.block_sizes), reverse=True):
        for mode in sorted({s.mode for s in eval_seqs}):
            rows = acceptance(model, [s for s in eval_seqs if s.mode == mode], b, embed, lm_head)
            report["tau"][f"B{b}/{mode}"] = tau_summary(rows)
            report.setdefault("depth_acceptance", {})[f"heldout/B{b}/{mode}"] = depth_acceptance(rows, b)
            unlike = [s for s in data.get("eval_unlike", []) if s.mode == mode]
            if unlike:
                rows = acceptance(model, unlike, b, embed, lm_head)
                report.setdefault("tau_unlike", {})[f"B{b}/{mode}"] = tau_summary(rows)
                report["depth_acceptance"][f"unlike/B{b}/{mode}"] = depth_acceptance(rows, b)
    report["calibration"] = calibrate_on_split(model, calib_seqs, eval_seqs, data.get("eval_unlike", []),
                                               max(settings.block_sizes), embed, lm_head)
    if report["calibration"]["prior"] is None:
        log(f"no calibration prior: {report['calibration']['skipped']}")
        return
    log(f"calibration prior from {len(calib_seqs)} held-back sequences: ECE raw -> calibrated "
        + ", ".join(f"{k} {v['ece_raw']:.3f} -> {v['ece_calibrated']:.3f}" for k, v in report["calibration"]["ece"].items()))


def _draw(rng: random.Random, seqs: Sequence[DraftSequence], s: TrainSettings) -> tuple[list[DraftSequence], list[list[int]]]:
    picked, anchors = [], []
    while len(picked) < s.seqs_per_step:
        cand = seqs[rng.randrange(len(seqs))]
        a = sample_anchors(rng, cand, s.blocks_per_seq)
        if a:
            picked.append(cand)
            anchors.append(a)
    return picked, anchors
