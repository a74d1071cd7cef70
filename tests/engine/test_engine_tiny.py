"""Engine logic on a tiny random model: lossless for every policy, packing, step records, traces."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcut_sched import RatioController, policies
from dcut_sched.engine import PromptFileError, SpecEngine, builtin_cpu_curve, load_prompt_texts, pack_rows
from dcut_sched.model import greedy_generate

B = 4
MAX_NEW = 10


@pytest.fixture(scope="module")
def tiny_prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 4096, size=int(n)).tolist() for n in (5, 9, 1, 7, 12, 3, 8)]


@pytest.fixture(scope="module")
def reference(tiny, tiny_prompts):
    return greedy_generate(tiny, tiny_prompts, MAX_NEW, eos_id=None, batch_size=1)


def make_controller(name, make_curve, **params):
    curve = make_curve(batch_sizes=(1, 2, 3), block_size=B) if policies.get(name).needs_cost else None
    return RatioController(curve, B, policy=name, **params)


@pytest.mark.parametrize("name", policies.names())
@pytest.mark.parametrize("skip_layers", [(2,), ()])
def test_engine_equals_greedy_for_every_policy(tiny, tiny_prompts, reference, make_curve, name, skip_layers):
    ctrl = make_controller(name, make_curve)
    engine = SpecEngine(tiny, ctrl, batch_size=3, max_new_tokens=MAX_NEW, skip_layers=skip_layers)
    result = engine.generate(tiny_prompts, record_trace=True)
    assert result.outputs == reference
    assert result.generated_tokens == MAX_NEW * len(tiny_prompts)
    # each request's first token comes from its prefill, the rest from decode steps
    assert result.decode_tokens == result.generated_tokens - len(tiny_prompts)
    for s in result.steps:
        assert 1 <= s.batch_size <= 3 and len(s.lengths) == s.batch_size
        assert sum(s.lengths) == s.num_tokens and all(1 <= n <= B for n in s.lengths)
        assert all(0 <= a <= n - 1 for a, n in zip(s.accepted, s.lengths))
        assert s.num_tokens <= s.packed_tokens <= s.batch_size * max(s.lengths) or name == "oracle"
        if not s.drafted:
            assert s.lengths == [1] * s.batch_size
    if name == "ar":
        assert not any(s.drafted for s in result.steps)
    if skip_layers == () and name == "full":
        # drafter == target: every draft is accepted (B-1 per request-step)
        assert result.accepted_per_step == B - 1


def test_continuous_batching_refills_rows(tiny, tiny_prompts, make_curve):
    engine = SpecEngine(tiny, make_controller("full", make_curve), batch_size=2, max_new_tokens=4, skip_layers=(2,))
    result = engine.generate(tiny_prompts)
    seen = [rid for s in result.steps for rid in s.request_ids]
    assert sorted(set(seen)) == list(range(len(tiny_prompts)))
    assert max(s.batch_size for s in result.steps) == 2


def test_eos_stops_a_request(tiny, tiny_prompts, reference):
    eos = reference[0][3]  # the 4th token request 0 generates
    want = greedy_generate(tiny, tiny_prompts, MAX_NEW, eos_id=eos, batch_size=1)
    engine = SpecEngine(tiny, RatioController(None, B, policy="full"), batch_size=3, max_new_tokens=MAX_NEW, eos_id=eos,
                        skip_layers=(2,))
    got = engine.generate(tiny_prompts).outputs
    assert got == want
    assert got[0][-1] == eos and len(got[0]) == 4


def test_recorded_trace_is_valid(tiny, tiny_prompts, tmp_path, make_curve):
    from dcut_sched.traces import Trace

    engine = SpecEngine(tiny, make_controller("topk", make_curve, rho=0.5), batch_size=3, max_new_tokens=MAX_NEW,
                        skip_layers=(2,))
    result = engine.generate(tiny_prompts, record_trace=True)
    trace = result.trace({"target_model": "tiny", "draft_model": "tiny skip 2", "dataset": "random"})
    drafted = sum(s.batch_size for s in result.steps if s.drafted)
    assert trace.num_rows == drafted
    assert trace.indexing == "step" and trace.block_size == B
    assert trace.metadata["accept_len_censored"] == "true"
    path = tmp_path / "t.parquet"
    trace.save(path)
    again = Trace.load(path)
    np.testing.assert_array_equal(again.accept_len, trace.accept_len)
    accepted = sorted(a for s in result.steps if s.drafted for a in s.accepted)
    assert sorted(trace.accept_len.tolist()) == accepted


def test_summary_and_frame(tiny, tiny_prompts, make_curve):
    result = SpecEngine(
        tiny, make_controller("dcut", make_curve), batch_size=3, max_new_tokens=MAX_NEW, skip_layers=(2,)
    ).generate(tiny_prompts)
    s = result.summary()
    assert s["generated_tokens"] == MAX_NEW * len(tiny_prompts) and s["steps"] == len(result.steps)
    assert s["tokens_per_s"] > 0
    frame = result.steps_frame()
    assert len(frame) == len(result.steps) and {"lengths", "num_tokens", "accepted"} <= set(frame.columns)
    with pytest.raises(ValueError, match="record_trace"):
        result.trace()
    json.dumps(s)


def test_engine_rejects_bad_arguments(tiny):
    with pytest.raises(ValueError, match="batch_size"):
        SpecEngine(tiny, RatioController(None, B, policy="full"), batch_size=0)
    with pytest.raises(ValueError, match="no prompts"):
        SpecEngine(tiny, RatioController(None, B, policy="full"), skip_layers=(2,)).generate([])
    engine = SpecEngine(tiny, RatioController(None, B, policy="full"), skip_layers=(2,))
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[1, 2], []])


# ---------------------------------------------------------------------------- packing
def test_pack_rows_hand_cases():
    p = pack_rows([4, 1, 1, 1])  # padded would be 4 x 4 = 16; T=1 gives 7 rows of 1
    assert (p.tokens_per_row, p.num_rows, p.padded_tokens) == (1, 7, 7)
    p = pack_rows([8, 2, 2, 2])  # T=2: 4 + 1 + 1 + 1 rows = 14 tokens (T=8: 32; T=4: 16)
    assert (p.tokens_per_row, p.num_rows) == (2, 7)
    assert p.request == [0, 0, 0, 0, 1, 2, 3] and p.start == [0, 2, 4, 6, 0, 0, 0]
    p = pack_rows([3, 3, 3])
    assert (p.tokens_per_row, p.num_rows) == (3, 3)
    with pytest.raises(ValueError):
        pack_rows([2, 0])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 16), min_size=1, max_size=64))
def test_pack_rows_covers_every_slot_once(lengths):
    p = pack_rows(lengths)
    assert p.padded_tokens <= len(lengths) * max(lengths)  # never worse than padding
    assert p.padded_tokens >= sum(lengths)
    covered = {}
    for j, s, n in zip(p.request, p.start, p.length):
        assert 1 <= n <= p.tokens_per_row
        covered.setdefault(j, []).extend(range(s, s + n))
    assert covered == {j: list(range(n)) for j, n in enumerate(lengths)}
    assert p.request == sorted(p.request)


# ---------------------------------------------------------------------------- prompts, default cost
def test_load_prompt_texts_formats(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\n second \n")
    assert load_prompt_texts(text) == ["first prompt", "second"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n{"text": "b"}\n"c"\n')
    assert load_prompt_texts(jsonl) == ["a", "b", "c"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"q": 1}\n')
    with pytest.raises(PromptFileError, match=r"bad.jsonl, line 2: .*'prompt'"):
        load_prompt_texts(bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a"\n')
    with pytest.raises(PromptFileError, match="line 1: not valid JSON"):
        load_prompt_texts(broken)
    with pytest.raises(PromptFileError, match="missing.txt: no such file"):
        load_prompt_texts(tmp_path / "missing.txt")


def test_prompt_files_with_a_repeated_key_or_a_byte_order_mark_are_refused(tmp_path):
    """A key given twice kept its last value silently; a BOM before a JSON-lines file made every
    line, JSON and all, a prompt text."""
    from dcut_sched.traces.prompts import PromptError, load_prompt_records

    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"id": "a", "category": "x", "prompt": "first", "prompt": "second"}\n')
    with pytest.raises(PromptFileError, match="twice.jsonl, line 1: key 'prompt' appears twice"):
        load_prompt_texts(twice)
    with pytest.raises(PromptError, match="twice.jsonl, line 1: key 'prompt' appears twice"):
        load_prompt_records(twice)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\n{"prompt": "b"}\n')
    with pytest.raises(PromptFileError, match="bom.jsonl: starts with a UTF-8 byte-order mark"):
        load_prompt_texts(bom)


def test_builtin_cpu_curve():
    curve = builtin_cpu_curve(8, 4)
    assert curve.block_size == 8 and curve.batch_sizes == [1, 2, 3, 4]
    assert curve.verify_ms(4, 10) == pytest.approx(130 + 6.4 * 10)
    assert curve.draft_ms(2) == pytest.approx(7 * 28 / 30 * (130 + 6.4 * 2))
