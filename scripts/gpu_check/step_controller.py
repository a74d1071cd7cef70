"""Step ``controller``: ``RatioController.plan()`` on CUDA tensors.

For policies ``dcut`` and ``fine`` at bs 4/16/64 with the shipped H20 Qwen3-8B curve (B = 16):

- **Same plans as on the CPU.** One seeded sequence of confidences (Beta(4, 1.5), float32) and
  greedy acceptances; a controller on CUDA tensors and one on numpy arrays plan and observe the same
  steps (a plain step where the previous plan said ``draft_next=False``); lengths, K, the draft
  decision, expected tokens and the layouts (gather indices, cumulative draft counts) must agree at
  every step.
- **One host sync per drafted step.** Each CUDA ``plan()`` runs under
  ``torch.cuda.set_sync_debug_mode("warn")``; the synchronising calls it makes are counted (the
  budget decision reads the expected tokens at the candidate budgets: exactly one, with the plan's
  layouts built as an engine reads them), and a plain step (``plan_without_draft``) must make none. A wrong count names the source lines that synced.
- **Time.** ``plan()`` timed with CUDA events around the call and with the host clock, after
  warm-up steps, without the debug mode; median ms per (policy, bs).

The dry run plans CPU torch tensors (which the controller routes through its numpy code) against
numpy arrays and times them with the host clock; the sync count needs CUDA and is skipped.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from common import REPO, StepResult, can_run
from settings import Settings

POLICIES = ("dcut", "fine")
WARMUP_STEPS = 5


def _episode(rng, bs: int, block: int, steps: int):
    conf = rng.beta(4.0, 1.5, size=(steps, bs, block - 1)).astype("float32")
    hit = rng.random((steps, bs, block - 1)) < conf
    accept = hit.cumprod(axis=2).sum(axis=2).astype("int64")  # leading drafts accepted
    return conf, accept


def _count_syncs(fn):
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    return out, len(syncs), [f"{Path(w.filename).name}:{w.lineno}" for w in syncs]


def _with_layout(plan):
    """``plan`` after building its layouts (slot mask, gather indices, draft-token counts)."""
    _ = plan.layout
    return plan


def run_controller(res: StepResult, cfg: Settings) -> None:
    if not can_run(res, ("torch", "numpy", "scipy"), cuda=True, dry_run=cfg.dry_run):
        return
    import numpy as np
    import torch

    from dcut_sched import CostCurve, RatioController

    gpu = not cfg.dry_run
    dev = torch.device(cfg.device)
    curve = CostCurve.load(cfg.controller_curve, check_hardware=False)
    block = curve.block_size
    res.figure("cost_curve", str(Path(cfg.controller_curve).relative_to(REPO)))
    timings = {}
    for policy in POLICIES:
        for bs in cfg.controller_batch_sizes:
            rng = np.random.default_rng(1000 * bs + len(policy))
            conf, accept = _episode(rng, bs, block, cfg.controller_steps)
            with res.guard(f"{policy} bs {bs}: plans and syncs"):
                _compare(res, RatioController, curve, block, policy, bs, conf, accept, dev, gpu)
            with res.guard(f"{policy} bs {bs}: timing"):
                timings[f"{policy}/{bs}"] = _time(res, RatioController, curve, block, policy, bs, conf, accept, dev, gpu)
    res.figure("plan_ms", timings)


def _compare(res, RatioController, curve, block, policy, bs, conf, accept, dev, gpu) -> None:
    import numpy as np
    import torch

    host = RatioController(curve, block, policy=policy)
    device = RatioController(curve, block, policy=policy)
    conf_dev = torch.from_numpy(conf).to(dev)
    accept_dev = torch.from_numpy(accept).to(dev)
    mismatches, plan_syncs, plain_syncs, sites = [], [], [], set()
    plain = False
    for s in range(conf.shape[0]):
        # The layouts are built on first access; an engine reads them every step, so they count too.
        if plain:
            p_host = host.plan_without_draft(bs)
            call = lambda: _with_layout(device.plan_without_draft(bs, dev))  # noqa: E731
        else:
            p_host = host.plan(conf[s])
            call = lambda: _with_layout(device.plan(conf_dev[s]))  # noqa: E731
        if gpu:
            torch.cuda.synchronize()
            p_dev, n, where = _count_syncs(call)
            (plain_syncs if plain else plan_syncs).append(n)
            if n != (0 if plain else 1):
                sites.update(where)
        else:
            p_dev = call()
        lengths = p_dev.lengths.cpu().numpy()
        same = (np.array_equal(lengths, p_host.lengths) and p_dev.num_tokens == p_host.num_tokens
                and np.array_equal(p_dev.gather_indices.cpu().numpy(), np.asarray(p_host.gather_indices))
                and np.array_equal(p_dev.cu_num_draft_tokens.cpu().numpy(), np.asarray(p_host.cu_num_draft_tokens))
                and p_dev.draft_next == p_host.draft_next and p_dev.drafted == p_host.drafted
                and abs(p_dev.expected_tokens - p_host.expected_tokens) <= 1e-4 * max(1.0, p_host.expected_tokens))
        if not same and len(mismatches) < 3:
            mismatches.append(f"step {s}: K {p_host.num_tokens} (numpy) vs {p_dev.num_tokens} ({dev.type}), expected "
                              f"tokens {p_host.expected_tokens:.4f} vs {p_dev.expected_tokens:.4f}, draft_next "
                              f"{p_host.draft_next} vs {p_dev.draft_next}")
        elif not same:
            mismatches.append("...")
        if plain:
            host.observe(np.zeros(bs, dtype=np.int64))
            device.observe(torch.zeros(bs, dtype=torch.int64, device=dev))
        else:
            host.observe(accept[s])
            device.observe(accept_dev[s])
        plain = not p_host.draft_next
    steps = conf.shape[0]
    res.check(f"{policy} bs {bs}: {'CUDA' if gpu else 'CPU-tensor'} plans equal the numpy plans", not mismatches,
              value=f"{steps - len(mismatches)} of {steps} steps" if not mismatches else f"{len(mismatches)} differ",
              detail="; ".join(mismatches), hint="a float32 tie between budgets would show as a K that differs by "
                                                 "one bucket with equal expected tokens" if mismatches else None)
    if not gpu:
        res.check(f"{policy} bs {bs}: one host sync per plan()", None, skip_reason="dry run: counting syncs needs CUDA")
        return
    counts = {n: plan_syncs.count(n) for n in sorted(set(plan_syncs))}
    res.check(f"{policy} bs {bs}: exactly one host sync per plan() (layouts included)",
              bool(plan_syncs) and set(plan_syncs) == {1},
              value=counts, unit="syncs: steps",
              detail=f"synchronising calls at {sorted(sites)}" if sites else "")
    if plain_syncs:
        res.check(f"{policy} bs {bs}: no host sync in plan_without_draft() (layouts included)", set(plain_syncs) == {0},
                  value={n: plain_syncs.count(n) for n in sorted(set(plain_syncs))}, unit="syncs: steps")


def _time(res, RatioController, curve, block, policy, bs, conf, accept, dev, gpu) -> dict:
    import numpy as np
    import torch

    ctrl = RatioController(curve, block, policy=policy)
    conf_dev = torch.from_numpy(conf).to(dev)
    accept_dev = torch.from_numpy(accept).to(dev)
    wall, events = [], []
    for s in range(conf.shape[0]):
        if gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            ctrl.plan(conf_dev[s])
            end.record()
            wall.append(1e3 * (time.perf_counter() - t0))
            events.append((start, end))
        else:
            t0 = time.perf_counter()
            ctrl.plan(conf_dev[s])
            wall.append(1e3 * (time.perf_counter() - t0))
        ctrl.observe(accept_dev[s])
    if gpu:
        torch.cuda.synchronize()
    out = {"host_ms": float(np.median(wall[WARMUP_STEPS:]))}
    if gpu:
        out["cuda_event_ms"] = float(np.median([s.elapsed_time(e) for s, e in events[WARMUP_STEPS:]]))
        res.measure(f"{policy} bs {bs}: plan() time, CUDA events (host clock)", round(out["cuda_event_ms"], 4), "ms",
                    detail=f"host {out['host_ms']:.4f} ms; median of {len(wall) - WARMUP_STEPS} steps")
    else:
        res.measure(f"{policy} bs {bs}: plan() time, host clock (CPU tensors)", round(out["host_ms"], 4), "ms",
                    detail=f"median of {len(wall) - WARMUP_STEPS} steps")
    return out
