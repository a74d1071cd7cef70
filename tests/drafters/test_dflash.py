"""DFlash drafter: shapes, the non-causal block mask, the context cut-off, the checkpoint round trip,
the engine's incremental context against the one-shot training forward, training lowers the loss,
and lossless engine output (greedy token for token; sampled against the exact distribution)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from dcut_sched import RatioController, policies
from dcut_sched.drafters.checkpoint import DraftCheckpointError, load_checkpoint, save_checkpoint
from dcut_sched.drafters.data import DraftSequence
from dcut_sched.drafters.dflash import DFlashConfig, DFlashDraftModel, block_loss_weights, default_target_layer_ids
from dcut_sched.drafters.heldout import acceptance
from dcut_sched.drafters.runtime import DFlashDrafter, DraftContextError
from dcut_sched.drafters.train import TrainSettings, _draw, block_batch, train_step
from dcut_sched.engine import SpecEngine
from dcut_sched.model import LlamaConfig, LlamaModel, greedy_generate, sample_generate
from dcut_sched.sampling import SamplingParams

VOCAB = 16
B = 4
TARGET = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=2, num_kv_heads=1,
                     head_dim=16, tie_word_embeddings=True, max_position=256, name="vocab16")


def drafter_config(**kw) -> DFlashConfig:
    base = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
                vocab_size=VOCAB, target_num_layers=4, target_layer_ids=(0, 2), mask_token_id=15, block_size=8)
    base.update(kw)
    return DFlashConfig(**base)


@pytest.fixture(scope="module")
def target():
    return LlamaModel.random_init(TARGET, seed=1, std=0.2)


def sequences(target, n: int, length: int, seed: int) -> list[DraftSequence]:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 15, (4,), generator=g).tolist() for _ in range(n)]
    outs = greedy_generate(target, prompts, length, eos_id=None)
    seqs = [DraftSequence(f"p{i}", "test", "greedy", torch.tensor(p + o), len(p)) for i, (p, o) in enumerate(zip(prompts, outs))]
    from dcut_sched.drafters.data import sequence_features

    sequence_features(target, seqs, (0, 2), dtype=torch.float32)
    return seqs


@pytest.fixture(scope="module")
def trained(target):
    """A drafter trained for 150 steps on the target's greedy continuations (and its loss curve)."""
    cfg = drafter_config()
    model = DFlashDraftModel.random_init(cfg, seed=0)
    seqs = sequences(target, 24, 40, seed=0)
    s = TrainSettings(steps=150, seqs_per_step=4, blocks_per_seq=8, block_sizes=(8, 4), lr=3e-3, warmup_steps=10)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr)
    rng = random.Random(0)
    emb = target.embed_tokens.weight.detach()
    losses = []
    for step in range(s.steps):
        bsz = s.block_sizes[step % 2]
        picked, anchors = _draw(rng, seqs, s)
        losses.append(train_step(model, opt, block_batch(picked, anchors, bsz, None), bsz, emb, emb, s.lr, 1.0))
    return model.eval(), losses


def test_default_target_layers_spread_like_dflash():
    assert default_target_layer_ids(30, 4) == (1, 10, 18, 27)
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B's published drafter
    with pytest.raises(ValueError):
        default_target_layer_ids(5, 4)


def test_loss_weights_decay_from_one():
    w = block_loss_weights(16)
    assert w.shape == (15,) and w[0] == 1.0
    assert torch.allclose(w[7], torch.tensor(np.exp(-1.0), dtype=torch.float32))  # gamma 7 at B = 16


def test_shapes_and_block_mask_is_non_causal(target):
    model = DFlashDraftModel.random_init(drafter_config(), seed=2)
    seqs = sequences(target, 1, 20, seed=1)
    emb = target.embed_tokens.weight
    s = seqs[0]
    f, t = s.features[None], s.tokens[None]
    out8 = model.training_logits(f, t, torch.tensor([[6, 9, 12]]), 8, emb, emb)
    assert out8.shape == (1, 3, 7, VOCAB)
    out4 = model.training_logits(f, t, torch.tensor([[6, 9, 12]]), 4, emb, emb)
    # slot 1 of a block sees the later mask slots: a shorter block changes it (a causal mask would not)
    assert not torch.allclose(out8[:, :, 0], out4[:, :, 0])
    # blocks are independent of each other: one block alone gives the same logits
    alone = model.training_logits(f, t, torch.tensor([[9]]), 8, emb, emb)
    assert torch.allclose(alone[0, 0], out8[0, 1], atol=1e-5)


