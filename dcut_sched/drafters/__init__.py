"""Block drafters: DFlash (one non-causal forward proposes a whole block; docs/drafters.md).

- :mod:`~dcut_sched.drafters.dflash`: the architecture and its config; :mod:`~dcut_sched.drafters.checkpoint`:
  the checkpoint format (``config.json``, ``model.safetensors``).
- :mod:`~dcut_sched.drafters.runtime`: :class:`DFlashDrafter`, the engine's drafter (context cache).
- :mod:`~dcut_sched.drafters.data` / :mod:`~dcut_sched.drafters.train`: data from the target and the
  training loop behind ``dcut-drafter train``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DraftSpec", "drafter_files", "parse_draft_spec", "load_dflash"]


@dataclass(frozen=True)
class DraftSpec:
    """Which drafter a command runs: ``self`` (the target without some layers, greedy or sampled
    drafts) or ``dflash`` (a DFlash checkpoint folder, greedy drafts)."""

    kind: str
    path: Path | None = None
    sampled: bool = False

    def describe(self) -> str:
        return f"dflash:{self.path}" if self.kind == "dflash" else ("sampled" if self.sampled else "greedy")


def parse_draft_spec(text: str) -> DraftSpec:
    """``greedy`` / ``sampled`` (the self-speculative drafter's draft tokens) or ``dflash:PATH``.

    ``PATH`` is a drafter folder, or a bare drafter name (``dflash:smollm2-135m-dflash``) looked up in
    the drafters folder of :func:`dcut_sched.paths.drafter_dir` (``$DCUT_DRAFTERS``, the user cache, the
    checkout) when no such folder is in the current one.

    Raises:
        ValueError: anything else, or ``dflash:`` without a folder that holds a config.json.
    """
    if text in ("greedy", "sampled"):
        return DraftSpec("self", sampled=text == "sampled")
    kind, sep, path = text.partition(":")
    if kind == "dflash" and sep and path:
        p = Path(path)
        if not p.exists() and len(p.parts) == 1:  # a folder here, even a damaged one, is the one meant
            from ..paths import drafter_dir

            if (drafter_dir(path) / "config.json").is_file():  # a drafter's name, under $DCUT_DRAFTERS & co
                p = drafter_dir(path)
        if not (p / "config.json").is_file():
            raise ValueError(f"dflash:{path}: no DFlash drafter folder there (it holds config.json and "
                             "model.safetensors; the shipped one is drafters/smollm2-135m-dflash)")
        return DraftSpec("dflash", p)
    raise ValueError(f"{text!r}: expected greedy, sampled or dflash:PATH")


def drafter_files(folder: str | os.PathLike) -> list[str]:
    """The files of a DFlash drafter folder that loading it reads -- ``config.json``, the weights
    ``model.safetensors`` and the optional calibration prior ``calibration.json`` -- as the inputs
    no output of a command that runs the drafter may overwrite (``cli.args.check_paths``)."""
    from ..calibration.prior import PRIOR_NAME
    from .checkpoint import CONFIG_NAME, WEIGHTS_NAME

    return [str(Path(folder) / name) for name in (CONFIG_NAME, WEIGHTS_NAME, PRIOR_NAME)]


def load_dflash(spec: DraftSpec | str | os.PathLike):
    """The :class:`~dcut_sched.drafters.dflash.DFlashDraftModel` of a spec or folder."""
    from .checkpoint import load_checkpoint

    path = spec.path if isinstance(spec, DraftSpec) else Path(spec)
    return load_checkpoint(path)
