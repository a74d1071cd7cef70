"""``DCutScheduler``: vLLM 0.32.0's v1 scheduler with RatioController deciding every verification.

Enable it with ``LLM(..., scheduler_cls="dcut_sched.integrations.vllm.scheduler.DCutScheduler",
additional_config={"dcut": {...}})`` (or :func:`dcut_sched.integrations.vllm.llm_kwargs`). Imported
only inside vLLM.

Per engine step (EngineCore: ``schedule`` -> execute -> ``update_from_output`` -> ``post_step``):

1. ``update_draft_token_ids`` (called from ``post_step``) receives each running request's draft
   tokens and, through :mod:`.hooks`, their draft confidences ``[n, B-1]``. The controller plans
   the lengths ``L[i]`` from them over the whole batch (one decision for every tensor-parallel
   rank, since V1 schedules centrally) and each request keeps its first ``L[i] - 1`` drafts.
2. ``schedule`` then schedules ``1 + len(spec_token_ids)`` tokens per request (vLLM's ragged
   ``SpecDecodeMetadata``); when the policy says the next step should not draft (``fine``
   skipping drafts, ``ar``) it sets ``num_spec_tokens_to_schedule = 0`` (vLLM's dynamic-SD knob:
   the drafter only runs its KV-keeping first pass).
3. ``update_from_output`` reads the accepted drafts of the verified requests and feeds them back
   (``RatioController.observe``), logs D-Cut metrics every ``log_interval_s`` the way vLLM logs
   spec-decode metrics, and writes the step record when ``record_path`` is set.

Requests that finish or are preempted between the plan and the verification simply drop out of
the step (their planned slots are not verified; the record lists them under ``dropped``); requests
that join mid-run have no draft on their prefill step and enter the next plan; a step whose batch
carries no draft is planned with ``plan_without_draft``. Start-up fails with a clear message on
another vLLM version, an unknown policy, a cost curve for another block size or one that does not
cover ``max_num_seqs``, async scheduling, or no speculative config.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import vllm
from vllm.logger import init_logger
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds

from . import hooks
from .config import DCutConfigError, DCutVllmConfig, check_engine_config, require_vllm_version

__all__ = ["DCutScheduler"]

# Under the "vllm" logger so the lines come out with vLLM's own handler and format.
logger = init_logger("vllm.plugins.dcut")


class DCutScheduler(Scheduler):
    """vLLM's ``Scheduler`` whose verification lengths come from a :class:`~dcut_sched.RatioController`."""

    def __init__(self, vllm_config, *args: Any, **kwargs: Any) -> None:
        require_vllm_version(vllm.__version__)
        cfg = check_engine_config(vllm_config)  # the front end ran it too (the plugin's engine-args hook)
        super().__init__(vllm_config, *args, **kwargs)
        hooks.install()
        spec = vllm_config.speculative_config
        self.dcut_config = cfg
        self.dcut_block_size = int(spec.num_speculative_tokens) + 1
        self.dcut_controller = _build_controller(cfg, vllm_config, self.dcut_block_size)
        self._dcut_pending: dict[str, Any] | None = None  # plan made in post_step, for the next step
        self._dcut_in_flight: dict[str, Any] | None = None  # that plan plus what was scheduled
        self._dcut_step = 0
        self._dcut_totals = {"steps": 0, "drafted_steps": 0, "verified_slots": 0, "drafted_slots": 0,
                             "accepted_drafts": 0, "verified_requests": 0, "plan_ms": 0.0}
        self._dcut_window = dict(self._dcut_totals)
        self._dcut_last_log = time.monotonic()
        self._dcut_record = None
        if cfg.record_path:
            path = Path(cfg.record_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._dcut_record = open(path, "a", encoding="utf-8")
        logger.info("D-Cut: policy %s, block size %d, cost curve %s (%s)", cfg.policy, self.dcut_block_size,
                    self.dcut_controller.cost.path if self.dcut_controller.cost is not None else None, cfg.source)

    # ------------------------------------------------------------------ plan (post_step)
    def update_draft_token_ids(self, draft_token_ids) -> None:
        t0 = time.perf_counter()
        k = self.dcut_block_size - 1
        confidences = getattr(draft_token_ids, "confidences", None)
        req_ids, drafts, conf_rows = [], [], []
        for row, (req_id, spec_ids) in enumerate(zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids)):
            request = self.requests.get(req_id)
            if request is None or request.is_finished() or request.is_prefill_chunk or not spec_ids:
                continue
            if confidences is None:  # the method and the config were checked at start-up
                raise DCutConfigError(
                    "D-Cut: the drafter's step carries no draft confidences although the speculative "
                    "config was checked at start-up, so the worker process did not load the D-Cut worker "
                    "hooks: install dcut-sched in the environment the vLLM workers run in (its "
                    "'vllm.general_plugins' entry point 'dcut' loads them) and do not exclude 'dcut' "
                    "from $VLLM_PLUGINS"
                )
            req_ids.append(req_id)
            drafts.append(list(spec_ids))
            c = np.zeros(k, dtype=np.float32)
            vals = confidences[row][:k]
            c[: len(vals)] = vals
            conf_rows.append(c)
        ctrl = self.dcut_controller
        if req_ids:
            plan = ctrl.plan(np.stack(conf_rows))
            lengths = np.minimum(np.asarray(plan.lengths, dtype=np.int64),
                                 1 + np.array([len(d) for d in drafts]))
        else:
            plan = ctrl.plan_without_draft(max(1, len(self.running)))
            lengths = np.zeros(0, dtype=np.int64)
        plan_ms = (time.perf_counter() - t0) * 1e3
        kept = []
        for req_id, spec_ids, length in zip(req_ids, drafts, lengths):
            kept.append(spec_ids[: int(length) - 1])
        # vLLM's own bookkeeping (structured-output validation, prefill chunks) on the kept drafts.
        super().update_draft_token_ids(DraftTokenIds(req_ids, kept))
        self._dcut_pending = {
            "req_ids": req_ids, "lengths": [int(x) for x in lengths], "drafted": bool(req_ids),
            "plan_batch_size": int(plan.batch_size),
            "draft_next": bool(plan.draft_next), "ratio": float(plan.ratio) if req_ids else None,
            "num_tokens": int(lengths.sum()) if req_ids else 0, "plan_ms": plan_ms,
            "expected_tokens": float(plan.expected_tokens) if req_ids else None,
        }
        if self._dcut_record is not None:  # the traces a benchmark replays (step- or position-indexed)
            self._dcut_pending["conf"] = [[round(float(x), 6) for x in c] for c in conf_rows]
            self._dcut_pending["drafts"] = [[int(t) for t in d] for d in drafts]
            self._dcut_pending["num_output"] = [len(self.requests[r].output_token_ids) for r in req_ids]

    # ------------------------------------------------------------------ schedule
    def schedule(self, *args: Any, **kwargs: Any):
        out = super().schedule(*args, **kwargs)
        pending, self._dcut_pending = self._dcut_pending, None
        if pending is not None and not pending["draft_next"]:
            out.num_spec_tokens_to_schedule = 0
        verified = {rid: 1 + len(out.scheduled_spec_decode_tokens.get(rid, ()))
                    for rid in (pending["req_ids"] if pending else ()) if rid in out.num_scheduled_tokens}
        unplanned = {rid: 1 + len(ids) for rid, ids in out.scheduled_spec_decode_tokens.items()
                     if not pending or rid not in pending["req_ids"]}
        self._dcut_in_flight = {"plan": pending, "verified": verified, "unplanned": unplanned,
                                "batch_size": len(out.num_scheduled_tokens),
                                "num_spec_tokens_to_schedule": int(out.num_spec_tokens_to_schedule)}
        return out

    # ------------------------------------------------------------------ observe
    def update_from_output(self, scheduler_output, model_runner_output):
        flight, self._dcut_in_flight = self._dcut_in_flight, None
        if flight is not None and model_runner_output is not None:
            self._dcut_observe(flight, scheduler_output, model_runner_output)
        return super().update_from_output(scheduler_output, model_runner_output)

    def _dcut_observe(self, flight, scheduler_output, model_runner_output) -> None:
        plan = flight["plan"]
        sampled = model_runner_output.sampled_token_ids or []
        index = model_runner_output.req_id_to_index or {}
        accepted: dict[str, int] = {}
        for rid, spec in scheduler_output.scheduled_spec_decode_tokens.items():
            i = index.get(rid)
            if i is not None and i < len(sampled) and len(sampled[i]):
                accepted[rid] = max(len(sampled[i]) - 1, 0)
        record = {"step": self._dcut_step, "batch_size": flight["batch_size"],
                  "num_spec_tokens_to_schedule": flight["num_spec_tokens_to_schedule"]}
        if plan is not None:
            if plan["drafted"]:
                self.dcut_controller.observe(np.array([accepted.get(r, 0) for r in plan["req_ids"]], dtype=np.int64))
            else:  # a plain step: nothing drafted, so nothing accepted (observe once per plan)
                self.dcut_controller.observe(np.zeros(plan["plan_batch_size"], dtype=np.int64))
            dropped = [r for r in plan["req_ids"] if r not in flight["verified"]]
            record.update({
                "planned": dict(zip(plan["req_ids"], plan["lengths"])), "verified": flight["verified"],
                "dropped": dropped, "drafted": plan["drafted"], "draft_next": plan["draft_next"],
                "ratio": plan["ratio"], "num_tokens": plan["num_tokens"], "plan_ms": plan["plan_ms"],
                "expected_tokens": plan["expected_tokens"],
            })
            if "conf" in plan:
                record["conf"] = dict(zip(plan["req_ids"], plan["conf"]))
                record["drafts"] = dict(zip(plan["req_ids"], plan["drafts"]))
                record["num_output"] = dict(zip(plan["req_ids"], plan["num_output"]))
            w = self._dcut_window
            w["plan_ms"] += plan["plan_ms"]
            if plan["drafted"]:
                w["drafted_steps"] += 1
                w["verified_slots"] += sum(flight["verified"].values())
                w["drafted_slots"] += self.dcut_block_size * len(flight["verified"])
                w["verified_requests"] += len(flight["verified"])
                w["accepted_drafts"] += sum(accepted.get(r, 0) for r in flight["verified"])
        w = self._dcut_window
        w["steps"] += 1
        record["unplanned"] = flight["unplanned"]
        record["accepted"] = accepted
        self._dcut_step += 1
        if self._dcut_record is not None:
            self._dcut_record.write(json.dumps(record) + "\n")
            self._dcut_record.flush()
        if time.monotonic() - self._dcut_last_log >= self.dcut_config.log_interval_s:
            self._dcut_log()

    # ------------------------------------------------------------------ metrics
    @property
    def dcut_metrics(self) -> dict[str, float]:
        """Totals since start-up: steps, drafted steps, keep ratio (verified / drafted slots),
        accepted drafts per verified request-step, tokens per request-step, mean plan ms per step."""
        t = {k: self._dcut_totals[k] + self._dcut_window[k] for k in self._dcut_totals}
        return _summary(t)

    def _dcut_log(self) -> None:
        w = self._dcut_window
        if w["steps"]:
            s = _summary(w)
            logger.info(
                "D-Cut metrics: policy %s, steps %d (drafted %d), keep ratio %.3f, accepted drafts per "
                "request-step %.2f, tokens per request-step %.2f, plan time %.3f ms/step",
                self.dcut_config.policy, s["steps"], s["drafted_steps"], s["keep_ratio"],
                s["accepted_per_request_step"], s["tokens_per_request_step"], s["plan_ms_per_step"])
        for k in self._dcut_totals:
            self._dcut_totals[k] += w[k]
            w[k] = 0 if k != "plan_ms" else 0.0
        self._dcut_last_log = time.monotonic()

    def shutdown(self) -> None:
        self._dcut_log()
        if self._dcut_record is not None:
            self._dcut_record.close()
            self._dcut_record = None
        super().shutdown()


