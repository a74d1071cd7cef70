"""Static (pre-allocated, fixed-shape) key/value cache."""

from __future__ import annotations

from typing import Iterable

import torch

from dcut_sched.model.config import LlamaConfig


class KVCache:
    """Per-layer K and V storage for `max_batch_size` rows of `max_seq_len` slots.

    Layout: `k`, `v` are [n_held_layers, max_batch_size, num_kv_heads, max_seq_len, head_dim]
    (heads before slots, gpt-fast style): `k[j, b]` is already the [kv_heads, S, head_dim] shape
    `scaled_dot_product_attention` wants, so reading a row's keys is a view, not a copy; writes
    scatter T tokens per call, which is the cheap side.

    `layers` lists the (absolute) layer indices this cache holds (default: all); a self-speculative
    drafter that skips layers holds only the layers it runs. `layer_slot[i]` maps layer index ->
    first axis of `k`/`v`.

    Semantics (enforced by `LlamaModel.forward`, not here): a slot is just storage; what a query
    sees is decided by the attention mask (default: slots <= the query's position). The cache
    does not track lengths: "rollback" is the caller forgetting slots, which later writes
    overwrite. Memory starts zeroed so unwritten (masked) slots never inject NaN/Inf.
    """

    def __init__(self, config: LlamaConfig, max_batch_size: int, max_seq_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 layers: Iterable[int] | None = None):
        if max_batch_size <= 0 or max_seq_len <= 0:
            raise ValueError(f"KVCache: max_batch_size ({max_batch_size}) and max_seq_len "
                             f"({max_seq_len}) must be positive")
        self.config = config
        self.max_batch_size = int(max_batch_size)
        self.max_seq_len = int(max_seq_len)
        held = tuple(range(config.num_layers)) if layers is None else tuple(sorted(set(int(i) for i in layers)))
        bad = [i for i in held if not 0 <= i < config.num_layers]
        if bad:
            raise ValueError(f"KVCache: layer indices {bad} out of range [0, {config.num_layers})")
        self.layers = held
        self.layer_slot = {layer: j for j, layer in enumerate(held)}
        shape = (len(held), self.max_batch_size, config.num_kv_heads, self.max_seq_len, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) views [max_batch, kv_heads, max_seq_len, head_dim] of absolute layer `layer_idx`.

        Raises:
            KeyError: the cache does not hold that layer (e.g. a drafter cache asked for a
                skipped layer); build the cache with `layers=` covering the layers you run.
        """
        try:
            j = self.layer_slot[layer_idx]
        except KeyError:
            raise KeyError(f"KVCache holds layers {self.layers}, not layer {layer_idx}; create it "
                           "with layers= including every layer passed to forward()") from None
        return self.k[j], self.v[j]

    def reset(self) -> None:
        """Zero all slots (never required for correctness; useful for debugging)."""
        self.k.zero_()
        self.v.zero_()
