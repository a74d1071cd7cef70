"""Analytic (roofline) cost model of one verification forward and one draft step.

Formulas (T = num_tokens / batch_size query tokens per request, c = context_len cached tokens per
request, N = num_tokens, L = layers, L_kv = full-attention layers, h = hidden, d = head_dim,
n_q / n_kv = query / key-value heads, V = vocabulary, P_act = matmul weights one token uses
(:attr:`ModelShape.active_matmul_params`, LM head included because verification needs logits at
every slot), beta = bytes per element (2 for bf16)):

FLOPs (multiply-add = 2 FLOPs; Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1):
    F = 2 * N * P_act                                   matmuls of every token
      + 4 * L_kv * n_q * d * N * (c + (T + 1) / 2)      QK^T and PV: each query sees the context
                                                        plus, causally, on average (T+1)/2 block slots

Bytes moved through HBM:
    W = beta * (L * (attn + dense MLP weights) + V * h)  every weight read once per forward
        (MoE: router + shared expert always; routed experts: the expected number of distinct
        experts N tokens touch under uniform routing, E * (1 - (1 - k/E)^N), per layer)
    KV = beta * 2 * L_kv * n_kv * d * (bs * c + 2 N)    read the context, write and read the new slots
    A = beta * N * L * (10 h + 2 d (n_q + 2 n_kv) + 6 I) + 4 * N * V
        activations: ~10 hidden-sized reads/writes per layer (two norms, residuals, attention
        in/out), q/k/v out and back in, ~6 intermediate-sized (gate/up out, activation, down in);
        float32 logits written once. (An estimate; kernels that fuse these move less.)

Time (ms): the GEMMs (and everything else that streams weights and activations) on a soft roofline,
plus attention as its own memory- or compute-bound kernel:
    t_c = F_matmul / (eta_compute * peak_flops),   t_m = (W + A) / (eta_memory * bandwidth)
    t_attn = max(F_attn / (eta_compute * peak_flops), KV / (eta_attention * bandwidth))
    t   = overhead_ms + (t_c^p + t_m^p)^(1/p) + t_attn
    ``p = smoothness``: p -> inf is the classic roofline max(t_c, t_m) (Williams, Waterman and
    Patterson 2009, "Roofline: an insightful visual performance model"); a finite p rounds the
    corner where GEMMs neither saturate compute nor bandwidth (what measured curves show).
    Attention gets its own efficiency because verification attention (few queries per request over
    a long cache) runs far below peak bandwidth, and because the context length of a published
    curve is often not stated: only ``context_len / eta_attention`` is identifiable from it.

Plain decode step (``C_ar``, its own path):
    one forward of one token per request (N = bs, T = 1) over the c cached slots, with its *own*
    :class:`Efficiency` (:data:`DEFAULT_AR_EFFICIENCY`, or fitted to ``ar`` rows by
    :mod:`dcut_sched.profiler.efficiency_fit`). A serving engine runs plain decode on another path than verification: a
    full CUDA graph of the one-token step (less fixed cost per forward than piecewise graphs) and a
    decode attention kernel (one query per request, split over the cache, so a higher fraction of
    bandwidth than the variable-length verification kernel). The GEMMs read the same weights on the
    same device, so :mod:`dcut_sched.profiler.efficiency_fit` shares ``eta_compute`` and ``eta_memory`` between the paths
    and gives each its own ``eta_attention`` and ``overhead_ms``.

Draft step:
    ``dflash:N``: one forward of N layers of the target's width on B tokens per request
    (N = bs * B), with its own KV cache at the context length, logits at every slot.
    ``self-skip:I,J``: B-1 sequential one-token forwards (N = bs) of the target without layers I, J,
    costed at the mean context ``c + B/2`` of the B-1 steps.

Device peaks and their sources are in :mod:`dcut_sched.profiler.devices`; :mod:`dcut_sched.profiler.efficiency_fit` fits
``eta_compute``, ``eta_memory`` and ``overhead_ms`` to a measured or published curve.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .devices import DeviceSpec
from .shapes import ModelShape, resolve_model

__all__ = ["DEFAULT_AR_EFFICIENCY", "DEFAULT_EFFICIENCY", "DraftSpec", "Efficiency", "ar_step_ms", "forward_bytes",
           "forward_flops", "forward_ms", "draft_ms", "parse_draft_spec"]

ACT_HIDDEN_RW = 10
ACT_FFN_RW = 6


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the device peaks a forward achieves, plus a fixed cost per forward.

    Attributes:
        eta_compute: achieved / peak bf16 FLOP/s, in (0, 1].
        eta_memory: achieved / peak HBM bandwidth of the weight/activation streams, in (0, 1].
        eta_attention: achieved / peak HBM bandwidth of attention reading the KV cache, in (0, 1].
        overhead_ms: fixed time per forward (launches, synchronisation, small kernels), ms >= 0.
        smoothness: p of the soft roofline ``(t_c^p + t_m^p)^(1/p)``; large = sharp max.
    """

    eta_compute: float = 0.7
    eta_memory: float = 0.7
    eta_attention: float = 0.3
    overhead_ms: float = 0.1
    smoothness: float = 4.0

    def __post_init__(self) -> None:
        for name in ("eta_compute", "eta_memory", "eta_attention"):
            v = getattr(self, name)
            if not (0.0 < v <= 1.0):
                raise ValueError(f"Efficiency.{name} must be in (0, 1], got {v}")
        if self.overhead_ms < 0 or self.smoothness < 1:
            raise ValueError(f"Efficiency: overhead_ms >= 0 and smoothness >= 1 required, got "
                             f"{self.overhead_ms}, {self.smoothness}")

    def to_dict(self) -> dict:
        return asdict(self)


