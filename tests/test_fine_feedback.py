"""``fine`` plans with what the engine delivered: accepted drafts and measured step times (design §2.1)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcut_sched as d
from dcut_sched.policies.fine import PLAIN_PROBE_MAX_STEPS, Realization
from dcut_sched.step_costs import StepCosts
from tests.conftest import linear_curve

# every slot .999: scores per request 1, .999, .998001, .997003; E(8) = 2 * 3.994004 = 7.988008
SURE = np.full((2, 3), 0.999)


def _costs(make_curve):
    # C_draft(2) = 1 + .5 * 2 = 2 ms, C_verify(2, K) = 2 + K ms, plain step C_ar(2) = 4 ms
    return StepCosts(make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0, draft_base_ms=1.0,
                                draft_per_request_ms=0.5), 4)


def test_accepted_drafts_replace_the_estimate_in_the_account_and_the_plans(make_curve):
    costs = _costs(make_curve)
    fine = d.policies.get("fine", granularity=1, probe_budget=0.01)
    plan = fine.plan(SURE, costs)
    # K = 8: 7.988008 tokens in 12 ms = .6657 per ms > 1.05 x .5 -> draft next; the estimate gains
    # 12 - 7.988008 / .5 = -3.976 ms, credited down to -1 % of the 12 ms elapsed
    assert plan.num_tokens == 8 and plan.draft_next is True
    assert fine.state.debt_ms == pytest.approx(-0.12)
    fine.observe(plan.lengths, np.array([0, 0]))  # nothing accepted: 2 tokens in 12 ms
    plan = fine.plan(SURE, costs)
    # settled: the step really lost 12 - 2 / .5 = 8 ms, 11.976 ms more than booked; the second step
    # (anchors only, below) books 6 - 2 / .5 = 2 ms
    assert fine.state.debt_ms == pytest.approx(-0.12 + 8 + 3.976016 + 2)
    rho = 1 / (1 + 5.988008)  # one pseudo-draft at 1 beside the 5.988 expected drafts, none accepted
    assert fine.state.realization.tokens == pytest.approx(rho)
    # counted tokens 2 + rho (E(K) - 2): the anchors alone are best (2 / 6 ms > 2.82 / 12 ms)
    assert plan.num_tokens == 2


def test_without_feedback_the_same_outcomes_keep_it_drafting(make_curve):
    costs = _costs(make_curve)
    blind = d.policies.get("fine", granularity=1, probe_budget=0.01, feedback=False)
    seeing = d.policies.get("fine", granularity=1, probe_budget=0.01)
    drafted = {"blind": 0, "seeing": 0}
    for name, fine in (("blind", blind), ("seeing", seeing)):
        draft = True
        for _ in range(200):
            if draft:
                plan = fine.plan(SURE, costs)
                fine.observe(plan.lengths, np.zeros(2, dtype=np.int64))
                drafted[name] += 1
            else:
                plan = fine.plan_without_draft(2, 4, costs)
            draft = plan.draft_next
    assert drafted["blind"] == 200  # the confidences promise .66 tokens/ms for ever
    # realized: a few steps until the running rate falls, then the probe budget holds it back
    assert drafted["seeing"] <= 6
    assert seeing.state.debt_ms > 0.01 * seeing.state.elapsed_ms  # probes held back by the real loss
    assert blind.state.debt_ms < 0


def test_measured_time_scales_the_priced_steps(make_curve):
    # drafting pays on the curve (the cheap draft of test_policies), not at 3x the priced time
    costs = StepCosts(make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=0.2, draft_base_ms=0.1,
                                 draft_per_request_ms=0.0), 4)
    fine = d.policies.get("fine", granularity=1)
    plan = fine.plan(SURE, costs)
    assert plan.draft_next is True
    priced = costs.drafted_ms(2, plan.num_tokens)
    steps = 0
    while plan.draft_next and steps < 50:
        fine.observe(plan.lengths, plan.lengths - 1)  # every verified draft accepted
        fine.observe_time(3.0 * costs.drafted_ms(2, plan.num_tokens))
        plan = fine.plan(SURE, costs)
        steps += 1
    assert not plan.draft_next and steps == 13  # the ratio passes 2.5 at step 4; the running rate (ema .8) lags
    rz = fine.state.realization
    assert rz.tokens == pytest.approx(1.0, abs=2e-3)
    assert rz.drafted_time > 2.0 and rz.plain_time == 1.0
    # hand-computed: one pseudo-observation at 1 beside the observed 3; a plain step ages the 3 by .95
    r = Realization(0.95)
    r.add_time(True, 3.0)
    assert r.drafted_time == pytest.approx((3.0 + 1) / (1 + 1))
    r.age()
    assert r.drafted_time == pytest.approx((0.95 * 3.0 + 1) / (0.95 + 1))
    assert priced == pytest.approx(0.1 + 2.0 + 0.2 * 8)


def test_controller_passes_the_measured_step_time_to_the_policy(make_curve):
    curve = make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0, draft_base_ms=1.0, draft_per_request_ms=0.5)
    ctrl = d.RatioController(curve, 4, policy="fine", calibrate=False, granularity=1)
    ctrl.plan(SURE)
    ctrl.observe(np.array([3, 3]), step_ms=24.0)
    assert ctrl.policy.state.booked.measured_ms == 24.0
    ctrl.plan(SURE)  # settles: measured 24 over priced 12 ms
    assert ctrl.policy.state.realization.drafted_time == pytest.approx((2.0 + 1) / (1 + 1))
    for bad in (float("nan"), float("inf"), 0.0, -1.0):  # a clock glitch is not a measurement
        ctrl.observe(np.array([3, 3]), step_ms=bad)
        assert ctrl.policy.state.booked.measured_ms is None
        ctrl.plan(SURE)
    ctrl.observe(np.array([0, 0]))
    plain = ctrl.plan_without_draft(2)
    assert not plain.drafted
    ctrl.observe(np.zeros(2, dtype=np.int64), step_ms=8.0)  # an undrafted step at 2x its 4 ms
    ctrl.plan_without_draft(2)
    assert ctrl.policy.state.realization.plain_time == pytest.approx((2.0 + 1) / (1 + 1))


def test_feedback_decay_is_checked():
    with pytest.raises(ValueError, match="feedback_decay"):
        d.policies.get("fine", feedback_decay=1.0)
    assert d.policies.get("fine").params()["feedback"] is True


def _drafts_after_a_stall(curve, stall_ms, steps=1500):
    """Drafted steps of ``fine`` through the controller, every draft accepted, each step timed at 17 ms
    except step 50, timed at ``stall_ms``."""
    ctrl = d.RatioController(curve, 4, policy="fine", calibrate=False)
    conf = np.full((4, 3), 0.95, np.float32)
    drafted, plan = 0, None
    for i in range(steps):
        ms = stall_ms if i == 50 else 17.0
        if plan is None or plan.draft_next:
            plan = ctrl.plan(conf)
            drafted += 1
            ctrl.observe(np.full(4, 3, np.int64), step_ms=ms)
        else:
            plan = ctrl.plan_without_draft(4)
            ctrl.observe(np.zeros(4, np.int64), step_ms=ms)
    return drafted, ctrl.policy.state


@pytest.mark.parametrize("stall_ms", [1e3, 1e4, 1e300])
def test_one_stalled_step_does_not_stop_drafting(make_curve, stall_ms):
    """A pause of the process on one drafted step (10 s on a 17 ms step) was booked in full as a
    loss of drafting: fine stopped and its probes waited ~10^5 steps (1e300 ms: for ever). One
    step's measured time counts at most STEP_TIME_OUTLIER times what its plan booked. The only plain
    steps are the 4 plain probes' (after 64, 128, 256 and 512 drafted steps, 3 plain steps each)."""
    from dcut_sched.policies.fine import STEP_TIME_OUTLIER

    curve = make_curve(batch_sizes=(1, 2, 4, 8), block_size=4)
    steady, state = _drafts_after_a_stall(curve, 17.0)
    drafted, state = _drafts_after_a_stall(curve, stall_ms)
    assert steady == drafted == 1500 - 4 * 3
    assert state.debt_ms < 0 and state.elapsed_ms < 1500 * 17.0 + STEP_TIME_OUTLIER * 17.0 * 2


