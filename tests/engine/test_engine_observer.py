"""SpecEngine's timing hooks (EngineObserver): call order, phase times = the step records, outputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from dcut_sched import RatioController
from dcut_sched.engine import PHASES, EngineObserver, SpecEngine
from dcut_sched.model import greedy_generate

B = 4
MAX_NEW = 8


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(1)
    return [rng.integers(0, 4096, size=int(n)).tolist() for n in (4, 7, 2, 9, 5)]


class Recorder(EngineObserver):
    """Logs every hook call, and the model forwards (torch module hooks) with the phase they ran in."""

    def __init__(self, model):
        self.calls: list[tuple] = []
        self.phase = None
        self.forwards: list[tuple[int, str | None]] = []
        self.step = -1
        self._h = model.register_forward_hook(lambda *a: self.forwards.append((self.step, self.phase)))

    def step_started(self, step, request_ids):
        self.step = step
        self.calls.append(("step_started", step, tuple(request_ids)))

    def phase_started(self, step, phase):
        self.phase = phase
        self.calls.append(("phase_started", step, phase))

    def phase_ended(self, step, phase, elapsed_ms):
        assert self.phase == phase
        self.phase = None
        self.calls.append(("phase_ended", step, phase, elapsed_ms))

    def step_ended(self, record):
        self.calls.append(("step_ended", record.step, record))

    def close(self):
        self._h.remove()


def _phases_of(calls, step):
    return [c[2] for c in calls if c[0] == "phase_started" and c[1] == step]


@pytest.mark.parametrize("policy", ["full", "oracle", "ar", "fine"])
def test_observer_sees_every_phase_in_order(tiny, prompts, make_curve, policy):
    curve = make_curve(batch_sizes=(1, 2, 3), block_size=B)
    ctrl = RatioController(curve, B, policy=policy)
    engine = SpecEngine(tiny, ctrl, batch_size=3, max_new_tokens=MAX_NEW, skip_layers=(2,))
    rec = Recorder(tiny)
    try:
        result = engine.generate(prompts, observer=rec)
    finally:
        rec.close()
    assert result.outputs == greedy_generate(tiny, prompts, MAX_NEW, eos_id=None, batch_size=1)
    calls = rec.calls
    ends = [c for c in calls if c[0] == "step_ended"]
    assert [c[2] for c in ends] == result.steps  # the same EngineStepRecord objects, in order
    for s in result.steps:
        want = (["draft"] + (["oracle_verify"] if policy == "oracle" else []) if s.drafted else []) + ["plan", "verify"]
        assert _phases_of(calls, s.step) == want
        assert all(p in PHASES for p in want)
        i = calls.index(("step_started", s.step, tuple(s.request_ids)))
        j = next(k for k, c in enumerate(calls) if c[0] == "step_ended" and c[1] == s.step)
        inside = calls[i + 1 : j]
        assert len(inside) == 2 * len(want)  # every phase started and ended within its step
        ms = {c[2]: c[3] for c in inside if c[0] == "phase_ended"}
        if s.drafted:
            assert ms["draft"] == pytest.approx(s.draft_ms, abs=1e-9)
        assert ms["verify"] == pytest.approx(s.verify_ms, abs=1e-9)
        # plan_ms covers the oracle's full verification and the plan (phases are disjoint)
        assert ms["plan"] + ms.get("oracle_verify", 0.0) == pytest.approx(s.plan_ms, rel=1e-6, abs=1e-6)
        assert all(v >= 0 for v in ms.values())
    # every decode-step forward ran inside a draft / oracle / verify phase, none inside plan
    decode = [f for f in rec.forwards if f[0] >= 0]
    assert decode and all(phase in ("draft", "oracle_verify", "verify", None) for _, phase in decode)
    verify_steps = {s for s, phase in decode if phase == "verify"}
    plain_or_verified = {s.step for s in result.steps if policy != "oracle" or not s.drafted}
    assert verify_steps == plain_or_verified
    if policy == "oracle":
        assert {s for s, phase in decode if phase == "oracle_verify"} == {s.step for s in result.steps if s.drafted}


def test_no_observer_and_base_observer_give_the_same_run(tiny, prompts, make_curve):
    def run(**kw):
        ctrl = RatioController(make_curve(batch_sizes=(1, 2), block_size=B), B, policy="dcut")
        res = SpecEngine(tiny, ctrl, batch_size=2, max_new_tokens=MAX_NEW, skip_layers=(2,)).generate(prompts, **kw)
        return res.outputs, [(s.request_ids, s.lengths, s.accepted) for s in res.steps]

    assert run() == run(observer=EngineObserver())
