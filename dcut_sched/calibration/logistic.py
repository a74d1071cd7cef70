"""The controller's default calibrator: per depth t, ``sigmoid(a_t + b_t * logit(conf_t))``, started
from the drafter's :class:`~.prior.CalibrationPrior` and refitted online from the censored outcomes
of verified steps, damped by the prior and by forgetting (class docstring; docs/design.md §2.7,
"Per-depth logistic calibration").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..scores import Array, verified_prefix_tokens
from .metrics import CONF_EPS, censored_outcomes
from .prior import CalibrationPrior

__all__ = ["LogisticCalibrator"]


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
            c = conf.clamp(CONF_EPS, 1.0 - CONF_EPS)
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
