"""The DFlash checkpoint format: a drafter folder's ``config.json`` and ``model.safetensors``.

:func:`save_checkpoint` writes the format vLLM 0.32.0's ``DFlashDraftModel`` loader reads (the
drafter's own weights under Hugging Face names, no embedding or LM head); :func:`load_checkpoint`
reads it back strictly, each fault one :class:`DraftCheckpointError` naming the file and the field;
:func:`check_target` refuses a drafter made for another target.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from ..calibration import CalibrationPrior, CalibrationPriorError
from ..model.config import LlamaConfig
from ..util.atomic import atomic_path, atomic_write_text
from ..util.inputs import InputFileError, parse_json_strict, read_text
from ..util.validation import validate
from .dflash import DFlashConfig, DFlashDraftModel

__all__ = [
    "CONFIG_NAME", "SHIP_DTYPE", "WEIGHTS_NAME", "DraftCheckpointError", "DraftTargetError", "check_target",
    "checkpoint_tensors", "hf_config", "load_checkpoint", "module_tensors", "read_config", "save_checkpoint",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
#: The dtype ``dcut-drafter train`` ships weights in (the held-out figures are those weights')
SHIP_DTYPE = torch.bfloat16


class DraftCheckpointError(ValueError):
    """A drafter checkpoint folder that cannot be loaded: names the file, the field and the fix."""


class DraftTargetError(DraftCheckpointError):
    """A drafter made for another target (width, vocabulary or layer count; :func:`check_target`)."""


def hf_config(cfg: DFlashConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The ``config.json`` of ``cfg`` vLLM 0.32.0 reads for architecture ``DFlashDraftModel`` (Qwen3 fields
    plus ``dflash_config``; ``target_layer_ids`` count layers from 0, vLLM adds 1) of weights
    stored in ``dtype``."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "silu",
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "tie_word_embeddings": cfg.draft_vocab_size is None,
        "draft_vocab_size": cfg.draft_vocab_size or cfg.vocab_size,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "num_target_layers": cfg.target_num_layers,
        "block_size": cfg.block_size,
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": list(cfg.target_layer_ids),
            "block_size": cfg.block_size,
        },
        "dcut_sched": {"target_name": cfg.target_name, **cfg.extra},
    }


_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")


def _checkpoint_name(module_name: str) -> str:
    """A module parameter's name in the checkpoint (inverse of :func:`module_tensors`)."""
    if module_name == "draft_to_target":
        return "d2t"
    for proj in _PROJECTIONS:
        module_name = module_name.replace(f".{proj}.", f".self_attn.{proj}.")
    return module_name


def checkpoint_tensors(model: DFlashDraftModel) -> dict[str, torch.Tensor]:
    """``model``'s parameters under the checkpoint's (Hugging Face DFlash) names."""
    out = {}
    for name, p in model.state_dict().items():
        if name == "draft_to_target":  # vLLM's d2t: target id = draft id + d2t[draft id]
            out["d2t"] = (p - torch.arange(p.numel())).contiguous()
            continue
        out[_checkpoint_name(name)] = p.detach().contiguous()
    return out


def module_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint names and tensors back to the module's (inverse of :func:`checkpoint_tensors`)."""
    out = {}
    for name, t in tensors.items():
        if name == "d2t":
            out["draft_to_target"] = t.long() + torch.arange(t.numel())
        else:
            out[name.replace(".self_attn.", ".")] = t
    return out


def save_checkpoint(model: DFlashDraftModel, folder: str | os.PathLike, *, metadata: dict | None = None,
                    dtype: torch.dtype = torch.float32) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (floating tensors in ``dtype``; the shipped
    drafter is bfloat16, :data:`SHIP_DTYPE`) into ``folder``, each atomically
    (inside :func:`~dcut_sched.util.atomic.all_or_none`, together with the block's other outputs).

    Returns the folder. ``metadata`` goes into the safetensors header (strings only).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / WEIGHTS_NAME, suffix=".safetensors") as tmp:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in checkpoint_tensors(model).items()}
        save_file(tensors, str(tmp), metadata={k: str(v) for k, v in (metadata or {}).items()})
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # save_file creates the file 0600
    atomic_write_text(folder / CONFIG_NAME, json.dumps(hf_config(model.config, dtype), indent=2) + "\n")
    return folder


_STRICT = ConfigDict(strict=True, extra="ignore")


class _DFlashSection(BaseModel):
    model_config = _STRICT
    mask_token_id: int = Field(ge=0)
    target_layer_ids: list[int] = Field(min_length=1, max_length=256)
    block_size: int = Field(16, ge=2, le=1024)


class _DcutSection(BaseModel):
    model_config = _STRICT
    target_name: str = ""


class _DefaultRope(BaseModel):
    """A ``rope_scaling`` that scales nothing (``{"rope_type": "default"}``, HF's spelling of none)."""
    model_config = _STRICT
    rope_type: Literal["default"] = "default"
    type: Literal["default"] = "default"