#: Used by ``dcut-profile --analytic`` without ``--fit``: round guesses, *not* fitted. Fitting
#: (``--fit FILE``) replaces them; see docs/profiler.md for what the H20 fit gives.
DEFAULT_EFFICIENCY = Efficiency()
#: The plain-decode path's defaults without ``--fit`` (round guesses, *not* fitted): a full CUDA graph
#: of the one-token step (smaller fixed cost) and a decode attention kernel (higher share of bandwidth).
DEFAULT_AR_EFFICIENCY = Efficiency(eta_attention=0.5, overhead_ms=0.05)


def _moe_touched_experts(shape: ModelShape, num_tokens: np.ndarray) -> np.ndarray:
    """Expected distinct routed experts ``num_tokens`` tokens touch in one layer, uniform routing:
    ``E * (1 - (1 - k/E)^N)`` (each token picks k of E experts)."""
    e, k = shape.num_experts, shape.experts_per_token
    return e * (1.0 - (1.0 - k / e) ** num_tokens)


def _parts(shape: ModelShape, batch_size, num_tokens, context_len: int, bytes_per_elem: int = 2):
    """(F_matmul, F_attn, W + A, KV) of the module formulas, float64 arrays."""
    bs = np.asarray(batch_size, dtype=np.float64)
    n = np.asarray(num_tokens, dtype=np.float64)
    h, d = shape.hidden_size, shape.head_dim
    f_matmul = 2.0 * n * shape.active_matmul_params
    f_attn = 4.0 * shape.kv_layers * shape.num_heads * d * n * (context_len + (n / bs + 1) / 2)
    dense_layer = shape.attn_params_per_layer
    if shape.is_moe:
        dense_layer += h * shape.num_experts + 3 * h * shape.shared_expert_intermediate_size
        experts = shape.num_layers * _moe_touched_experts(shape, n) * shape.expert_params
        ffn_act = shape.expert_intermediate_size * shape.experts_per_token + shape.shared_expert_intermediate_size
    else:
        dense_layer += 3 * h * shape.intermediate_size
        experts = 0.0
        ffn_act = shape.intermediate_size
    weights = bytes_per_elem * (shape.num_layers * dense_layer + shape.lm_head_params + experts)
    act_per_token = shape.num_layers * (ACT_HIDDEN_RW * h + 2 * d * (shape.num_heads + 2 * shape.num_kv_heads)
                                        + ACT_FFN_RW * ffn_act)
    act = bytes_per_elem * n * act_per_token + 4.0 * n * shape.vocab_size
    kv = shape.kv_bytes_per_token(bytes_per_elem) * (bs * context_len + 2.0 * n)
    return f_matmul, f_attn, weights + act, kv


def forward_flops(shape: ModelShape, batch_size, num_tokens, context_len: int) -> np.ndarray:
    """FLOPs ``F = F_matmul + F_attn`` of one forward of ``num_tokens`` tokens over ``batch_size``
    requests with ``context_len`` cached tokens each (module formula). Ints or broadcastable arrays
    in, float64 out."""
    f_matmul, f_attn, _, _ = _parts(shape, batch_size, num_tokens, context_len)
    return f_matmul + f_attn


def forward_bytes(shape: ModelShape, batch_size, num_tokens, context_len: int, bytes_per_elem: int = 2) -> np.ndarray:
    """HBM bytes ``W + KV + A`` of one forward (module formula), float64."""
    _, _, wa, kv = _parts(shape, batch_size, num_tokens, context_len, bytes_per_elem)
    return wa + kv