def test_block_sees_only_context_before_its_anchor(target):
    model = DFlashDraftModel.random_init(drafter_config(), seed=3)
    s = sequences(target, 1, 20, seed=2)[0]
    emb = target.embed_tokens.weight
    p = 10
    base = model.training_logits(s.features[None], s.tokens[None], torch.tensor([[p]]), 8, emb, emb)
    later = s.features.clone()
    later[p:] += 5.0  # the anchor's own features and beyond: not yet computed by the target at run time
    t2 = s.tokens.clone()
    t2[p + 1:] = (t2[p + 1:] + 1) % VOCAB  # the tokens the block predicts
    same = model.training_logits(later[None], t2[None], torch.tensor([[p]]), 8, emb, emb)
    assert torch.allclose(base, same, atol=1e-6)
    earlier = s.features.clone()
    earlier[p - 1] += 5.0
    assert not torch.allclose(base, model.training_logits(earlier[None], s.tokens[None], torch.tensor([[p]]), 8, emb, emb))


def test_checkpoint_round_trip_and_vllm_format(tmp_path, target):
    for vocab in (None, 12):
        model = DFlashDraftModel.random_init(drafter_config(draft_vocab_size=vocab), seed=4)
        if vocab:
            model.set_draft_vocab(torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13]), target.embed_tokens.weight)
        folder = save_checkpoint(model, tmp_path / f"d{vocab}")
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["architectures"] == ["DFlashDraftModel"]
        assert cfg["dflash_config"] == {"mask_token_id": 15, "target_layer_ids": [0, 2], "block_size": 8}
        from safetensors.torch import load_file

        names = set(load_file(str(folder / "model.safetensors")))
        assert "layers.0.self_attn.q_proj.weight" in names and "fc.weight" in names and "embed_tokens.weight" not in names
        assert ("lm_head.weight" in names) == bool(vocab) and ("d2t" in names) == bool(vocab)
        again = load_checkpoint(folder)
        s = sequences(target, 1, 12, seed=5)[0]
        emb = target.embed_tokens.weight
        a = model.training_logits(s.features[None], s.tokens[None], torch.tensor([[6]]), 8, emb, emb)
        assert torch.equal(a, again.training_logits(s.features[None], s.tokens[None], torch.tensor([[6]]), 8, emb, emb))
        if vocab:
            assert again.to_target_ids(torch.tensor([11])).item() == 13