class HFDraftConfig(BaseModel):
    """Strict pydantic model of the config.json fields the loader reads (:func:`_config_from_hf`)."""

    model_config = _STRICT
    architectures: list[str]
    hidden_size: int = Field(gt=0, le=1 << 16)
    num_hidden_layers: int = Field(gt=0, le=256)
    num_attention_heads: int = Field(gt=0, le=1024)
    num_key_value_heads: int = Field(gt=0, le=1024)
    head_dim: int = Field(gt=0, le=4096)
    intermediate_size: int = Field(gt=0, le=1 << 20)
    vocab_size: int = Field(gt=0, le=1 << 22)
    num_target_layers: int = Field(gt=0, le=1024)
    max_position_embeddings: int = Field(gt=0, le=1 << 24)
    rope_theta: float = Field(gt=0, allow_inf_nan=False)
    rms_norm_eps: float = Field(gt=0, allow_inf_nan=False)
    tie_word_embeddings: bool = False
    #: the drafter's forward is SiLU, without attention biases or RoPE scaling (what :func:`hf_config`
    #: writes); another value would be read and never applied, so it is refused
    hidden_act: Literal["silu"] = "silu"
    attention_bias: Literal[False] = False
    rope_scaling: _DefaultRope | None = None
    draft_vocab_size: int | None = Field(None, gt=0)
    #: the top-level copy of ``dflash_config.block_size`` (:func:`hf_config` writes both): when both are
    #: given they must agree; a config with only this one uses it
    block_size: int | None = Field(None, ge=2, le=1024)
    dflash_config: _DFlashSection
    dcut_sched: _DcutSection | None = None


def _config_from_hf(path: Path, raw: dict) -> DFlashConfig:
    """The :class:`DFlashConfig` of a checkpoint's config.json, every field strictly typed (an
    integer is not a float or a boolean, sizes are bounded, norms' epsilon and RoPE base are positive
    finite numbers), each fault one :class:`DraftCheckpointError` naming the file and the field."""
    fix = "re-save the drafter with dcut-drafter train (or DFlash's save_pretrained)"
    h = validate(HFDraftConfig, raw, str(path), fix, DraftCheckpointError)
    if h.architectures != ["DFlashDraftModel"]:
        raise DraftCheckpointError(f"{path}: field architectures is {h.architectures!r}, expected "
                                   "['DFlashDraftModel'] (not a DFlash drafter checkpoint)")
    dc = h.dflash_config
    if h.block_size is not None and "block_size" not in dc.model_fields_set:
        dc = dc.model_copy(update={"block_size": h.block_size})
    if h.block_size is not None and h.block_size != dc.block_size:
        raise DraftCheckpointError(f"{path}: field block_size is {h.block_size}, field dflash_config.block_size is "
                                   f"{dc.block_size}: the two copies must agree; {fix}")
    try:
        return DFlashConfig(
            hidden_size=h.hidden_size, num_layers=h.num_hidden_layers, num_heads=h.num_attention_heads,
            num_kv_heads=h.num_key_value_heads, head_dim=h.head_dim, intermediate_size=h.intermediate_size,
            vocab_size=h.vocab_size, target_num_layers=h.num_target_layers,
            target_layer_ids=tuple(dc.target_layer_ids), mask_token_id=dc.mask_token_id, block_size=dc.block_size,
            draft_vocab_size=None if h.tie_word_embeddings else h.draft_vocab_size,
            rope_theta=h.rope_theta, rms_norm_eps=h.rms_norm_eps, max_position=h.max_position_embeddings,
            target_name=h.dcut_sched.target_name if h.dcut_sched else "",
        )
    except ValueError as e:
        raise DraftCheckpointError(f"{path}: {e}") from None


def read_config(folder: str | os.PathLike) -> DFlashConfig:
    """The :class:`DFlashConfig` of a drafter folder's ``config.json`` alone (its weights unread).

    Raises:
        DraftCheckpointError: the folder lacks ``config.json`` or ``model.safetensors``, or the config
            is unreadable or malformed (names the file and the field).
    """
    folder = Path(folder)
    cfg_path, w_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise DraftCheckpointError(f"{p}: not found; a DFlash drafter folder holds {CONFIG_NAME} and "
                                       f"{WEIGHTS_NAME} (train one with `dcut-drafter train`)")
    try:
        raw = parse_json_strict(read_text(cfg_path, "a DFlash drafter config.json"), str(cfg_path))
    except InputFileError as e:
        raise DraftCheckpointError(str(e)) from None
    if not isinstance(raw, dict):
        raise DraftCheckpointError(f"{cfg_path}: expected a JSON object")
    return _config_from_hf(cfg_path, raw)


