"""Policy names and parameters: one validation path (dcut_sched.policies.check_params) for the CLIs,
SimConfig, the controller and the vLLM config; booleans are not numbers; a run builds each policy once."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest

from dcut_sched import RatioController, policies
from dcut_sched.paths import trace_path
from dcut_sched.policies import PolicyParamError, UnknownPolicyError
from dcut_sched.simulator import SimConfig, SimulationError


@pytest.fixture
def built(monkeypatch) -> Counter:
    """Counts constructions per policy name: every registered class's ``__init__`` wrapped (a call
    through ``super().__init__`` from a subclass is not counted twice)."""
    counts: Counter = Counter()
    for name in policies.names():
        cls = policies.policy_class(name)
        original = cls.__init__

        @functools.wraps(original)
        def init(self, *args, __original=original, __cls=cls, **kwargs):
            if type(self) is __cls:
                counts[self.name] += 1
            __original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", init)
    return counts


@pytest.mark.parametrize("name, params, match", [
    ("tetris", {"draft_capacity": True}, "parameter draft_capacity: expects an integer, got True"),
    ("topk", {"rho": False}, "parameter rho: expects a number, got False"),
    ("smartspec", {"max_draft_len": True}, "parameter max_draft_len: expects an integer or None, got True"),
    ("fine", {"allowed_num_tokens": [64, True]}, "parameter allowed_num_tokens: expects a list of integers or None"),
    ("dcut", {"ratios": []}, "parameter ratios: expects a list of numbers"),
    ("fine", {"probe_budget": float("inf")}, "parameter probe_budget: inf is not finite"),
    ("fine", {"granularity": 10**400}, "is not finite"),
    ("full", {"rho": 0.5}, "policy full: parameter 'rho': is not a parameter of this policy; valid keys: none"),
])
def test_one_validation_path_refuses_kinds_without_building(built, name, params, match):
    with pytest.raises(PolicyParamError, match=match):
        policies.check_params(name, params)
    with pytest.raises(PolicyParamError, match=match):
        policies.get(name, **params)
    with pytest.raises(SimulationError, match=match):
        SimConfig(policies=(name,), policy_params={name: params})
    with pytest.raises(PolicyParamError, match=match):
        RatioController(None, 4, name, **params)
    assert not built  # nothing was built to find out


def test_accepted_kinds_and_unknown_names():
    # an integral float is an integer, an int is a number, numpy scalars count as their kind
    policies.check_params("fine", {"granularity": 8.0, "ema_decay": 1, "probe_interval": np.int64(4)})
    policies.check_params("dcut", {"ratios": (0.5, np.float32(1.0))})
    policies.check_params("smartspec", {"max_draft_len": None})
    with pytest.raises(UnknownPolicyError, match="unknown policy 'nope'; known policies: ar, full") as exc:
        policies.check_params("nope", {})
    assert isinstance(exc.value, KeyError) and str(exc.value).startswith("unknown policy")
    # a value out of range is the constructor's to refuse, when the policy is built
    with pytest.raises(PolicyParamError, match=r"uniform: rho=0 must be in \(0, 1\]"):
        policies.get("uniform", rho=0)


def test_dcut_sim_builds_each_policy_once(built, tmp_path):
    from dcut_sched.cli import sim

    traces = [str(trace_path(f"dflash-qwen3-8b-{b}-b16.parquet")) for b in ("gsm8k", "math500")]
    argv = [*(a for t in traces for a in ("--trace", t)), "--policies", "dcut,fine", "--param", "fine.granularity=4",
            "--batch-sizes", "4,8", "--steps", "30", "--warmup", "5", "--jobs", "1", "--quiet",
            "--out", str(tmp_path / "o.csv")]
    assert sim.main(argv) == 0
    # two traces x two batch sizes x three policies = 12 runs, each on a reset copy of one instance
    assert built == Counter({"ar": 1, "dcut": 1, "fine": 1})


def test_controller_builds_its_policy_once(built, make_curve):
    from dcut_sched.controller import GraphCells

    curve = make_curve(batch_sizes=(2, 4), block_size=4)
    ctrl = RatioController(curve, 4, "fine", graph_bank=GraphCells.at_batch_sizes([4, 8, 16], [2, 4]), granularity=2)
    assert ctrl.policy.allowed_num_tokens == (4, 8, 16)
    ctrl.plan(np.full((2, 3), 0.5, dtype=np.float32))
    assert built == Counter({"fine": 1})
    # a policy built by the caller (the vLLM config builds the one it validates) is used as it is
    policy = policies.get("dcut", ratios=[0.5, 1.0])
    assert RatioController(curve, 4, policy).policy is policy
    with pytest.raises(ValueError, match="already built"):
        RatioController(curve, 4, policy, ratios=[1.0])
    assert built == Counter({"fine": 1, "dcut": 1})


@pytest.mark.parametrize("raw, value", [("False", False), ("false", False), ("FALSE", False), ("True", True),
                                        ("true", True), ("tRuE", True), ("None", None), ("null", None),
                                        ("1", 1), ("0", 0), ("0.25", 0.25), ("[0.5,1.0]", [0.5, 1.0]),
                                        ("ratio", "ratio")])
def test_param_values_take_the_spellings_help_prints(raw, value):
    """--param values: the booleans and None as --help prints the defaults (True, False, None) in any
    case, JSON as before; 1 and 0 stay integers (a boolean parameter refuses them)."""
    from dcut_sched.cli import engine, sim
    from dcut_sched.cli.args import param_value

    got = param_value(raw, "fine.feedback")
    assert got == value and type(got) is type(value)
    assert sim._param(f"fine.feedback={raw}") == ("fine", "feedback", got)
    assert engine._param(f"feedback={raw}") == ("feedback", got)


def test_boolean_param_from_the_command_line(tmp_path):
    """dcut-sim --param fine.feedback=False runs fine without feedback, labelled as --help spells it;
    1 is an integer, which a boolean parameter refuses."""
    import pandas as pd

    from dcut_sched.cli import sim

    base = ["--trace", str(trace_path("dflash-qwen3-8b-gsm8k-b16.parquet")), "--policies", "fine",
            "--batch-sizes", "4", "--steps", "30", "--warmup", "5", "--jobs", "1", "--quiet"]
    out = tmp_path / "o.csv"
    assert sim.main([*base, "--param", "fine.feedback=False", "--out", str(out)]) == 0
    assert set(pd.read_csv(out)["policy"]) == {"ar", "fine(feedback=False)"}
    assert sim.main([*base, "--param", "fine.feedback=1"]) == 2
