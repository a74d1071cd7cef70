"""Pure parts of analysis/bench_vllm.py: the position-indexed trace recorded in vLLM, the clipped
step-indexed trace and the one-wave prediction, on hand-made records (no vLLM needed)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_vllm", ROOT / "analysis" / "bench_vllm.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
B = bench.BLOCK_SIZE  # 8: 7 drafts per step


def _write(tmp_path, outputs, trace_steps, full_steps=()):
    rec = tmp_path / "records"
    rec.mkdir()
    (rec / "result-bs2.json").write_text(json.dumps({"runs": [{"name": "nospec", "token_ids": outputs}]}))
    (rec / "trace-bs2.jsonl").write_text("".join(json.dumps(s) + "\n" for s in trace_steps))
    (rec / "full-bs2.jsonl").write_text("".join(json.dumps(s) + "\n" for s in full_steps))


def _conf(x):
    return [x] * (B - 1)


def test_position_trace_accepts_drafts_that_match_the_output(tmp_path):
    y0, y1 = [10, 11, 12, 13, 14], [20, 21, 22, 23, 24]  # n = 5: decode positions 1..4
    steps = [{"step": 0, "accepted": {}}]  # the prefill step: no plan
    for p in range(1, 5):
        # request 0's drafts match the next 2 output tokens, then miss; request 1's miss at once
        d0 = y0[p:p + 2] + [99] * (B - 1 - len(y0[p:p + 2]))
        d1 = [98] * (B - 1)
        steps.append({"step": p, "conf": {"0-a": _conf(0.5), "1-b": _conf(0.25)}, "drafts": {"0-a": d0, "1-b": d1},
                      "num_output": {"0-a": p, "1-b": p}, "accepted": {}})
    _write(tmp_path, [y0, y1], steps)
    t = bench.position_trace(tmp_path, 2)
    assert t.exact_replay and t.num_requests == 2 and t.num_positions.tolist() == [4, 4]
    # request 0 at positions 1..4: 2 matches, capped at n - p - 1 = 3, 2, 1, 0
    assert t.accept_len[:4].tolist() == [2, 2, 1, 0] and t.accept_len[4:].tolist() == [0, 0, 0, 0]
    assert t.conf[0].tolist() == pytest.approx(_conf(0.5)) and t.conf[4].tolist() == pytest.approx(_conf(0.25))
    # the simulator replays the wave: full verification makes request 0 take 1+2, 1+1 tokens... to 4 in all
    costs = bench.one_wave(t, _curve(), "full", 2)
    assert costs["steps"] == 4 and costs["predicted_tokens_per_step"] == pytest.approx(8 / 4)
    bad = tmp_path / "incomplete"
    bad.mkdir()
    for s in steps:  # request 1 loses its drafts at position 4
        if s.get("num_output", {}).get("1-b") == 4:
            for key in ("conf", "drafts", "num_output"):
                s[key].pop("1-b")
    _write(bad, [y0, y1], steps)
    with pytest.raises(ValueError, match=r"bs 2: request 1 has no drafts at output positions \[4\]"):
        bench.position_trace(bad, 2)


def _curve():
    from dcut_sched import CostCurve

    verify = [{"batch_size": bs, "num_tokens": k, "median_ms": 10.0 + k} for bs in (1, 2) for k in range(bs, bs * B + 1)]
    return CostCurve(hardware={"device_name": "t", "backend": "analytic"}, model={"name": "t"}, block_size=B,
                     context_len=0, verify=verify, draft=[{"batch_size": 1, "median_ms": 5.0},
                                                          {"batch_size": 2, "median_ms": 6.0}],
                     ar=[{"batch_size": 1, "median_ms": 4.0}, {"batch_size": 2, "median_ms": 5.0}])


def test_step_indexed_trace_is_clipped_at_max_tokens(tmp_path):
    full = [{"step": 1, "conf": {"0-a": _conf(0.9)}, "accepted": {"0-a": 6}},
            {"step": 2, "conf": {"0-a": _conf(0.9)}, "accepted": {"0-a": 5}},
            {"step": 3, "conf": {"0-a": _conf(0.9)}, "accepted": {"0-a": 4}}]
    _write(tmp_path, [[0] * 13], [], full)
    t = bench.recorded_trace(tmp_path, [2], max_decode_tokens=12)
    # 7 + 6 tokens would pass 12: the second step is clipped to 1 + 4, the third was never output
    assert t.accept_len.tolist() == [6, 4] and t.num_requests == 1
    assert bench.recorded_trace(tmp_path, [2]).accept_len.tolist() == [6, 5, 4]
