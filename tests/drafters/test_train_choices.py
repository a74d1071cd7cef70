"""The drafter's training choices (the ablation's knobs): top-k soft labels from the target, the
distillation terms against hand-computed values, initialisation from the target's top layers, the
constant schedule, and every loss training a tiny drafter to a lower loss."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest
import torch

from dcut_sched.calibration import fit_prior
from dcut_sched.drafters.checkpoint import SHIP_DTYPE, load_checkpoint, save_checkpoint
from dcut_sched.drafters.data import DraftSequence, sequence_features
from dcut_sched.drafters.dflash import DFlashConfig, DFlashDraftModel, block_loss_weights
from dcut_sched.drafters.heldout import calibrate_on_split, calibration_blocks, depth_acceptance
from dcut_sched.drafters.train import (
    TrainSettings,
    _draw,
    block_batch,
    in_calibration_split,
    init_from_target,
    lr_at,
    soft_losses,
    step_loss,
    train_step,
)
from dcut_sched.model import LlamaConfig, LlamaModel, greedy_generate

VOCAB = 16
TARGET = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=2, num_kv_heads=1,
                     head_dim=16, tie_word_embeddings=True, max_position=256, name="vocab16")
CFG = DFlashConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
                   vocab_size=VOCAB, target_num_layers=4, target_layer_ids=(0, 2), mask_token_id=15, block_size=8)


@pytest.fixture(scope="module")
def target():
    return LlamaModel.random_init(TARGET, seed=1, std=0.2)


@pytest.fixture(scope="module")
def seqs(target):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 15, (4,), generator=g).tolist() for _ in range(6)]
    outs = greedy_generate(target, prompts, 20, eos_id=None)
    out = [DraftSequence(f"p{i}", "test", "greedy", torch.tensor(p + o), len(p)) for i, (p, o) in enumerate(zip(prompts, outs))]
    sequence_features(target, out, (0, 2), dtype=torch.float32, top_k=4)
    return out


def test_top_k_is_the_targets_next_token_distribution(target, seqs):
    s = seqs[0]
    cache = target.new_cache(1, s.length)
    logits = target(s.tokens[None], torch.arange(s.length)[None], cache)[0]
    logp, ids = logits.log_softmax(-1).topk(4, dim=-1)
    assert s.top_ids.dtype == torch.int32 and s.top_logp.dtype == torch.float16 and s.top_ids.shape == (s.length, 4)
    assert torch.equal(s.top_ids.long(), ids)
    assert torch.allclose(s.top_logp.float(), logp, atol=2e-3)
    # greedy data: each continuation token is the target's most likely one after the position before it
    assert torch.equal(s.top_ids[s.prompt_len - 1:-1, 0].long(), s.tokens[s.prompt_len:])


def test_soft_labels_are_the_distribution_before_each_slot(seqs):
    s = seqs[1]
    batch = block_batch([s], [[s.prompt_len, s.prompt_len + 3]], 4, None, soft=True)
    for b, p in enumerate((s.prompt_len, s.prompt_len + 3)):
        for j in range(1, 4):  # slot j predicts the token at p + j from the distribution at p + j - 1
            assert torch.equal(batch["soft_ids"][0, b, j - 1], s.top_ids[p + j - 1].long())
            assert torch.allclose(batch["soft_p"][0, b, j - 1], s.top_logp[p + j - 1].float().exp())
    # a slot past the sequence has no label and no soft mass
    late = block_batch([s], [[s.length - 2]], 4, None, soft=True)
    assert late["labels"][0, 0].tolist()[1:] == [-100, -100] and float(late["soft_p"][0, 0, 1:].sum()) == 0.0


def test_soft_labels_outside_the_draft_vocabulary_carry_no_mass(seqs):
    s = seqs[2]
    t2d = torch.full((VOCAB,), -1, dtype=torch.long)
    keep = s.top_ids[s.prompt_len, :2].long()  # the two likeliest tokens after the anchor are drafted
    t2d[keep] = torch.arange(2)
    batch = block_batch([s], [[s.prompt_len]], 4, t2d, soft=True)
    assert batch["soft_ids"][0, 0, 0].tolist() == [0, 1, -1, -1]
    assert batch["soft_p"][0, 0, 0, 2:].tolist() == [0.0, 0.0]


def test_soft_losses_by_hand():
    # one block of two slots over a 3-token vocabulary; the target's top-2 at each slot
    logits = torch.log(torch.tensor([[[[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]]]))
    ids = torch.tensor([[[[0, 1], [1, 2]]]])
    p = torch.tensor([[[[0.6, 0.2], [0.5, 0.5]]]])
    w = block_loss_weights(3)  # slot weights 1 and exp(-1 / (7 * 2 / 15))
    w2 = math.exp(-15 / 14)
    assert w.tolist() == pytest.approx([1.0, w2])
    t = soft_losses(logits, ids, p, w)
    kl0 = -(0.75 * math.log(0.5) + 0.25 * math.log(0.3))  # top-k renormalised: 0.6/0.8, 0.2/0.8
    kl1 = -(0.5 * math.log(0.6) + 0.5 * math.log(0.3))
    assert float(t["kl"]) == pytest.approx((kl0 + w2 * kl1) / (1 + w2), rel=1e-5)
    a0, a1 = min(0.6, 0.5) + min(0.2, 0.3), min(0.5, 0.6) + min(0.5, 0.3)  # 0.7, 0.8
    assert float(t["tv"]) == pytest.approx(((1 - a0) + w2 * (1 - a1)) / (1 + w2), rel=1e-5)
    assert float(t["accepted"]) == pytest.approx((a0 + a0 * a1) / 2, rel=1e-5)
    batch = {"soft_ids": ids, "soft_p": p, "labels": torch.tensor([[[0, 1]]])}
    assert float(step_loss(logits, batch, 3, "lk")) == pytest.approx(float(t["kl"]) + 1 - (a0 + a0 * a1) / 2, rel=1e-5)


def test_init_from_target_copies_the_top_layers(target):
    model = DFlashDraftModel.random_init(CFG, seed=0)
    init_from_target(model, target)
    for mine, theirs in zip(model.layers, target.layers[2:]):
        assert torch.equal(mine.q_proj.weight, theirs.self_attn.q_proj.weight)
        assert torch.equal(mine.mlp.state_dict()["down_proj.weight"], theirs.mlp.state_dict()["down_proj.weight"])
        assert torch.equal(mine.post_attention_layernorm.weight, theirs.post_attention_layernorm.weight)
    assert torch.equal(model.norm.weight, target.norm.weight)
    assert not torch.equal(model.fc.weight, torch.zeros_like(model.fc.weight))  # the projection stays random


def test_constant_schedule_and_settings_are_checked():
    s = TrainSettings(lr=2e-3, warmup_steps=10, steps=100, lr_schedule="constant")
    assert lr_at(4, s) == pytest.approx(1e-3) and lr_at(10, s) == lr_at(99, s) == 2e-3
    assert lr_at(99, dataclasses.replace(s, lr_schedule="cosine")) == pytest.approx(2e-3 * (0.1 + 0.45 * (1 + math.cos(math.pi * 89 / 90))))
    for field, bad in (("loss", "mse"), ("init", "zeros"), ("lr_schedule", "step")):
        with pytest.raises(ValueError, match=f"TrainSettings.{field} must be one of"):
            TrainSettings(**{field: bad})


@pytest.mark.parametrize("loss", ["ce", "kl", "tv", "lk"])
def test_every_loss_trains(target, seqs, loss):
    torch.manual_seed(0)
    model = DFlashDraftModel.random_init(CFG, seed=0)
    init_from_target(model, target)
    s = TrainSettings(seqs_per_step=4, blocks_per_seq=4, loss=loss)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    emb = target.embed_tokens.weight.detach()
    losses = []
    for _ in range(40):
        picked, anchors = _draw(rng, seqs, s)
        losses.append(train_step(model, opt, block_batch(picked, anchors, 8, None, soft=loss != "ce"), 8, emb, emb,
                                 3e-3, 1.0, loss))
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5]), losses


def test_calibration_split_keeps_conversations_whole_and_is_a_tenth():
    ids = [f"gsm8k-{i:04d}" for i in range(2000)]
    held = [i for i in ids if in_calibration_split(i, 10)]
    assert 160 <= len(held) <= 240  # CRC-32 spreads the ids: about one in ten
    assert all(in_calibration_split(i + "/turn2", 10) for i in held)  # the second turn goes with the first
    assert not any(in_calibration_split(i + "/turn2", 10) for i in ids if i not in held)


def test_depth_acceptance_counts_prefixes():
    rows = [{"accept_len": torch.tensor([0, 1, 3]).numpy()}, {"accept_len": torch.tensor([2]).numpy()}]
    assert depth_acceptance(rows, 5) == [0.75, 0.5, 0.25, 0.0]


def test_calibration_prior_from_the_split_or_none_when_too_small(target, seqs):
    model = DFlashDraftModel.random_init(CFG, seed=0)
    init_from_target(model, target)
    emb = target.embed_tokens.weight.detach()
    fitted = calibrate_on_split(model, seqs, seqs[:2], [], 8, emb, emb)
    conf, accept, slots = calibration_blocks(model, seqs, 8, emb, emb)
    assert conf.shape == (sum(s.length - s.prompt_len - 1 for s in seqs), 7)
    assert fitted["prior"].intercepts == fit_prior(conf, accept, slots).intercepts
    assert set(fitted["ece"]) == {"calibration split", "held-out"}
    assert fitted["ece"]["calibration split"]["ece_calibrated"] <= fitted["ece"]["calibration split"]["ece_raw"]
    small = calibrate_on_split(model, seqs[:1], [], [], 8, emb, emb)
    assert small["prior"] is None and "1 calibration sequences" in small["skipped"]


def test_bfloat16_checkpoint_loads_as_the_rounded_weights(tmp_path):
    model = DFlashDraftModel.random_init(CFG, seed=0)
    folder = save_checkpoint(model, tmp_path / "d", dtype=SHIP_DTYPE)
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "bfloat16"
    back = load_checkpoint(folder)
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        expect = a.to(torch.bfloat16).float() if a.is_floating_point() else a
        assert torch.equal(expect, b), name
    small = (folder / "model.safetensors").stat().st_size
    full = (save_checkpoint(model, tmp_path / "f") / "model.safetensors").stat().st_size
    assert small < 0.55 * full


def test_truncation_settings_below_one_are_refused():
    for name in ("max_train_prompts", "max_eval_prompts"):
        with pytest.raises(ValueError, match=f"TrainSettings.{name} must be >= 1 or None"):
            TrainSettings(**{name: 0})


def test_a_prior_deeper_than_the_block_is_refused(tmp_path):
    from dcut_sched.calibration import CalibrationPrior
    from dcut_sched.drafters.checkpoint import DraftCheckpointError

    folder = save_checkpoint(DFlashDraftModel.random_init(CFG, seed=0), tmp_path / "d")  # B = 8: 7 draft slots
    CalibrationPrior(intercepts=[0.0] * 7, slope=1.0).save(folder / "calibration.json")
    assert len(load_checkpoint(folder).calibration_prior.intercepts) == 7
    CalibrationPrior(intercepts=[0.0] * 8, slope=1.0).save(folder / "calibration.json")
    with pytest.raises(DraftCheckpointError, match="intercepts has 8 depths, this B = 8 drafter drafts at most 7"):
        load_checkpoint(folder)
