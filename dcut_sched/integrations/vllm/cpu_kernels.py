"""A correct CPU ``expand_kernel`` for vLLM 0.32.0: sampling at temperature > 0 under speculation on CPU.

vLLM's rejection sampler spreads each request's sampling parameters over its draft tokens with
``expand_batch_to_tokens`` (``[bs]`` -> ``[num_tokens]``, e.g. temperature ``[a, b]`` with
``cu_num_tokens = [2, 5]`` gives ``[a, a, b, b, b]``), which launches the Triton ``expand_kernel``.
On CPU, vLLM 0.32.0 replaces that kernel with ``vllm.utils.cpu_triton_utils._expand_kernel_impl``,
which hands ``output.to(torch.int64)`` and ``input.to(torch.int64)`` to the C++ op. For the float
temperature and top-p tensors that truncates the values and writes into a temporary copy, so the
output keeps whatever ``new_empty`` left in it: draft positions are sampled with garbage
temperatures, and speculative decoding at temperature > 0 on CPU produces degenerate text.

:func:`expand_kernel` computes the same thing in the output's own dtype with two torch ops, and
:func:`install` registers it through vLLM's documented override point
(``vllm.triton_utils.dispatcher.register_kernels``) right after the CPU platform registers its own
fallbacks (``CpuPlatform.register_triton_kernel_overrides``, which each worker calls after loading
the general plugins, so a plain registration from the plugin would be overwritten). Only the CPU
platform is touched. Installed by :func:`dcut_sched.integrations.vllm.hooks.install`.
"""

from __future__ import annotations

import torch

__all__ = ["EXPAND_KERNEL", "expand_kernel", "install"]

#: The kernel's fully qualified name in vLLM 0.32.0 (the key ``register_kernels`` expects).
EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"

_installed = False


def expand_kernel(output_ptr: torch.Tensor, input_ptr: torch.Tensor, cu_num_tokens_ptr: torch.Tensor,
                  replace_from: float, replace_to: float, MAX_NUM_TOKENS: int | None = None) -> None:  # noqa: N803
    """``output[start_i:end_i] = replace_to if input[i] == replace_from else input[i]`` for each request i.

    The Triton kernel's contract (vllm/v1/sample/rejection_sampler.py, ``expand_kernel``), with its
    parameter names, in the output's dtype.

    Args:
        output_ptr: ``[num_tokens]`` tensor written in place (any dtype; float for temperature, top-p).
        input_ptr: ``[bs]`` per-request values, same dtype family as ``output_ptr``.
        cu_num_tokens_ptr: ``[bs]`` integer cumulative token counts (``cu[i]`` = tokens of requests
            ``0..i``); ``start_i = cu[i-1]`` (0 for the first), ``end_i = cu[i]``.
        replace_from, replace_to: a value of ``input`` to substitute (vLLM maps the greedy
            temperature to 1 this way).
        MAX_NUM_TOKENS: the Triton launch's block width; unused here.
    """
    cu = cu_num_tokens_ptr.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = input_ptr.masked_fill(input_ptr == replace_from, replace_to)
    total = int(cu[-1]) if cu.numel() else 0
    output_ptr[:total].copy_(torch.repeat_interleave(values, counts))


def install() -> None:
    """Register :func:`expand_kernel` after the CPU platform's own overrides (idempotent, CPU only)."""
    global _installed
    if _installed:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.platforms.cpu import CpuPlatform
    from vllm.triton_utils.dispatcher import register_kernels

    platform_overrides = CpuPlatform.register_triton_kernel_overrides.__func__

    def register_triton_kernel_overrides(cls) -> None:
        platform_overrides(cls)
        register_kernels({EXPAND_KERNEL: expand_kernel})

    CpuPlatform.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)
    _installed = True