def test_checkpoint_errors_name_file_and_field(tmp_path):
    folder = save_checkpoint(DFlashDraftModel.random_init(drafter_config(), seed=0), tmp_path / "d")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["dflash_config"]["mask_token_id"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftCheckpointError, match=r"config.json: field dflash_config.mask_token_id: missing"):
        load_checkpoint(folder)
    with pytest.raises(DraftCheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nowhere")
    folder2 = save_checkpoint(DFlashDraftModel.random_init(drafter_config(), seed=0), tmp_path / "e")
    cfg = json.loads((folder2 / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (folder2 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftCheckpointError, match="tensors missing"):
        load_checkpoint(folder2)


def test_training_lowers_the_loss(trained):
    _, losses = trained
    assert np.mean(losses[-20:]) < 0.7 * np.mean(losses[:10])


def test_engine_context_equals_one_shot_forward(target, trained):
    """The drafter fed incrementally (prefill, then verified slots) drafts what the training forward
    drafts at the same anchor."""
    model, _ = trained
    s = sequences(target, 1, 24, seed=7)[0]
    drafter = DFlashDrafter(model, target, max_batch_size=2, max_seq_len=64)
    n0 = s.prompt_len
    drafter.extend([1], [s.features[: n0 - 1]], [0])
    drafter.extend([1], [s.features[n0 - 1: n0 + 3]], [n0 - 1])  # as if 3 drafts + current were committed
    seq = s.tokens[: n0 + 4].tolist()
    toks, conf = drafter.draft([seq], 7, rows=[1])
    emb = target.embed_tokens.weight
    ref = model.training_logits(s.features[None], s.tokens[None], torch.tensor([[n0 + 3]]), 8, emb, emb)[0, 0]
    assert toks[0].tolist() == ref.argmax(-1).tolist()
    assert torch.allclose(conf[0], ref.softmax(-1).max(-1).values, atol=1e-5)
    with pytest.raises(DraftContextError):
        drafter.draft([seq + [1]], 7, rows=[1])


def controller(name, make_curve, max_bs=8):
    needs = policies.get(name).needs_cost
    curve = (make_curve(batch_sizes=tuple(range(1, max_bs + 1)), block_size=B, per_token_ms=0.05, draft_base_ms=0.5,
                        draft_per_request_ms=0.01) if needs else None)
    return RatioController(curve, B, policy=name)


@pytest.mark.parametrize("name", policies.names())
def test_engine_with_dflash_equals_greedy_decoding(target, trained, make_curve, name):
    model, _ = trained
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 15, (int(n),), generator=g).tolist() for n in (3, 7, 1, 5, 9)]
    ref = greedy_generate(target, prompts, 14, eos_id=None, batch_size=1)
    result = SpecEngine(target, controller(name, make_curve), batch_size=3, max_new_tokens=14, dflash=model).generate(prompts)
    assert result.outputs == ref
    if name in ("full", "oracle"):
        assert sum(sum(s.accepted) for s in result.steps) > 10  # the drafts are good enough to be kept


def test_held_out_acceptance_counts_prefix_matches(target, trained):
    model, _ = trained
    seqs = sequences(target, 3, 30, seed=9)
    rows = acceptance(model, seqs, 8, target.embed_tokens.weight, target.embed_tokens.weight)
    for r, s in zip(rows, seqs):
        for i, p in enumerate(r["pos"]):
            a = r["accept_len"][i]
            toks = r["tokens"][i]
            q = s.prompt_len + p
            assert list(toks[:a]) == s.tokens[q + 1: q + 1 + a].tolist()
            if a < 7 and q + 1 + a < s.length:
                assert toks[a] != s.tokens[q + 1 + a]


def test_sampled_engine_with_dflash_equals_sampled_decoding(target, trained, make_curve):
    model, _ = trained
    sp = SamplingParams(temperature=0.8, seed=3)
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]] * 2
    ref = sample_generate(target, prompts, 12, None, sp, batch_size=1)
    for name in ("full", "dcut", "fine", "topk"):
        out = SpecEngine(target, controller(name, make_curve), batch_size=4, max_new_tokens=12, dflash=model,
                         sampling=sp).generate(prompts)
        assert out.outputs == ref, name


def test_training_is_deterministic_for_a_seed(target):
    """Same seed, same data: the same draws and the same losses, step for step (the card's
    reproducibility claim rests on this and on the seeded data)."""
    seqs = sequences(target, 8, 20, seed=3)
    s = TrainSettings(steps=6, seqs_per_step=2, blocks_per_seq=4, block_sizes=(8, 4), lr=3e-3, warmup_steps=2)
    emb = target.embed_tokens.weight.detach()

    def run():
        model = DFlashDraftModel.random_init(drafter_config(), seed=5)
        opt = torch.optim.AdamW(model.parameters(), lr=s.lr)
        rng = random.Random(5)
        out = []
        for step in range(s.steps):
            bsz = s.block_sizes[step % 2]
            picked, anchors = _draw(rng, seqs, s)
            out.append(train_step(model, opt, block_batch(picked, anchors, bsz, None), bsz, emb, emb, s.lr, 1.0))
        return out

    assert run() == run()


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(dcut_sched=[1]), r"field dcut_sched: Input should be a valid dictionary"),
    (lambda c: c["dflash_config"].update(mask_token_id=5.5), r"field dflash_config.mask_token_id: Input should be a valid integer"),
    (lambda c: c["dflash_config"].update(mask_token_id=True), r"field dflash_config.mask_token_id"),
    (lambda c: c.update(rope_theta="nan"), r"field rope_theta: Input should be a valid number"),
    (lambda c: c.update(rope_theta=-1), r"field rope_theta: Input should be greater than 0"),
    (lambda c: c.update(rms_norm_eps=-1), r"field rms_norm_eps"),
    (lambda c: c.update(tie_word_embeddings="false"), r"field tie_word_embeddings: Input should be a valid boolean"),
    (lambda c: c.update(hidden_size=10 ** 6), r"field hidden_size: Input should be less than or equal"),
    (lambda c: c.update(num_hidden_layers=10 ** 7), r"field num_hidden_layers"),
])
def test_hostile_configs_are_named(tmp_path, edit, match):
    folder = save_checkpoint(DFlashDraftModel.random_init(drafter_config(), seed=0), tmp_path / "d")
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftCheckpointError, match=match):
        load_checkpoint(folder)


