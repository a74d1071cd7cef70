"""``DCutScheduler``: vLLM 0.32.0's v1 scheduler with RatioController deciding every verification.

Enabled by ``scheduler_cls=SCHEDULER_CLS`` (:func:`dcut_sched.integrations.vllm.llm_kwargs`;
docs/vllm.md); imported only inside vLLM. A thin adapter over
:class:`~dcut_sched.controller.request_batch.RequestBatch` (plans by request id, clipping, dropped
and unplanned requests, metrics window, step records). Per engine step (EngineCore: ``schedule``
-> execute -> ``update_from_output`` -> ``post_step``):

1. ``update_draft_token_ids`` (from ``post_step``): the running requests' drafts and confidences
   (:mod:`.hooks`) are planned at once; each request keeps its first ``L[i] - 1`` drafts. A batch
   without drafts (prefills) is planned without draft.
2. ``schedule``: vLLM's (``1 + len(spec_token_ids)`` tokens per request), with
   ``num_spec_tokens_to_schedule`` (the drafter pass after this step) 0 when the plan says not to
   draft next, else (with ``adaptive_draft_depth``) the plan's ``draft_depth`` where that is below
   vLLM's own value.
3. ``update_from_output``: the accepted drafts go back to the controller, with the step's wall
   time (from the previous ``update_from_output``) for the cost-curve check; a step that also ran
   prefill tokens, or came after an idle gap longer than its own forward, is not timed.

Start-up fails clearly on another vLLM version or a bad config (:mod:`.config`, :mod:`.startup`).
"""

from __future__ import annotations

import time
from typing import Any

import vllm
from vllm.logger import init_logger
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds

