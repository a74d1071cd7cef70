"""Sampled verification of greedy drafts (temperature > 0), lossless for every verification policy.

Pure functions of arrays (torch logits in, numpy/torch tokens out); the only randomness is a
counter-based generator keyed by ``(request key, sequence index)``, so nothing here holds state.

The rule (greedy drafts, sampled target)
----------------------------------------
The drafter proposes argmax tokens ``d_1..d_{L-1}`` (DFlash, EAGLE and this project's self-speculative
drafter are greedy). Let ``p_t(.)`` be the target's distribution at temperature T (after top-k, then
top-p; :func:`sampling_probs`) for the token after the accepted prefix and ``d_1..d_{t-1}``.
Verification of a request that verifies its first L slots:

- draft t (t = 1..L-1, in order) is accepted with probability ``p_t(d_t)``;
- on the first rejection, the token is sampled from ``p_t`` with ``d_t`` removed and renormalised,
  ``p_t(y) / (1 - p_t(d_t))`` for ``y != d_t``, and the step ends;
- if all L-1 drafts are accepted, the bonus token is sampled from ``p_L``.

The request commits ``1 + min(a, L-1)`` tokens (:func:`dcut_sched.scores.verified_prefix_tokens`),
``a`` being the drafts the whole block would accept with the same random draws.

Implementation (one draw per position). Let ``x ~ p_t`` and accept ``d_t`` iff ``x == d_t``; on
rejection output ``x``. Then ``P(accept) = p_t(d_t)`` and, given rejection, ``P(x = y) = p_t(y) /
(1 - p_t(d_t))``: exactly the rule above (the standard rejection-sampling step with a one-hot draft
distribution, as vLLM treats greedy drafts). :func:`sample_at` draws ``x`` by inverse CDF from one
uniform ``u = U(key, n)``, n being the index the token will take in the request's sequence (prompt
included). So every verified slot, every bonus token and every plain decode step that produces the
token at index n uses the same draw; the request's output is the sequence plain sampled decoding
(:func:`dcut_sched.model.generate.sample_generate`) produces with the same key, token for token,
whatever lengths were verified, and whatever else is in the batch. (Up to floating-point: differently
shaped forwards change logits in the last ulps, which moves a token only when u falls within ~1e-7
of a CDF boundary.) T = 0 is the argmax (greedy) rule.

Why any length rule computed from greedy-draft confidences is lossless
-----------------------------------------------------------------------
Fix a request and condition on its committed prefix ``h`` (n tokens). Greedy drafts ``d_t`` and their
confidences ``c_t`` are deterministic functions of ``h`` (the drafter's argmax), and so is anything
the policy computes from them and from the other requests' confidences: the other requests are
conditionally independent of this request's draws, because each request uses its own key. Hence the
verified length ``L`` is a function of ``h`` and of randomness independent of this request's
uniforms ``u_n, u_{n+1}, ..``. Given ``h`` and ``L``, slot t (t <= L) produces the token at index
``n + t - 1`` as ``x = icdf(p_t, u_{n+t-1})`` whether it is the accepted draft, the replacement after
a rejection, or the bonus, so it is distributed as ``p(. | h, x_n..x_{n+t-2})``: target sampling. By
induction over steps the whole output is distributed as plain target sampling, for every L. (Even
without the coupling, the textbook two-draw rule gives, for any L fixed given h, the token at index
n distributed as ``p(d|h) * 1[y = d] + (1 - p(d|h)) * p(y|h) / (1 - p(d|h)) * 1[y != d] = p(y|h)``,
and the next tokens likewise given the accepted prefix; L cannot bias which token was drafted
because the drafted token is fixed before L is chosen.) This covers ``full``, ``uniform``,
``threshold``, ``topk``, ``dcut``, ``fine`` and ``ar``; ``oracle`` reads the acceptance, which at
T > 0 depends on this request's draws, so it is still an upper-bound diagnostic; its outputs are
nevertheless the coupled target samples (the engine commits ``x`` at every index).

Sampled drafts are refused
--------------------------
With drafts sampled from the draft distribution q, the standard rule (accept with
``min(1, p(d)/q(d))``, else sample ``max(0, p - q)`` renormalised) is lossless for a length fixed
before the draft token is sampled, but a length chosen from the sampled token's own probability is
not. Worked case: vocabulary {a, b}, ``q = (0.9, 0.1)``, ``p = (0.5, 0.5)``. Verify the draft only
when it is ``a`` (confidence 0.9), otherwise sample the target directly:

    P(a) = q(a) * min(1, p(a)/q(a)) + q(b) * p(a) = 0.9 * 5/9 + 0.1 * 0.5 = 0.55  (target: 0.5).

Rejection sampling conditioned on the draft being ``a`` accepts ``a`` with 5/9, and never produces
``a`` from the residual (``max(0, p - q) = (0, 0.4)``); the unverified branch produces ``a`` half the
time; the mixture is biased. D-Cut's scores ``prod_t c_t`` for sampled drafts are functions of the
sampled tokens, and its budget (the sum of the top-K scores over all slots of the batch) makes slot
t's verification depend on tokens drawn after slot t (``c_{t+1}, ..`` depend on ``d_t``), so the
sound subset (verify-slot-t decided from quantities fixed before ``d_t`` is drawn, such as
``max q_t``) would exclude ``dcut``, ``fine`` and ``topk``. This module therefore refuses sampled
drafts (:class:`SampledDraftsError`); every drafter in the project is greedy. ``docs/sampling.md``
has the full argument and the test that shows the bias.
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

#: Draft modes :class:`SamplingParams` knows; only ``greedy`` is supported (module docstring).
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