def test_a_curve_that_prices_every_step_low_is_still_followed(make_curve):
    """Every step 10x its price (above STEP_TIME_OUTLIER): the running ratio follows within a few steps."""
    costs = _costs(make_curve)
    fine = d.policies.get("fine", granularity=1)
    for _ in range(40):
        plan = fine.plan(SURE, costs)
        fine.observe(plan.lengths, plan.lengths - 1)
        fine.observe_time(10.0 * costs.drafted_ms(2, plan.num_tokens))
    fine.plan(SURE, costs)
    assert fine.state.realization.drafted_time > 8.0


def test_a_measured_plain_step_re_prices_the_open_losses(make_curve):
    """Losses booked against the plain ratio in force are re-priced when a plain step moves it
    (design §2.1, "A host slower than its curve"): by -delta t_plain x the tokens' priced plain time."""
    costs = _costs(make_curve)
    fine = d.policies.get("fine", granularity=1, probe_budget=0.01, ema_decay=0.0)
    plan = fine.plan(SURE, costs)  # K = 8, priced 12 ms
    fine.observe(plan.lengths, np.array([0, 0]))
    fine.observe_time(36.0)
    plan = fine.plan(SURE, costs)
    # settled: 2 tokens in 36 ms lost 36 - 2 / .5 = 32 ms (the estimate -3.976 was credited to -0.12):
    # debt -0.12 + 32 + 3.976 = 35.856, open: 2 tokens' 4 ms of plain decoding. This plan: t_drafted
    # (36/12 + 1) / 2 = 2, anchors only, 2 tokens in 12 ms, stops drafting and books 12 - 4 = 8 ms.
    st = fine.state
    assert plan.num_tokens == 2 and plan.draft_next is False
    assert st.debt_ms == pytest.approx(43.856016) and st.open_plain_ms == pytest.approx(4.0)
    assert st.probe_loss_ms == pytest.approx(8.0) and st.probe_plain_ms == pytest.approx(4.0)
    fine.observe(plan.lengths, np.array([0, 0]))
    fine.observe_time(12.0)  # as booked
    fine.plan_without_draft(2, 4, costs)
    assert st.debt_ms == pytest.approx(43.856016) and st.open_plain_ms == pytest.approx(8.0)
    fine.observe_time(8.0)  # the plain step at 2x its 4 ms: t_plain 1 -> (2 + 1) / 2 = 1.5
    fine.plan_without_draft(2, 4, costs)
    assert st.realization.plain_time == pytest.approx(1.5)
    assert st.debt_ms == pytest.approx(43.856016 - 0.5 * 8.0)
    assert st.probe_loss_ms == pytest.approx(8.0 - 0.5 * 4.0)
    # a new drafting stretch settles the last one's: only its own tokens stay open (the anchors: the
    # drafts still look bad; 2 tokens in 30 ms lose 30 - 2 / (.5 / 1.5) = 24 ms, their plain 4 ms open)
    plan = fine.plan(SURE, costs)
    assert plan.num_tokens == 2
    fine.observe(plan.lengths, np.array([0, 0]))
    fine.observe_time(30.0)
    fine.plan(SURE, costs)
    assert st.open_plain_ms == pytest.approx(4.0)