def test_huge_number_and_duplicate_key_in_config_are_named(tmp_path):
    folder = save_checkpoint(DFlashDraftModel.random_init(drafter_config(), seed=0), tmp_path / "d")
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.replace('"hidden_size": 32', '"hidden_size": ' + "9" * 5000))
    with pytest.raises(DraftCheckpointError, match=r"config.json: a number with 5000 characters"):
        load_checkpoint(folder)
    (folder / "config.json").write_text(text.replace('"hidden_size": 32', '"hidden_size": 32, "hidden_size": 64'))
    with pytest.raises(DraftCheckpointError, match=r"key 'hidden_size' appears twice"):
        load_checkpoint(folder)


def test_saved_weights_are_readable_by_others_and_bad_d2t_is_named(tmp_path, target):
    import os
    import stat

    from safetensors.torch import load_file, save_file

    model = DFlashDraftModel.random_init(drafter_config(draft_vocab_size=12), seed=4)
    model.set_draft_vocab(torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13]), target.embed_tokens.weight)
    folder = save_checkpoint(model, tmp_path / "d")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((folder / "model.safetensors").stat().st_mode) == 0o666 & ~mask
    t = load_file(str(folder / "model.safetensors"))
    t["d2t"] = t["d2t"].view(3, 4)
    save_file(t, str(folder / "model.safetensors"))
    with pytest.raises(DraftCheckpointError, match=r"tensor d2t has shape \(3, 4\), expected \[12\]"):
        load_checkpoint(folder)
    t["d2t"] = t["d2t"].reshape(-1)
    t["fc.weight"] = t["fc.weight"].double() * 1e300
    save_file(t, str(folder / "model.safetensors"))
    with pytest.raises(DraftCheckpointError, match=r"tensor fc.weight holds non-finite values"):
        load_checkpoint(folder)


#: ``fine`` made to alternate: every drafted step stops drafting (the margin is out of reach), every
#: plain step asks for a probe (interval 1, a budget that always admits one)
# fine alternating drafted and undrafted steps (a probe after every plain step); decided without
# feedback, so two runs make the same decisions whatever their measured step times
SWITCHING = {"speculate_margin": 1000.0, "probe_interval": 1, "probe_budget": 0.9, "feedback": False}


def test_engine_switching_drafted_and_undrafted_steps_is_lossless(target, trained, make_curve):
    """Requests that alternate between drafted and undrafted steps (the undrafted step keeps only the
    drafter's context) decode exactly what plain decoding does, greedy and sampled."""
    model, _ = trained
    curve = make_curve(batch_sizes=tuple(range(1, 9)), block_size=B, per_token_ms=0.05, draft_base_ms=0.5,
                       draft_per_request_ms=0.01)
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11, 3]]
    for sp in (None, SamplingParams(temperature=0.8, seed=5)):
        ref = (greedy_generate(target, prompts, 14, eos_id=None, batch_size=1) if sp is None
               else sample_generate(target, prompts, 14, None, sp, batch_size=1))
        ctrl = RatioController(curve, B, policy="fine", **SWITCHING)
        result = SpecEngine(target, ctrl, batch_size=3, max_new_tokens=14, dflash=model, sampling=sp).generate(prompts)
        assert result.outputs == ref
        drafted = [s.drafted for s in result.steps]
        assert sum(drafted) >= 4 and len(drafted) - sum(drafted) >= 4
        assert any(a and not b for a, b in zip(drafted, drafted[1:])) and any(b and not a for a, b in zip(drafted, drafted[1:]))
        assert sum(sum(s.accepted) for s in result.steps if s.drafted) > 0  # drafts after plain stretches are kept


