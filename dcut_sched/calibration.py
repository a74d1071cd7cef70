"""Calibration of draft confidences: what a confidence says against what the target accepts.

Two online calibrators learn ``P(draft t accepted | drafts < t accepted, conf_t)`` from the
censored outcomes a serving loop observes anyway (:func:`censored_outcomes`; docs/design.md §2.7):

- :class:`LogisticCalibrator` (the controller's default): per depth t, ``sigmoid(a_t + b_t *
  logit(conf_t))``, started from the drafter's :class:`CalibrationPrior` (its ``calibration.json``,
  written by ``dcut-drafter calibrate``) and refitted as outcomes arrive, damped by the prior and by
  forgetting (module section "Per-depth logistic calibration").
- :class:`OnlineCalibrator`: a monotone map per confidence bin (isotonic, pooled over depth by
  default), identity prior; kept for the simulator's ``--calibrate`` and its recovery tests.

The prior format (:class:`CalibrationPrior`, ``dcut.calibration-prior/1``), its maximum-likelihood
fit (:func:`fit_prior`) and the before/after evidence (:func:`calibration_report`) live here too:
one format in one place.

Contract of :class:`OnlineCalibrator`:

- :meth:`OnlineCalibrator.observe` takes one verified step (raw ``conf [bs, B-1]``, drafts accepted,
  slots verified) and counts its censored outcomes (:func:`censored_outcomes`) per confidence bin and
  depth band: constant work per step, on the data's device, no host sync except at a refit.
- Every ``refit_every`` observed requests the map is refitted on the host: a Beta prior centred on the
  identity (``prior_strength`` pseudo-observations per bin), made non-decreasing by weighted isotonic
  regression, per depth band with the pooled fit as prior mean, interpolated onto a lookup table of
  ``resolution`` points per band. With no data the map is the identity (to the table's resolution).
- At each refit the counts of a bin with no new observation decay with a half-life of
  ``unobserved_half_life`` requests (``None``: never); the clock counts the rows of ``observe`` and
  the requests of :meth:`OnlineCalibrator.observe_plain` (steps without a draft).
- :meth:`OnlineCalibrator.transform` is one gather into that table (same shape, kind, dtype and
  device as its input): monotone non-decreasing in confidence within each band.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .scores import Array, verified_prefix_tokens

__all__ = ["PRIOR_FORMAT", "PRIOR_NAME", "CalibrationPrior", "CalibrationPriorError", "LogisticCalibrator",
           "OnlineCalibrator", "calibration_report", "censored_outcomes", "expected_calibration_error", "fit_prior",
           "reached_slots"]


def censored_outcomes(num_accepted: np.ndarray, lengths: np.ndarray, num_drafts: int) -> tuple[np.ndarray, np.ndarray]:
    """The observed and accepted masks ``[bs, B-1]`` of one step (docs/design.md §2.7, "Observations").

    Args:
        num_accepted: ``[bs]`` ints, drafts accepted (already ``<= lengths - 1``).
        lengths: ``[bs]`` ints in ``[1, B]``, slots verified.
        num_drafts: ``B - 1``.

    Returns:
        ``(observed, accepted)`` bool arrays ``[bs, B-1]`` (numpy or torch, like ``num_accepted``).
    """
    if isinstance(num_accepted, torch.Tensor):
        t = torch.arange(1, num_drafts + 1, device=num_accepted.device)[None, :]
    else:
        t = np.arange(1, num_drafts + 1)[None, :]
    acc = num_accepted[:, None]
    accepted = t <= acc
    observed = accepted | ((t == acc + 1) & (t <= lengths[:, None] - 1))
    return observed, accepted


def expected_calibration_error(prob: np.ndarray, outcome: np.ndarray, num_bins: int = 15) -> float:
    """Expected calibration error: ``sum_b (n_b / N) |mean(outcome)_b - mean(prob)_b|``.

    Equal-width bins of the predicted probability on [0, 1] (Guo et al. 2017, "On Calibration of
    Modern Neural Networks", eq. 3); the per-bin means come from ``scipy.stats.binned_statistic``.

    Args:
        prob: predicted probabilities (any shape, flattened).
        outcome: 0/1 outcomes, same size.
        num_bins: number of bins.
    """
    from scipy.stats import binned_statistic

    prob = np.asarray(prob, dtype=np.float64).ravel()
    outcome = np.asarray(outcome, dtype=np.float64).ravel()
    if prob.size == 0:
        return 0.0
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    count, _, _ = binned_statistic(prob, prob, statistic="count", bins=edges)
    mean_p, _, _ = binned_statistic(prob, prob, statistic="mean", bins=edges)
    mean_o, _, _ = binned_statistic(prob, outcome, statistic="mean", bins=edges)
    keep = count > 0
    return float(np.sum(count[keep] / prob.size * np.abs(mean_o[keep] - mean_p[keep])))


class OnlineCalibrator:
    """Learns ``P(draft t accepted | drafts < t accepted, conf_t)`` online (module docstring; docs/design.md §2.7).

    Args:
        block_size: B (slots per block; confidences are ``[bs, B-1]``). ``None``: taken from the first
            call, then fixed.
        num_bins: equal-width confidence bins on [0, 1].
        depth_bands: first draft slot (1-based) of each depth band, ascending, starting at 1; e.g.
            ``(1, 2, 4, 8)`` = bands {1}, {2, 3}, {4..7}, {8..}. ``None`` or ``(1,)`` (default): one
            map for every depth. Bands help when acceptance at equal confidence depends on depth
            (synthetic test); on a recorded SmolLM2 self-speculative trace they did not
            (docs/controller.md), hence the pooled default.
        prior_strength: pseudo-observations per bin of the identity prior (and of the pooled prior
            of each band), > 0.
        refit_every: refit after this many more observed requests (rows of ``observe``), >= 1.
        resolution: points of the lookup table on [0, 1], >= 2.
        unobserved_half_life: observed requests (rows of ``observe``) over which the counts of a
            bin that gets no observation halve (docs/design.md §2.7, "Recovery"), > 0; ``None``: never.

    Raises:
        ValueError: invalid parameters, or inputs whose shape disagrees with the block size.
    """

    def __init__(
        self,
        block_size: int | None = None,
        *,
        num_bins: int = 20,
        depth_bands: Sequence[int] | None = None,
        prior_strength: float = 8.0,
        refit_every: int = 256,
        resolution: int = 1024,
        unobserved_half_life: float | None = 256.0,
    ):
        if num_bins < 1:
            raise ValueError(f"OnlineCalibrator: num_bins={num_bins} must be >= 1")
        if not prior_strength > 0:
            raise ValueError(f"OnlineCalibrator: prior_strength={prior_strength} must be > 0")
        if refit_every < 1:
            raise ValueError(f"OnlineCalibrator: refit_every={refit_every} must be >= 1")
        if resolution < 2:
            raise ValueError(f"OnlineCalibrator: resolution={resolution} must be >= 2")
        if unobserved_half_life is not None and not 0 < unobserved_half_life < float("inf"):
            raise ValueError(f"OnlineCalibrator: unobserved_half_life={unobserved_half_life} must be a finite "
                             f"number > 0 (or None)")
        bands = (1,) if depth_bands is None else tuple(int(b) for b in depth_bands)
        if not bands or bands[0] != 1 or any(b2 <= b1 for b1, b2 in zip(bands, bands[1:])):
            raise ValueError(
                f"OnlineCalibrator: depth_bands={depth_bands!r} must be strictly ascending draft slots "
                f"starting at 1, e.g. (1, 2, 4, 8)"
            )
        self.num_bins = int(num_bins)
        self.depth_bands = bands
        self.prior_strength = float(prior_strength)
        self.refit_every = int(refit_every)
        self.resolution = int(resolution)
        self.unobserved_half_life = None if unobserved_half_life is None else float(unobserved_half_life)
        self.block_size: int | None = None
        self.centers = (np.arange(self.num_bins) + 0.5) / self.num_bins
        self.grid = np.linspace(0.0, 1.0, self.resolution)
        if block_size is not None:
            self._set_block_size(int(block_size))
        self.reset()

    # ------------------------------------------------------------------ state
    @property
    def num_bands(self) -> int:
        return len(self.depth_bands)

    def params(self) -> dict[str, Any]:
        """Constructor parameters (for logs and result tables)."""
        return {
            "block_size": self.block_size,
            "num_bins": self.num_bins,
            "depth_bands": self.depth_bands,
            "prior_strength": self.prior_strength,
            "refit_every": self.refit_every,
            "resolution": self.resolution,
            "unobserved_half_life": self.unobserved_half_life,
        }

    def reset(self) -> None:
        """Forget every observation: the map returns to the identity prior."""
        shape = (self.num_bands, self.num_bins)
        self._host_counts = np.zeros((2,) + shape, dtype=np.float64)  # [accepted | observed]
        self._device_counts: dict[torch.device, torch.Tensor] = {}
        self.num_observed_requests = 0
        self.num_refits = 0
        self.num_decayed_bins = 0
        self._since_refit = 0
        self._fit_counts = np.zeros((2,) + shape, dtype=np.float64)
        self._fit(self._fit_counts)

    def _set_block_size(self, block_size: int) -> None:
        if block_size < 2:
            raise ValueError(f"OnlineCalibrator: block_size={block_size} must be >= 2")
        self.block_size = block_size
        depth = np.arange(1, block_size)
        self._band_of_depth = (np.searchsorted(np.asarray(self.depth_bands), depth, side="right") - 1).astype(np.int64)
        self._band_offsets_np = self._band_of_depth * self.resolution
        self._band_offsets_torch: dict[torch.device, torch.Tensor] = {}

    def _check_conf(self, conf: Array) -> None:
        if len(conf.shape) != 2:
            raise ValueError(f"OnlineCalibrator: conf must be [batch_size, block_size - 1]; got shape {tuple(conf.shape)}")
        if self.block_size is None:
            self._set_block_size(int(conf.shape[1]) + 1)
        elif conf.shape[1] != self.block_size - 1:
            raise ValueError(
                f"OnlineCalibrator: conf has {conf.shape[1]} draft slots but the calibrator was built for "
                f"block size {self.block_size} ({self.block_size - 1} draft slots)"
            )

    # ------------------------------------------------------------------ fitting
    def _isotonic(self, values: np.ndarray, weights: np.ndarray) -> np.ndarray:
        if values.size == 1:
            return values
        from scipy.optimize import isotonic_regression  # scipy loads on the first refit only

        return isotonic_regression(values, weights=weights, increasing=True).x

    def _fit(self, counts: np.ndarray) -> None:
        acc, obs = counts
        a = self.prior_strength
        pooled_acc, pooled_obs = acc.sum(0), obs.sum(0)
        pooled = self._isotonic((pooled_acc + a * self.centers) / (pooled_obs + a), pooled_obs + a)
        knots = np.empty((self.num_bands, self.num_bins))
        for b in range(self.num_bands):
            if self.num_bands == 1:
                knots[b] = pooled
            else:
                knots[b] = self._isotonic((acc[b] + a * pooled) / (obs[b] + a), obs[b] + a)
        self.knots = knots
        xs = np.concatenate([[0.0], self.centers, [1.0]])
        table = np.empty((self.num_bands, self.resolution))
        for b in range(self.num_bands):
            # Ends: the outer knots shifted by the identity prior's change over the half bin, so
            # the unfitted map is exactly the identity and the map stays monotone within [0, 1].
            lo = max(0.0, knots[b, 0] - self.centers[0])
            hi = min(1.0, knots[b, -1] + (1.0 - self.centers[-1]))
            ys = np.concatenate([[lo], knots[b], [hi]])
            table[b] = np.interp(self.grid, xs, ys)
        self._table_np = table.reshape(-1)
        self._table_torch: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """``(accepted, observed)`` counts ``[num_bands, num_bins]`` so far (syncs device counts)."""
        total = self._host_counts.copy()
        for dev_counts in self._device_counts.values():
            total += dev_counts.cpu().numpy()
        return total[0], total[1]

    def refit(self) -> None:
        """Refit the map from every observation so far (called by :meth:`observe` every
        ``refit_every`` observed requests; one device-to-host copy of the ``2 x bands x bins`` counts)."""
        acc, obs = self.counts()
        total = np.stack([acc, obs])
        if self.unobserved_half_life is not None and self._since_refit > 0:
            # Bins with no new observation since the last refit decay towards the prior
            # (docs/design.md §2.7, "Recovery"); the device counts are folded into the host copy to apply it.
            idle = (obs <= self._fit_counts[1]) & (obs > 0)
            if idle.any():
                total[:, idle] *= 0.5 ** (self._since_refit / self.unobserved_half_life)
                self.num_decayed_bins += int(idle.sum())
            self._host_counts = total.copy()
            self._device_counts = {}
        self._fit_counts = total
        self._fit(self._fit_counts)
        self.num_refits += 1
        self._since_refit = 0

    # ------------------------------------------------------------------ public
    def transform(self, conf: Array) -> Array:
        """Calibrated confidences: the current map applied elementwise.

        Args:
            conf: ``[bs, B-1]`` float confidences in [0, 1] (numpy or torch, any device); values
                outside [0, 1] are clamped, NaN is not allowed (sanitise first, as the controller does).

        Returns:
            Same shape, kind, dtype and device: estimates of ``P(draft t accepted | drafts < t
            accepted, conf_t)``, non-decreasing in ``conf`` within each depth band.
        """
        self._check_conf(conf)
        top = self.resolution - 1
        if isinstance(conf, torch.Tensor):
            key = (conf.device, conf.dtype)
            table = self._table_torch.get(key)
            if table is None:
                table = self._table_torch[key] = torch.as_tensor(self._table_np, dtype=conf.dtype, device=conf.device)
            offsets = self._band_offsets_torch.get(conf.device)
            if offsets is None:
                offsets = self._band_offsets_torch[conf.device] = torch.as_tensor(self._band_offsets_np, device=conf.device)
            idx = torch.round(conf.clamp(0.0, 1.0) * top).to(torch.int64) + offsets
            return table[idx]
        conf_np = np.asarray(conf)
        idx = np.rint(np.clip(conf_np, 0.0, 1.0) * top).astype(np.int64) + self._band_offsets_np
        return self._table_np[idx].astype(conf_np.dtype, copy=False)

    def observe(self, conf: Array, num_accepted: Array, lengths: Array) -> None:
        """Record one verified step's censored outcomes (docs/design.md §2.7, "Observations").

        Args:
            conf: ``[bs, B-1]`` raw (uncalibrated) confidences of the drafted step, in [0, 1].
            num_accepted: ``[bs]`` ints, drafts accepted (``verified_prefix_tokens(accept_len,
                lengths) - 1``); larger values are clipped to ``lengths - 1``.
            lengths: ``[bs]`` ints in ``[1, B]``, slots each request verified.

        All three of one kind (numpy, or torch on one device). Constant work per step (one
        scatter-add of ``bs * (B-1)`` slots), no host sync for torch inputs except at a refit.
        """
        self._check_conf(conf)
        bs = int(conf.shape[0])
        nd = self.block_size - 1
        if isinstance(conf, torch.Tensor):
            dev = conf.device
            num_accepted = torch.as_tensor(num_accepted, device=dev).to(torch.int64)
            lengths = torch.as_tensor(lengths, device=dev).to(torch.int64)
            num_accepted = verified_prefix_tokens(num_accepted, lengths) - 1  # at most lengths - 1
            observed, accepted = censored_outcomes(num_accepted, lengths, nd)
            bins = (conf.clamp(0.0, 1.0) * self.num_bins).to(torch.int64).clamp_(max=self.num_bins - 1)
            offsets = self._band_offsets_torch.get(dev)
            if offsets is None:
                offsets = self._band_offsets_torch[dev] = torch.as_tensor(self._band_offsets_np, device=dev)
            cell = (offsets // self.resolution) * self.num_bins + bins  # [bs, nd]
            size = self.num_bands * self.num_bins
            # accepted slots count in cells [0, size), observed ones in [size, 2*size).
            w = torch.stack([accepted, observed]).to(torch.float64).reshape(2, -1)
            flat = (cell.reshape(1, -1) + torch.arange(2, device=dev)[:, None] * size).reshape(-1)
            # index_add_ into a fixed-size buffer: unlike torch.bincount it needs no max() of the
            # indices, so it does not synchronise with the host on CUDA.
            add = torch.zeros(2 * size, dtype=torch.float64, device=dev).index_add_(0, flat, w.reshape(-1))
            add = add.reshape(2, self.num_bands, self.num_bins)
            acc_counts = self._device_counts.get(dev)
            if acc_counts is None:
                self._device_counts[dev] = add
            else:
                acc_counts += add
        else:
            conf = np.asarray(conf)
            num_accepted = np.asarray(num_accepted, dtype=np.int64)
            lengths = np.asarray(lengths, dtype=np.int64)
            num_accepted = verified_prefix_tokens(num_accepted, lengths) - 1  # at most lengths - 1
            observed, accepted = censored_outcomes(num_accepted, lengths, nd)
            bins = np.minimum((np.clip(conf, 0.0, 1.0) * self.num_bins).astype(np.int64), self.num_bins - 1)
            cell = self._band_of_depth[None, :] * self.num_bins + bins
            size = self.num_bands * self.num_bins
            self._host_counts[0].reshape(-1)[:] += np.bincount(cell[accepted], minlength=size)
            self._host_counts[1].reshape(-1)[:] += np.bincount(cell[observed], minlength=size)
        self.num_observed_requests += bs
        self._since_refit += bs
        if self._since_refit >= self.refit_every:
            self.refit()

    def observe_plain(self, batch_size: int) -> None:
        """Count a step that ran no draft (``batch_size`` requests, nothing to learn) on the clock of
        the unobserved-range decay (docs/design.md §2.7, "Recovery"); refits when due. Host-only, O(1)
        except at a refit."""
        if self.unobserved_half_life is None:
            return
        self._since_refit += int(batch_size)
        if self._since_refit >= self.refit_every:
            self.refit()

    def curve(self, band: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(bin centres, fitted acceptance probability)`` of one depth band at the last refit."""
        return self.centers.copy(), self.knots[band].copy()

    def __repr__(self) -> str:
        return (
            f"OnlineCalibrator(block_size={self.block_size}, bins={self.num_bins}, bands={self.depth_bands}, "
            f"observed_requests={self.num_observed_requests}, refits={self.num_refits})"
        )


# ---------------------------------------------------------------------------------------------
# Per-depth logistic calibration: the drafter's prior and the online refit (docs/design.md §2.7,
# "Per-depth logistic calibration").

#: The ``format`` field of a calibration prior file.
PRIOR_FORMAT = "dcut.calibration-prior/1"
#: The prior's file name inside a drafter folder (read by the checkpoint loader and the vLLM plugin).
PRIOR_NAME = "calibration.json"
#: Confidences are clipped into ``[_EPS, 1 - _EPS]`` before the logit (0 and 1 themselves map to 0 and 1).
_EPS = 1e-6
_Intercept = Annotated[float, Field(ge=-50.0, le=50.0, allow_inf_nan=False)]


class CalibrationPriorError(ValueError):
    """A calibration prior file that cannot be used; the message names the file, the field and the fix."""


class CalibrationPrior(BaseModel):
    """A drafter's per-depth calibration: ``P(draft t accepted | drafts < t accepted, c_t) =
    sigmoid(intercepts[t-1] + slope * logit(c_t))``; depths beyond the last intercept reuse it.

    The form of vLLM's acceptance estimator (an intercept per depth, one slope on the logit of the
    confidence). ``intercepts = [0], slope = 1`` is the identity (:meth:`identity`). ``provenance``
    records how it was fitted (command, seed, data, log-loss and ECE before/after); it is not read.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    format: Literal["dcut.calibration-prior/1"] = PRIOR_FORMAT
    intercepts: list[_Intercept] = Field(min_length=1, max_length=1024)
    slope: float = Field(gt=0.0, le=100.0, allow_inf_nan=False)
    provenance: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def identity(cls) -> "CalibrationPrior":
        """The prior that says the raw confidence is already calibrated."""
        return cls(intercepts=[0.0], slope=1.0)

    @property
    def is_identity(self) -> bool:
        return self.slope == 1.0 and all(a == 0.0 for a in self.intercepts)

    def intercepts_for(self, num_depths: int) -> np.ndarray:
        """``[num_depths]`` float64 intercepts of depths ``1..num_depths`` (the last one reused beyond)."""
        a = np.asarray(self.intercepts, dtype=np.float64)
        return a[np.minimum(np.arange(num_depths), a.size - 1)]

    def probability(self, conf: np.ndarray) -> np.ndarray:
        """The prior's acceptance probability of ``conf [..., D]`` (depth = last axis), float64."""
        conf = np.asarray(conf, dtype=np.float64)
        return _logistic_map(conf, self.intercepts_for(conf.shape[-1]), np.full(conf.shape[-1], self.slope))

    # ------------------------------------------------------------------ files
    @classmethod
    def load(cls, path: str | os.PathLike) -> "CalibrationPrior":
        """Read and validate a prior file.

        Raises:
            CalibrationPriorError: unreadable, not strict JSON, or a field missing / of the wrong
                type or range (one line naming the file, the field and the fix).
        """
        from .inputs import InputFileError, parse_json_strict, read_text

        fix = "refit it with `dcut-drafter calibrate --draft DIR` (or delete it to run without a prior)"
        try:
            raw = parse_json_strict(read_text(path, "a calibration prior"), str(path))
        except InputFileError as exc:
            raise CalibrationPriorError(f"{exc}; {fix}") from None
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            shown = repr(err.get("input"))
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise CalibrationPriorError(f"{path}: field {loc}: {err['msg']} (got {shown}); {fix}") from None

    @classmethod
    def from_folder(cls, folder: str | os.PathLike | None) -> "CalibrationPrior | None":
        """The prior of a drafter folder (its :data:`PRIOR_NAME`), ``None`` when it has none (or
        ``folder`` is not a local folder, e.g. a model name on a hub).

        Raises:
            CalibrationPriorError: the file is there but malformed.
        """
        if folder is None:
            return None
        path = Path(folder) / PRIOR_NAME
        return cls.load(path) if path.is_file() else None

    def save(self, path: str | os.PathLike) -> None:
        """Write the prior atomically (JSON, indented)."""
        from .atomic import atomic_write_text

        atomic_write_text(path, json.dumps(self.model_dump(), indent=2) + "\n")


def _logit(conf: np.ndarray) -> np.ndarray:
    c = np.clip(conf, _EPS, 1.0 - _EPS)
    return np.log(c) - np.log1p(-c)


def _logistic_map(conf: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sigmoid(a_t + b_t logit(c))`` along the last axis; exact 0 and 1 stay 0 and 1 (the map's limits)."""
    z = a + b * _logit(conf)
    out = 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic function, without overflow warnings
    return np.where(conf <= 0.0, 0.0, np.where(conf >= 1.0, 1.0, out))


def reached_slots(accept_len: np.ndarray, num_drafts: int, num_slots: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Reached and accepted masks ``[N, num_drafts]`` of fully verified blocks.

    Slot t (1-based) of block i is *reached* when drafts ``< t`` were all accepted
    (``t <= accept_len[i] + 1``) and the slot could be checked (``t <= num_slots[i]``: a block near
    the end of its sequence has fewer); its label is ``t <= accept_len[i]``.
    """
    a = np.asarray(accept_len, dtype=np.int64)[:, None]
    t = np.arange(1, num_drafts + 1)[None, :]
    reached = t <= a + 1
    if num_slots is not None:
        reached &= t <= np.asarray(num_slots, dtype=np.int64)[:, None]
    return reached, t <= a


def fit_prior(conf: np.ndarray, accept_len: np.ndarray, num_slots: np.ndarray | None = None, *,
              min_reached: int = 50, provenance: dict[str, Any] | None = None) -> CalibrationPrior:
    """Maximum-likelihood :class:`CalibrationPrior` of fully verified blocks (docs/design.md §2.7).

    The reached slots (:func:`reached_slots`) of depths ``1..D`` get one intercept each, where D is
    the last depth such that every depth up to it has at least ``min_reached`` reached slots; deeper
    slots share depth D's intercept (as the prior is applied). One slope on ``logit(conf)``. Fitted
    with ``scipy.optimize.minimize`` (L-BFGS-B, analytic gradient; intercepts bounded to [-30, 30],
    slope to [1e-3, 100], so perfectly separable data stays finite).

    Args:
        conf: ``[N, B-1]`` raw confidences of N blocks; accept_len: ``[N]`` drafts accepted with every
            slot verified; num_slots: ``[N]`` slots each block could check (default ``B-1``).

    Raises:
        ValueError: shapes disagree, or depth 1 has fewer than ``min_reached`` reached slots.
    """
    from scipy.optimize import minimize

    conf = np.asarray(conf, dtype=np.float64)
    accept_len = np.asarray(accept_len)
    if conf.ndim != 2 or accept_len.shape != (conf.shape[0],):
        raise ValueError(f"fit_prior: conf must be [N, B-1] and accept_len [N]; got {conf.shape} and "
                         f"{accept_len.shape}")
    reached, accepted = reached_slots(accept_len, conf.shape[1], num_slots)
    counts = reached.sum(0)
    if counts[0] < min_reached:
        raise ValueError(f"fit_prior: {int(counts[0])} reached slots at depth 1, fewer than min_reached="
                         f"{min_reached}; give more prompts or tokens")
    num_fit = int(np.argmin(counts >= min_reached)) if not (counts >= min_reached).all() else conf.shape[1]
    depth = np.broadcast_to(np.minimum(np.arange(conf.shape[1]), num_fit - 1), conf.shape)[reached]
    x = _logit(conf[reached])
    y = accepted[reached].astype(np.float64)

    def nll(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = theta[depth] + theta[-1] * x
        p = 0.5 * (1.0 + np.tanh(0.5 * z))
        loss = float(np.sum(np.logaddexp(0.0, z) - y * z)) / x.size
        r = (p - y) / x.size
        return loss, np.concatenate([np.bincount(depth, weights=r, minlength=num_fit), [r @ x]])

    theta0 = np.concatenate([np.zeros(num_fit), [1.0]])
    res = minimize(nll, theta0, jac=True, method="L-BFGS-B", bounds=[(-30.0, 30.0)] * num_fit + [(1e-3, 100.0)])
    return CalibrationPrior(intercepts=[round(float(v), 6) for v in res.x[:-1]], slope=round(float(res.x[-1]), 6),
                            provenance=dict(provenance or {}))


def calibration_report(conf: np.ndarray, accept_len: np.ndarray, num_slots: np.ndarray | None = None,
                       prior: CalibrationPrior | None = None, *, num_bins: int = 15) -> dict[str, Any]:
    """Raw confidence against ``prior`` on the reached slots of fully verified blocks.

    Returns ``{"reached", "log_loss_raw", "log_loss_calibrated", "ece_raw", "ece_calibrated",
    "by_depth": [{"depth", "reached", "acceptance", "mean_conf", "mean_calibrated", "ece_raw",
    "ece_calibrated"}]}`` (mean Bernoulli log-loss; ECE of :func:`expected_calibration_error`);
    ``prior=None`` reports the raw confidence on both sides. Depths with no reached slot are left out.
    """
    conf = np.asarray(conf, dtype=np.float64)
    prior = prior or CalibrationPrior.identity()
    cal = prior.probability(conf)
    reached, accepted = reached_slots(accept_len, conf.shape[1], num_slots)

    def log_loss(p: np.ndarray, y: np.ndarray) -> float:
        p = np.clip(p, _EPS, 1.0 - _EPS)
        return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p))) if y.size else float("nan")

    y = accepted[reached].astype(np.float64)
    out: dict[str, Any] = {
        "reached": int(y.size),
        "log_loss_raw": round(log_loss(conf[reached], y), 5), "log_loss_calibrated": round(log_loss(cal[reached], y), 5),
        "ece_raw": round(expected_calibration_error(conf[reached], y, num_bins), 5),
        "ece_calibrated": round(expected_calibration_error(cal[reached], y, num_bins), 5), "by_depth": []}
    for t in range(conf.shape[1]):
        m = reached[:, t]
        if not m.any():
            continue
        yt = accepted[m, t].astype(np.float64)
        out["by_depth"].append({
            "depth": t + 1, "reached": int(m.sum()), "acceptance": round(float(yt.mean()), 4),
            "mean_conf": round(float(conf[m, t].mean()), 4), "mean_calibrated": round(float(cal[m, t].mean()), 4),
            "ece_raw": round(expected_calibration_error(conf[m, t], yt, num_bins), 4),
            "ece_calibrated": round(expected_calibration_error(cal[m, t], yt, num_bins), 4)})
    return out


class LogisticCalibrator:
    """Per-depth logistic calibration, started from a prior and refitted online (docs/design.md §2.7).

    The map of draft slot t is ``sigmoid(a_t + b_t * logit(conf))`` (0 and 1 stay 0 and 1), started at
    the prior's ``(intercept_t, slope)``. Each observed step adds its censored outcomes
    (:func:`censored_outcomes`) to per-depth bins on the logit scale (count, accepted, sum of
    logits: three scatter-adds, bounded memory ``3 x (B-1) x num_bins``). Every ``refit_every``
    requests (rows of :meth:`observe` and of :meth:`observe_plain`; sooner at the start: after 16
    requests, then whenever the requests since the last refit reach half of all so far) the bins forget with a half-life
    of ``half_life`` requests (``unobserved_half_life`` for a depth that got no observation since the
    last refit: a policy that stopped verifying it sees it return to the prior, no lock-out), and
    each depth's two parameters are refitted by a few vectorised Newton
    steps on the bins plus ``prior_strength`` pseudo-observations drawn from the prior (half at the
    logit where the prior says 1/4, half where it says 3/4). With no data, or after the data has been
    forgotten, the map is the prior; with much data it follows the data.

    Pure numpy on the host for numpy input. Torch input (any device): :meth:`transform` runs on the
    input's device; :meth:`observe` scatter-adds on the device, folded on the host at a refit (no
    host sync otherwise).

    Args:
        block_size: B (``None``: taken from the first call, then fixed).
        prior: the drafter's :class:`CalibrationPrior` (default: the identity).
        prior_strength: pseudo-observations per depth that the prior counts for (> 0).
        refit_every: requests between refits in the steady state (>= 1).
        half_life: requests over which the observed counts halve (> 0; ``None``: never forget).
        unobserved_half_life: the same for a depth with no new observation (> 0; ``None``: ``half_life``).
        num_bins: bins of ``logit(conf)`` on ``[-logit_range, logit_range]`` (>= 2).
        newton_steps: Newton steps per refit (>= 1), from the current parameters.

    Raises:
        ValueError: invalid parameters, or confidences whose width disagrees with the block size.
    """

    def __init__(self, block_size: int | None = None, *, prior: CalibrationPrior | None = None,
                 prior_strength: float = 32.0, refit_every: int = 128, half_life: float | None = 4096.0,
                 unobserved_half_life: float | None = 256.0, num_bins: int = 32, logit_range: float = 8.0,
                 newton_steps: int = 4):
        if not (prior_strength > 0 and np.isfinite(prior_strength)):
            raise ValueError(f"LogisticCalibrator: prior_strength={prior_strength} must be a finite number > 0")
        if refit_every < 1:
            raise ValueError(f"LogisticCalibrator: refit_every={refit_every} must be >= 1")
        for name, value in (("half_life", half_life), ("unobserved_half_life", unobserved_half_life)):
            if value is not None and not 0 < value < float("inf"):
                raise ValueError(f"LogisticCalibrator: {name}={value} must be a finite number > 0 (or None)")
        if num_bins < 2 or not logit_range > 0 or newton_steps < 1:
            raise ValueError(f"LogisticCalibrator: num_bins={num_bins} must be >= 2, logit_range={logit_range} > 0, "
                             f"newton_steps={newton_steps} >= 1")
        self.prior = prior if prior is not None else CalibrationPrior.identity()
        self.prior_strength = float(prior_strength)
        self.refit_every = int(refit_every)
        self.half_life = None if half_life is None else float(half_life)
        self.unobserved_half_life = None if unobserved_half_life is None else float(unobserved_half_life)
        self.num_bins = int(num_bins)
        self.logit_range = float(logit_range)
        self.newton_steps = int(newton_steps)
        self.block_size: int | None = None
        self._since_refit = self._clock = self.num_observed_requests = self.num_refits = 0
        if block_size is not None:
            self._set_block_size(int(block_size))

    def params(self) -> dict[str, Any]:
        """Constructor parameters (for logs and result tables; the prior as its two fields)."""
        return {"block_size": self.block_size, "prior": {"intercepts": list(self.prior.intercepts),
                                                         "slope": self.prior.slope},
                "prior_strength": self.prior_strength, "refit_every": self.refit_every,
                "half_life": self.half_life, "unobserved_half_life": self.unobserved_half_life, "num_bins": self.num_bins, "logit_range": self.logit_range,
                "newton_steps": self.newton_steps}

    def _set_block_size(self, block_size: int) -> None:
        if block_size < 2:
            raise ValueError(f"LogisticCalibrator: block_size={block_size} must be >= 2")
        self.block_size = block_size
        d = block_size - 1
        a0, b0 = self.prior.intercepts_for(d), self.prior.slope
        self._prior_ab = (a0, np.full(d, b0))
        # the pseudo-observations: half at the logit where the prior says 1/4, half where it says 3/4
        q = np.array([0.25, 0.75])
        self._pseudo_x = (np.log(q / (1 - q))[None, :] - a0[:, None]) / b0  # [D, 2]
        self._pseudo_n = np.full((d, 2), self.prior_strength / 2)
        self._pseudo_y = self._pseudo_n * q[None, :]
        self._cell_offsets = np.arange(d)[None, :] * self.num_bins
        self._torch_offsets: dict[Any, torch.Tensor] = {}
        self.reset()

    def reset(self) -> None:
        """Forget every observation: the map returns to the prior."""
        d = self.block_size - 1
        self._stats = np.zeros((3, d, self.num_bins))  # [observed, accepted, sum of logits], decayed
        self._new = np.zeros((3, d * self.num_bins))  # since the last refit (host)
        self._device_new: dict[Any, torch.Tensor] = {}
        self.a, self.b = self._prior_ab[0].copy(), self._prior_ab[1].copy()
        self._at_identity = self.prior.is_identity
        self._torch_ab: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}
        self._half_ab: dict[np.dtype, tuple[np.ndarray, np.ndarray]] = {}
        self._since_refit = self._clock = 0
        self.num_observed_requests = 0
        self.num_refits = 0

    def _check_conf(self, conf: Array) -> None:
        if len(conf.shape) != 2:
            raise ValueError(f"LogisticCalibrator: conf must be [batch_size, block_size - 1]; got shape "
                             f"{tuple(conf.shape)}")
        if self.block_size is None:
            self._set_block_size(int(conf.shape[1]) + 1)
        elif conf.shape[1] != self.block_size - 1:
            raise ValueError(f"LogisticCalibrator: conf has {conf.shape[1]} draft slots but the calibrator was "
                             f"built for block size {self.block_size} ({self.block_size - 1} draft slots)")

    # ------------------------------------------------------------------ map
    def transform(self, conf: Array) -> Array:
        """Calibrated confidences: same shape, kind, dtype and device; non-decreasing in ``conf`` per
        depth. The identity prior with nothing learnt returns ``conf`` itself."""
        self._check_conf(conf)
        if self._at_identity:
            return conf
        if isinstance(conf, torch.Tensor):
            key = (conf.device, conf.dtype)
            ab = self._torch_ab.get(key)
            if ab is None:
                ab = self._torch_ab[key] = (torch.as_tensor(self.a, dtype=conf.dtype, device=conf.device),
                                            torch.as_tensor(self.b, dtype=conf.dtype, device=conf.device))
            c = conf.clamp(_EPS, 1.0 - _EPS)
            out = torch.sigmoid(ab[0] + ab[1] * (torch.log(c) - torch.log1p(-c)))
            return torch.where(conf <= 0, torch.zeros_like(out), torch.where(conf >= 1, torch.ones_like(out), out))
        conf_np = np.asarray(conf)
        half_a, half_b = self._half_ab.get(conf_np.dtype) or self._half_params(conf_np.dtype)
        with np.errstate(divide="ignore"):  # logit(0) = -inf and logit(1) = inf map to 0 and 1 (b > 0)
            x = np.log(conf_np)
            x -= np.log1p(-conf_np)
        x *= half_b
        x += half_a
        np.tanh(x, out=x)
        x *= 0.5
        x += 0.5
        return x

    def _half_params(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """``(a / 2, b / 2)`` in ``dtype`` (the map is ``1/2 + tanh(a/2 + b/2 logit(c)) / 2``), cached."""
        dt = dtype if dtype.kind == "f" else np.dtype(np.float64)
        pair = self._half_ab[dtype] = ((0.5 * self.a).astype(dt), (0.5 * self.b).astype(dt))
        return pair

    # ------------------------------------------------------------------ observations
    def observe(self, conf: Array, num_accepted: Array, lengths: Array) -> None:
        """Record one verified step: raw ``conf [bs, B-1]``, drafts accepted ``[bs]`` (clipped to
        ``lengths - 1``) and slots verified ``[bs]``, all of one kind; refits when due."""
        self._check_conf(conf)
        bs = int(conf.shape[0])
        nd = self.block_size - 1
        size = nd * self.num_bins
        if isinstance(conf, torch.Tensor):
            dev = conf.device
            num_accepted = torch.as_tensor(num_accepted, device=dev).to(torch.int64)
            lengths = torch.as_tensor(lengths, device=dev).to(torch.int64)
            num_accepted = verified_prefix_tokens(num_accepted.clamp(min=0), lengths) - 1
            observed, accepted = censored_outcomes(num_accepted, lengths, nd)
            c = conf.to(torch.float64)
            x = (torch.log(c) - torch.log1p(-c)).clamp(-self.logit_range, self.logit_range)
            bins = ((x + self.logit_range) * (self.num_bins / (2 * self.logit_range))).floor().clamp(0, self.num_bins - 1)
            offsets = self._torch_offsets.get(dev)
            if offsets is None:  # copied to the device once, not per step
                offsets = self._torch_offsets[dev] = torch.as_tensor(self._cell_offsets, device=dev)
            cell = (bins.to(torch.int64) + offsets).reshape(-1)
            obs = observed.reshape(-1).to(torch.float64)
            w = torch.stack([obs, accepted.reshape(-1).to(torch.float64), obs * x.reshape(-1)])
            add = torch.zeros(3, size, dtype=torch.float64, device=dev).index_add_(1, cell, w)
            held = self._device_new.get(dev)
            self._device_new[dev] = add if held is None else held + add
        else:
            conf = np.asarray(conf, dtype=np.float64)
            lengths = np.asarray(lengths, dtype=np.int64)
            num_accepted = np.minimum(np.maximum(np.asarray(num_accepted, dtype=np.int64), 0), lengths - 1)
            observed, accepted = censored_outcomes(num_accepted, lengths, nd)
            r = self.logit_range
            with np.errstate(divide="ignore"):
                x = np.log(conf)
                x -= np.log1p(-conf)
            x = np.minimum(np.maximum(x, -r), r)  # statistics of logits beyond +-logit_range count at the edge
            bins = np.minimum(((x + r) * (self.num_bins / (2 * r))).astype(np.int64), self.num_bins - 1)
            bins += self._cell_offsets
            cell = bins[observed]
            new = self._new
            new[0] += np.bincount(cell, minlength=size)
            new[1] += np.bincount(bins[accepted], minlength=size)
            new[2] += np.bincount(cell, weights=x[observed], minlength=size)
        self.num_observed_requests += bs
        self._tick(bs)

    def observe_plain(self, batch_size: int) -> None:
        """Count a step without a draft on the refit clock (the forgetting continues, so a map that
        stopped the drafting returns towards the prior)."""
        self._tick(int(batch_size))

    def _tick(self, requests: int) -> None:
        self._since_refit += requests
        self._clock += requests
        # every refit_every requests, sooner at the start (after 16, then after half the requests so far)
        if self._since_refit >= min(self.refit_every, max(16, self._clock // 2)):
            self.refit()

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """``(accepted, observed)`` ``[B-1, num_bins]``, decayed, including what is not refitted yet."""
        new = self._new.copy()
        for t in self._device_new.values():
            new += t.cpu().numpy()
        new = new.reshape(3, self.block_size - 1, self.num_bins)
        return self._stats[1] + new[1], self._stats[0] + new[0]

    def refit(self) -> None:
        """Fold the new observations in (after forgetting), then Newton steps per depth (class docstring)."""
        if self.block_size is None:
            return
        new = self._new
        for t in self._device_new.values():  # one device-to-host copy per device
            new = new + t.cpu().numpy()
        new = new.reshape(self._stats.shape)
        decay = np.full(self.block_size - 1, 1.0 if self.half_life is None else 0.5 ** (self._since_refit / self.half_life))
        if self.unobserved_half_life is not None:  # a depth with no observation since the last refit
            idle = new[0].sum(1) == 0
            decay[idle] = np.minimum(decay[idle], 0.5 ** (self._since_refit / self.unobserved_half_life))
        self._stats = self._stats * decay[None, :, None] + new
        self._new = np.zeros_like(self._new)
        self._device_new = {}
        self._since_refit = 0
        self.num_refits += 1
        n, y, sx = self._stats
        with np.errstate(invalid="ignore", divide="ignore"):
            centres = np.where(n > 0, sx / n, 0.0)
        x = np.concatenate([centres, self._pseudo_x], axis=1)
        n = np.concatenate([n, self._pseudo_n], axis=1)
        y = np.concatenate([y, self._pseudo_y], axis=1)
        a, b = self.a.copy(), self.b.copy()
        for _ in range(self.newton_steps):
            z = a[:, None] + b[:, None] * x
            p = 0.5 * (1.0 + np.tanh(0.5 * z))
            r = y - n * p
            w = n * p * (1.0 - p)
            ga, gb = r.sum(1), (r * x).sum(1)
            h00, h01, h11 = w.sum(1), (w * x).sum(1), (w * x * x).sum(1)
            det = np.maximum(h00 * h11 - h01 * h01, 1e-12)
            da, db = (h11 * ga - h01 * gb) / det, (h00 * gb - h01 * ga) / det
            step = np.maximum(1.0, np.hypot(da, db) / 2.0)  # at most 2 in parameter space per step
            a, b = a + da / step, np.maximum(b + db / step, 1e-3)
        self.a, self.b = a, b
        self._at_identity = False
        self._torch_ab = {}
        self._half_ab = {}

    def __repr__(self) -> str:
        return (f"LogisticCalibrator(block_size={self.block_size}, prior_depths={len(self.prior.intercepts)}, "
                f"observed_requests={self.num_observed_requests}, refits={self.num_refits})")
