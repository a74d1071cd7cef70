"""Fixtures shared by the engine tests."""

import pytest
import torch

from dcut_sched.model import LlamaConfig, LlamaModel


@pytest.fixture(scope="module")
def tiny():
    """The random-weight ``tiny`` preset (seeded): a fast stand-in target for engine tests."""
    torch.manual_seed(0)
    return LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=3, std=0.1)