def test_extend_flat_equals_piecewise_extend(target, trained):
    """One flat call writes the same context as one call per row, and counts each row's tokens."""
    model, _ = trained
    s = sequences(target, 2, 20, seed=4)
    a = DFlashDrafter(model, target, max_batch_size=3, max_seq_len=64)
    b = DFlashDrafter(model, target, max_batch_size=3, max_seq_len=64)
    a.extend([2], [s[0].features[:5]], [0])
    a.extend([0], [s[1].features[:3]], [0])
    b.extend_flat([2, 0], [5, 3], [0, 0], torch.cat([s[0].features[:5], s[1].features[:3]]))
    assert a.context_len.tolist() == b.context_len.tolist() == [3, 0, 5]
    # the same values up to rounding: one projection over 8 rows and two over 5 and 3 may take
    # different GEMM kernels (bit-equal on some CPUs' BLAS, not on every one)
    for ka, kb, va, vb in zip(a.k_cache, b.k_cache, a.v_cache, b.v_cache):
        assert torch.allclose(ka, kb, rtol=1e-5, atol=1e-6) and torch.allclose(va, vb, rtol=1e-5, atol=1e-6)
    with pytest.raises(DraftContextError, match="row 2 holds 5 context tokens"):
        b.extend_flat([2], [1], [4], s[0].features[4:5])


def test_committed_features_gathers_each_requests_first_slots():
    """Requests split over several packed rows: slot s of request j is row first(j) + s // T, column s % T."""
    from dcut_sched.engine.decode_step import committed_features
    from dcut_sched.engine.packing import pack_rows

    lengths = [5, 1, 3]
    packing = pack_rows(lengths)
    T = packing.tokens_per_row
    feats = torch.zeros(packing.num_rows, T, 2)
    for r, (j, start, n) in enumerate(zip(packing.request, packing.start, packing.length)):
        for c in range(n):
            feats[r, c] = torch.tensor([j, start + c], dtype=torch.float32)
    got = committed_features(packing, feats, [4, 1, 2])
    assert got.tolist() == [[0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [2, 0], [2, 1]]


def test_deferred_context_equals_immediate_writes(target, trained):
    """Deferred pieces (a row reset and refilled in between included) leave the cache that immediate
    writes leave at every position a draft reads, and the drafts are the same."""
    model, _ = trained
    s = sequences(target, 3, 24, seed=8)
    now = DFlashDrafter(model, target, max_batch_size=2, max_seq_len=64)
    later = DFlashDrafter(model, target, max_batch_size=2, max_seq_len=64)
    for d, defer in ((now, False), (later, True)):
        d.extend_flat([0, 1], [4, 6], [0, 0], torch.cat([s[0].features[:4], s[1].features[:6]]), defer=defer)
        d.extend_flat([0, 1], [2, 1], [4, 6], torch.cat([s[0].features[4:6], s[1].features[6:7]]), defer=defer)
        d.reset([1])  # row 1 gets a new request: its old pieces may still be pending
        d.extend_flat([1], [3], [0], s[2].features[:3], defer=defer)
    assert later._pending_tokens == 16 and now._pending_tokens == 0
    seqs = [s[0].tokens[:7].tolist(), s[2].tokens[:4].tolist()]
    a, b = now.draft(seqs, 7), later.draft(seqs, 7)
    assert later._pending_tokens == 0
    assert torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1])
    for kn, kl in zip(now.k_cache, later.k_cache):
        # up to rounding: the deferred projection runs over other row counts (other GEMM kernels)
        assert torch.allclose(kn[0, :, :6], kl[0, :, :6], rtol=1e-5, atol=1e-6)
        assert torch.allclose(kn[1, :, :3], kl[1, :, :3], rtol=1e-5, atol=1e-6)
