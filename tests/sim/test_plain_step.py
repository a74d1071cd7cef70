"""The plain-decode step C_ar(bs): what the simulator charges, what `ar` and `fine` use, and fine's probes."""

from __future__ import annotations

import numpy as np
import pytest

from dcut_sched import policies
from dcut_sched.cost_curve import CostCurveError
from dcut_sched.simulator import run_closed_loop, simulate
from dcut_sched.step_costs import StepCosts

from .conftest import build_trace


def test_step_costs_hand_computed(make_curve):
    # C_verify = 2 + K, C_draft = 1 + 0.5 bs, C_ar = 3 ms at bs 2 (not C_verify(2, 2) = 4)
    curve = make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0, draft_base_ms=1.0,
                       draft_per_request_ms=0.5, ar_ms={2: 3.0})
    costs = StepCosts(curve, 4, overhead_ms=0.5, draft_scale=2.0)
    assert costs.plain_ms(2) == 3.0 and costs.plain_tokens_per_ms(2) == pytest.approx(2 / 3)
    assert costs.draft_ms(2) == pytest.approx(4.0)  # 2 x (1 + 0.5 * 2)
    assert costs.drafted_ms(2, 5) == pytest.approx(4.0 + 7.0 + 0.5)
    assert costs.token_range(2) == (2, 8)
    assert costs.verify_ms_at(2, [2, 8]).tolist() == [4.0, 10.0]
    with pytest.raises(ValueError, match="outside the measured range 2..8"):
        costs.verify_ms_at(2, [9])
    # the curve's block size is checked where the step costs are built
    with pytest.raises(CostCurveError, match="block size"):
        StepCosts(curve, 8)
    # beside decode steps: an open-loop prefill, and the measured cells as a profiled table
    assert costs.prefill_ms(2, 3) == pytest.approx(2.0 + 6.0)  # C_verify(2, 2 * 3), no draft scale or overhead
    assert costs.measured_batch_sizes == [2]
    qs, ms = costs.measured_verify(2)
    assert qs.tolist() == list(range(2, 9)) and ms.tolist() == [2.0 + k for k in range(2, 9)]
    assert costs.measured_verify(2)[0] is qs  # cached
    with pytest.raises(ValueError, match="draft_scale"):
        StepCosts(curve, 4, draft_scale=0.0)


def _trace(n=40, block=4, accept=3, conf=0.9, requests=3):
    reqs = []
    for _ in range(requests):
        a = np.minimum(accept, n - 1 - np.arange(n))
        reqs.append((a, np.full((n, block - 1), conf)))
    return build_trace(reqs)


def test_simulator_charges_c_ar_for_plain_steps(make_curve):
    trace = _trace()
    # plain step 3 ms although C_verify(2, 2) = 12 ms
    curve = make_curve(batch_sizes=(2,), base_ms=10.0, per_token_ms=1.0, ar_ms={2: 3.0})
    run = run_closed_loop(trace, curve, policies.get("ar"), 2, num_steps=10, shuffle=False)
    assert run.steps.step_ms.tolist() == [3.0] * 10
    df = simulate(trace, curve, policies=["ar"], batch_sizes=[2], num_steps=10, warmup_steps=0)
    assert df["tokens_per_s"].iat[0] == pytest.approx(1000 * 2 / 3.0)
    assert df["plain_step"].iat[0] == "measured" and df.attrs["plain_step"] == "measured"
    # a curve without ar rows: the plain step is assumed C_verify(2, 2) = 12 ms, with one warning, and said so
    bare = make_curve(batch_sizes=(2,), base_ms=10.0, per_token_ms=1.0, ar_ms=False)
    with pytest.warns(UserWarning, match="ASSUMED"):
        df = simulate(trace, bare, policies=["ar"], batch_sizes=[2], num_steps=10, warmup_steps=0)
    assert df["tokens_per_s"].iat[0] == pytest.approx(1000 * 2 / 12.0)
    assert df["plain_step"].iat[0].startswith("assumed")


