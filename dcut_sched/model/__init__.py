"""Compact Llama-family model shared by trace recording, the speculative engine and the profiler.

See docs/model.md. Main entry points:
    LlamaConfig (config), LlamaModel / KVCache (llama, kv_cache), SelfSpecDrafter (drafter),
    greedy_generate (generate), load_smollm2_tokenizer / chat_prompt_ids (tokenizer, needs
    transformers), smollm2_gguf_path (gguf_weights).
The tokenizer is imported lazily by its own module so that the model works without transformers.
"""

from dcut_sched.model.config import PRESETS, LlamaConfig
from dcut_sched.model.drafter import DRAFTER_PRESETS, SelfSpecDrafter, confidence
from dcut_sched.model.generate import greedy_generate, sample_generate
from dcut_sched.model.gguf_weights import load_gguf_state_dict, smollm2_available, smollm2_gguf_path
from dcut_sched.model.kv_cache import KVCache
from dcut_sched.model.llama import LlamaModel

__all__ = [
    "PRESETS", "LlamaConfig", "DRAFTER_PRESETS", "SelfSpecDrafter", "confidence", "greedy_generate", "sample_generate",
    "load_gguf_state_dict", "smollm2_available", "smollm2_gguf_path", "KVCache", "LlamaModel",
]
