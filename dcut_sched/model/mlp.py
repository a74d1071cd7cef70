"""Feed-forward blocks. The MLP is its own module so that an MoE variant can slot in here.

Extension point: `build_mlp(config, layer_idx, ...)` is the only place `LlamaBlock` asks for its
feed-forward module. An MoE implementation adds its fields to the config (e.g. `num_experts`)
and returns its own module from `build_mlp` for those configs; the module must map
[bs, T, hidden] -> [bs, T, hidden] in the model dtype and keep its parameters under `mlp.`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dcut_sched.model.config import LlamaConfig


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); x [..., hidden] -> [..., hidden], no biases."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype | None = None, device: torch.device | str | None = None):
        super().__init__()
        kw = dict(bias=False, dtype=dtype, device=device)
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, **kw)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, **kw)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def build_mlp(config: LlamaConfig, layer_idx: int, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> nn.Module:
    """Feed-forward module of block `layer_idx` (dense SwiGLU for every current config)."""
    return LlamaMLP(config, dtype=dtype, device=device)