def _drafted_on_a_host(costs, drafted_x: float, plain_x: float, steps: int, accept=None, seed=0, timing="every",
                       stall=0.0, fine=None):
    """Run ``fine`` for ``steps`` steps on a host where drafted and plain steps take ``drafted_x`` and
    ``plain_x`` times their price (+-10 %) and each draft is accepted with probability ``accept``
    (``None``: every one). ``timing``: ``"every"`` step is timed, ``"vllm"`` only a step whose next one
    drafts alike (the plugin's rule: its window holds the next step's drafter pass), ``"drafted"`` only
    drafted steps; ``stall``: the chance that a step is reported 10x its time (a pause of the process).
    Returns (drafted steps, what drafting really lost against plain decoding at the host's plain rate,
    the run's time, the first drafting stretch's loss, the worst later one's)."""
    rng = np.random.default_rng(seed)
    fine = fine or d.policies.get("fine", granularity=1)
    plain_rate = costs.undrafted_tokens_per_ms(2) / plain_x
    plan, drafted, loss, elapsed, stretches, stretch = None, 0, 0.0, 0.0, [], None
    for _ in range(steps):
        if plan is None or plan.draft_next:
            plan = fine.plan(SURE, costs)
            lengths = np.asarray(plan.lengths)
            if accept is None:
                accepted = lengths - 1
            else:  # the accepted prefix: the first rejected draft ends it
                accepted = np.array([np.argmin(np.r_[rng.random(n - 1) < accept, False]) for n in lengths])
            fine.observe(plan.lengths, accepted)
            ms = drafted_x * costs.drafted_ms(2, plan.num_tokens) * rng.uniform(0.9, 1.1)
            step_loss = ms - (2 + accepted.sum()) / plain_rate
            drafted, loss, stretch = drafted + 1, loss + step_loss, (stretch or 0.0) + step_loss
        else:
            if stretch is not None:
                stretches, stretch = stretches + [stretch], None
            plan = fine.plan_without_draft(2, 4, costs)
            ms = plain_x * costs.undrafted_ms(2) * rng.uniform(0.9, 1.1)
        timed = {"every": True, "vllm": plan.drafted == plan.draft_next, "drafted": plan.drafted}[timing]
        if timed:
            fine.observe_time(ms * (10.0 if rng.random() < stall else 1.0))
        elapsed += ms
    stretches += [] if stretch is None else [stretch]
    return drafted, loss, elapsed, stretches[0], max(stretches[1:], default=0.0)


