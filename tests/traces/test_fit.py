"""Fit: recovers known generator parameters from a synthetic trace (small budget)."""

import numpy as np
import pytest

from dcut_sched.traces.fit import fit_moments, moments
from dcut_sched.traces.synth import SynthParams, generate


def test_fit_recovers_acceptance_and_separation():
    truth = SynthParams(block_size=8, accept_logit=1.5, depth_decay=0.1, request_sd=0.3, position_sd=0.5,
                        separation=1.5, length_median=150, length_sd=0.2)
    target = moments(generate(truth, num_requests=64, seed=11), num_batches=60, seed=11)
    start = truth.replace(accept_logit=0.0, separation=0.2)
    res = fit_moments({k: target[k] for k in ("hist", "conf", "topk", "uniform")}, start,
                      ["accept_logit", "separation"], num_requests=64, num_batches=60, seed=5, max_evals=150)
    assert res.params.accept_logit == pytest.approx(1.5, abs=0.3)
    assert res.params.separation == pytest.approx(1.5, abs=0.4)
    assert abs(res.rel_errors["tau"][0]) < 0.05
    assert res.rms_rel_error < 0.05
    # parameters that were not fitted stay as given
    assert res.params.depth_decay == 0.1 and res.params.block_size == 8


def test_fit_rejects_unknown_parameter():
    with pytest.raises(ValueError, match="cannot fit"):
        fit_moments({"tau": np.array([3.0])}, SynthParams(), ["colour"])
