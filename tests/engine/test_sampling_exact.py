"""Sampled verification is lossless: exact distributions by enumeration vs many engine runs.

A tiny random-weight Llama with a 16-token vocabulary; the exact distribution of the first three
output tokens under plain target sampling is enumerated (16**3 outcomes) and compared with the engine's
outputs under ``full``, ``dcut``, ``fine`` and ``threshold`` by a chi-square test (scipy.stats), cells
with small expected counts pooled, at a significance level fixed below. The same test rejects the
biased length rule of the worked case (sampled drafts, verified only when confident).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from dcut_sched import RatioController, policies
from dcut_sched.engine import SpecEngine
from dcut_sched.model import LlamaConfig, LlamaModel, sample_generate
from dcut_sched.sampling import SamplingParams, request_keys, sampling_probs

VOCAB = 16
B = 4
NUM_TOKENS = 3  # enumerated output tokens
NUM_SAMPLES = 2000
BATCH = 48
ALPHA = 1e-3  # per-test significance level; seeds are fixed, so the outcome is deterministic
PROMPT = [3, 7, 1]
SKIP = (2,)
CFG = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=2, num_kv_heads=1,
                  head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, max_position=256,
                  name="vocab16")


@pytest.fixture(scope="module")
def model():
    # std 0.2: first-token max probability ~0.47 and ~0.4 accepted drafts per step with layer 2 skipped
    return LlamaModel.random_init(CFG, seed=1, std=0.2)


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square goodness-of-fit test (scipy.stats.chisquare).

    Cells with expected count below ``min_expected`` are pooled into one cell (the usual validity
    condition of the chi-square approximation); a sample in a cell of probability 0 gives p = 0.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    if np.any(counts[probs == 0] > 0):
        return 0.0
    expected = n * probs
    big = expected >= min_expected
    obs = np.concatenate([counts[big], [counts[~big].sum()]])
    exp = np.concatenate([expected[big], [expected[~big].sum()]])
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


@torch.inference_mode()
def exact_first_tokens(model, prompt, sp: SamplingParams, m: int = NUM_TOKENS) -> np.ndarray:
    """``[V]*m`` array: P(x_1..x_m) under plain target sampling, by enumerating every prefix."""
    prefixes = np.array(list(itertools.product(range(VOCAB), repeat=m - 1)), dtype=np.int64).reshape(VOCAB ** (m - 1), m - 1)
    ids = torch.tensor([list(prompt) + list(p) for p in prefixes])
    T = ids.shape[1]
    cache = model.new_cache(len(ids), T)
    logits = model(ids, torch.arange(T)[None].expand(len(ids), T), cache)  # [R, T, V]
    probs = sampling_probs(logits[:, len(prompt) - 1:], sp).numpy()  # [R, m, V]
    out = np.ones([VOCAB] * m)
    for r, pre in enumerate(prefixes):
        joint = 1.0
        for t, tok in enumerate(pre):
            joint *= probs[r, t, tok]
        out[tuple(pre)] = joint * probs[r, m - 1]
    assert abs(out.sum() - 1) < 1e-9
    return out


def counts_of(outputs: list[list[int]], m: int = NUM_TOKENS) -> np.ndarray:
    counts = np.zeros([VOCAB] * m)
    for o in outputs:
        counts[tuple(o[:m])] += 1
    return counts


def controller(name, make_curve, max_bs: int = 8):
    # cheap verified tokens (0.05 ms each on a 10 ms step) and drafts, so dcut and fine verify drafts often
    needs = policies.get(name).needs_cost
    curve = (make_curve(batch_sizes=tuple(range(1, max_bs + 1)), block_size=B, per_token_ms=0.05, draft_base_ms=0.5,
                        draft_per_request_ms=0.01) if needs else None)
    # raw confidences and, for fine, no feedback: the test needs drafts verified often (both verification
    # branches exercised); the online calibrator would learn the tiny model's low acceptance, and fine's
    # realized outcomes (accepted drafts, this machine's measured step times) would verify fewer
    params = {"feedback": False} if name == "fine" else {}
    return RatioController(curve, B, policy=name, calibrate=False, **params)


SETTINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_p=0.9, top_k=8),
]


DIST_POLICIES = ["full", "dcut", "fine", "threshold"]
CASES = [(name, 0) for name in DIST_POLICIES] + [("full", 1), ("dcut", 1)]


@pytest.mark.parametrize("name, sp_index", CASES)
def test_engine_matches_exact_target_distribution(model, make_curve, name, sp_index):
    base = SETTINGS[sp_index]
    # a different seed per policy, so the four tests are four independent samples
    sp = SamplingParams(temperature=base.temperature, top_p=base.top_p, top_k=base.top_k,
                        seed=10 * sp_index + DIST_POLICIES.index(name))
    _check_engine_distribution(model, make_curve, name, sp, min_branch=300, label=name, skip_layers=SKIP)


def _check_engine_distribution(model, make_curve, name, sp, *, min_branch, label, **engine_kw):
    """Run the engine on NUM_SAMPLES copies of PROMPT and chi-square its first tokens against the exact
    target distribution; drafts must be both accepted and rejected at least ``min_branch`` times."""
    exact = exact_first_tokens(model, PROMPT, sp)
    engine = SpecEngine(model, controller(name, make_curve, BATCH), batch_size=BATCH, max_new_tokens=NUM_TOKENS,
                        sampling=sp, **engine_kw)
    result = engine.generate([PROMPT] * NUM_SAMPLES)
    # drafts do get accepted and rejected, so both branches of verification are exercised
    accepted = sum(sum(s.accepted) for s in result.steps)
    verified = sum(n - 1 for s in result.steps for n in s.lengths)
    assert accepted > min_branch and verified - accepted > min_branch
    p = chi_square_pvalue(counts_of(result.outputs), exact)
    assert p > ALPHA, f"{label} {sp.describe()}: chi-square p = {p:.2e}"


@pytest.fixture(scope="module")
def dflash_drafter(model):
    """A DFlash block drafter for ``model``, trained for 120 steps on its sampled continuations."""
    import random

    from dcut_sched.drafters.data import DraftSequence, sequence_features
    from dcut_sched.drafters.dflash import DFlashConfig, DFlashDraftModel
    from dcut_sched.drafters.train import TrainSettings, _draw, block_batch, train_step

    cfg = DFlashConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
                       vocab_size=VOCAB, target_num_layers=3, target_layer_ids=(0, 1), mask_token_id=15, block_size=B)
    drafter = DFlashDraftModel.random_init(cfg, seed=0)
    sp = SamplingParams(temperature=1.0, seed=99)
    prompts = [[int(t) for t in np.random.default_rng(i).integers(0, VOCAB, 3)] for i in range(24)]
    seqs = [DraftSequence(str(i), "t", "t1", torch.tensor(p + o), len(p))
            for i, (p, o) in enumerate(zip(prompts, sample_generate(model, prompts, 24, None, sp)))]
    sequence_features(model, seqs, cfg.target_layer_ids, dtype=torch.float32)
    s = TrainSettings(steps=120, seqs_per_step=4, blocks_per_seq=8, block_sizes=(B,), lr=3e-3, warmup_steps=10)
    opt = torch.optim.AdamW(drafter.parameters(), lr=s.lr)
    rng = random.Random(0)
    emb = model.embed_tokens.weight.detach()
    for _ in range(s.steps):
        picked, anchors = _draw(rng, seqs, s)
        train_step(drafter, opt, block_batch(picked, anchors, B, None), B, emb, emb, s.lr, 1.0)
    return drafter.eval()


@pytest.mark.parametrize("name", ["full", "dcut"])
def test_engine_with_dflash_matches_exact_target_distribution(model, make_curve, dflash_drafter, name):
    """The same chi-square test with the DFlash block drafter proposing the drafts."""
    sp = SamplingParams(temperature=1.0, seed=40 + DIST_POLICIES.index(name))
    _check_engine_distribution(model, make_curve, name, sp, min_branch=100, label=f"dflash {name}",
                               dflash=dflash_drafter)


# --------------------------------------------------------------- the biased rule of the worked case
def sampled_draft_step(p: np.ndarray, q: np.ndarray, rng: np.random.Generator, verify_if) -> np.ndarray:
    """One token per row with a *sampled* one-token draft: d ~ q, then either standard rejection
    sampling (accept with min(1, p(d)/q(d)), else sample max(0, p - q) renormalised) when
    ``verify_if(q(d))``, or a direct target sample. ``p``, ``q``: ``[n, V]``; returns ``[n]`` tokens."""
    n, V = p.shape
    cq = np.cumsum(q, 1)
    d = np.minimum((cq < rng.random((n, 1)) * cq[:, -1:]).sum(1), V - 1)
    qd, pd_ = q[np.arange(n), d], p[np.arange(n), d]
    residual = np.maximum(p - q, 0)
    residual = np.where(residual.sum(1, keepdims=True) > 0, residual, p)
    cr = np.cumsum(residual, 1)
    fix = np.minimum((cr < rng.random((n, 1)) * cr[:, -1:]).sum(1), V - 1)
    cp = np.cumsum(p, 1)
    direct = np.minimum((cp < rng.random((n, 1)) * cp[:, -1:]).sum(1), V - 1)
    accept = rng.random(n) < np.minimum(1.0, pd_ / qd)
    verified = np.where(accept, d, fix)
    return np.where(verify_if(qd), verified, direct)


def test_worked_case_biased_rule_is_rejected():
    """Vocabulary {a, b}, q = (0.9, 0.1), p = (0.5, 0.5): verifying only confident drafts gives P(a) = 0.55."""
    p = np.array([[0.5, 0.5]]).repeat(NUM_SAMPLES, 0)
    q = np.array([[0.9, 0.1]]).repeat(NUM_SAMPLES, 0)
    rng = np.random.default_rng(0)
    biased = sampled_draft_step(p, q, rng, lambda qd: qd >= 0.5)
    fair = sampled_draft_step(p, q, rng, lambda qd: np.ones_like(qd, dtype=bool))
    # exact probability of a under the biased rule: q(a) * min(1, p(a)/q(a)) + q(b) * p(a)
    assert 0.9 * (0.5 / 0.9) + 0.1 * 0.5 == pytest.approx(0.55)
    assert np.mean(biased == 0) == pytest.approx(0.55, abs=0.03)
    assert chi_square_pvalue(np.bincount(biased, minlength=2), p[0]) < ALPHA
    assert chi_square_pvalue(np.bincount(fair, minlength=2), p[0]) > ALPHA


@torch.inference_mode()
def test_biased_rule_on_the_tiny_model_is_rejected(model):
    """The same rule on the tiny model's first token: drafts sampled from the drafter (layer 2 skipped)
    at T = 0.5, verified only when q(d) >= 0.5, against the target at T = 1. Always verifying passes."""
    sp = SamplingParams(temperature=1.0)
    exact = exact_first_tokens(model, PROMPT, sp, m=1)
    cache = model.new_cache(1, len(PROMPT))
    ids = torch.tensor([PROMPT])
    draft_layers = [i for i in range(CFG.num_layers) if i not in SKIP]
    draft_logits = model(ids, torch.arange(len(PROMPT))[None], cache, layers=draft_layers)[0, -1]
    q = sampling_probs(draft_logits, SamplingParams(temperature=0.5)).numpy()
    p_rows = exact[None].repeat(NUM_SAMPLES, 0)
    q_rows = q[None].repeat(NUM_SAMPLES, 0)
    rng = np.random.default_rng(1)
    biased = sampled_draft_step(p_rows, q_rows, rng, lambda qd: qd >= 0.5)
    fair = sampled_draft_step(p_rows, q_rows, rng, lambda qd: np.ones_like(qd, dtype=bool))
    # exact distribution under the biased rule: verified branch for confident d, direct sample otherwise
    conf = q >= 0.5
    resid = np.maximum(exact - q, 0)
    resid = resid / resid.sum()
    verified = np.minimum(q, exact) * conf + (q * conf * (1 - np.minimum(1, exact / q))).sum() * resid
    biased_exact = verified + (q * ~conf).sum() * exact
    assert 0.5 * np.abs(biased_exact - exact).sum() > 0.05  # the rule moves >= 5% of the mass
    assert chi_square_pvalue(np.bincount(biased, minlength=VOCAB), exact) < ALPHA
    assert chi_square_pvalue(np.bincount(biased, minlength=VOCAB), biased_exact) > ALPHA
    assert chi_square_pvalue(np.bincount(fair, minlength=VOCAB), exact) > ALPHA


# --------------------------------------------------------------- token-level identities
@pytest.mark.parametrize("name", policies.names())
def test_sampled_engine_equals_sampled_decoding_for_every_policy(model, make_curve, name):
    """With the same keys every policy reproduces plain sampled decoding token for token."""
    sp = SamplingParams(temperature=0.8, top_p=0.95, seed=5)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, VOCAB, size=int(n)).tolist() for n in (2, 5, 1, 4, 7, 3, 6, 2, 3)]
    ref = sample_generate(model, prompts, 12, None, sp, batch_size=1)
    engine = SpecEngine(model, controller(name, make_curve), batch_size=4, max_new_tokens=12, skip_layers=SKIP,
                        sampling=sp)
    assert engine.generate(prompts).outputs == ref


def test_output_depends_only_on_the_request_key(model, make_curve):
    sp = SamplingParams(temperature=1.0, seed=3)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, VOCAB, size=4).tolist() for _ in range(10)]
    keys = request_keys(sp.seed, len(prompts))
    alone = SpecEngine(model, controller("dcut", make_curve), batch_size=1, max_new_tokens=10, skip_layers=SKIP,
                       sampling=sp).generate(prompts[:3], keys=keys[:3]).outputs
    mixed = SpecEngine(model, controller("dcut", make_curve), batch_size=8, max_new_tokens=10, skip_layers=SKIP,
                       sampling=sp).generate(prompts[::-1], keys=keys[::-1]).outputs[::-1]
    assert mixed[:3] == alone
    other_seed = SpecEngine(model, controller("dcut", make_curve), batch_size=8, max_new_tokens=10, skip_layers=SKIP,
                            sampling=SamplingParams(temperature=1.0, seed=4)).generate(prompts).outputs
    assert other_seed != mixed


def test_sampled_trace_records_target_probabilities(model, make_curve, tmp_path):
    from dcut_sched.traces import Trace

    sp = SamplingParams(temperature=0.7, seed=1)
    engine = SpecEngine(model, controller("full", make_curve), batch_size=4, max_new_tokens=8, skip_layers=SKIP,
                        sampling=sp)
    result = engine.generate([PROMPT, [1, 2], [5]], record_trace=True)
    trace = result.trace({"target_model": "tiny", "draft_model": "skip 2", "dataset": "random"})
    assert trace.sampled and trace.temperature == 0.7
    assert trace.target_prob.shape == trace.conf.shape
    assert np.all((trace.target_prob >= 0) & (trace.target_prob <= 1))
    trace.save(tmp_path / "s.parquet")
    again = Trace.load(tmp_path / "s.parquet")
    np.testing.assert_array_equal(again.target_prob, trace.target_prob)
    with pytest.raises(ValueError, match="policy 'full'"):
        SpecEngine(model, controller("dcut", make_curve), batch_size=4, max_new_tokens=8, skip_layers=SKIP,
                   sampling=sp).generate([PROMPT], record_trace=True)
