"""Synthetic position-indexed traces from a small generative model with interpretable parameters.

Generative model (one trace = R requests; request i has n_i output positions):

- Output length: ``n_i = clip(round(exp(N(log length_median, length_sd))), min_length, max_length)``.
- Difficulty: request shift ``z_i ~ N(0, request_sd)`` (stratified over the R requests: one draw per
  1/R quantile slice), position shift ``e_{i,p} ~ N(0, position_sd)``.
- Acceptance: draft t (t = 1..B-1) at position p is right, given drafts 1..t-1 were, with probability
  ``q = sigmoid(accept_logit - depth_decay * (t - 1) + z_i + e_{i,p})``; ``X ~ Bernoulli(q)``.
  ``accept_len[p]`` = number of leading right drafts, capped at ``n_i - p - 1`` (docs/design.md §3).
- Confidence: the drafter sees a noisy signal of the outcome, ``s ~ N(separation * (2X - 1), 1)``, and
  reports ``conf = sigmoid(calibration_slope * (logit q + 2 * separation * s) + calibration_bias)``.
  With slope 1 and bias 0 this is exactly calibrated: ``P(X = 1 | q, s) = sigmoid(logit q + 2 mu s)``
  (Bayes' rule for two unit-variance Gaussians at +-mu). ``separation`` = 0 makes confidence the prior
  q (it knows how hard the spot is but not whether this draft is right); large separation makes
  confidence nearly reveal the outcome, which is what makes global top-K close to the oracle.
  ``calibration_bias`` > 0 is over-confidence, < 0 under-confidence; slope < 1 squashes toward 1/2.
- Depth calibration: ``calibration_depth`` adds ``(t - 1) * calibration_depth`` to draft t's
  confidence logit (0 in the presets): miscalibration that grows or shrinks with depth, the shape
  of the real DFlash drafter's (docs/drafters.md).
- Calibration gap: the reported confidence is finally ``conf ** (1 + calibration_gap)``, a monotone
  distortion of the (calibrated, with slope 1 and bias 0) probability that the draft is right. Gap 0
  (the presets' default) is calibrated; a gap > 0 is **under-confidence** (real DFlash confidence is
  reported under-calibrated; the SGLang port leaves anchors out of the numerator for that reason),
  -1 < gap < 0 over-confidence. A power keeps the order of every prefix product
  (``prod_t c_t**(1+g) = (prod_t c_t)**(1+g)``), so a global top-K at a fixed budget selects the same
  slots; only the *budget* a cost-aware policy (``dcut``, ``fine``) chooses from the expected-token
  estimates changes, and ``threshold`` cut-offs. Acceptance (``accept_len``) does not change.

Positions are conditionally independent given the request's difficulty: the right shape for a block
drafter that re-drafts every step (DFlash). An autoregressive drafter's real trace also has the exact
shift structure ``accept_len[p+1] = accept_len[p] - 1`` inside accepted runs; the generator does not
reproduce that (``dcut-trace fit`` reports how well the statistics still match).

Presets (``PRESETS``) are fitted to public DFlash figures for Qwen3-8B (see each preset's ``source``
and ``dcut_sched/data/traces/README.md`` for the fit error); ``analysis/fit_presets.py`` re-runs those fits.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import expit, ndtri

from ..util.atomic import atomic_write_text
from ..util.inputs import InputFileError, is_symlink_loop, read_json_strict
from .format import accept_len_dtype
from .trace import Trace

__all__ = [
    "PRESETS",
    "Preset",
    "SynthParams",
    "SynthParamsError",
    "generate",
    "get_preset",
]

GENERATOR = "dcut_sched.traces.synth/1"


class SynthParamsError(ValueError):
    """Invalid generator parameters or parameter file (the message names the field)."""


@dataclass(frozen=True)
class SynthParams:
    """Parameters of the synthetic generator (see the module docstring for the model).

    Attributes:
        block_size: B (draft slots incl. anchor).
        accept_logit: acceptance logit of draft 1 for a median request and position.
        depth_decay: decrease of the acceptance logit per draft depth.
        request_sd: s.d. of the per-request difficulty shift (logit units).
        position_sd: s.d. of the per-position difficulty shift (logit units).
        separation: mu, how sharply confidence separates accepted from rejected drafts (>= 0).
        calibration_slope: multiplies the calibrated confidence logit (1 = calibrated, > 0).
        calibration_bias: added to the confidence logit (0 = calibrated; > 0 over-confident).
        calibration_depth: added to the confidence logit per draft depth, ``(t - 1) * calibration_depth``
            (0 = the same calibration at every depth; the shape fitted to the real DFlash drafter,
            analysis/dflash_traces.py).
        calibration_gap: reported confidence = ``conf ** (1 + gap)`` (0 = calibrated; > 0 under-confident,
            as real DFlash confidence is reported; must be > -1). Not fitted: the sources do not
            quantify it, so the presets keep 0 and analyses vary it (analysis/report_reproduce.py).
        length_median: median output positions per request.
        length_sd: s.d. of log output length.
        min_length, max_length: output length bounds (positions).
    """

    block_size: int = 16
    accept_logit: float = 1.5
    depth_decay: float = 0.1
    request_sd: float = 0.5
    position_sd: float = 1.0
    separation: float = 1.0
    calibration_slope: float = 1.0
    calibration_bias: float = 0.0
    calibration_depth: float = 0.0
    calibration_gap: float = 0.0
    length_median: float = 192.0
    length_sd: float = 0.35
    min_length: int = 16
    max_length: int = 1024

    def __post_init__(self) -> None:
        checks = [
            ("block_size", self.block_size >= 2, "must be an integer >= 2"),
            ("request_sd", self.request_sd >= 0, "must be >= 0"),
            ("position_sd", self.position_sd >= 0, "must be >= 0"),
            ("separation", self.separation >= 0, "must be >= 0"),
            ("calibration_slope", self.calibration_slope > 0, "must be > 0"),
            ("calibration_gap", self.calibration_gap > -1, "must be > -1 (confidence ** (1 + gap))"),
            ("length_median", self.length_median >= 1, "must be >= 1"),
            ("length_sd", self.length_sd >= 0, "must be >= 0"),
            ("min_length", 1 <= self.min_length <= self.max_length, "need 1 <= min_length <= max_length"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise SynthParamsError(f"synthetic parameter {name}={getattr(self, name)!r} {why}")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not np.isfinite(v):
                raise SynthParamsError(f"synthetic parameter {f.name}={v!r} must be finite")

    def replace(self, **changes: Any) -> "SynthParams":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "parameters") -> "SynthParams":
        """Raises SynthParamsError on unknown or invalid fields."""
        if not isinstance(d, dict):
            raise SynthParamsError(f"{where}: parameters must be a JSON object of numbers; got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise SynthParamsError(f"{where}: unknown synthetic parameter(s) {unknown}; known: {sorted(names)}")
        kw = {}
        for k, v in d.items():
            integer = k in ("block_size", "min_length", "max_length")
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or (integer and not float(v).is_integer()):  # lossless casts only
                raise SynthParamsError(f"{where}: field {k!r} = {v!r} is not a finite "
                                       f"{'integer' if integer else 'number'}")
            kw[k] = int(v) if integer else float(v)
        return cls(**kw)

    def save(self, path: str | os.PathLike) -> None:
        """Write ``{"generator": ..., "params": {...}}`` as JSON, atomically."""
        atomic_write_text(path, json.dumps({"generator": GENERATOR, "params": self.to_dict()}, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SynthParams":
        """Read a parameter file written by :meth:`save` (or a bare JSON object of parameters).

        Raises:
            SynthParamsError: missing/unreadable file (a symlink loop too), JSON that
                :func:`~dcut_sched.util.inputs.parse_json_strict` refuses (a key repeated in one object, a
                number longer than 64 digits, nesting too deep) or invalid parameters (names the file).
        """
        p = Path(path)
        if not p.exists() and not is_symlink_loop(p):
            raise SynthParamsError(f"{p}: no such parameter file")
        try:  # NaN/Infinity parse, so that from_dict names the field holding them
            obj = read_json_strict(p, "a JSON parameter file (as written by `dcut-trace fit --out`)",
                                   allow_nonfinite=True)
        except InputFileError as exc:
            raise SynthParamsError(str(exc)) from None
        if not isinstance(obj, dict):
            raise SynthParamsError(f"{p}: expected a JSON object")
        return cls.from_dict(obj.get("params", obj), where=str(p))


@dataclass(frozen=True)
class Preset:
    """A named parameter set with the public figures it was fitted to.

    Attributes:
        params: the generator parameters.
        target_tau: tau (incl. bonus) the preset reproduces under full verification.
        source: citation of the figures.
        fit_error: the fit error reported by ``analysis/fit_presets.py`` (a short string).
    """

    params: SynthParams
    target_tau: float
    source: str
    fit_error: str = ""


def _sample_lengths(p: SynthParams, rng: np.random.Generator, num_requests: int) -> np.ndarray:
    raw = np.exp(rng.normal(np.log(p.length_median), p.length_sd, size=num_requests))
    return np.clip(np.round(raw), p.min_length, p.max_length).astype(np.int64)


def sample_rows(p: SynthParams, rng: np.random.Generator, request_shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Draft outcomes and confidences for rows with the given per-row request shift.

    Args:
        p: parameters.
        rng: random generator (consumed in a fixed order: position shift, outcomes, signal).
        request_shift: ``[N]`` float, z of the request each row belongs to.

    Returns:
        ``(right [N, B-1] bool, conf [N, B-1] float32)``: whether each draft is right given its
        prefix, and its confidence. ``accept_len`` = leading ``right`` count (before the length cap).
    """
    n, k = len(request_shift), p.block_size - 1
    e = rng.normal(0.0, 1.0, size=n) * p.position_sd
    base = p.accept_logit + request_shift + e
    lq = base[:, None] - p.depth_decay * np.arange(k)[None, :]
    right = rng.random((n, k)) < expit(lq)
    s = rng.normal(0.0, 1.0, size=(n, k)) + p.separation * (2.0 * right - 1.0)
    conf_logit = p.calibration_slope * (lq + 2.0 * p.separation * s) + p.calibration_bias
    if p.calibration_depth != 0.0:
        conf_logit = conf_logit + p.calibration_depth * np.arange(k)[None, :]
    conf = expit(conf_logit)
    if p.calibration_gap != 0.0:
        conf = conf ** (1.0 + p.calibration_gap)
    return right, conf.astype(np.float32)