def forward_ms(shape: ModelShape, device: DeviceSpec, eff: Efficiency, batch_size, num_tokens,
               context_len: int) -> np.ndarray:
    """Time (ms) of one forward: ``overhead + (t_c^p + t_m^p)^(1/p) + t_attn`` (module docstring)."""
    f_matmul, f_attn, wa, kv = _parts(shape, batch_size, num_tokens, context_len)
    t_c = f_matmul / (eff.eta_compute * device.peak_flops)
    t_m = wa / (eff.eta_memory * device.bytes_per_s)
    t_attn = np.maximum(f_attn / (eff.eta_compute * device.peak_flops), kv / (eff.eta_attention * device.bytes_per_s))
    p = eff.smoothness
    top = np.maximum(t_c, t_m)  # scale before the power so that a large p cannot overflow
    soft = top * ((t_c / top) ** p + (t_m / top) ** p) ** (1.0 / p)
    return eff.overhead_ms + 1e3 * (soft + t_attn)


def ar_step_ms(shape: ModelShape, device: DeviceSpec, eff: Efficiency, batch_size, context_len: int) -> np.ndarray:
    """Time (ms) of one plain decode step: :func:`forward_ms` of one token per request
    (``num_tokens = batch_size``) with the decode path's efficiency ``eff`` (module docstring)."""
    bs = np.asarray(batch_size, dtype=np.float64)
    return forward_ms(shape, device, eff, bs, bs, context_len)


@dataclass(frozen=True)
class DraftSpec:
    """How the draft step is made.

    Attributes:
        kind: ``"none"``, ``"self-skip"`` (target minus ``skip_layers``, B-1 sequential one-token
            forwards) or ``"dflash"`` (``num_layers`` layers of the target width, one forward of B
            tokens per request).
        skip_layers: absolute layer indices skipped (self-skip).
        num_layers: drafter depth (dflash).
        config: a preset name or config.json for a dflash drafter of another shape (optional).
    """

    kind: str
    skip_layers: tuple[int, ...] = ()
    num_layers: int = 0
    config: str | None = None

    def label(self) -> str:
        if self.kind == "self-skip":
            return "self-skip:" + ",".join(map(str, self.skip_layers))
        if self.kind == "dflash":
            return f"dflash:{self.config or self.num_layers}"
        return "none"


def parse_draft_spec(text: str) -> DraftSpec:
    """Parse ``none``, ``self-skip:14,15``, ``dflash:5`` or ``dflash:CONFIG`` (preset or config.json).

    Raises:
        ValueError: any other form (the message shows the accepted ones).
    """
    forms = "none, self-skip:I,J,..., dflash:N (layers of the target width) or dflash:CONFIG"
    kind, _, arg = text.strip().partition(":")
    if kind == "none" and not arg:
        return DraftSpec("none")
    if kind == "self-skip":
        try:
            layers = tuple(sorted({int(x) for x in arg.split(",") if x.strip()}))
        except ValueError:
            raise ValueError(f"draft spec {text!r}: layer list must be integers ({forms})") from None
        if not layers:
            raise ValueError(f"draft spec {text!r}: name the skipped layers ({forms})")
        return DraftSpec("self-skip", skip_layers=layers)
    if kind == "dflash" and arg:
        if arg.isdigit():
            if len(arg) > 4 or not 1 <= int(arg) <= 1024:
                raise ValueError(f"draft spec {text[:40]!r}: a DFlash drafter of 1..1024 layers")
            return DraftSpec("dflash", num_layers=int(arg))
        return DraftSpec("dflash", config=arg)
    raise ValueError(f"draft spec {text!r}: expected {forms}")


def draft_shape(target: ModelShape, spec: DraftSpec) -> ModelShape:
    """The shape of the drafter's forward (see :func:`draft_ms`)."""
    if spec.kind == "self-skip":
        bad = [i for i in spec.skip_layers if not 0 <= i < target.num_layers]
        if bad:
            raise ValueError(f"draft self-skip: layers {bad} out of range for {target.num_layers} layers")
        return target.with_layers(target.num_layers - len(spec.skip_layers))
    if spec.kind == "dflash":
        if spec.config is not None:
            return resolve_model(spec.config)[0]
        return target.with_layers(spec.num_layers)
    raise ValueError("no draft step to cost (draft spec 'none')")


def draft_ms(target: ModelShape, spec: DraftSpec, device: DeviceSpec, eff: Efficiency, batch_size,
             block_size: int, context_len: int) -> np.ndarray:
    """Analytic time (ms) of one draft step for ``batch_size`` requests (module docstring)."""
    shape = draft_shape(target, spec)
    bs = np.asarray(batch_size, dtype=np.float64)
    if spec.kind == "self-skip":
        steps = block_size - 1
        return steps * forward_ms(shape, device, eff, bs, bs, context_len + block_size // 2)
    return forward_ms(shape, device, eff, bs, bs * block_size, context_len)