def check_target(cfg: DFlashConfig, target: LlamaConfig) -> None:
    """The drafter reads ``target``'s embedding, LM head and layer outputs: their width, vocabulary and
    layer count must be the ones it was made for.

    Raises:
        DraftTargetError: they differ (the message gives both shapes; the caller names the drafter).
    """
    made = (cfg.hidden_size, cfg.vocab_size, cfg.target_num_layers)
    have = (target.hidden_size, target.vocab_size, target.num_layers)
    if made != have:
        raise DraftTargetError(
            f"the drafter was made for a target of width {made[0]}, vocabulary {made[1]} and {made[2]} layers "
            f"(it reads target layers {list(cfg.target_layer_ids)}); the target {target.name or ''} here has width "
            f"{have[0]}, vocabulary {have[1]} and {have[2]} layers: use a drafter trained for this target")



def load_checkpoint(folder: str | os.PathLike, *, calibration: bool = True) -> DFlashDraftModel:
    """Read a DFlash drafter folder written by :func:`save_checkpoint` (or any checkpoint of that format
    whose embedding and LM head are the target's).

    The model's ``checkpoint_sha256`` is the SHA-256 of the config and weight bytes it was built from
    (what a resumed recording compares, not the folder's name). The folder's optional
    ``calibration.json`` (written by ``dcut-drafter calibrate``) becomes the model's
    ``calibration_prior`` (``None`` without one, or with ``calibration=False``: not read).

    Raises:
        DraftCheckpointError: a missing file, a malformed or incomplete config, missing or unexpected
            tensors, a tensor of the wrong shape, or a malformed calibration.json (each names the file
            and the field, tensors under their checkpoint names).
    """
    folder = Path(folder)
    cfg_path, w_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    cfg = read_config(folder)
    try:
        blob = w_path.read_bytes()
        tensors = load_safetensors(blob)
    except (SafetensorError, OSError, ValueError) as e:
        raise DraftCheckpointError(f"{w_path}: not a readable safetensors file ({e})") from None
    digest = hashlib.sha256(cfg_path.read_bytes())
    digest.update(blob)
    del blob
    with torch.device("meta"):  # shapes from the config without allocating them
        own = DFlashDraftModel(cfg).state_dict()
    if "d2t" in tensors and tensors["d2t"].dim() != 1:
        raise DraftCheckpointError(f"{w_path}: tensor d2t has shape {tuple(tensors['d2t'].shape)}, expected "
                                   f"[{cfg.draft_vocab_size}]")
    if "d2t" in tensors and (tensors["d2t"].is_floating_point() or tensors["d2t"].dtype == torch.bool):
        raise DraftCheckpointError(f"{w_path}: tensor d2t is {str(tensors['d2t'].dtype).removeprefix('torch.')}, "
                                   "not integer token-id offsets (a fraction would be cut); re-save the drafter")
    sd = module_tensors(tensors)
    missing = sorted(_checkpoint_name(k) for k in set(own) - set(sd))
    extra = sorted(_checkpoint_name(k) for k in set(sd) - set(own))
    if missing or extra:
        raise DraftCheckpointError(f"{w_path}: tensors missing {missing[:4]} / unexpected {extra[:4]} for the "
                                   f"config in {cfg_path}")
    for k, v in sd.items():
        name = _checkpoint_name(k)
        if tuple(v.shape) != tuple(own[k].shape):
            raise DraftCheckpointError(f"{w_path}: tensor {name} has shape {tuple(v.shape)}, the config says "
                                       f"{tuple(own[k].shape)}")
        if own[k].is_floating_point() and not v.is_floating_point():
            raise DraftCheckpointError(f"{w_path}: tensor {name} is {str(v.dtype).removeprefix('torch.')}, not a "
                                       "floating type (its weights would be whole numbers); re-save the drafter")
        if v.is_floating_point() and not torch.isfinite(v.float()).all():
            raise DraftCheckpointError(f"{w_path}: tensor {name} holds non-finite values (in float32)")
    model = DFlashDraftModel(cfg)
    model.load_state_dict({k: v if k == "draft_to_target" else v.float() for k, v in sd.items()}, strict=True)
    model.calibration_prior = _calibration_prior(folder) if calibration else None
    prior = model.calibration_prior
    if prior is not None and len(prior.intercepts) > cfg.block_size - 1:
        raise DraftCheckpointError(f"{folder / 'calibration.json'}: intercepts has {len(prior.intercepts)} depths, this "
                                   f"B = {cfg.block_size} drafter drafts at most {cfg.block_size - 1}; refit it with "
                                   f"dcut-drafter calibrate --draft {folder} --out {folder / 'calibration.json'}")
    if model.draft_to_target is not None:
        d2t = model.draft_to_target
        if not bool((d2t[1:] > d2t[:-1]).all()) or int(d2t[0]) < 0 or int(d2t[-1]) >= cfg.vocab_size:
            raise DraftCheckpointError(f"{w_path}: tensor d2t does not map the draft vocabulary to distinct, "
                                       "ascending target ids")
    model.checkpoint_sha256 = digest.hexdigest()
    return model.eval()


def _calibration_prior(folder: Path):
    """The folder's optional ``calibration.json`` (:class:`~dcut_sched.calibration.CalibrationPrior`), or None."""
    try:
        return CalibrationPrior.from_folder(folder)
    except CalibrationPriorError as e:
        raise DraftCheckpointError(str(e)) from None