def generate(params: SynthParams, num_requests: int = 32, seed: int = 0, dataset: str = "synthetic",
             extra_metadata: dict[str, Any] | None = None) -> Trace:
    """Sample a position-indexed synthetic trace.

    Args:
        params: generator parameters.
        num_requests: R >= 1 requests (ids 0..R-1).
        seed: numpy seed; the same (params, R, seed) gives the same trace.
        dataset: metadata label.

    Returns:
        A :class:`Trace` with ``source=synthetic`` and the generator and its parameters in the
        metadata.
    """
    if num_requests < 1:
        raise SynthParamsError(f"num_requests={num_requests} must be >= 1")
    rng = np.random.default_rng(seed)
    lengths = _sample_lengths(params, rng, num_requests)
    # Stratified: one draw from each 1/R quantile slice of N(0, 1), in random order, so that even a
    # small trace spans the difficulty distribution instead of a lucky or unlucky handful of draws.
    strata = (rng.permutation(num_requests) + rng.random(num_requests)) / num_requests
    z = ndtri(strata) * params.request_sd
    req = np.repeat(np.arange(num_requests, dtype=np.int32), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pos = (np.arange(len(req)) - np.repeat(starts, lengths)).astype(np.int32)
    right, conf = sample_rows(params, rng, z[req])
    accept = np.cumprod(right, axis=1).sum(axis=1)
    remaining = np.repeat(lengths, lengths) - pos - 1
    accept = np.minimum(accept, remaining).astype(accept_len_dtype(params.block_size))
    meta = {
        "indexing": "position", "source": "synthetic", "block_size": str(params.block_size),
        "dataset": dataset, "temperature": "0", "generator": GENERATOR,
        "generator_params": {**params.to_dict(), "num_requests": num_requests, "seed": seed},
        **(extra_metadata or {}),
    }
    return Trace(req, pos, accept, conf, meta)


# ----------------------------------------------------------------------------- presets
_DFLASH_SOURCE = (
    "DFlash Qwen3-8B, B=16: selection curve at bs=32 (accepted tokens at 128/256/384/512 verified slots: "
    "uniform 101.4/152.9/183.0/201.2, confidence top-K 124.6/190.8/200.9/201.2; D-Cut docs); tau per "
    "dataset 5.7 GSM8K, 6.1 MATH-500, 6.9 HumanEval, 5.3 MBPP, 3.6 MT-Bench (ROCm ATOM PR 1881); "
    "tau ~6.3 on GSM8K at concurrency 1..32 (SGLang PR 16818)"
)

# Fitted by analysis/fit_presets.py (seed 0). The GSM8K preset fits the whole selection curve (tau
# 201.2/32 = 6.29, as SGLang's 6.3); the others keep its shape parameters and refit accept_logit to
# their dataset's tau. Confidence calibration is not quantified by the sources: slope 1, bias 0.
# name: (target tau, fitted parameters, fit error as reported by the script)
from .presets_dflash import DFLASH_FITS  # noqa: E402

PRESETS: dict[str, Preset] = {
    name: Preset(SynthParams(**params), tau, _DFLASH_SOURCE, err) for name, (tau, params, err) in DFLASH_FITS.items()
}


def get_preset(name: str) -> Preset:
    """The preset ``name``. Raises KeyError listing the known presets."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown synthetic preset {name!r}; known presets: {', '.join(PRESETS)}") from None
