"""Sampled verification of greedy drafts (temperature > 0), lossless for every verification policy.

Pure functions of arrays (torch logits in, numpy/torch tokens out); the only randomness is a
counter-based generator keyed by ``(request key, sequence index)``, so nothing here holds state.
Why the rule is lossless for any length a policy computes from greedy-draft confidences, and why
sampled drafts are refused (with the worked counterexample): docs/sampling.md.

Contract (greedy drafts, sampled target). The drafter proposes argmax tokens ``d_1..d_{L-1}``.
Let ``p_t(.)`` be the target's distribution at temperature T (after top-k, then top-p;
:func:`sampling_probs`) for the token after the accepted prefix and ``d_1..d_{t-1}``. A request that
verifies its first L slots:

- accepts draft t (t = 1..L-1, in order) with probability ``p_t(d_t)``;
- on the first rejection, samples the token from ``p_t`` with ``d_t`` removed and renormalised,
  ``p_t(y) / (1 - p_t(d_t))`` for ``y != d_t``, and the step ends;
- if all L-1 drafts are accepted, samples the bonus token from ``p_L``;

and commits ``1 + min(a, L-1)`` tokens (:func:`dcut_sched.scores.verified_prefix_tokens`), ``a``
being the drafts the whole block would accept with the same random draws. One draw per position:
:func:`sample_at` draws ``x ~ p_t`` by inverse CDF from one uniform ``u = U(key, n)``, n the index
the token takes in the request's sequence (prompt included); ``d_t`` is accepted iff ``x == d_t``,
else ``x`` is committed. So the request's output is the sequence plain sampled decoding
(:func:`dcut_sched.model.generate.sample_generate`) produces with the same key, token for token,
whatever lengths were verified and whatever else is in the batch (up to floating-point: differently
shaped forwards change logits in the last ulps, which moves a token only when u falls within ~1e-7
of a CDF boundary). T = 0 is the argmax (greedy) rule. Sampled drafts raise
:class:`SampledDraftsError`; every drafter in the project is greedy.
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
    """How the target samples.

    Attributes:
        temperature: T >= 0; 0 = greedy (argmax), the engine's original path.
        top_p: nucleus mass in (0, 1]; 1 = off. Applied after top-k (vLLM and Hugging Face order).
        top_k: keep the k most likely tokens (ties at the k-th logit are all kept); 0 = off.
        seed: run seed; request i draws with key ``request_keys(seed, ..)[i]`` unless keys are given.
        draft: ``greedy`` (supported) or ``sampled`` (refused, :class:`SampledDraftsError`).

    Raises:
        ValueError: a value out of range (names the field).
        SampledDraftsError: ``draft='sampled'`` with T > 0.
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
    """Philox keys of requests ``0..num_requests-1`` of a run: ``seed * 2**64 + i`` (distinct per pair).

    A request's draws depend on its key only, so its output is reproduced by its key alone.
    """
    return [(int(seed) << 64) | i for i in range(int(num_requests))]


def position_uniforms(key: int, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """``U(key, n)`` in [0, 1) for each sequence index n: Philox (numpy) with that key and counter n.

    Args:
        key: the request's key (0 <= key < 2**128).
        indices: ``[m]`` non-negative ints (index in the sequence, prompt included).

    Returns:
        ``[m]`` float64. Counter-based: the value at n does not depend on which other indices were drawn.
    """
    out = np.empty(len(indices), dtype=np.float64)
    for j, n in enumerate(indices):
        out[j] = np.random.Generator(np.random.Philox(key=int(key), counter=int(n))).random()
    return out


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target's sampling distribution: softmax(logits / T) after top-k, then top-p.

    Args:
        logits: ``[..., V]`` float logits.
        params: temperature (> 0 here; T = 0 gives the one-hot argmax), top_k, top_p.

    Returns:
        ``[..., V]`` float64 probabilities summing to 1 on the last axis. Top-p keeps the smallest
        prefix of the tokens sorted by probability whose mass reaches ``top_p`` (the most likely
        token always stays); sources: vLLM / Hugging Face ``TopKLogitsWarper``, ``TopPLogitsWarper``.
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
    """One request's tokens at consecutive slots: ``x_j = icdf(p_j, U(key, indices[j]))``.

    With greedy drafts, slot j's draft is accepted iff it equals ``x_j``; this is the rejection rule of
    the module docstring (accept with ``p(d)``, else sample ``p`` without ``d``, bonus from ``p``).

    Args:
        logits: ``[m, V]`` target logits at the request's m verified slots (or one decode step).
        params: sampling parameters; T = 0 returns the argmax of each row.
        key: the request's key (:func:`request_keys`).
        indices: ``[m]`` index in the request's sequence of the token each slot produces.

    Returns:
        ``m`` token ids.

    Raises:
        ValueError: ``logits`` and ``indices`` disagree in length.
    """
    if logits.shape[0] != len(indices):
        raise ValueError(f"sample_at: {logits.shape[0]} logit rows but {len(indices)} indices")
    if params.is_greedy:
        return logits.argmax(-1).tolist()
    probs = sampling_probs(logits, params).cpu().numpy()
    cdf = np.cumsum(probs, axis=-1)
    u = position_uniforms(key, indices) * cdf[:, -1]
    tok = np.array([np.searchsorted(cdf[j], u[j], side="right") for j in range(len(u))], dtype=np.int64)
    return np.minimum(tok, probs.shape[-1] - 1).tolist()
