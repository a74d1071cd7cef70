"""What gets timed: the project's own forward (``dcut_sched.model``) for each profile cell.

A *workload* hands the harness one zero-argument callable per cell; the eager timer calls it, the
CUDA-graph timer captures it once and replays the graph. Any object with ``fn_for(cell)`` and
``describe()`` is a workload (tests use a tiny stand-in); :class:`ForwardWorkload` is the real one.

Verification cell (bs, num_tokens), with c = ``context_len`` and B = ``block_size``:
    ``LlamaModel.forward`` on ``input_ids [bs, T]`` with ``T = ceil(num_tokens / bs)``, positions
    ``c .. c+T-1``, attending to the ``c`` cached slots (random K/V) plus the block, causally
    (``kv_len = c + T``), logits at every slot. When ``num_tokens`` is a multiple of ``bs`` every
    request verifies ``T`` slots; otherwise the first ``num_tokens - bs*(T-1)`` requests verify T and
    the rest T-1, and each shorter request is padded with one token that writes a scratch cache slot
    no query can see. The forward is [bs, T] either way, so a cell costs what the balanced padded
    batch costs, which is what this dense forward does for any budget of that size. (An engine that
    pads every request to the *longest* prefix L_max pays the cell ``bs * L_max`` instead; a packed
    variable-length kernel would make the curve smoother between multiples of bs.)

Plain decode cell ``ar`` (bs):
    the step an engine runs without speculation, as :func:`dcut_sched.model.generate.greedy_generate`
    runs it: ``LlamaModel.forward`` on ``input_ids [bs, 1]`` at position ``c``, the default causal
    mask over the ``c`` cached slots plus itself (``kv_len = c + 1``), K/V written at slot ``c``, no
    per-slot cache remapping, no padding, logits of the one token. On a GPU the timer captures this
    whole step as one full CUDA graph (:mod:`dcut_sched.profiler.cuda_graphs`), which is how serving engines
    run plain decode. On this project's CPU forward the verification cell ``(bs, bs)`` does nearly
    the same work; on an engine whose verification runs piecewise graphs and variable-length
    attention the two differ a lot (docs/design.md §1), which is why the AR step is its own cell.

Draft cell (bs):
    ``self-skip:I,J``: ``SelfSpecDrafter(model, skip_layers).propose`` of B-1 tokens from one
    pending token per request: B-1 sequential one-token forwards of the target without layers I, J,
    each followed by argmax and confidence (the drafter the recorded traces use).
    ``dflash:N`` / ``dflash:CONFIG``: one forward of a random-weight drafter (N layers of the target's
    width sharing its embedding and LM head, or the given config) on B tokens per request with its
    own KV cache filled to ``c``, logits at every slot (a DFlash-style block drafter).
    ``dflash:FOLDER`` (a trained DFlash drafter, ``dcut-drafter train``): the engine's own
    :class:`~dcut_sched.drafters.runtime.DFlashDrafter` with the folder's weights and a context of
    ``c`` tokens per request: one context-feature update of one verified token per request
    (``extend``), then the block forward of the anchor and B-1 mask slots (``draft``), confidences
    included. Further verified tokens of a step cost a few more rows of that update (small next to
    the block forward; docs/drafters.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch

from dcut_sched.drafters.checkpoint import load_checkpoint
from dcut_sched.drafters.runtime import DFlashDrafter
from dcut_sched.model.config import LlamaConfig
from dcut_sched.model.drafter import SelfSpecDrafter
from dcut_sched.model.llama import LlamaModel

from .analytic import DraftSpec
from .grid import Cell
from .shapes import resolve_model

__all__ = ["ForwardWorkload", "padded_layout"]


def padded_layout(batch_size: int, num_tokens: int) -> tuple[int, list[int]]:
    """``(T, per_request)``: the [bs, T] shape of a verification cell and each request's real slots.

    ``T = ceil(num_tokens / bs)``; the first ``num_tokens - bs*(T-1)`` requests get T slots, the rest
    T-1 (so ``sum(per_request) == num_tokens``).

    Raises:
        ValueError: ``num_tokens`` outside ``[bs, ...]`` (every request verifies its anchor).
    """
    if batch_size < 1 or num_tokens < batch_size:
        raise ValueError(f"num_tokens={num_tokens} must be >= batch_size={batch_size} >= 1")
    t = math.ceil(num_tokens / batch_size)
    full = num_tokens - batch_size * (t - 1)
    return t, [t] * full + [t - 1] * (batch_size - full)


def _is_dflash_folder(config: Any) -> bool:
    """A ``dflash:CONFIG`` argument naming a trained DFlash drafter folder (``architectures`` is
    ``DFlashDraftModel`` in its config.json), not a layer count or a target preset."""
    if not isinstance(config, str) or not (Path(config) / "config.json").is_file():
        return False
    try:
        return json.loads((Path(config) / "config.json").read_text()).get("architectures") == ["DFlashDraftModel"]
    except (OSError, ValueError, AttributeError):
        return False


def _fill_context(k: torch.Tensor, v: torch.Tensor, context_len: int, gen: torch.Generator) -> None:
    """Random K/V in slots [0, context_len) of cache tensors [layers, rows, heads, slots, head_dim]."""
    if context_len <= 0:
        return
    for t in (k, v):
        t[:, :, :, :context_len].normal_(0.0, 1.0, generator=gen)


class ForwardWorkload:
    """Random-weight target (and drafter) with static KV caches, one callable per cell.

    Args:
        config: target shape (a dense ``LlamaConfig``).
        block_size: B.
        context_len: cached tokens per request during every cell.
        max_batch_size: largest batch size any cell uses (cache rows).
        draft: draft step to time (``DraftSpec``; kind ``"none"`` = no draft cells).
        dtype, device: of weights, caches and activations.
        seed: weights, cache contents and input ids.

    Raises:
        ValueError: a draft spec that does not fit the target (skipped layer out of range, a MoE or
            unreadable drafter config).
    """

    def __init__(self, config: LlamaConfig, block_size: int, context_len: int, max_batch_size: int,
                 draft: DraftSpec, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 seed: int = 0):
        self.config = config
        self.block_size = int(block_size)
        self.context_len = int(context_len)
        self.max_batch_size = int(max_batch_size)
        self.draft = draft
        self.dtype = dtype
        self.device = torch.device(device)
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self.model = LlamaModel.random_init(config, seed=seed, dtype=dtype, device=self.device)
        # One scratch slot after the block for padding writes.
        self.max_seq_len = self.context_len + self.block_size + 1
        self.scratch_slot = self.max_seq_len - 1
        self.cache = self.model.new_cache(self.max_batch_size, self.max_seq_len)
        _fill_context(self.cache.k, self.cache.v, self.context_len, self._gen)
        self.drafter: Any = None
        self.draft_config: LlamaConfig | None = None
        if draft.kind == "self-skip":
            self.drafter = SelfSpecDrafter(self.model, draft.skip_layers, max_batch_size=self.max_batch_size,
                                           max_seq_len=self.context_len + self.block_size)
            _fill_context(self.drafter.cache.k, self.drafter.cache.v, self.context_len, self._gen)
        elif draft.kind == "dflash" and _is_dflash_folder(draft.config):
            self.drafter = DFlashDrafter(load_checkpoint(draft.config), self.model, max_batch_size=self.max_batch_size,
                                         max_seq_len=self.max_seq_len)
            fs = self.drafter.model.config.feature_size
            rows = list(range(self.max_batch_size))
            if self.context_len > 1:
                feats = torch.randn(self.context_len - 1, fs, generator=self._gen, device=self.device).to(dtype)
                self.drafter.extend(rows, [feats] * len(rows), [0] * len(rows))
            self._feature_row = torch.randn(1, fs, generator=self._gen, device=self.device).to(dtype)
        elif draft.kind == "dflash":
            self.draft_config = self._dflash_config(draft)
            self.drafter = LlamaModel.random_init(self.draft_config, seed=seed + 1, dtype=dtype, device=self.device)
            if (self.draft_config.vocab_size, self.draft_config.hidden_size) == (config.vocab_size, config.hidden_size):
                # DFlash drafters share the target's embedding and LM head.
                self.drafter.embed_tokens = self.model.embed_tokens
                self.drafter.lm_head = self.model.lm_head
            self.draft_cache = self.drafter.new_cache(self.max_batch_size, self.max_seq_len)
            _fill_context(self.draft_cache.k, self.draft_cache.v, self.context_len, self._gen)

    def _dflash_config(self, draft: DraftSpec) -> LlamaConfig:
        if draft.config is None:
            return self.config.replace(num_layers=draft.num_layers, name=f"{self.config.name}-dflash{draft.num_layers}")

        _, cfg = resolve_model(draft.config)
        if cfg is None:
            raise ValueError(f"draft config {draft.config!r} is MoE; the measured modes need a dense drafter")
        return cfg

    # ------------------------------------------------------------------ cells
    def _ids(self, bs: int, t: int) -> torch.Tensor:
        return torch.randint(0, self.config.vocab_size, (bs, t), generator=self._gen, device=self.device)

    def verify_fn(self, batch_size: int, num_tokens: int) -> Callable[[], torch.Tensor]:
        """Callable running the verification forward of cell (batch_size, num_tokens) (module docstring).

        The callable returns logits float32 [bs, T, vocab]; its ``inputs`` attribute holds the static
        ``input_ids``/``position_ids``/``cache_slots`` [bs, T] int64, ``kv_len`` and ``per_request``.

        Raises:
            ValueError: batch size above ``max_batch_size`` or more than B tokens per request.
        """
        if batch_size > self.max_batch_size:
            raise ValueError(f"batch_size={batch_size} > max_batch_size={self.max_batch_size}")
        t, per_request = padded_layout(batch_size, num_tokens)
        if t > self.block_size:
            raise ValueError(f"num_tokens={num_tokens} exceeds batch_size*block_size={batch_size * self.block_size}")
        c = self.context_len
        ids = self._ids(batch_size, t)
        pos = (c + torch.arange(t, device=self.device))[None, :].repeat(batch_size, 1)
        slots = pos.clone()
        for b, n in enumerate(per_request):
            slots[b, n:] = self.scratch_slot
        model, cache, kv_len = self.model, self.cache, c + t

        def run() -> torch.Tensor:
            with torch.inference_mode():
                return model(ids, pos, cache, cache_slots=slots, kv_len=kv_len)

        run.inputs = {"input_ids": ids, "position_ids": pos, "cache_slots": slots, "kv_len": kv_len,  # type: ignore[attr-defined]
                      "per_request": per_request}
        return run

    def ar_fn(self, batch_size: int) -> Callable[[], torch.Tensor]:
        """Callable running one plain decode step for ``batch_size`` requests (module docstring).

        The callable returns logits float32 [bs, 1, vocab]; its ``inputs`` attribute holds the static
        ``input_ids``/``position_ids`` [bs, 1] int64 and ``kv_len``.

        Raises:
            ValueError: batch size above ``max_batch_size``.
        """
        if not 1 <= batch_size <= self.max_batch_size:
            raise ValueError(f"batch_size={batch_size} must be in 1..max_batch_size={self.max_batch_size}")
        c = self.context_len
        ids = self._ids(batch_size, 1)
        pos = torch.full((batch_size, 1), c, dtype=torch.long, device=self.device)
        model, cache, kv_len = self.model, self.cache, c + 1

        def run() -> torch.Tensor:
            with torch.inference_mode():
                return model(ids, pos, cache, kv_len=kv_len)

        run.inputs = {"input_ids": ids, "position_ids": pos, "kv_len": kv_len}  # type: ignore[attr-defined]
        return run

    def draft_fn(self, batch_size: int) -> Callable[[], Any]:
        """Callable running one draft step for ``batch_size`` requests (module docstring).

        Raises:
            ValueError: the workload has no drafter (draft spec ``none``).
        """
        c, B = self.context_len, self.block_size
        if self.draft.kind == "self-skip":
            drafter = self.drafter
            ids = self._ids(batch_size, 1)
            pos = torch.full((batch_size, 1), c, dtype=torch.long, device=self.device)

            def run_skip() -> Any:
                return drafter.propose(ids, pos, B - 1, kv_len=c + B)

            return run_skip
        if self.draft.kind == "dflash" and _is_dflash_folder(self.draft.config):
            drafter, feat = self.drafter, self._feature_row
            rows = list(range(batch_size))
            seqs = [[1] * (c + 1)] * batch_size
            start = max(c - 1, 0)

            def run_dflash() -> Any:
                for r in rows:
                    drafter.context_len[r] = start
                drafter.extend(rows, [feat] * batch_size, [start] * batch_size)
                return drafter.draft(seqs, B - 1, rows=rows)

            return run_dflash
        if self.draft.kind == "dflash":
            drafter, cache = self.drafter, self.draft_cache
            ids = self._ids(batch_size, B)
            pos = (c + torch.arange(B, device=self.device))[None, :].repeat(batch_size, 1)

            def run_block() -> torch.Tensor:
                with torch.inference_mode():
                    return drafter(ids, pos, cache, kv_len=c + B)

            return run_block
        raise ValueError("this workload has no draft step (draft spec 'none')")

    def fn_for(self, cell: Cell) -> Callable[[], Any]:
        """The callable of ``cell`` (verify, ar or draft)."""
        if cell.kind == "verify":
            return self.verify_fn(cell.batch_size, cell.num_tokens)
        if cell.kind == "ar":
            return self.ar_fn(cell.batch_size)
        return self.draft_fn(cell.batch_size)

    def describe(self) -> dict[str, Any]:
        """Model metadata for the curve file: name, config, dtype, draft step and its config."""
        out: dict[str, Any] = {
            "name": self.config.name,
            "config": self.config.to_dict(),
            "dtype": str(self.dtype).removeprefix("torch."),
            "weights": "random (cost depends on shapes, not values)",
            "draft": self.draft.label(),
        }
        if self.draft_config is not None:
            out["draft_config"] = self.draft_config.to_dict()
        return out
