"""A minimal single-request greedy speculative-decoding loop (draft k, verify, accept prefix + bonus).

Not the project's engine: a compact reference that exercises the forward/cache/drafter contracts
end to end and measures the drafter's acceptance. Its output equals `greedy_generate` token for
token (up to floating-point near-ties, see generate.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from dcut_sched.model.drafter import SelfSpecDrafter
from dcut_sched.model.llama import LlamaModel


@dataclass
class SpecResult:
    """tokens: generated ids (prompt excluded); accepted: drafts accepted at each verify step
    (0..num_draft, the bonus token not counted); confidences: per step, the drafter's
    confidences [num_draft] (float list)."""

    tokens: list[int]
    accepted: list[int] = field(default_factory=list)
    confidences: list[list[float]] = field(default_factory=list)

    @property
    def mean_accepted(self) -> float:
        return sum(self.accepted) / max(len(self.accepted), 1)


@torch.inference_mode()
def speculative_greedy(model: LlamaModel, drafter: SelfSpecDrafter, prompt: Sequence[int],
                       max_new_tokens: int, eos_id: int | None, num_draft: int = 8,
                       row: int = 0) -> SpecResult:
    """Greedy speculative decoding of one prompt with `drafter` (its cache row `row` is reset).

    Each step verifies [current, d_1..d_k] at positions n-1..n-1+k with one target forward,
    accepts the longest prefix of drafts equal to the target's argmax, and appends the target's
    next token (bonus). Output is truncated at `max_new_tokens` / after `eos_id`.
    """
    prompt = list(prompt)
    n0 = len(prompt)
    if n0 == 0:
        raise ValueError("speculative_greedy: empty prompt")
    dev = model.device
    cache = model.new_cache(1, n0 + max_new_tokens + num_draft + 1)
    if n0 > 1:
        model.prefill(torch.tensor([prompt[:-1]], device=dev), cache)
    drafter.reset([row])
    seq = list(prompt)
    res = SpecResult(tokens=[])
    while len(seq) - n0 < max_new_tokens and not (eos_id is not None and seq[-1] == eos_id and len(seq) > n0):
        n = len(seq)
        drafts, conf = drafter.draft([seq], num_draft, rows=[row])
        d = drafts[0].tolist()
        ids = torch.tensor([[seq[-1]] + d], device=dev)
        pos = torch.arange(n - 1, n + num_draft, device=dev)[None]
        target = model(ids, pos, cache)[0].argmax(-1).tolist()  # [k+1]
        a = 0
        while a < num_draft and d[a] == target[a]:
            a += 1
        res.accepted.append(a)
        res.confidences.append(conf[0].tolist())
        seq.extend(d[:a] + [target[a]])
    new = seq[n0:]
    if eos_id is not None and eos_id in new:
        new = new[:new.index(eos_id) + 1]
    res.tokens = new[:max_new_tokens]
    return res
