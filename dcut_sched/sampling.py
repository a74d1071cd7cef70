"""Sampled verification of greedy drafts (temperature > 0), lossless for every verification policy
(the rule and why it holds: docs/sampling.md). Pure functions, torch logits in, tokens out; the only
randomness is one Philox uniform per (request key, sequence index), so a request's output is the
sequence plain sampled decoding makes with the same key. T = 0 is argmax; sampled drafts raise
:class:`SampledDraftsError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

__all__ = [
    "DRAFT_MODES",
    "SampledDraftsError",
    "SamplingParams",
    "position_uniforms",
    "request_keys",
    "sample_at",
    "sampling_probs",
]

#: Draft modes :class:`SamplingParams` knows; only ``greedy`` is supported (docs/sampling.md).
DRAFT_MODES = ("greedy", "sampled")

SAMPLED_DRAFTS_REFUSAL = (
    "sampled drafts at temperature > 0 are refused: choosing the verified length from the sampled "
    "draft tokens' own probabilities biases the output (vocabulary {a, b}, q = (0.9, 0.1), p = (0.5, 0.5), "
    "verify only when the draft is a: P(a) = 0.55, not 0.5); use greedy drafts (draft='greedy'), which "
    "are lossless under every policy; see docs/sampling.md"
)


class SampledDraftsError(ValueError):
    """Sampled drafts were asked for; refused because length rules would bias the output."""


@dataclass(frozen=True)
class SamplingParams:
    """How the target samples: ``temperature`` T >= 0 (0: greedy), ``top_p`` in (0, 1] (1: off; applied
    after ``top_k``), ``top_k`` (ties at the k-th logit kept; 0: off; both only at T > 0), ``seed`` (the run's, for
    :func:`request_keys`), ``draft`` (``greedy``; ``sampled`` raises :class:`SampledDraftsError` at
    T > 0). A value out of range raises ``ValueError`` naming the field.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    draft: str = "greedy"

    def __post_init__(self) -> None:
        t = float(self.temperature)
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature={self.temperature!r} must be a finite value >= 0")
        if not (0.0 < float(self.top_p) <= 1.0):
            raise ValueError(f"top_p={self.top_p!r} must be in (0, 1]")
        if int(self.top_k) < 0:
            raise ValueError(f"top_k={self.top_k!r} must be >= 0 (0 = off)")
        if not 0 <= int(self.seed) < 2**64:
            raise ValueError(f"seed={self.seed!r} must be in [0, 2**64)")
        if t == 0 and (float(self.top_p) < 1.0 or int(self.top_k) > 0):
            field_ = f"top_p={self.top_p!r}" if float(self.top_p) < 1.0 else f"top_k={self.top_k!r}"
            raise ValueError(f"{field_} has no effect at temperature=0 (greedy decoding takes the argmax); "
                             f"give a temperature > 0 to sample, or leave top_p=1 and top_k=0")
        if self.draft not in DRAFT_MODES:
            raise ValueError(f"draft={self.draft!r} must be one of {DRAFT_MODES}")
        if self.draft == "sampled" and t > 0:
            raise SampledDraftsError(SAMPLED_DRAFTS_REFUSAL)

    @property
    def is_greedy(self) -> bool:
        """True at temperature 0 (argmax decoding; top-p/top-k have no effect)."""
        return float(self.temperature) == 0.0

    def describe(self) -> str:
        """Short label, e.g. ``T=0.7 top_p=0.9 seed=0`` or ``greedy``."""
        if self.is_greedy:
            return "greedy"
        parts = [f"T={self.temperature:g}"]
        if self.top_p < 1:
            parts.append(f"top_p={self.top_p:g}")
        if self.top_k:
            parts.append(f"top_k={self.top_k}")
        return " ".join(parts + [f"seed={self.seed}"])


def request_keys(seed: int, num_requests: int) -> list[int]:
    """Philox keys of requests ``0..num_requests-1`` of a run: ``seed * 2**64 + i`` (distinct per pair)."""
    return [(int(seed) << 64) | i for i in range(int(num_requests))]


def position_uniforms(key: int, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[m]`` float64 ``U(key, n)`` in [0, 1) for each sequence index n (prompt included): Philox with
    that key and counter n, independent of which other indices are drawn.
    """
    out = np.empty(len(indices), dtype=np.float64)
    for j, n in enumerate(indices):
        out[j] = np.random.Generator(np.random.Philox(key=int(key), counter=int(n))).random()
    return out


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[..., V]`` float64 target distribution: softmax(logits / T) after top-k, then top-p (the
    smallest prefix by probability reaching ``top_p``; vLLM / Hugging Face order). T = 0: one-hot argmax.
    """
    z = logits.double()
    if params.is_greedy:
        return torch.nn.functional.one_hot(z.argmax(-1), z.shape[-1]).double()
    z = z / float(params.temperature)
    vocab = z.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(z, int(params.top_k), dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    probs = torch.softmax(z, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p
        drop_sorted = mass_before >= float(params.top_p)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_at(logits: torch.Tensor, params: SamplingParams, key: int, indices: Sequence[int]) -> list[int]:
    """One request's ``m`` tokens at consecutive slots, ``x_j = icdf(p_j, U(key, indices[j]))`` (argmax at
    T = 0); a greedy draft is accepted iff it equals ``x_j``. ``logits`` has one row per index (the
    callers slice both from one step).
    """
    assert logits.shape[0] == len(indices), f"sample_at: {logits.shape[0]} logit rows but {len(indices)} indices"
    if params.is_greedy:
        return logits.argmax(-1).tolist()
    probs = sampling_probs(logits, params).cpu().numpy()
    cdf = np.cumsum(probs, axis=-1)
    u = position_uniforms(key, indices) * cdf[:, -1]
    tok = np.array([np.searchsorted(cdf[j], u[j], side="right") for j in range(len(u))], dtype=np.int64)
    return np.minimum(tok, probs.shape[-1] - 1).tolist()