from ...controller.request_batch import DraftDepth, RequestBatch, confidence_matrix, metrics_line
from . import hooks
from .config import DCutConfigError, check_engine_config, require_vllm_version
from .startup import build_controller

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
        self.dcut_config = cfg
        self.dcut_block_size = int(vllm_config.speculative_config.num_speculative_tokens) + 1
        self.dcut_controller = build_controller(cfg, vllm_config, self.dcut_block_size)
        depth = DraftDepth(self.dcut_block_size) if cfg.adaptive_draft_depth else None
        self.dcut = RequestBatch(self.dcut_controller, record_path=cfg.record_path, log_interval_s=cfg.log_interval_s,
                                 on_window=self._dcut_log, on_warning=logger.warning, draft_depth=depth)
        self._dcut_pending = None  # the StepPlan made in post_step, for the next step
        self._dcut_in_flight = None  # that plan and what was scheduled of it
        self._dcut_last_update = None  # perf_counter at the end of the last update_from_output
        self._dcut_scheduled_at = None  # perf_counter when this step's schedule() began
        self._dcut_decode_only = False  # whether this step scheduled decode tokens only (no prefill)
        cal = self.dcut_controller.calibrator
        logger.info("D-Cut: policy %s, block size %d, cost curve %s, calibration %s (%s)", cfg.policy,
                    self.dcut_block_size,
                    self.dcut_controller.cost.path if self.dcut_controller.cost is not None else None,
                    "off" if cal is None else ("identity prior" if getattr(cal, "prior", None) is None
                                               or cal.prior.is_identity else "the drafter's calibration.json prior"),
                    cfg.source)

    def update_draft_token_ids(self, draft_token_ids) -> None:
        t0 = time.perf_counter()
        conf = getattr(draft_token_ids, "confidences", None)
        rows = []  # (row, request id, drafts) of the running decode requests with drafts
        for row, (req_id, spec_ids) in enumerate(zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids)):
            request = self.requests.get(req_id)
            if request is not None and not request.is_finished() and not request.is_prefill_chunk and spec_ids:
                rows.append((row, req_id, list(spec_ids)))
        if rows and conf is None:  # the method and the config were checked at start-up
            raise DCutConfigError(hooks.NO_CONFIDENCES)
        req_ids = [r for _, r, _ in rows]
        if rows:
            num_output = [len(self.requests[r].output_token_ids) for r in req_ids] if self.dcut.recording else None
            plan = self.dcut.plan(req_ids, [d for _, _, d in rows],
                                  confidence_matrix([conf[i] for i, _, _ in rows], self.dcut_block_size - 1),
                                  remaining=self._dcut_remaining(req_ids), num_output=num_output, started=t0)
        else:
            plan = self.dcut.plan_without_draft(max(1, len(self.running)), started=t0)
        # vLLM's own bookkeeping (structured-output validation, prefill chunks) on the kept drafts.
        super().update_draft_token_ids(DraftTokenIds(req_ids, plan.kept))
        self._dcut_pending = plan

    def _dcut_remaining(self, req_ids: list[str]) -> list[int] | None:
        """With ``finite_batch``, while no request waits: each request's ``max_tokens`` less its output so
        far (the batch drains); ``None`` otherwise."""
        if not self.dcut_config.finite_batch or len(self.waiting) or len(self.kv_holding_waiting):
            return None
        return [self.requests[r].max_tokens - self.requests[r].num_output_tokens for r in req_ids]

    def schedule(self, *args: Any, **kwargs: Any):
        self._dcut_scheduled_at = time.perf_counter()
        out = super().schedule(*args, **kwargs)
        plan, self._dcut_pending = self._dcut_pending, None
        if plan is not None and not plan.draft_next:
            out.num_spec_tokens_to_schedule = 0
        elif plan is not None and plan.draft_depth is not None:
            out.num_spec_tokens_to_schedule = min(int(out.num_spec_tokens_to_schedule), plan.draft_depth)
        spec = {r: len(t) for r, t in out.scheduled_spec_decode_tokens.items()}
        self._dcut_decode_only = sum(out.num_scheduled_tokens.values()) == len(out.num_scheduled_tokens) + sum(spec.values())
        self._dcut_in_flight = self.dcut.schedule(plan, out.num_scheduled_tokens, spec,
                                                  num_spec_tokens_to_schedule=int(out.num_spec_tokens_to_schedule))
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        flight, self._dcut_in_flight = self._dcut_in_flight, None
        step_ms = self._dcut_step_ms()
        if flight is not None and model_runner_output is not None:
            sampled = model_runner_output.sampled_token_ids or []
            index = model_runner_output.req_id_to_index or {}
            accepted: dict[str, int] = {}  # drafts accepted: the sampled tokens but the bonus one
            for rid in scheduler_output.scheduled_spec_decode_tokens:
                i = index.get(rid)
                if i is not None and i < len(sampled) and len(sampled[i]):
                    accepted[rid] = len(sampled[i]) - 1
            if flight.plan is not None and flight.plan.drafted != flight.plan.draft_next:
                # the window holds the drafter pass for the *next* step (vLLM proposes after the
                # target's forward): a drafted step that stops drafting, or a step before a probe,
                # is not the step the curve prices, so it is not timed
                step_ms = None
            self.dcut.observe(flight, accepted, step_ms=step_ms)
        return super().update_from_output(scheduler_output, model_runner_output)

    def _dcut_step_ms(self) -> float | None:
        """Wall ms from the previous ``update_from_output`` to this one; ``None`` for the first step, a
        step with prefill tokens (the cost curve prices decode steps), and after an idle gap (the time
        before this step's ``schedule`` exceeds the step's own forward). The window holds this step's
        verification and the drafter pass for the next one."""
        now, last, began = time.perf_counter(), self._dcut_last_update, self._dcut_scheduled_at
        self._dcut_last_update = now
        if last is None or began is None or not self._dcut_decode_only or began - last > now - began:
            return None
        return (now - last) * 1e3

    @property
    def dcut_metrics(self) -> dict[str, float]:
        """Totals since start-up (:func:`~dcut_sched.controller.request_batch.summarize_metrics`)."""
        return self.dcut.metrics

    def _dcut_log(self, s: dict[str, float]) -> None:
        logger.info("%s", metrics_line(self.dcut_config.policy, s))

    def shutdown(self) -> None:
        self.dcut.close()
        super().shutdown()
