"""Worker-side hooks into vLLM 0.32.0 (imported only inside vLLM): capture draft confidences.

vLLM's greedy draft proposers (``SpecDecodeBaseProposer._greedy_sample``, used by the
``draft_model`` method and by EAGLE-style drafters) keep only the argmax of each draft step's
logits. :func:`install` wraps vLLM's methods so that, while a D-Cut config is active
(:meth:`DCutVllmConfig.resolve` is not ``None`` for the engine's config), each drafted step also
yields the draft's confidence ``c[i, t] = exp(max_logit - logsumexp(logits))`` (docs/design.md §1) and
hands it to the scheduler **inside the step's own outputs**:

- ``SpecDecodeBaseProposer._greedy_sample``: computes the logits once, keeps the argmax (the same
  call vLLM makes, so the drafts are unchanged) and appends the ``[bs]`` confidences of the step;
- ``SpecDecodeBaseProposer.propose``: stacks them into ``[bs, k]`` float32 beside the returned
  draft tensor (tied to that tensor, so a later zeroed-out draft never reuses stale confidences).
  A parallel drafter (``DFlashProposer``: one pass samples all ``k`` slots of every request, rows
  request-major) makes one ``[bs * k]`` sample call, reshaped to ``[bs, k]``;
- ``GPUModelRunner.take_draft_token_ids`` (the CPU runner inherits it): returns
  :class:`DCutDraftTokenIds`, vLLM's ``DraftTokenIds`` plus ``confidences`` rows in the same
  request order; pickled across processes like its parent.

**The undrafted step.** When the scheduler asks for no drafts after a step (the plan's
``draft_next`` is false, so ``num_spec_tokens_to_schedule = 0``), vLLM's DFlash proposer would still
run its whole pass: the context K/V update and a drafter forward over every request's anchor.
With ``skip_undrafted_block`` (the default) the ``propose`` wrapper runs only :func:`context_only_pass`:
the committed tokens' context K/V, written where vLLM's own pass writes them, so the next drafted
step drafts from the same context; the block forward is skipped and vLLM gets no drafts
(docs/vllm.md, "The undrafted step"). With ``defer_undrafted_context`` (the default) that write waits
for the request's next drafted pass or a full KV-cache block (:mod:`.deferred_context`); the
``GPUModelRunner.propose_draft_token_ids`` wrapper hands the proposer the batch's request ids and
prompt lengths, and the ``GPUModelRunner._update_states`` wrapper drops the waiting tokens of finished,
preempted and resumed requests. Targets with M-RoPE positions write every step.

On the step after an undrafted pass, where no request carries a draft, ``GPUModelRunner._sample`` takes vLLM's plain-decoding sampler instead of the rejection sampler (which,
over zero drafts, samples the same bonus tokens with the same sampler after copying the logits): the
same tokens for greedy and for seeded requests (their own generators draw the same); an unseeded
sampled request draws from the engine-wide generator, which the rejection path also advances (its
recovered-token draw), so its tokens differ from ``skip_undrafted_block: false`` though their
distribution does not. Kept for steps that want logprobs (``logprobs`` or ``logprob_token_ids``) or
track a thinking budget.

The worker also records the draft lengths it verifies (``GPUModelRunner._calc_spec_decode_metadata``,
the ragged ``SpecDecodeMetadata`` the rejection sampler consumes) when the config names a
``record_path``: one JSON line per verification step in ``<record_path>.worker.jsonl``, and one per
DFlash drafter pass in ``<record_path>.drafter.jsonl`` (``pass``: ``"block"``, ``"deferred"`` or
``"context"``; with deferral also ``deferred_written``, the earlier tokens written in the pass, and
``deferred_pending``, the tokens waiting after it).

Drafters without logits (ngram, suffix) never call ``_greedy_sample``; their steps carry no
confidences and the scheduler fails at the first one with a clear message. Heterogeneous-vocabulary
and local-argmax drafters are not captured (the wrapper passes them through).

:func:`install` also installs :mod:`.cpu_kernels` (a correct CPU ``expand_kernel``, without which
speculative decoding at temperature > 0 on CPU samples with garbage temperatures).
"""

from __future__ import annotations

import inspect
import json
import threading
from dataclasses import dataclass
from typing import Any

import torch

from . import cpu_kernels
from .config import DCutVllmConfig, require_vllm_version
from .deferred_context import DeferredContext

__all__ = ["NO_CONFIDENCES", "DCutDraftTokenIds", "context_only_pass", "install"]

