"""Recorder: acceptance by hand, batched drafting vs the one-position reference, resume, HF backend."""

import importlib.util
import json

import numpy as np
import pytest
import torch

from dcut_sched.engine.trace_backends import NativeBackend, draft_all_positions, draft_positions_reference
from dcut_sched.model import LlamaConfig, LlamaModel, greedy_generate
from dcut_sched.traces import Trace
from dcut_sched.traces.prompts import Prompt
from dcut_sched.traces.record import RecordError, accept_lengths, partial_path, record_trace


def test_accept_lengths_by_hand():
    y = [5, 6, 7, 8]
    drafts = np.array([
        [5, 6, 9],   # p0: d1=y0, d2=y1, d3!=y2 -> 2
        [6, 7, 8],   # p1: 3 matches, but only 2 positions remain after p1 -> capped at 2
        [1, 8, 8],   # p2: first draft wrong -> 0
        [8, 8, 8],   # p3: last position: cap 0
    ])
    assert accept_lengths(drafts, y).tolist() == [2, 2, 0, 0]
    assert accept_lengths(drafts, y).dtype == np.int8
    with pytest.raises(ValueError, match="rows"):
        accept_lengths(drafts[:2], y)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=3, std=0.05)
    prompt = [11, 7, 301, 45, 9, 1000]
    out = greedy_generate(model, [prompt], 24, None)[0]
    return model, prompt, out


@pytest.mark.parametrize("skip", [(1,), (2,), (0, 3)])
@pytest.mark.parametrize("max_extension", [None, 2, 0])
def test_batched_drafting_equals_one_position_reference(tiny, skip, max_extension):
    model, prompt, out = tiny
    layers = [i for i in range(model.config.num_layers) if i not in skip]
    toks, conf = draft_all_positions(model, layers, prompt, out, 5, max_extension=max_extension)
    ref_toks, ref_conf = draft_positions_reference(model, skip, prompt, out, 5)
    assert toks.shape == (len(out), 5) and conf.dtype == np.float32
    np.testing.assert_array_equal(toks, ref_toks)
    np.testing.assert_allclose(conf, ref_conf, atol=1e-5)


def test_drafter_without_skipped_layers_accepts_everything(tiny):
    model, prompt, out = tiny
    toks, conf = draft_all_positions(model, range(model.config.num_layers), prompt, out, 7)
    n = len(out)
    assert accept_lengths(toks, out).tolist() == [min(7, n - 1 - p) for p in range(n)]


class FakeTokenizer:
    """Maps each character to a token id; no chat template beyond a fixed header."""

    eos_id = None

    def chat_ids(self, messages):
        return [1, 2] + [ord(ch) % 4000 + 5 for ch in messages[-1]["content"]]


PROMPTS = [Prompt("a", "math", "one plus one"), Prompt("b", "code", "def f(x):"),
           Prompt("c", "chat", "hello there"), Prompt("d", "rewrite", "make it short")]


def tiny_backend(tiny, **kw):
    return NativeBackend(model=tiny[0], tokenizer=FakeTokenizer(), skip_layers=(1,), generate_batch=2,
                         target_name="tiny-random", **kw)


def test_record_trace_writes_a_valid_position_indexed_trace(tiny, tmp_path):
    out = tmp_path / "rec.parquet"
    trace = record_trace(tiny_backend(tiny), PROMPTS, out, block_size=6, max_new_tokens=10, progress=False)
    back = Trace.load(out)
    assert back.num_requests == 4 and back.block_size == 6 and back.num_rows == 40
    assert back.metadata["source"] == "recorded" and back.metadata["indexing"] == "position"
    assert json.loads(back.metadata["recorder"])["skip_layers"] == [1]
    assert [r[1] for r in json.loads(back.metadata["requests"])] == ["a", "b", "c", "d"]
    assert not partial_path(out).exists()
    # the recorded rows are the drafting of each request's own greedy output
    be = tiny_backend(tiny)
    ids = be.encode_prompt(PROMPTS[2].text)
    y = be.generate([ids], 10)[0]
    toks, conf = draft_positions_reference(tiny[0], (1,), ids, y, 5)
    rows = slice(int(back.starts[2]), int(back.starts[2] + back.num_positions[2]))
    np.testing.assert_array_equal(back.accept_len[rows], accept_lengths(toks, y))
    np.testing.assert_allclose(back.conf[rows], conf, atol=1e-5)
    np.testing.assert_array_equal(trace.accept_len, back.accept_len)


class Interrupt(Exception):
    pass


def test_resume_after_interruption_gives_the_same_trace(tiny, tmp_path):
    full = record_trace(tiny_backend(tiny), PROMPTS, tmp_path / "full.parquet", block_size=4,
                        max_new_tokens=8, progress=False)
    be = tiny_backend(tiny)
    calls = {"n": 0}
    real = be.draft_positions

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Interrupt
        return real(*args)

    be.draft_positions = flaky
    out = tmp_path / "resumed.parquet"
    with pytest.raises(Interrupt):
        record_trace(be, PROMPTS, out, block_size=4, max_new_tokens=8, progress=False)
    part = Trace.load(partial_path(out))
    assert part.num_requests == 2  # two finished requests were kept
    again = tiny_backend(tiny)
    seen = []
    again.draft_positions = lambda p, o, k: seen.append(p) or real(p, o, k)
    resumed = record_trace(again, PROMPTS, out, block_size=4, max_new_tokens=8, progress=False)
    assert len(seen) == 2  # only the two missing requests were drafted
    np.testing.assert_array_equal(resumed.request_id, full.request_id)
    np.testing.assert_array_equal(resumed.accept_len, full.accept_len)
    np.testing.assert_allclose(resumed.conf, full.conf, atol=1e-6)


