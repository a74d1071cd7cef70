"""The sampler's pieces: sampling distributions (hand-computed), draws, keys and the refusal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dcut_sched.sampling import (
    SampledDraftsError,
    SamplingParams,
    position_uniforms,
    request_keys,
    sample_at,
    sampling_probs,
)
from dcut_sched.scores import verified_prefix_tokens


def test_temperature_top_k_top_p_by_hand():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    np.testing.assert_allclose(sampling_probs(logits, SamplingParams(temperature=1.0)).numpy(), [0.5, 0.3, 0.15, 0.05])
    # T = 0.5 squares the probabilities before renormalising
    sq = np.array([0.25, 0.09, 0.0225, 0.0025])
    np.testing.assert_allclose(sampling_probs(logits, SamplingParams(temperature=0.5)).numpy(), sq / sq.sum())
    np.testing.assert_allclose(sampling_probs(logits, SamplingParams(temperature=1.0, top_k=2)).numpy(),
                               [0.625, 0.375, 0, 0])
    # top_p = 0.8: 0.5 + 0.3 reaches 0.8, so the nucleus is the first two tokens
    np.testing.assert_allclose(sampling_probs(logits, SamplingParams(temperature=1.0, top_p=0.8)).numpy(),
                               [0.625, 0.375, 0, 0])
    np.testing.assert_allclose(sampling_probs(logits, SamplingParams(temperature=1.0, top_p=0.81)).numpy(),
                               np.array([0.5, 0.3, 0.15, 0]) / 0.95)
    np.testing.assert_allclose(sampling_probs(logits, SamplingParams(temperature=1.0, top_p=0.1)).numpy(), [1, 0, 0, 0])
    np.testing.assert_array_equal(sampling_probs(logits, SamplingParams()).numpy(), [1, 0, 0, 0])


def test_draws_follow_the_distribution_and_never_pick_zero_mass():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    sp = SamplingParams(temperature=1.0, top_k=3)
    tokens = sample_at(logits, sp, key=7, indices=range(4000))
    freq = np.bincount(tokens, minlength=4) / 4000
    np.testing.assert_allclose(freq, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], atol=0.03)
    assert sample_at(logits[:3], SamplingParams(), key=7, indices=[0, 1, 2]) == [0, 0, 0]


def test_uniforms_are_counter_based_and_keys_distinct():
    u = position_uniforms(5, [3, 4, 9])
    assert position_uniforms(5, [9])[0] == u[2]
    assert not np.array_equal(position_uniforms(6, [3, 4, 9]), u)
    keys = request_keys(1, 3) + request_keys(2, 3)
    assert len(set(keys)) == 6 and request_keys(1, 3) == request_keys(1, 3)


def test_bad_parameters_and_sampled_drafts_are_refused():
    for kwargs, field in [({"temperature": -1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
                          ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"),
                          ({"draft": "beam"}, "draft")]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)
    with pytest.raises(SampledDraftsError, match="0.55"):
        SamplingParams(temperature=0.7, draft="sampled")
    SamplingParams(temperature=0.0, draft="sampled")  # greedy decoding is the same either way


def test_verified_prefix_tokens():
    acc = np.array([0, 3, 5, 2])
    lengths = np.array([4, 2, 6, 1])
    np.testing.assert_array_equal(verified_prefix_tokens(acc, lengths), [1, 2, 6, 1])
    assert verified_prefix_tokens(torch.tensor(acc), torch.tensor(lengths)).tolist() == [1, 2, 6, 1]
