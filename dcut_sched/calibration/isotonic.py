"""The isotonic online calibrator: a monotone map per confidence bin (pooled over depth by default),
identity prior, learnt from the censored outcomes of verified steps. The simulator's ``--calibrate``
and the recovery tests use it; the controller's default is :class:`~.logistic.LogisticCalibrator`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from scipy.optimize import isotonic_regression

from ..scores import Array, verified_prefix_tokens
from .metrics import censored_outcomes

__all__ = ["OnlineCalibrator"]


class OnlineCalibrator:
    """Learns ``P(draft t accepted | drafts < t accepted, conf_t)`` online (docs/design.md §2.7).

    Contract:

    - :meth:`observe` takes one verified step (raw ``conf [bs, B-1]``, drafts accepted, slots
      verified) and counts its censored outcomes (:func:`~.metrics.censored_outcomes`) per confidence
      bin and depth band: constant work per step, on the data's device, no host sync except at a refit.
    - Every ``refit_every`` observed requests the map is refitted on the host: a Beta prior centred on
      the identity (``prior_strength`` pseudo-observations per bin), made non-decreasing by weighted
      isotonic regression, per depth band with the pooled fit as prior mean, interpolated onto a lookup
      table of ``resolution`` points per band. With no data the map is the identity (to the table's
      resolution).
    - At each refit the counts of a bin with no new observation decay with a half-life of
      ``unobserved_half_life`` requests (``None``: never); the clock counts the rows of ``observe`` and
      the requests of :meth:`observe_plain` (steps without a draft).
    - :meth:`transform` is one gather into that table (same shape, kind, dtype and device as its
      input): monotone non-decreasing in confidence within each band.

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