def test_resume_refuses_a_partial_file_from_other_settings(tiny, tmp_path):
    out = tmp_path / "x.parquet"
    be = tiny_backend(tiny)
    real = be.draft_positions
    be.draft_positions = lambda *a: (_ for _ in ()).throw(Interrupt) if be.n_calls() else real(*a)
    counter = {"n": 0}

    def n_calls():
        counter["n"] += 1
        return counter["n"] > 1

    be.n_calls = n_calls
    with pytest.raises(Interrupt):
        record_trace(be, PROMPTS, out, block_size=4, max_new_tokens=8, progress=False)
    with pytest.raises(RecordError, match="block_size"):
        record_trace(tiny_backend(tiny), PROMPTS, out, block_size=6, max_new_tokens=8, progress=False)
    with pytest.raises(RecordError, match="max_new_tokens"):
        record_trace(tiny_backend(tiny), PROMPTS, out, block_size=4, max_new_tokens=9, progress=False)
    # --fresh (resume=False) starts over
    t = record_trace(tiny_backend(tiny), PROMPTS, out, block_size=6, max_new_tokens=8, progress=False, resume=False)
    assert t.block_size == 6 and t.num_requests == 4


def test_max_positions_stops_early(tiny, tmp_path):
    t = record_trace(tiny_backend(tiny), PROMPTS, tmp_path / "m.parquet", block_size=4, max_new_tokens=8,
                     progress=False, max_positions=10)
    assert t.num_requests == 2 and t.num_rows == 16


# ----------------------------------------------------------------------------- HF backend
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


class FakeHFTokenizer:
    eos_token_id = None
    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 120 + 3 for c in text]


def hf_llama(seed, layers=2):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).eval()


def brute_greedy(model, ids, steps):
    """Greedy continuation by full recomputation (no cache): tokens and confidences."""
    ids, toks, confs = list(ids), [], []
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            tok = int(logits.argmax())
            confs.append(float(torch.softmax(logits, -1).max()))
            toks.append(tok)
            ids.append(tok)
    return toks, confs


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed (extra [models])")
def test_hf_backend_matches_brute_force(tmp_path):
    from dcut_sched.engine.trace_backends import HFBackend

    target, draft = hf_llama(1), hf_llama(2)
    target.save_pretrained(tmp_path / "target")
    draft.save_pretrained(tmp_path / "draft")
    be = HFBackend(str(tmp_path / "target"), str(tmp_path / "draft"), tokenizer=FakeHFTokenizer())
    prompt = be.encode_prompt("speculate")
    out = be.generate([prompt], 12)[0]
    assert out == brute_greedy(target, prompt, 12)[0]
    toks, conf = be.draft_positions(prompt, out, 4)
    for p in range(len(out)):
        ref_t, ref_c = brute_greedy(draft, prompt + out[:p], 4)
        assert toks[p].tolist() == ref_t
        np.testing.assert_allclose(conf[p], ref_c, atol=1e-5)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed (extra [models])")
def test_hf_backend_with_the_target_as_draft_accepts_everything(tmp_path):
    from dcut_sched.engine.trace_backends import HFBackend

    model = hf_llama(5)
    be = HFBackend(model, model, tokenizer=FakeHFTokenizer())
    t = record_trace(be, PROMPTS[:2], tmp_path / "hf.parquet", block_size=5, max_new_tokens=9, progress=False)
    n = 9
    expected = [min(4, n - 1 - p) for p in range(n)] * 2
    assert t.accept_len.tolist() == expected


def test_record_progress_in_logs_reports_the_target_decode(tiny, tmp_path, capsys, monkeypatch):
    """Not on a terminal: an up-front line, status lines from inside the target decode, an estimate."""
    import time as _time

    be = tiny_backend(tiny)
    slow = be.generate

    def slow_generate(prompts, max_new_tokens, on_step=None):
        def step(done, total):
            _time.sleep(0.01)  # a decode step long enough for the 0.02 s status timer
            on_step(done, total)
        return slow(prompts, max_new_tokens, on_step=step)

    monkeypatch.setattr(be, "generate", slow_generate)
    monkeypatch.setenv("DCUT_PROGRESS_INTERVAL_S", "0.02")
    record_trace(be, PROMPTS, tmp_path / "p.parquet", block_size=4, max_new_tokens=8, progress=True)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("dcut-trace record: 4 prompts to go (0 done) in 2 batch(es) of 2")
    assert any(": target decode " in line and "/8 (" in line and "ETA ~" in line for line in err)
    assert any(line.startswith("dcut-trace record: estimate ~") for line in err)
    assert err[-1].startswith("dcut-trace record p.parquet: 4/4 requests (100%)") and err[-1].endswith("(done)")