def _summary(t: dict[str, float]) -> dict[str, float]:
    vr = max(t["verified_requests"], 1)
    return {
        "steps": int(t["steps"]), "drafted_steps": int(t["drafted_steps"]),
        "keep_ratio": t["verified_slots"] / t["drafted_slots"] if t["drafted_slots"] else float("nan"),
        "accepted_per_request_step": t["accepted_drafts"] / vr,
        "tokens_per_request_step": (t["accepted_drafts"] + t["verified_requests"]) / vr,
        "plan_ms_per_step": t["plan_ms"] / max(t["steps"], 1),
    }


def _build_controller(cfg: DCutVllmConfig, vllm_config, block_size: int):
    """The RatioController of ``cfg``; checks the curve against the block size and ``max_num_seqs``."""
    from ... import policies
    from ...controller import RatioController
    from ...cost_curve import CostCurve, CostCurveError, CostCurveRangeError

    # the policy the config check built (built here only for a config made in code)
    policy = cfg.policy_object if cfg.policy_object is not None else policies.get(cfg.policy, **cfg.policy_params)
    curve = None
    if cfg.cost_curve:
        try:
            curve = CostCurve.load(cfg.cost_curve, check_hardware=False)
        except (OSError, CostCurveError) as exc:
            raise DCutConfigError(f"{cfg.source}: 'cost_curve' {cfg.cost_curve}: {exc}") from None
    elif policy.needs_cost:
        from .startup_profile import startup_curve

        curve = startup_curve(cfg, vllm_config, block_size)
    if curve is not None and curve.block_size != block_size:
        raise DCutConfigError(
            f"{cfg.source}: cost curve {curve.path or cfg.cost_curve} was measured for block size "
            f"{curve.block_size}, but vLLM serves block size {block_size} (num_speculative_tokens "
            f"{block_size - 1} + 1); profile it with dcut-profile --vllm MODEL --block-size {block_size}"
        )
    ctrl = RatioController(curve, block_size, policy, calibrate=cfg.calibrate)
    max_bs = int(vllm_config.scheduler_config.max_num_seqs)
    if curve is not None:
        try:
            for bs in range(1, max_bs + 1):
                ctrl.plan(np.full((bs, block_size - 1), 0.5, dtype=np.float32))
        except CostCurveRangeError as exc:
            raise DCutConfigError(
                f"{cfg.source}: cost curve {curve.path} does not cover batch size {bs} <= max_num_seqs "
                f"{max_bs} ({exc}); profile up to max_num_seqs or lower max_num_seqs"
            ) from None
    ctrl.reset()
    return ctrl
