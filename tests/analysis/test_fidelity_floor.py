"""Pure parts of analysis/fidelity_floor.py: the rounds' settings, the peers' policies, the measured
cells and the per-cell cause, on small hand-made inputs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fidelity_floor", ROOT / "analysis" / "fidelity_floor.py")
ff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ff)


def test_read_settings_from_a_rounds_header():
    vllm = ("SmolLM2-135M fp32, draft: x, B = 8, one wave of bs prompts x 32 greedy tokens, 3 interleaved rounds "
            "... the K per bs the same cost curve implies ({1: 7, 2: 0, 16: 3}; `analysis/bench_vllm.py`).")
    assert ff.read_settings(vllm) == {"block_size": 8, "max_tokens": 32, "schedule": {1: 7, 2: 0, 16: 3}}
    own = "the DFlash drafter (d), B = 16, one wave of bs prompts x 48 greedy tokens, 2 torch threads"
    assert ff.read_settings(own) == {"block_size": 16, "max_tokens": 48, "schedule": {}}
    with pytest.raises(ValueError, match="greedy tokens"):
        ff.read_settings("B = 8 and nothing else")


def test_sim_policy_maps_plain_decoding_and_the_vllm_peers():
    sched = {1: 7, 4: 0, 8: 3}
    assert ff.sim_policy("nospec", 4, 8, sched) == ("ar", {}, False)
    assert ff.sim_policy("ar", 4, 16, {}) == ("ar", {}, False)
    assert ff.sim_policy("vllm-k2", 4, 8, sched) == ("uniform", {"rho": 3 / 8}, False)
    assert ff.sim_policy("vllm-k4", 4, 8, sched) == ("uniform", {"rho": 5 / 8}, False)
    assert ff.sim_policy("vllm-dynsd", 1, 8, sched) == ("uniform", {"rho": 1.0}, False)
    assert ff.sim_policy("vllm-dynsd", 8, 8, sched) == ("uniform", {"rho": 4 / 8}, False)
    # K = 0: never drafts, but its undrafted steps run vLLM's whole drafter pass
    assert ff.sim_policy("vllm-dynsd", 4, 8, sched) == ("ar", {}, True)
    assert ff.sim_policy("fine", 4, 8, sched) == ("fine", {}, False)


def _runs():
    # one set, bs 2, two rounds; plain decoding "nospec" and "fine"; vLLM-like step counts (prefill included)
    return pd.DataFrame({
        "prompt_set": ["s"] * 4, "batch_size": [2] * 4, "round": [0, 0, 1, 1],
        "config": ["nospec", "fine", "nospec", "fine"],
        "tokens_per_s": [40.0, 50.0, 50.0, 45.0],
        "steps": [np.nan, 11.0, np.nan, 13.0], "drafted_steps": [np.nan, 4.0, np.nan, 6.0],
    })


def test_measured_cells_medians_spread_speedup_and_steps():
    cells = ff.measured_cells(_runs(), "nospec", prefill_steps=1, max_tokens=17).set_index("config")
    plain, fine = cells.loc["nospec"], cells.loc["fine"]
    assert plain["measured"] == 45.0 and plain["measured_min"] == 40.0 and plain["measured_max"] == 50.0
    assert plain["spread"] == pytest.approx(10 / 45)
    assert plain["speedup"] == 1.0 and plain["steps"] == 16 and plain["drafted_steps"] == 0
    assert fine["measured"] == 47.5
    assert fine["speedup"] == pytest.approx((50 / 40 + 45 / 50) / 2)  # within-round ratios, median of two
    assert fine["steps"] == 11.0 and fine["drafted_steps"] == 5.0  # median 12 minus the prefill step
    # plain step: bs / plain tok/s; ms per step: bs x (T - 1) tokens over the decode steps
    assert plain["plain_step_ms"] == pytest.approx(2e3 / 45) == fine["plain_step_ms"]
    assert plain["ms_per_step"] == pytest.approx(2e3 / 45)
    assert fine["ms_per_step"] == pytest.approx(2 * 16 * 1e3 / 47.5 / 11)


def _row(**kw):
    base = {"config": "fine", "error": 0.0, "spread": 0.05, "measured_min": 95.0, "measured_max": 100.0,
            "predicted": 100.0, "steps": 20.0, "sim_steps": 20, "drafted_steps": 10.0, "sim_drafted_steps": 10,
            "ms_per_step": 10.0, "sim_ms_per_step": 10.0, "plain_step_error": 0.0}
    return {**base, **kw}


def test_cause_is_empty_within_the_tolerance():
    assert ff.cause(_row(error=0.10)) == ""
    assert ff.cause(_row(error=-0.09)) == ""


def test_cause_names_noise_steps_and_the_plain_step():
    # the rounds' spread exceeds the error
    noise = ff.cause(_row(error=0.2, spread=0.3, predicted=120.0, sim_ms_per_step=12.0, plain_step_error=0.2))
    assert noise.startswith("noise: the rounds' spread 30% >= |error| 20%")
    # steps: 20 in the engine, 25 simulated; step times equal
    steps = ff.cause(_row(error=-0.2, predicted=80.0, sim_steps=25, sim_drafted_steps=15))
    assert steps == "steps differ: engine 20 (10 drafted), simulator 25 (15 drafted)"
    # the whole error is the curve's plain step being 25 % slow on that day
    plain = ff.cause(_row(error=-0.2, predicted=80.0, sim_ms_per_step=12.5, plain_step_error=0.25))
    assert plain == "step time: the curve's plain step is +25% off this cell's measured one (step time +25%)"
    # the drafted step costs 30 % more than the curve says while the plain step is right
    drafted = ff.cause(_row(error=0.3, predicted=130.0, sim_ms_per_step=7.7, plain_step_error=0.0))
    assert drafted.startswith("step time -23% vs plain step +0%: the drafted step")
    # same steps, but a different number of them drafted
    mixed = ff.cause(_row(error=0.15, predicted=115.0, drafted_steps=2.0, sim_drafted_steps=12,
                          sim_ms_per_step=10.0 / 1.15))
    assert mixed.startswith("drafted steps differ: engine 2, simulator 12 of 20")
    # a peer without recorded steps: only the plain step can be named
    peer = ff.cause(_row(config="vllm-k2", error=0.15, predicted=115.0, steps=np.nan, plain_step_error=-0.12))
    assert peer == "the curve's plain step is -12% off this cell's measured one (steps not recorded)"


def test_block_pass_extra_is_the_upkeep_over_the_pass_written_every_step():
    """vLLM's own drafter pass over D-Cut's from the in-step upkeep times (block - context-write), the
    step medians ignored; a file from before the context-write row uses context."""
    rows = [("vllm", 1, "block", 50.0, 4.0), ("vllm", 1, "context-write", 45.0, 1.0), ("vllm", 1, "context", 60.0, 0.3),
            ("vllm", 16, "block", 80.0, 9.0), ("vllm", 16, "context-write", 90.0, 1.5), ("vllm", 16, "context", 70.0, 0.5),
            ("own", 1, "context", 30.0, 0.2)]
    table = pd.DataFrame(rows, columns=["engine", "batch_size", "config", "step_ms", "upkeep_ms"])
    assert ff.block_pass_extra_ms(table) == {1: 3.0, 16: 7.5}
    older = table[table.config != "context-write"]
    assert ff.block_pass_extra_ms(older) == {1: 3.7, 16: 8.5}
