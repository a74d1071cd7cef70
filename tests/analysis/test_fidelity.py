"""Pure parts of analysis/fidelity.py: engine-matched traces, the trace check, errors, step times.

The end-to-end test records a position-indexed trace from a tiny random model with the project's
recorder functions, runs the real SpecEngine on the same token ids and checks that the matched trace
replays the engine's run exactly (the position convention: the engine's first token is the prefill's).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dcut_sched import policies
from dcut_sched.traces import Trace

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fidelity", ROOT / "analysis" / "fidelity.py")
fidelity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fidelity)


def _trace(requests, block_size=4):
    rid, pos, acc, conf = [], [], [], []
    for r, a in enumerate(requests):
        n = len(a)
        rid.append(np.full(n, r, np.int32)); pos.append(np.arange(n, dtype=np.int32))
        acc.append(np.asarray(a, np.int8))
        conf.append((np.arange(n * (block_size - 1), dtype=np.float32).reshape(n, -1) + 100 * r) / 1000)
    return Trace(np.concatenate(rid), np.concatenate(pos), np.concatenate(acc), np.concatenate(conf),
                 metadata={"indexing": "position", "source": "synthetic", "block_size": str(block_size)})


def test_engine_matched_trace_drops_prefill_position_and_recaps():
    # request 0: 6 recorded positions; request 1: 5. Caps of the recording: a[p] <= n - p - 1.
    t = _trace([[3, 2, 3, 2, 1, 0], [1, 0, 3, 1, 0]])
    m = fidelity.engine_matched_trace(t, [4, 5])
    # request 0 cut to n = 4: positions 1..3 -> 0..2, accept_len min(a[p], 4 - p - 1) = min(2,2), min(3,1), min(2,0)
    assert m.num_positions.tolist() == [3, 4]
    assert m.accept_len[:3].tolist() == [2, 1, 0]
    # request 1 kept whole (n = 5): positions 1..4, caps 3, 2, 1, 0 -> unchanged values 0, 3?, ...
    assert m.accept_len[3:].tolist() == [0, min(3, 2), min(1, 1), 0]
    np.testing.assert_array_equal(m.conf[:3], t.conf[1:4])
    np.testing.assert_array_equal(m.conf[3:], t.conf[7:11])
    assert m.pos.tolist() == [0, 1, 2, 0, 1, 2, 3]
    # the replay of every request ends inside its output (the loader's invariant)
    m2 = Trace.from_frame(m.to_frame(), m.metadata)
    assert m2.num_rows == 7


def test_engine_matched_trace_picks_requests_and_rejects_bad_lengths():
    t = _trace([[1, 0], [2, 1, 0]])
    m = fidelity.engine_matched_trace(t, [3], requests=[1])
    assert m.num_requests == 1 and m.accept_len.tolist() == [1, 0]
    with pytest.raises(ValueError, match="has 2 positions"):
        fidelity.engine_matched_trace(t, [3, 3])
    with pytest.raises(ValueError, match="no decode step"):
        fidelity.engine_matched_trace(t, [1, 2])


def test_errors_hand_computed():
    e = fidelity.relative_error([110.0, 90.0, 50.0], [100.0, 100.0, 40.0])
    np.testing.assert_allclose(e, [0.1, -0.1, 0.25])
    s = fidelity.error_summary(e)
    assert s["median_abs"] == pytest.approx(0.1)
    assert s["mean_abs"] == pytest.approx(0.15)
    assert s["max_abs"] == pytest.approx(0.25)
    assert s["mean_signed"] == pytest.approx(0.25 / 3)
    with pytest.raises(ValueError):
        fidelity.relative_error([1.0], [0.0])


def test_step_time_ms_hand_computed(make_curve):
    # C_verify = 10 + 0.5 K, C_draft = 2 + 0.25 bs (tests/conftest.py)
    curve = make_curve(batch_sizes=(1, 2, 4), block_size=4)
    ms = fidelity.step_time_ms(curve, [2, 2, 4], [5, 2, 10], [True, False, True])
    np.testing.assert_allclose(ms, [2.5 + 12.5, 11.0, 3.0 + 15.0])
    # the measured overhead table as step_overhead rows: plain 1 ms at bs 1, 4 ms at bs 4 (2 ms at bs 2,
    # linear), drafted 3 ms flat; StepCosts sums them
    table = pd.DataFrame({"batch_size": [1, 4, 1, 4], "drafted": [False, False, True, True],
                          "overhead_ms": [1.0, 4.0, 3.0, 3.0], "p20": [0.5, 3.0, 2.0, 2.0], "p80": [1.5, 5.0, 4.0, 4.0],
                          "n": [9, 9, 9, 9]})
    ov = fidelity.with_overhead_rows(curve, table)
    assert [(r.kind, r.batch_size, r.median_ms) for r in ov.step_overhead] == [
        ("plain", 1, 1.0), ("plain", 4, 4.0), ("drafted", 1, 3.0), ("drafted", 4, 3.0)]
    assert not curve.step_overhead  # the input curve is untouched
    ms = fidelity.step_time_ms(ov, [2, 2], [5, 2], [True, False], verify_tokens=[8, 2])
    np.testing.assert_allclose(ms, [2.5 + 14.0 + 3.0, 11.0 + 2.0])
    # the project's engine truly skips its drafter: a step without draft is the plain step either way
    np.testing.assert_allclose(fidelity.step_time_ms(ov, [2], [2], [False], speculative=False), [13.0])


def test_engine_positions_and_check_on_hand_steps():
    t = _trace([[3, 2, 3, 2, 1, 0]])  # n = 6 -> matched positions 0..4 (caps 3, 3, 2, 1, 0)
    m = fidelity.engine_matched_trace(t, [6])
    assert m.accept_len.tolist() == [2, 3, 2, 1, 0]
    # full verification from engine position 1: accept 2 (-> pos 4), then accept 1 capped (engine says 3)
    steps = pd.DataFrame({"step": [0, 1], "request_ids": [[0], [0]], "accepted": [[2], [3]], "drafted": [True, True]})
    at = fidelity.engine_positions(steps, 1)
    assert at["pos"].tolist() == [1, 4]
    assert fidelity.check_trace_matches(m, steps, 1) == {"checked": 2, "accept_mismatch": 0}
    steps.loc[0, "accepted"] = [1]
    assert fidelity.check_trace_matches(m, steps, 1)["accept_mismatch"] >= 1


def test_matched_trace_replays_a_real_engine_run(make_curve):
    """Tiny random model: recorder trace -> engine-matched trace -> simulator == SpecEngine step for step."""
    from dcut_sched.controller import RatioController
    from dcut_sched.engine import SpecEngine
    from dcut_sched.engine.trace_backends import draft_all_positions
    from dcut_sched.model import LlamaConfig, LlamaModel, greedy_generate
    from dcut_sched.simulator import run_open_loop
    from dcut_sched.traces.record import accept_lengths

    torch.manual_seed(0)
    model = LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=3, std=0.1)
    B, new = 4, 10
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 4096, size=int(n)).tolist() for n in (5, 9, 7, 3)]
    outs = greedy_generate(model, prompts, new, eos_id=None, batch_size=1)
    layers = [0, 1, 3]  # the drafter: layer 2 skipped, as SpecEngine(skip_layers=(2,))
    rid, pos, acc, conf = [], [], [], []
    for r, (p, o) in enumerate(zip(prompts, outs)):
        toks, c = draft_all_positions(model, layers, p, o, B - 1)
        rid.append(np.full(len(o), r, np.int32)); pos.append(np.arange(len(o), dtype=np.int32))
        acc.append(accept_lengths(toks, o)); conf.append(np.clip(c, 0, 1))
    trace = Trace(np.concatenate(rid), np.concatenate(pos), np.concatenate(acc), np.concatenate(conf).astype(np.float32),
                  metadata={"indexing": "position", "source": "recorded", "block_size": str(B)})
    curve = make_curve(batch_sizes=(1, 2), block_size=B)
    ctrl = RatioController(curve, B, policy="full")
    res = SpecEngine(model, ctrl, batch_size=2, max_new_tokens=new, skip_layers=(2,)).generate(prompts)
    assert res.outputs == outs
    matched = fidelity.engine_matched_trace(trace, [len(o) for o in res.outputs])
    steps = res.steps_frame()
    assert fidelity.check_trace_matches(matched, steps, len(prompts)) == {"checked": int(steps["batch_size"].sum()),
                                                                        "accept_mismatch": 0}
    sim = run_open_loop(matched, curve, policies.get("full"), 2, rate_rps=1.0, num_requests=len(prompts),
                        shuffle=False, arrival_ms=np.zeros(len(prompts)))
    assert int(sim.steps.tokens.sum()) == res.decode_tokens
    assert sim.steps.batch_size.tolist() == steps["batch_size"].tolist()
    assert sim.steps.tokens.tolist() == steps["committed_tokens"].tolist()


def test_drafter_prefill_ms_hand_computed():
    # B = 4: a draft call has 3 forwards; the first one's excess over the mean of the other two counts
    # only on steps where a request drafts for the first time.
    steps = pd.DataFrame({
        "step": [0, 1, 2, 3],
        "request_ids": [[0, 1], [0, 1], [0, 2], [0, 2]],
        "drafted": [True, True, False, True],
        "draft_fwd_ms": [100.0, 30.0, 0.0, 70.0],
        "draft_first_fwd_ms": [80.0, 10.0, 0.0, 40.0],
    })
    out = fidelity.drafter_prefill_ms(steps, 4)
    # step 0: new 0, 1: 80 - (100-80)/2 = 70; step 1: none new; step 2 plain; step 3: request 2 new: 40 - 15
    np.testing.assert_allclose(out, [70.0, 0.0, 0.0, 25.0])


def test_forward_timer_attributes_forwards_to_phases(make_curve):
    """ForwardTimer (the engine's observer hooks + torch module hooks, no monkeypatching) on a tiny model."""
    from dcut_sched.model import LlamaConfig, LlamaModel

    model = LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=3, std=0.1)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 4096, size=int(n)).tolist() for n in (5, 9, 3)]
    curve = make_curve(batch_sizes=(1, 2), block_size=fidelity.BLOCK_SIZE)
    for policy in ("full", "oracle", "ar"):
        res, steps, summary = fidelity._engine_run(model, prompts, policy, 2, 6, curve, eos_id=None, skip_layers=(2,))
        assert not model._forward_hooks and not model._forward_pre_hooks  # hooks removed
        assert len(steps) == summary["steps"] == len(res.steps)
        d = steps["drafted"].to_numpy(bool)
        assert ((steps["draft_fwd_ms"] > 0) == d).all()
        assert (steps["draft_first_fwd_ms"] <= steps["draft_fwd_ms"]).all()
        assert ((steps["draft_first_len"] > 0) == d).all()
        if policy == "oracle":
            assert ((steps["oracle_fwd_ms"] > 0) == d).all()
            assert (steps.loc[d, "verify_fwd_ms"] == 0).all()  # the step reuses the oracle's verification
        else:
            assert (steps["oracle_fwd_ms"] == 0).all() and (steps["verify_fwd_ms"] > 0).all()
            assert (steps["verify_fwd_ms"] <= steps["verify_ms"]).all()
            assert (steps["verify_kv_len"] > 0).all()
        assert (steps["draft_fwd_ms"] <= steps["draft_ms"] + 1e-9).all()