def test_fine_decides_against_c_ar(make_curve):
    # Drafted step at K = 8 (B = 4, conf .9 -> E = 2 * (1 + .9 + .81 + .729) = 6.878 tokens) takes
    # C_draft + C_verify = (2 + .5) + (2 + 8) = 12.5 ms: .55 tokens/ms.
    trace = _trace(conf=0.9)
    kw = dict(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0, draft_base_ms=2.0, draft_per_request_ms=0.25)
    # plain 2 / 2.5 ms = .8 tokens/ms beats it: fine stops drafting after step 1
    cheap_plain = make_curve(ar_ms={2: 2.5}, **kw)
    run = run_closed_loop(trace, cheap_plain, policies.get("fine"), 2, num_steps=5, shuffle=False)
    assert run.steps.drafted.tolist() == [True, False, False, False, False]
    assert run.steps.step_ms.tolist()[1:] == [2.5] * 4
    # plain 2 / 8 ms = .25 tokens/ms: fine keeps drafting (C_verify(2, 2) = 4 ms would say the same)
    dear_plain = make_curve(ar_ms={2: 8.0}, **kw)
    run = run_closed_loop(trace, dear_plain, policies.get("fine"), 2, num_steps=5, shuffle=False)
    assert run.steps.drafted.all()


def test_fine_resumes_within_the_bound_on_a_two_phase_trace(make_curve):
    """Phase 1: drafts never accepted (conf .05); phase 2: every draft accepted (conf .95).

    Curve (bs 2, B 4): C_verify = 2 + K, C_draft = 1 + .5 bs = 2, C_ar = 4 ms (.5 tokens/ms).
    Phase 1: the best drafted step is K = 2 (E = 2 in 6 ms, .33 tokens/ms): plain decoding wins, and
    each probe loses 6 - 2 / .5 = 2 ms. Phase 2: K = 8, E = 2 (1 + .95 + .9025 + .857) = 7.42 in 12 ms,
    .62 tokens/ms > 1.05 x .5: drafting pays. With probe_budget .005 a probe comes within
    (2 + 2) / .005 = 800 ms = 200 plain steps (module docstring of fine), which resumes drafting.
    """
    block, n_bad, n_good = 4, 600, 400
    bad = [(np.zeros(n_bad, dtype=int), np.full((n_bad, block - 1), 0.05)) for _ in range(2)]
    good = [(np.minimum(3, n_good - 1 - np.arange(n_good)), np.full((n_good, block - 1), 0.95)) for _ in range(6)]
    trace = build_trace(bad + good)
    curve = make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0, draft_base_ms=1.0,
                       draft_per_request_ms=0.5, ar_ms={2: 4.0})
    fine = policies.get("fine", probe_budget=0.005)
    run = run_closed_loop(trace, curve, fine, 2, num_steps=1200, shuffle=False, record=True)
    requests = np.array([log["request"] for log in run.log])
    drafted = run.steps.drafted
    switch = int(np.flatnonzero((requests >= 2).all(axis=1))[0])  # first step with both slots in phase 2
    # phase 1: what fine lost against plain decoding stays within the budget (plus the first step)
    ms, tokens = run.steps.step_ms[:switch], run.steps.tokens[:switch]
    plain_equiv_ms = tokens.sum() / 0.5
    assert 0 < drafted[:switch].sum() < switch * 0.02
    assert ms.sum() - plain_equiv_ms <= 0.005 * ms.sum() + 2.0 + 1e-9
    # phase 2: drafting resumes within the bound and then stays on
    resume = switch + int(np.flatnonzero(drafted[switch:])[0])
    assert resume - switch <= 200 + 1
    assert drafted[resume:resume + 50].all()


