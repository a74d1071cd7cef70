"""Held-out quality of a DFlash drafter: acceptance per anchor, tau, per-depth acceptance, calibration.

For every anchor of a continuation the accepted length is the longest prefix of draft tokens equal
to the continuation; tau = 1 + its mean. On a greedy continuation that is greedy verification's
acceptance; on a sampled one, that of sampled verification with the same draws (docs/sampling.md).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..calibration import calibration_report, fit_prior
from .data import DraftSequence
from .dflash import DFlashDraftModel

__all__ = ["acceptance", "calibrate_on_split", "calibration_blocks", "depth_acceptance", "tau_summary"]


@torch.inference_mode()
def acceptance(model: DFlashDraftModel, seqs: Sequence[DraftSequence], block_size: int, embed: torch.Tensor,
               lm_head: torch.Tensor, *, max_blocks: int = 64) -> list[dict[str, Any]]:
    """Per held-out sequence, every anchor's draft: tokens, confidences and accepted length.

    Returns one dict per sequence: ``pos`` (anchor positions, counted from the first generated
    token), ``accept_len [n]`` (0..B-1), ``conf [n, B-1]`` float32, ``tokens [n, B-1]`` target ids.
    Slots past the sequence's end cannot be accepted.
    """
    model.eval()
    out = []
    for s in seqs:
        anchors = list(range(s.prompt_len, s.length - 1))
        if not anchors:
            continue
        acc, confs, toks = [], [], []
        for i in range(0, len(anchors), max_blocks):
            a = anchors[i:i + max_blocks]
            logits = model.training_logits(s.features[None].float(), s.tokens[None], torch.tensor([a]), block_size,
                                           embed, lm_head)[0]  # [nb, B-1, V]
            probs_max, arg = logits.float().softmax(-1).max(-1)
            tok = model.to_target_ids(arg)
            for b, p in enumerate(a):
                k = 0
                while k < block_size - 1 and p + 1 + k < s.length and int(tok[b, k]) == int(s.tokens[p + 1 + k]):
                    k += 1
                acc.append(k)
            confs.append(probs_max.numpy().astype(np.float32))
            toks.append(tok.numpy())
        out.append({"prompt_id": s.prompt_id, "category": s.category, "mode": s.mode,
                    "pos": np.array(anchors) - s.prompt_len, "accept_len": np.array(acc, dtype=np.int64),
                    "conf": np.concatenate(confs), "tokens": np.concatenate(toks)})
    return out



def calibration_blocks(model: DFlashDraftModel, seqs: Sequence[DraftSequence], block_size: int, embed: torch.Tensor,
                       lm_head: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every anchor's block of ``seqs`` (features filled): ``conf [N, B-1]``, drafts accepted ``[N]``
    with every slot verified, and ``num_slots [N]`` (slots left before the sequence's end), the
    inputs of :func:`~dcut_sched.calibration.fit_prior`."""
    conf, accept, slots = [], [], []
    for s in seqs:
        for row in acceptance(model, [s], block_size, embed, lm_head):
            conf.append(row["conf"])
            accept.append(row["accept_len"])
            slots.append(np.minimum(block_size - 1, s.length - s.prompt_len - 1 - row["pos"]))
    if not conf:
        raise ValueError("calibration_blocks: no anchor to draft from ("
                         + ("no sequence given)" if not seqs else "every continuation is empty)"))
    return np.concatenate(conf), np.concatenate(accept), np.concatenate(slots)



def depth_acceptance(rows: Sequence[dict[str, Any]], block_size: int) -> list[float]:
    """``P(accepted length >= d)`` for ``d = 1..B-1`` over every anchor of ``rows`` (:func:`acceptance`)."""
    acc = np.concatenate([r["accept_len"] for r in rows])
    return [round(float((acc >= d).mean()), 4) for d in range(1, block_size)]



def tau_summary(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """tau (1 + mean accepted length over every anchor) overall and per category."""
    by: dict[str, list[np.ndarray]] = {}
    for r in rows:
        by.setdefault(r["category"], []).append(r["accept_len"])
        by.setdefault("all", []).append(r["accept_len"])
    return {k: float(1 + np.concatenate(v).mean()) for k, v in sorted(by.items())}



def calibrate_on_split(model: DFlashDraftModel, calib: Sequence[DraftSequence], heldout: Sequence[DraftSequence],
                       unlike: Sequence[DraftSequence], block_size: int, embed: torch.Tensor, lm_head: torch.Tensor
                       ) -> dict[str, Any]:
    """The per-depth calibration prior fitted on the calibration split ``calib`` at ``block_size``,
    and its ECE (raw and calibrated) there and on both held-out sets: ``{"prior": CalibrationPrior,
    "ece": {split: calibration_report}}``; ``prior`` None (and ``skipped`` the reason) when the split
    is too small to fit one."""
    try:
        conf, accept, slots = calibration_blocks(model, calib, block_size, embed, lm_head)
        prior = fit_prior(conf, accept, slots)
    except ValueError as exc:  # a smoke run's split too small to fit: no prior
        return {"prior": None, "ece": {}, "skipped": f"{len(calib)} calibration sequences: {exc}"}
    ece = {"calibration split": calibration_report(conf, accept, slots, prior)}
    for name, seqs in (("held-out", heldout), ("unlike", unlike)):
        if seqs:
            ece[name] = calibration_report(*calibration_blocks(model, seqs, block_size, embed, lm_head), prior)
    prior = prior.model_copy(update={"provenance": {
        "fitted_on": f"the calibration split of the training data: {len(calib)} continuations "
                     "(TrainSettings.calibration_every), never trained on", "block_size": block_size,
        "blocks": int(conf.shape[0]), **{f"ece {k}": [v["ece_raw"], v["ece_calibrated"]] for k, v in ece.items()}}})
    return {"prior": prior, "ece": ece}
