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

**A failed engine must not poison the next one.** Every registration (the CPU platform's own, in
each new engine's worker, and this one) rescans ``sys.modules`` in vLLM's
``dispatcher._rebind_kernels``, which reads ``vars(value).get("kernel")`` for every module
attribute that answers ``hasattr(value, "__dict__")``. Once numba is imported (vLLM's ngram
proposer imports it), ``llvmlite.binding.ffi.lib`` is such a value whose ``__getattr__`` hands back
a function wrapper for ``__dict__``, so every later registration in that process raises
``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'`` and no engine starts again.
:func:`rebind_kernels` does the same rebinding reading instance dictionaries without attribute
hooks, and :func:`install` puts it in the dispatcher's place.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable, Iterable, Mapping

import torch

__all__ = ["EXPAND_KERNEL", "expand_kernel", "install", "rebind_kernels"]

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


def _own_namespace(value: Any) -> Mapping[str, Any] | None:
    """``value``'s own attribute mapping (instance or class ``__dict__``), read without ``__getattr__``
    hooks; ``None`` when it has none or the hook-free read is not a mapping."""
    try:
        namespace = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        return None
    return namespace if isinstance(namespace, (dict, types.MappingProxyType)) else None


def rebind_kernels(overrides: Iterable[tuple[Any, Callable[..., Any]]]) -> None:
    """Point every holder of an overridden kernel at its wrapper (vLLM's ``_rebind_kernels`` contract).

    Two kinds of holder, in every module of ``sys.modules``: a module attribute that *is* the
    original kernel (a ``from mod import kernel`` copy) is rebound to the wrapper; an attribute
    whose own ``kernel`` attribute is the original (a JIT warm-up owner, instance or class) gets the
    wrapper there, and an instance also drops its cached ``_kernel_arg_names``. Kernels are compared
    by identity only.
    """
    wrapper_of = {id(original): (original, wrapper) for original, wrapper in overrides}

    def wrapper_for(value: Any) -> Callable[..., Any] | None:
        hit = wrapper_of.get(id(value))
        return hit[1] if hit is not None and hit[0] is value else None

    for module in list(sys.modules.values()):
        namespace = _own_namespace(module)
        if not namespace:
            continue
        for attr, value in list(namespace.items()):
            wrapper = wrapper_for(value)
            if wrapper is not None:
                setattr(module, attr, wrapper)
                continue
            owned = _own_namespace(value)
            wrapper = wrapper_for(owned.get("kernel")) if owned is not None else None
            if wrapper is None:
                continue
            value.kernel = wrapper
            if not isinstance(value, type):
                value.__dict__.pop("_kernel_arg_names", None)


def install() -> None:
    """Register :func:`expand_kernel` after the CPU platform's own overrides, and replace the
    dispatcher's rebinding scan with :func:`rebind_kernels` (idempotent, CPU only)."""
    global _installed
    if _installed:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.platforms.cpu import CpuPlatform
    from vllm.triton_utils import dispatcher
    from vllm.triton_utils.dispatcher import register_kernels

    dispatcher._rebind_kernels = rebind_kernels  # register_kernels looks it up at call time

    platform_overrides = CpuPlatform.register_triton_kernel_overrides.__func__

    def register_triton_kernel_overrides(cls) -> None:
        platform_overrides(cls)
        register_kernels({EXPAND_KERNEL: expand_kernel})

    CpuPlatform.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)
    _installed = True