@pytest.mark.parametrize("timing", ["every", "vllm"])
@pytest.mark.parametrize("slowdown", [1.65, 2.0, 3.0])
def test_a_host_slower_than_its_curve_for_every_step_keeps_drafting(make_curve, slowdown, timing):
    """Every step ``slowdown`` x its price: drafting pays as much as on the curve (8 tokens in 12 ms
    against 2 in 4). The drafted steps look slow against plain decoding at its prior ratio 1 and it
    stops; the plain steps measured next re-price that loss, and the probe 16 steps later resumes.
    Before the re-pricing, the loss held the probes back: 4-81 of 1000 steps drafted (seeds 0-3).
    The plain probes (after 64, 128, 256 and 512 drafted steps, 3 plain steps each) find drafting
    still pays: 972 drafted."""
    drafted, loss, elapsed, _, _ = _drafted_on_a_host(_costs(make_curve), slowdown, slowdown, 1000, timing=timing)
    assert drafted >= 965
    assert loss < -0.3 * elapsed  # a third of the run's time saved against plain decoding


def test_a_curve_that_prices_drafting_low_against_plain_decoding_is_still_found_out(make_curve):
    """Drafted steps at 3x their price, plain steps at theirs: drafting loses (8 tokens in 36 ms
    against 2 in 4), and the measured plain ratio, 1, re-prices nothing."""
    drafted, loss, elapsed, first, _ = _drafted_on_a_host(_costs(make_curve), 3.0, 1.0, 2000)
    assert drafted <= 8
    assert loss <= 0.005 * elapsed + first


@pytest.mark.parametrize("timing", ["every", "vllm"])
def test_a_plain_probe_finds_plain_decoding_faster_than_its_curve(make_curve, timing):
    """Drafted steps at 1.1x their price, plain steps at 0.5x: drafting loses (8 tokens in 13.2 ms
    against 2 in 2), but while drafting looks paying no plain step is measured. The plain probe after
    64 drafted steps measures plain decoding and drafting stops; what drafting lost after that first
    stretch stays within the bound of design §2.1 (the probe budget and one later stretch). Before
    plain probes: 1500 of 1500 steps drafted, 39 % of the run lost."""
    drafted, loss, elapsed, first, later = _drafted_on_a_host(_costs(make_curve), 1.1, 0.5, 1500, timing=timing)
    assert 64 <= drafted <= 80
    assert loss <= 0.005 * elapsed + first + max(later, 0.0)


def _plain_probe(fine, costs, plain_ms, drafted_bs=2, plain_bs=2):
    """Draft at ``drafted_bs`` until ``fine`` asks for a plain probe (every step at its price, every draft
    accepted), then run plain steps at ``plain_bs`` reported at ``plain_ms`` (one entry per step; ``None``:
    untimed) until it drafts again or they run out. Returns the drafted steps before the probe and the
    plain steps it ran."""
    conf, before = np.full((drafted_bs, 3), 0.999), 0
    plan = fine.plan(conf, costs)
    while plan.draft_next:
        fine.observe(plan.lengths, np.asarray(plan.lengths) - 1)
        fine.observe_time(costs.drafted_ms(drafted_bs, plan.num_tokens))
        plan, before = fine.plan(conf, costs), before + 1
    fine.observe(plan.lengths, np.asarray(plan.lengths) - 1)
    fine.observe_time(costs.drafted_ms(drafted_bs, plan.num_tokens))
    for n, ms in enumerate(plain_ms, 1):
        plan = fine.plan_without_draft(plain_bs, 4, costs)
        if ms is not None:
            fine.observe_time(ms)
        if plan.draft_next:
            return before + 1, n
    return before + 1, len(plain_ms)


