"""Cost-curve rows from timed vLLM engine steps (dcut_sched.integrations.vllm_tools.engine_steps), by hand.

Pure: no vLLM needed. The records are what ``StepTimer`` writes; the rows are what
``dcut-profile --vllm`` adds to the curve, and StepCosts must give back the measured medians.
"""

from __future__ import annotations

import pytest

from dcut_sched.integrations.vllm_tools.engine_steps import VllmStepTiming, engine_step_rows
from dcut_sched.step_costs import StepCosts


def _rec(kind, n, k, step, propose=0.0, first=0.0, wave=2):
    return VllmStepTiming(kind=kind, num_requests=n, num_tokens=k, num_drafts=0, step_ms=step, propose_ms=propose,
                      draft_first_ms=first, wave=wave, proposed=7 if kind == "drafted" else 0)


def _records():
    recs = [_rec("prefill", 2, 90, 500.0), _rec("plain", 1, 1, 99.0)]  # a prefill and a wave's tail: left out
    recs += [_rec("plain", 2, 2, ms) for ms in (7.0, 8.0, 9.0)]
    recs += [_rec("drafted", 2, 2, 40.0, propose=p, first=4.0) for p in (20.0, 21.0, 22.0)]  # uniform, K = bs
    recs += [_rec("drafted", 2, 8, ms, propose=26.0, first=10.0) for ms in (50.0, 52.0, 54.0)]  # full, K = bs*B
    recs += [_rec("undrafted", 2, 2, 15.0, propose=5.0, first=5.0) for _ in range(3)]
    recs += [_rec("drafted", 1, 4, 80.0, propose=30.0, first=9.0, wave=2)]  # tail of the wave: left out
    return recs


def test_rows_from_hand_records(make_curve):
    # C_verify(2, K) = 10 + 0.5 K (11 at K = 2, 14 at K = 8), C_ar(2) = 6, B = 4
    curve = make_curve(batch_sizes=(1, 2), block_size=4, ar_ms={1: 5.0, 2: 6.0})
    draft, first, overhead, notes = engine_step_rows(curve, _records(), 4, [1, 2])
    assert [(r.batch_size, r.median_ms, r.repeats) for r in draft] == [(2, 21.0, 3)]  # propose at K = bs
    assert [(r.batch_size, r.num_tokens, r.median_ms) for r in first] == [(2, 2, 4.0), (2, 8, 10.0)]
    got = {(r.kind, r.batch_size, r.num_tokens): r.median_ms for r in overhead}
    # plain: 7, 8, 9 - C_ar 6; undrafted: 15 - 6 - C_draft_first(2, 2) 4; drafted residuals, one row
    # per K bucket: K = 2: 40 - (21 + 11) = 8 (x3); K = 8: 50/52/54 - (21 + 14 + (10 - 4)) = 9, 11, 13
    assert got == {("plain", 2, None): 2.0, ("undrafted", 2, None): 5.0, ("drafted", 2, 2): 8.0,
                   ("drafted", 2, 8): 11.0}
    assert notes["drafted/bs2"]["median_residual_ms_by_num_tokens"] == {"2": 8.0, "8": 11.0}
    assert notes["drafted/bs2"]["median_residual_ms"] == 8.5
    # StepCosts on the curve with these rows gives the measured median steps back
    from dcut_sched import CostCurve

    full = CostCurve(hardware=curve.hardware, model=curve.model, block_size=4, context_len=0, verify=curve.verify,
                     ar=curve.ar, draft=draft, draft_first=first, step_overhead=overhead)
    costs = StepCosts(full, 4)
    assert costs.plain_ms(2) == 8.0 and costs.undrafted_ms(2) == 15.0
    # the K-keyed rows give back the median step at each K (one row per bs used to price both at 8.5:
    # 40.5 and 49.5 ms against the measured 40 and 52)
    assert costs.drafted_ms(2, 2) == pytest.approx(40.0) and costs.drafted_ms(2, 8) == pytest.approx(52.0)
    # between the buckets the residual is linear in K: K = 5 -> 9.5
    assert costs.drafted_ms(2, 5) == pytest.approx(21 + 12.5 + (full.draft_first_ms(2, 5) - 4.0) + 9.5)


def test_negative_residual_is_kept_signed(make_curve):
    """A real step faster than the dummy-batch forward: the row keeps the negative median (it used to
    be clipped to 0, which priced the plain step 1 ms too high)."""
    curve = make_curve(batch_sizes=(2,), block_size=4, ar_ms={2: 6.0})
    recs = [_rec("plain", 2, 2, ms) for ms in (4.0, 5.0, 7.0)]
    _, _, overhead, notes = engine_step_rows(curve, recs, 4, [2])
    (row,) = overhead
    assert (row.kind, row.median_ms, row.p20_ms) == ("plain", -1.0, pytest.approx(-1.6))
    assert row.p80_ms == pytest.approx(0.2) and notes["plain/bs2"]["median_residual_ms"] == -1.0
    from dcut_sched import CostCurve

    full = CostCurve(hardware=curve.hardware, model=curve.model, block_size=4, context_len=0, verify=curve.verify,
                     ar=curve.ar, step_overhead=overhead)
    assert StepCosts(full, 4).plain_ms(2) == 5.0  # the measured median step


def test_missing_anchor_run_is_an_error(make_curve):
    curve = make_curve(batch_sizes=(2,), block_size=4)
    recs = [r for r in _records() if not (r.kind == "drafted" and r.num_tokens == 2)]
    with pytest.raises(ValueError, match="batch size 2: no drafted decode step verifying anchors only"):
        engine_step_rows(curve, recs, 4, [2])