#: What the scheduler raises (DCutConfigError) on a drafted step without confidences.
NO_CONFIDENCES = (
    "D-Cut: the drafter's step carries no draft confidences although the speculative config was checked "
    "at start-up, so the worker process did not load the D-Cut worker hooks: install dcut-sched in the "
    "environment the vLLM workers run in (its 'vllm.general_plugins' entry point 'dcut' loads them) and "
    "do not exclude 'dcut' from $VLLM_PLUGINS")

_installed = False
_lock = threading.Lock()


def _config_of(obj: Any) -> DCutVllmConfig | None:
    cached = obj.__dict__.get("_dcut_config", False)
    if cached is False:
        vllm_config = getattr(obj, "vllm_config", None)
        extra = getattr(vllm_config, "additional_config", None)
        cached = DCutVllmConfig.resolve(extra)
        obj.__dict__["_dcut_config"] = cached
    return cached


def _write_context(proposer: Any, rows: torch.Tensor, positions: torch.Tensor, raw_hidden: torch.Tensor,
                   block_table: torch.Tensor) -> None:
    """Write the drafter context K/V of tokens (their request's block-table row, position, captured hidden
    states) at the block-table slot where vLLM's ``copy_and_expand_dflash_inputs`` kernel places them."""
    hidden = proposer.model.combine_hidden_states(raw_hidden)
    block = torch.clamp(positions // proposer.block_size, max=block_table.shape[1] - 1)
    slots = block_table[rows, block].to(torch.int64) * proposer.block_size + positions % proposer.block_size
    proposer.model.precompute_and_store_context_kv(hidden, positions, slots)


def _batch_rows(common_attn_metadata: Any) -> tuple[int, int, list[int]]:
    """(requests, context tokens, tokens per request) of a proposer call's attention metadata."""
    qsl = common_attn_metadata.query_start_loc_cpu
    num_reqs = qsl.shape[0] - 1
    return num_reqs, int(qsl[-1]), (qsl[1:] - qsl[:-1]).tolist()


def _flat_positions(target_positions: torch.Tensor) -> torch.Tensor:
    """The token positions (M-RoPE's ``[3, n]`` positions: their first row, as vLLM's DFlash kernel reads)."""
    return target_positions[0] if target_positions.dim() == 2 else target_positions


def context_only_pass(proposer: Any, target_positions: torch.Tensor, target_hidden_states: torch.Tensor,
                      common_attn_metadata: Any) -> torch.Tensor:
    """A DFlash proposer's pass on a step that drafts nothing: the context K/V of this step's tokens only.

    Writes what ``DFlashProposer.build_model_inputs_first_pass`` writes (every scheduled token's context
    K/V) and runs no drafter forward. Returns the ``[num_reqs, 0]`` draft tensor vLLM's own pass
    returns when asked for no drafts.
    """
    cad = common_attn_metadata
    num_reqs, num_ctx, counts = _batch_rows(cad)
    positions = _flat_positions(target_positions)[:num_ctx]
    req = torch.repeat_interleave(torch.arange(num_reqs, device=positions.device),
                                  torch.as_tensor(counts, device=positions.device), output_size=num_ctx)
    _write_context(proposer, req, positions, target_hidden_states[:num_ctx], cad.block_table_tensor)
    return _no_drafts(proposer, num_reqs, positions.device)


def _no_drafts(proposer: Any, num_reqs: int, device: torch.device) -> torch.Tensor:
    proposer.num_speculative_tokens = 0
    proposer._last_draft_probs = None
    return torch.empty(num_reqs, 0, dtype=torch.int64, device=device)


@dataclass(frozen=True)
class _RunnerBatch:
    """What the runner knows of the proposer's rows: request ids and prompt lengths, in batch order."""

    req_ids: list[str]
    num_prompt_tokens: list[int]


def _deferred_pass(proposer: Any, call: dict, deferred: DeferredContext, batch: _RunnerBatch, *,
                   drafted: bool) -> int:
    """Hand this step's context tokens to ``deferred`` and write what it returns (before vLLM's own pass
    on a ``drafted`` one, which writes this step's tokens and then reads them all); returns how many."""
    cad = call["common_attn_metadata"]
    num_reqs, num_ctx, counts = _batch_rows(cad)
    ends = cad.seq_lens_cpu_upper_bound[:num_reqs].tolist()  # exact without async scheduling, which D-Cut refuses
    write = deferred.step(batch.req_ids[:num_reqs], counts, ends, call["target_hidden_states"][:num_ctx],
                          drafted=drafted, num_prompt_tokens=batch.num_prompt_tokens[:num_reqs])
    if write is None:
        return 0
    _write_context(proposer, write.rows, write.positions, write.hidden, cad.block_table_tensor)
    return int(write.positions.shape[0])


def _fill_unit(proposer: Any) -> int:
    """The KV-cache block, or vLLM's prefix-cache hash block where that is smaller."""
    cache = getattr(getattr(proposer, "vllm_config", None), "cache_config", None)
    hashed = getattr(cache, "hash_block_size", None)
    return min(proposer.block_size, hashed) if hashed else proposer.block_size


def _plain_sampler(runner: Any, cfg: DCutVllmConfig | None, max_drafts: int) -> bool:
    """Whether a verification step samples with vLLM's plain sampler (module docstring): D-Cut active with
    ``skip_undrafted_block``, no request carries a draft, none wants logprobs (``logprobs`` or
    ``logprob_token_ids``: the rejection sampler returns none for the latter, so the plain one would
    return them on undrafted steps only), no thinking budget tracked."""
    if cfg is None or not cfg.skip_undrafted_block or max_drafts != 0:
        return False
    meta = runner.input_batch.sampling_metadata  # vLLM 0.32.0's SamplingMetadata (the version is pinned)
    holder = meta.thinking_budget_state_holder
    return (meta.max_num_logprobs is None and not meta.logprob_token_ids
            and (holder is None or not holder.has_tracked_requests()))


def _record_line(path: str, rec: dict) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec) + "\n")