def test_a_plain_probe_decides_on_its_own_measurements(make_curve):
    """On the curve drafting makes 8 tokens in 12 ms against plain decoding's 2 in 4 (0.67 against 0.5
    tokens per ms; drafting pays while a plain step takes more than 3.15 ms at the 5 % margin). Plain
    steps at 2 ms: two agree, drafting stops (the probe holds the usual probe rule off: no draft for
    the next 16 steps). At 4 ms: two agree, drafting resumes after 3 plain steps (the third asks).
    One stalled step (40 ms) beside two at 2 ms: the median decides, drafting stops. With
    ``probe_interval=1`` the usual probe rule waits until the plain probe has decided; a "loses"
    verdict brings ``t_plain`` down to its median (0.5)."""
    costs = _costs(make_curve)
    before, ran = _plain_probe(d.policies.get("fine", granularity=1), costs, [2.0] * 16)
    assert (before, ran) == (64, 16)
    before, ran = _plain_probe(d.policies.get("fine", granularity=1), costs, [4.0] * 16)
    assert (before, ran) == (64, 3)
    before, ran = _plain_probe(d.policies.get("fine", granularity=1), costs, [40.0] + [2.0] * 15)
    assert (before, ran) == (64, 16)
    fine = d.policies.get("fine", granularity=1, probe_interval=1)
    before, ran = _plain_probe(fine, costs, [2.0] * 16)
    # the usual rule (a probe after 1 plain step) waited for the verdict at the 3rd, then for the budget
    assert before == 64 and ran > 3 and fine.state.realization.plain_time < 0.55


def test_a_plain_probe_without_step_times_ends_at_its_cap(make_curve):
    """Untimed plain steps (prefill in the batch, or an engine that times only drafted steps) leave the
    probe nothing to decide on: drafting resumes after ``PLAIN_PROBE_MAX_STEPS``; the next plain probe
    waits twice as long. Without step times at all (the simulator) there is no plain probe."""
    costs = _costs(make_curve)
    fine = d.policies.get("fine", granularity=1)
    assert _plain_probe(fine, costs, [None] * 16) == (64, PLAIN_PROBE_MAX_STEPS)
    assert fine.state.plain_probe_after == 128
    fine = d.policies.get("fine", granularity=1)
    for _ in range(1000):
        plan = fine.plan(SURE, costs)
        fine.observe(plan.lengths, plan.lengths - 1)
        assert plan.draft_next


@settings(max_examples=60, deadline=None)
@given(drafted_x=st.floats(0.5, 4.0), plain_x=st.floats(0.5, 4.0), accept=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**16), timing=st.sampled_from(["every", "vllm"]))
def test_what_drafting_really_loses_stays_within_the_probe_budget(drafted_x, plain_x, accept, seed, timing):
    """The bound of design §2.1, on any host speed and any acceptance, with either timing rule: against
    plain decoding at the host's real rate, drafting loses at most ``probe_budget`` of the run, its
    first drafting stretch and one later stretch (a probe's, or one a plain probe resumed)."""
    drafted, loss, elapsed, first, probe = _drafted_on_a_host(_costs(linear_curve), drafted_x, plain_x, 600, accept,
                                                              seed, timing)
    assert loss <= 0.005 * elapsed + max(first, 0.0) + max(probe, 0.0) + 1e-9


def test_a_paying_stretch_is_not_left_open_to_re_pricing(make_curve):
    """A paying step's estimate is credited down to the floor and its settling adds a small correction; if
    the stretch stayed open, a later fall of t_plain would charge the account for all of it (-dt x its
    plain time) and lock probes out. An estimate the floor swallows closes what was open: at most the
    last step (16 ms of plain decoding) is open when drafting stops."""
    costs = _costs(make_curve)
    fine = d.policies.get("fine", granularity=1)
    for _ in range(300):  # every step 1.2x its price, every draft accepted: drafting pays (8 tokens in
        plan = fine.plan(SURE, costs)  # 14.4 ms against 2 in 4)
        fine.observe(plan.lengths, plan.lengths - 1)
        fine.observe_time(1.2 * costs.drafted_ms(2, plan.num_tokens))
    fine.plan(SURE, costs)
    st = fine.state
    assert plan.draft_next and st.debt_ms == pytest.approx(-0.005 * st.elapsed_ms)
    assert st.open_plain_ms <= 8 / 0.5


