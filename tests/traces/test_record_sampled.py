"""Sampled trace recording: the target's probability of every draft token, against brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dcut_sched.engine.trace_backends import NativeBackend, draft_all_positions, target_probs_all_positions
from dcut_sched.model import LlamaConfig, LlamaModel, sample_generate
from dcut_sched.sampling import SamplingParams, request_keys, sampling_probs
from dcut_sched.traces import Trace
from dcut_sched.traces.prompts import Prompt
from dcut_sched.traces.record import accept_lengths, record_trace

SP = SamplingParams(temperature=0.7, top_k=50, seed=2)


@pytest.fixture(scope="module")
def tiny():
    return LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=3, std=0.05)


@torch.inference_mode()
def brute_force_probs(model, prompt, out, toks, sp):
    """One fresh forward per position: prefix + drafts, read the probability of each next draft."""
    n, k = toks.shape
    ref = np.zeros((n, k))
    for p in range(n):
        seq = list(prompt) + list(out[:p]) + toks[p, : k - 1].tolist()
        cache = model.new_cache(1, len(seq))
        logits = model(torch.tensor([seq]), torch.arange(len(seq))[None], cache)[0]
        probs = sampling_probs(logits[len(prompt) + p - 1:], sp).numpy()
        ref[p] = probs[np.arange(k), toks[p]]
    return ref


@pytest.mark.parametrize("chunk", [32, 3])
def test_target_probs_equal_brute_force(tiny, chunk):
    prompt = [11, 7, 301, 45]
    out = sample_generate(tiny, [prompt], 12, None, SP)[0]
    layers = [0, 2, 3]
    toks, _ = draft_all_positions(tiny, layers, prompt, out, 5)
    got = target_probs_all_positions(tiny, prompt, out, toks, SP, chunk_positions=chunk)
    np.testing.assert_allclose(got, brute_force_probs(tiny, prompt, out, toks, SP), atol=1e-5)


class FakeTokenizer:
    eos_id = None

    def chat_ids(self, messages):
        return [1, 2] + [ord(ch) % 4000 + 5 for ch in messages[-1]["content"]]


def test_record_sampled_trace(tiny, tmp_path):
    prompts = [Prompt("a", "math", "one plus one"), Prompt("b", "code", "def f(x):"), Prompt("c", "chat", "hi")]
    be = NativeBackend(model=tiny, tokenizer=FakeTokenizer(), skip_layers=(1,), generate_batch=2, target_name="tiny")
    path = tmp_path / "s.parquet"
    trace = record_trace(be, prompts, path, block_size=5, max_new_tokens=9, progress=False, sampling=SP)
    back = Trace.load(path)
    assert back.sampled and back.temperature == 0.7 and back.metadata["top_k"] == "50"
    np.testing.assert_array_equal(back.target_prob, trace.target_prob)
    # request 1's rows: its sampled output (key of prompt index 1), the drafts' matches and brute-force p
    ids = be.encode_prompt(prompts[1].text)
    y = sample_generate(tiny, [ids], 9, None, SP, keys=[request_keys(SP.seed, 3)[1]])[0]
    toks, _ = draft_all_positions(tiny, be.layers, ids, y, 4)
    rows = slice(int(back.starts[1]), int(back.starts[1] + back.num_positions[1]))
    np.testing.assert_array_equal(back.accept_len[rows], accept_lengths(toks, y))
    np.testing.assert_allclose(back.target_prob[rows], brute_force_probs(tiny, ids, y, toks, SP), atol=1e-5)