def test_simulate_stays_a_function_whichever_module_loads_it_first():
    # the simulator package has submodules named like its functions; importing one of them first (as
    # the protocol module does) must not turn dcut_sched.simulate into a module
    import subprocess
    import sys

    code = ("from dcut_sched.simulator import benchmark_table\n"
            "import dcut_sched as d, dcut_sched.simulator as s\n"
            "assert callable(d.simulate) and callable(s.simulate) and callable(s.sweep) and callable(d.sweep)\n"
            "assert callable(s.selection_curve)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def _with_engine_rows(curve, draft_first=None, overhead=None):
    from dcut_sched import CostCurve

    return CostCurve(hardware=curve.hardware, model=curve.model, block_size=curve.block_size,
                     context_len=curve.context_len, verify=curve.verify, draft=curve.draft, ar=curve.ar,
                     draft_first=draft_first or [], step_overhead=overhead or [])


def test_step_costs_with_engine_rows_by_hand(make_curve):
    # C_verify = 2 + K, C_draft = 1 + 0.5 bs = 2, C_ar = 3 at bs 2, B = 4;
    # draft_first 1 ms at K = 2, 4 ms at K = 8 (0.5 ms per token between); O_plain 0.5, O_drafted 1, O_undrafted 2
    base = make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0, draft_base_ms=1.0,
                      draft_per_request_ms=0.5, ar_ms={2: 3.0})
    curve = _with_engine_rows(
        base, [{"batch_size": 2, "num_tokens": 2, "median_ms": 1.0}, {"batch_size": 2, "num_tokens": 8, "median_ms": 4.0}],
        [{"kind": "plain", "batch_size": 2, "median_ms": 0.5}, {"kind": "drafted", "batch_size": 2, "median_ms": 1.0},
         {"kind": "undrafted", "batch_size": 2, "median_ms": 2.0}])
    costs = StepCosts(curve, 4, overhead_ms=0.25)
    assert costs.plain_ms(2) == 3.5  # C_ar + O_plain: the engine without speculation
    assert costs.undrafted_ms(2) == 3.0 + 1.0 + 2.0  # C_ar + C_draft_first(2, 2) + O_undrafted
    assert not costs.truly_skips and costs.undrafted_tokens_per_ms(2) == pytest.approx(2 / 6.0)
    # drafted at K = 6: C_draft + (C_draft_first(2, 6) - C_draft_first(2, 2)) + C_verify(2, 6) + O_drafted + overhead
    assert costs.drafted_ms(2, 6) == pytest.approx(2.0 + (3.0 - 1.0) + 8.0 + 1.0 + 0.25)
    assert costs.drafted_fixed_ms(2) == pytest.approx(2.0 + 1.0 + 0.25)
    np.testing.assert_allclose(costs.budget_ms_at(2, [2, 6, 8]), [4.0, 10.0, 13.0])
    np.testing.assert_allclose(costs.drafted_ms_at(2, [2, 6, 8]), [7.25, 13.25, 16.25])
    assert costs.drafted_ms_at(2, [6])[0] == pytest.approx(costs.drafted_ms(2, 6))
    # draft_scale scales the whole draft pass, its first forward included
    scaled = StepCosts(curve, 4, draft_scale=2.0)
    assert scaled.drafted_ms(2, 8) == pytest.approx(4.0 + 2 * 3.0 + 10.0 + 1.0)
    assert scaled.undrafted_ms(2) == pytest.approx(3.0 + 2.0 + 2.0)
    # without undrafted rows the engine truly skips: undrafted = plain (C_ar + O_plain)
    skips = StepCosts(_with_engine_rows(base, None, [{"kind": "plain", "batch_size": 2, "median_ms": 0.5}]), 4)
    assert skips.truly_skips and skips.undrafted_ms(2) == skips.plain_ms(2) == 3.5
    # no optional rows at all: the former prices exactly
    bare = StepCosts(base, 4, overhead_ms=0.25)
    assert bare.undrafted_ms(2) == bare.plain_ms(2) == 3.0
    assert bare.drafted_ms(2, 6) == 2.0 + 8.0 + 0.25 and bare.budget_ms_at(2, [6]) is bare.verify_ms_at(2, [6])


def test_simulator_and_fine_price_undrafted_steps(make_curve):
    # fine would stop drafting against C_ar = 2.5 ms (.8 tokens/ms, test above); on an engine whose
    # undrafted step also runs the drafter's first pass (C_ar + 1 + O_undrafted 6 = 9.5 ms: .21 tokens/ms)
    # drafting (.55 tokens/ms) wins, and the simulator charges ar the plain step, fine the undrafted one
    trace = _trace(conf=0.9)
    base = make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0, draft_base_ms=2.0, draft_per_request_ms=0.25,
                      ar_ms={2: 2.5})
    rows = [{"batch_size": 2, "num_tokens": 2, "median_ms": 1.0}, {"batch_size": 2, "num_tokens": 8, "median_ms": 1.0}]
    engine = _with_engine_rows(base, rows, [{"kind": "undrafted", "batch_size": 2, "median_ms": 6.0}])
    run = run_closed_loop(trace, engine, policies.get("fine"), 2, num_steps=5, shuffle=False)
    assert run.steps.drafted.all()
    run = run_closed_loop(trace, engine, policies.get("ar"), 2, num_steps=3, shuffle=False)
    assert run.steps.step_ms.tolist() == [2.5] * 3
    # an undrafted step of a speculative policy costs 9.5 ms: a fine that is told to skip pays it
    skip = policies.get("fine", speculate_margin=10.0)
    run = run_closed_loop(trace, engine, skip, 2, num_steps=3, shuffle=False)
    assert run.steps.drafted.tolist()[:2] == [True, False] and run.steps.step_ms.tolist()[1] == 9.5
