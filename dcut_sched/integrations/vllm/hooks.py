"""Worker-side hooks into vLLM 0.32.0 (imported only inside vLLM): capture draft confidences.

vLLM's greedy draft proposers (``SpecDecodeBaseProposer._greedy_sample``, used by the
``draft_model`` method and by EAGLE-style drafters) keep only the argmax of each draft step's
logits. :func:`install` wraps three methods so that, while a D-Cut config is active
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
(docs/vllm.md, "The undrafted step"). On the step that follows, where no request carries a draft,
``GPUModelRunner._sample`` takes vLLM's plain-decoding sampler instead of the rejection sampler (which,
over zero drafts, samples the same bonus tokens with the same sampler after copying the logits): the
same tokens for greedy and for seeded requests (their own generators draw the same); an unseeded
sampled request draws from the engine-wide generator, which the rejection path also advances (its
recovered-token draw), so its tokens differ from ``skip_undrafted_block: false`` though their
distribution does not. Kept for steps that want logprobs (``logprobs`` or ``logprob_token_ids``) or
track a thinking budget.

The worker also records the draft lengths it verifies (``GPUModelRunner._calc_spec_decode_metadata``,
the ragged ``SpecDecodeMetadata`` the rejection sampler consumes) when the config names a
``record_path``: one JSON line per verification step in ``<record_path>.worker.jsonl``, and one per
DFlash drafter pass in ``<record_path>.drafter.jsonl`` (``pass``: ``"block"`` or ``"context"``).

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


def context_only_pass(proposer: Any, target_positions: torch.Tensor, target_hidden_states: torch.Tensor,
                      common_attn_metadata: Any) -> torch.Tensor:
    """A DFlash proposer's pass on a step that drafts nothing: the context K/V of this step's tokens only.

    Writes what ``DFlashProposer.build_model_inputs_first_pass`` writes (every scheduled token's
    context K/V at its target position and its block-table slot, as vLLM's
    ``copy_and_expand_dflash_inputs`` kernel places them) and runs no drafter forward. Returns the
    ``[num_reqs, 0]`` draft tensor vLLM's own pass returns when asked for no drafts.
    """
    cad = common_attn_metadata
    proposer.num_speculative_tokens = 0
    proposer._last_draft_probs = None
    qsl = cad.query_start_loc
    num_reqs = qsl.shape[0] - 1
    num_ctx = int(cad.query_start_loc_cpu[-1])
    hidden = proposer.model.combine_hidden_states(target_hidden_states[:num_ctx])
    positions = target_positions[:num_ctx]
    req = torch.repeat_interleave(torch.arange(num_reqs, device=positions.device), qsl[1:] - qsl[:-1],
                                  output_size=num_ctx)
    table = cad.block_table_tensor
    block = torch.clamp(positions // proposer.block_size, max=table.shape[1] - 1)
    slots = table[req, block].to(torch.int64) * proposer.block_size + positions % proposer.block_size
    proposer.model.precompute_and_store_context_kv(hidden, positions, slots)
    return torch.empty(num_reqs, 0, dtype=torch.int64, device=positions.device)


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
            if self.method == "dflash" and cfg.record_path:
                cad = call["common_attn_metadata"]
                _record_line(cfg.record_path + ".drafter.jsonl", {
                    "pass": "context" if num_spec == 0 and cfg.skip_undrafted_block else "block",
                    "num_speculative_tokens": num_spec, "num_reqs": int(cad.num_reqs),
                    "context_tokens": int(cad.query_start_loc_cpu[-1])})
            if num_spec == 0 and cfg.skip_undrafted_block and self.method == "dflash":
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
        _installed = True


DCutDraftTokenIds: Any = None  # set by install() (the class derives from vLLM's DraftTokenIds)
