"""Offline tokenizer and chat template read from a GGUF file (via transformers).

transformers converts the GGUF's gpt2-BPE vocabulary/merges and chat template into a fast
tokenizer (`AutoTokenizer.from_pretrained(dir, gguf_file=name)`, needs `transformers` and
`tokenizers`; no network). That conversion is slow (timings: docs/model.md), so the converted
tokenizer is saved once to `cache_dir()/<gguf cache key>-tokenizer/` (atomic directory rename) and
later loads read that.
Special ids (EOS/BOS/PAD) are read from the GGUF metadata itself and stored next to it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dcut_sched.model.gguf_file import gguf_field, open_gguf
from dcut_sched.model.gguf_weights import cache_dir, cache_key, smollm2_gguf_path

_TOKENIZER_CACHE_VERSION = 1


def _require_transformers() -> Any:
    try:
        import transformers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("dcut_sched.model.tokenizer needs Hugging Face transformers to read the "
                          "GGUF tokenizer: `pip install transformers` (or `pip install "
                          "'dcut-sched[models]'`)") from e
    import transformers

    return transformers


class GGUFTokenizer:
    """Tokenizer + chat template + special ids of a GGUF model.

    Attributes:
        hf: the underlying transformers fast tokenizer.
        eos_id / bos_id / pad_id: ids from the GGUF metadata (`tokenizer.ggml.*_token_id`; None if absent).
        add_bos: GGUF `tokenizer.ggml.add_bos_token` (False for SmolLM2).
    """

    def __init__(self, hf_tokenizer: Any, eos_id: int, bos_id: int | None, pad_id: int | None, add_bos: bool):
        self.hf = hf_tokenizer
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.pad_id = pad_id
        self.add_bos = add_bos

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        """Token ids of raw `text` (special-token strings such as `<|im_start|>` are recognised;
        BOS prepended only if the GGUF says add_bos_token)."""
        ids = self.hf.encode(text, add_special_tokens=False)
        if self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render `messages` ([{"role": ..., "content": ...}]) with the GGUF's chat template."""
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def chat_ids(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered chat (the template already contains any special tokens)."""
        return self.hf.encode(self.apply_chat_template(messages, add_generation_prompt), add_special_tokens=False)


def load_gguf_tokenizer(path: str | os.PathLike, use_cache: bool = True) -> GGUFTokenizer:
    """Tokenizer of the GGUF at `path`, offline (see module docstring for the cache).

    Raises:
        ImportError: transformers missing (message says what to install).
        FileNotFoundError: `path` missing.
        KeyError: the GGUF has no `tokenizer.ggml.eos_token_id`.
    """
    transformers = _require_transformers()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    tdir = cache_dir() / f"{cache_key(path)}-tokenizer-v{_TOKENIZER_CACHE_VERSION}"
    meta_file = tdir / "dcut_special_ids.json"
    if use_cache and meta_file.is_file():
        try:
            meta = json.loads(meta_file.read_text())
            hf = transformers.AutoTokenizer.from_pretrained(str(tdir), local_files_only=True)
            return GGUFTokenizer(hf, **meta)
        except Exception:  # noqa: BLE001 - rebuild a broken cache
            pass
    reader = open_gguf(path)
    meta = {
        "eos_id": int(gguf_field(reader, "tokenizer.ggml.eos_token_id", path=str(path))),
        "bos_id": gguf_field(reader, "tokenizer.ggml.bos_token_id", default=None),
        "pad_id": gguf_field(reader, "tokenizer.ggml.padding_token_id", default=None),
        "add_bos": bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", default=False)),
    }
    del reader
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    if use_cache:
        try:
            tdir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=tdir.parent, prefix=tdir.name + ".tmp"))
            hf.save_pretrained(str(tmp))
            (tmp / "dcut_special_ids.json").write_text(json.dumps(meta))
            try:
                os.replace(tmp, tdir)
            except OSError:  # another process won the race (target exists and is non-empty)
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass
    return GGUFTokenizer(hf, **meta)


def load_smollm2_tokenizer(use_cache: bool = True) -> GGUFTokenizer:
    """Tokenizer of the project's SmolLM2-135M-Instruct GGUF (EOS = `<|im_end|>`, id 2)."""
    return load_gguf_tokenizer(smollm2_gguf_path(), use_cache=use_cache)


def chat_prompt_ids(tokenizer: GGUFTokenizer, user_text: str, system: str | None = None) -> list[int]:
    """Ids of a one-turn chat prompt ending with the assistant generation prompt.

    With `system=None` the template's default system message is used (SmolLM2 inserts
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face").
    """
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": user_text}]
    return tokenizer.chat_ids(messages, add_generation_prompt=True)