def install() -> None:
    """Wrap the vLLM methods (idempotent). Raises ``DCutConfigError`` on another vLLM version."""
    global _installed
    with _lock:
        if _installed:
            return
        import vllm
        from vllm.v1.outputs import DraftTokenIds
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        require_vllm_version(vllm.__version__)
        cpu_kernels.install()  # sampling under speculation on CPU (see cpu_kernels)

        @dataclass
        class _DCutDraftTokenIds(DraftTokenIds):
            # num_reqs x num_draft_tokens draft confidences in [0, 1], same order as req_ids.
            confidences: list[list[float]] | None = None

        _DCutDraftTokenIds.__name__ = _DCutDraftTokenIds.__qualname__ = "DCutDraftTokenIds"
        _DCutDraftTokenIds.__module__ = __name__
        globals()["DCutDraftTokenIds"] = _DCutDraftTokenIds

        orig_sample = SpecDecodeBaseProposer._greedy_sample
        orig_propose = SpecDecodeBaseProposer.propose
        orig_take = GPUModelRunner.take_draft_token_ids
        orig_meta = GPUModelRunner._calc_spec_decode_metadata
        orig_sample_tokens = GPUModelRunner._sample
        orig_propose_ids = GPUModelRunner.propose_draft_token_ids
        orig_update_states = GPUModelRunner._update_states
        propose_signature = inspect.signature(orig_propose)

        def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
            steps = self.__dict__.get("_dcut_conf_steps")
            if steps is None or self.use_local_argmax_reduction or self.use_heterogeneous_vocab:
                return orig_sample(self, hidden_states)
            logits = self.model.compute_logits(hidden_states)
            token_ids = logits.argmax(dim=-1)
            lf = logits.float()
            steps.append(torch.exp(lf.max(dim=-1).values - torch.logsumexp(lf, dim=-1)))
            return token_ids

        def propose(self, *args: Any, **kwargs: Any):
            cfg = _config_of(self)
            if cfg is None:
                return orig_propose(self, *args, **kwargs)
            call = propose_signature.bind(self, *args, **kwargs).arguments
            num_spec = int(call["num_speculative_tokens"])
            dflash = self.method == "dflash"
            skip = num_spec == 0 and cfg.skip_undrafted_block and dflash
            batch = self.__dict__.get("_dcut_batch")  # set by propose_draft_token_ids below
            deferred = None
            # M-RoPE targets (positions [3, n]) write every step: deferral keeps token indices, not their rows;
            # it decides on vLLM's host sequence lengths (always set by vLLM 0.32's runner)
            if (dflash and cfg.skip_undrafted_block and cfg.defer_undrafted_context and batch is not None
                    and call["target_positions"].dim() == 1
                    and call["common_attn_metadata"].seq_lens_cpu_upper_bound is not None):
                deferred = self.__dict__.get("_dcut_deferred")
                if deferred is None:
                    deferred = self._dcut_deferred = DeferredContext(_fill_unit(self))
            rec = None
            if dflash and cfg.record_path:
                cad = call["common_attn_metadata"]
                rec = {"pass": ("deferred" if deferred is not None else "context") if skip else "block",
                       "num_speculative_tokens": num_spec, "num_reqs": int(cad.num_reqs),
                       "context_tokens": int(cad.query_start_loc_cpu[-1])}
            if deferred is not None:
                written = _deferred_pass(self, call, deferred, batch, drafted=not skip)
                if rec is not None:
                    rec.update(deferred_written=written, deferred_pending=deferred.num_waiting)
            if rec is not None:
                _record_line(cfg.record_path + ".drafter.jsonl", rec)
            if skip:
                if deferred is not None:
                    out = _no_drafts(self, int(call["common_attn_metadata"].num_reqs), call["target_hidden_states"].device)
                else:
                    out = context_only_pass(self, call["target_positions"], call["target_hidden_states"],
                                            call["common_attn_metadata"])
                self._dcut_conf = (out, None)
                return out
            self._dcut_conf_steps = []
            try:
                out = orig_propose(self, *args, **kwargs)
            finally:
                steps, self._dcut_conf_steps = self._dcut_conf_steps, None
            conf = None
            if torch.is_tensor(out) and out.dim() == 2 and out.shape[1] > 0:
                if len(steps) == 1 and out.shape[1] > 1 and steps[0].numel() >= out.numel():
                    # parallel drafting: one sample call over request-major [bs * k] rows
                    conf = steps[0][: out.numel()].view(out.shape).to(torch.float32)
                elif len(steps) == out.shape[1]:
                    conf = torch.stack(steps, dim=1)[: out.shape[0]].to(torch.float32)
            self._dcut_conf = (out, conf)
            return out

        def propose_draft_token_ids(self, scheduler_output, *args: Any, **kwargs: Any):
            drafter = getattr(self, "drafter", None)
            if drafter is None or _config_of(self) is None:
                return orig_propose_ids(self, scheduler_output, *args, **kwargs)
            n = self.input_batch.num_reqs
            drafter._dcut_batch = _RunnerBatch(list(self.input_batch.req_ids),  # the proposer's rows, in order
                                               self.input_batch.num_prompt_tokens[:n].tolist())
            try:
                return orig_propose_ids(self, scheduler_output, *args, **kwargs)
            finally:
                drafter._dcut_batch = None

        def _update_states(self, scheduler_output):
            result = orig_update_states(self, scheduler_output)
            deferred = getattr(getattr(self, "drafter", None), "_dcut_deferred", None)
            if deferred is not None:  # finished, preempted (blocks freed) and resumed (recomputed) requests
                deferred.retain(self.requests.keys(), set(scheduler_output.finished_req_ids)
                                | set(scheduler_output.preempted_req_ids or ())
                                | set(scheduler_output.scheduled_cached_reqs.resumed_req_ids))
            return result

        def take_draft_token_ids(self):
            result = orig_take(self)
            if result is None or _config_of(self) is None:
                return result
            held = getattr(getattr(self, "drafter", None), "_dcut_conf", None)
            conf_rows = None
            if held is not None and held[0] is self._draft_token_ids and held[1] is not None:
                conf_rows = held[1][: len(result.req_ids)].cpu().tolist()
            return _DCutDraftTokenIds(result.req_ids, result.draft_token_ids, conf_rows)

        def _calc_spec_decode_metadata(self, num_draft_tokens, cu_num_scheduled_tokens):
            cfg = _config_of(self)
            if cfg is not None and cfg.record_path:
                n = len(num_draft_tokens)
                rec = {"req_ids": list(self.input_batch.req_ids[:n]),
                       "num_draft_tokens": [int(x) for x in num_draft_tokens],
                       "sampler": "plain" if _plain_sampler(self, cfg, int(max(num_draft_tokens, default=0)))
                       else "rejection"}
                _record_line(cfg.record_path + ".worker.jsonl", rec)
            return orig_meta(self, num_draft_tokens, cu_num_scheduled_tokens)

        def _sample(self, logits, spec_decode_metadata):
            if spec_decode_metadata is not None and _plain_sampler(self, _config_of(self),
                                                                   int(spec_decode_metadata.max_spec_len)):
                spec_decode_metadata = None  # one logits row per request, in request order
            return orig_sample_tokens(self, logits, spec_decode_metadata)

        SpecDecodeBaseProposer._greedy_sample = _greedy_sample
        SpecDecodeBaseProposer.propose = propose
        GPUModelRunner.take_draft_token_ids = take_draft_token_ids
        GPUModelRunner._calc_spec_decode_metadata = _calc_spec_decode_metadata
        GPUModelRunner._sample = _sample
        GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
        GPUModelRunner._update_states = _update_states
        _installed = True


DCutDraftTokenIds: Any = None  # set by install() (the class derives from vLLM's DraftTokenIds)