def test_plain_probe_after_is_checked_and_none_turns_plain_probes_off(make_curve):
    """``plain_probe_after=None``: drafting goes on as before plain probes (1500 of 1500 steps drafted
    at 1.1x / 0.5x, every step timed); 16 gives the first plain probe after 16 drafted steps."""
    with pytest.raises(ValueError, match="plain_probe_after"):
        d.policies.get("fine", plain_probe_after=0)
    costs = _costs(make_curve)
    off = d.policies.get("fine", granularity=1, plain_probe_after=None)
    assert off.params()["plain_probe_after"] is None
    assert _drafted_on_a_host(costs, 1.1, 0.5, 1500, fine=off)[0] == 1500
    assert _plain_probe(d.policies.get("fine", granularity=1, plain_probe_after=16), costs, [2.0] * 16) == (16, 16)


@pytest.mark.parametrize("drafted_bs, plain_bs", [(1, 1), (1, 8), (8, 8), (8, 1)])
def test_a_plain_probe_judges_drafting_alike_at_any_batch_size(make_curve, drafted_bs, plain_bs):
    """Every step at its price on the default linear curve, where drafting pays at bs 1 and 8: a plain
    probe whose plain steps run at another batch size (a request joined or finished) resumes after 3
    plain steps, as at the same one. Comparing drafting's rate at bs 1 with plain decoding's at bs 8
    (0.28 against 0.57 tokens per ms) said it loses and waited 16 steps for the usual probe."""
    costs = StepCosts(make_curve(), 4)
    fine = d.policies.get("fine", granularity=1)
    _, ran = _plain_probe(fine, costs, [costs.undrafted_ms(plain_bs)] * 16, drafted_bs, plain_bs)
    assert fine.state.plain_probes == 1 and ran == 3


def test_the_gap_between_plain_probes_stops_doubling_at_its_cap(make_curve):
    """64, 128, ..., 1024 drafted steps, then every 1024: a server that runs for days keeps checking."""
    from dcut_sched.policies.fine import PLAIN_PROBE_MAX_GAP

    costs = _costs(make_curve)
    fine = d.policies.get("fine", granularity=1, plain_probe_after=PLAIN_PROBE_MAX_GAP // 2)
    assert _plain_probe(fine, costs, [4.0] * 16) == (PLAIN_PROBE_MAX_GAP // 2, 3)
    assert fine.state.plain_probe_after == PLAIN_PROBE_MAX_GAP
    assert _plain_probe(fine, costs, [4.0] * 16) == (PLAIN_PROBE_MAX_GAP, 3)
    assert fine.state.plain_probe_after == PLAIN_PROBE_MAX_GAP and fine.state.plain_probes == 2


def test_a_batch_that_shrinks_before_a_plain_probe_does_not_carry_its_gain(make_curve):
    """Drafted steps at their price, plain steps at 0.3x, on the default linear curve: drafting loses at
    bs 1 (a gain of 2.95 over the priced plain rate, 0.89 at the measured one). A batch of 8 that
    shrinks to 1 four steps before the plain probe: the running rate still carried bs 8's tokens per ms
    (a gain of 6.3), the probe said "pays" and 204 of 400 steps were drafted. The gain is averaged per
    step, over each step's own priced plain rate: 64 drafted, as at bs 1 throughout."""
    costs = StepCosts(make_curve(), 4)
    fine = d.policies.get("fine", granularity=1)
    rng = np.random.default_rng(0)
    plan, drafted = None, 0
    for i in range(400):
        bs = 8 if i < 60 else 1
        if plan is None or plan.draft_next:
            plan = fine.plan(np.full((bs, 3), 0.999), costs)
            fine.observe(plan.lengths, np.asarray(plan.lengths) - 1)
            ms, drafted = costs.drafted_ms(bs, plan.num_tokens) * rng.uniform(0.97, 1.03), drafted + 1
        else:
            plan = fine.plan_without_draft(bs, 4, costs)
            ms = 0.3 * costs.undrafted_ms(bs) * rng.uniform(0.97, 1.03)
        fine.observe_time(ms)
    assert drafted == 64 and fine.state.plain_probes == 1


def test_a_losing_verdict_lowers_t_plain_to_its_median_even_from_the_prior():
    """Three plain steps at 0.2 leave ``plain_time`` at 0.41 beside the pseudo-observation at 1; a plain
    probe's median of 0.2 brings it there (the measured weight raised), not to 0.26."""
    rz = Realization(0.95)
    for _ in range(3):
        rz.add_time(False, 0.2)
    assert rz.plain_time == pytest.approx(0.408, abs=1e-3)
    rz.lower_plain_time(0.2)
    assert rz.plain_time == pytest.approx(0.2)
    rz.lower_plain_time(0.5)  # never raised
    assert rz.plain_time == pytest.approx(0.2)
