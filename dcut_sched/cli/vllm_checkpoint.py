"""``python -m dcut_sched.cli.vllm_checkpoint``: write SmolLM2-135M and its layer-skip draft as the
safetensors folders vLLM loads (:func:`dcut_sched.integrations.vllm_tools.checkpoint.write_pair`)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from ..integrations.vllm_tools.checkpoint import DEFAULT_SKIP_LAYERS, default_root, write_pair
from .args import comma_list

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dcut_sched.cli.vllm_checkpoint",
        description="Write SmolLM2-135M and its layer-skip draft as safetensors folders for vLLM.",
        epilog="example: python -m dcut_sched.cli.vllm_checkpoint --skip-layers 14,15",
    )
    ap.add_argument("--root", help=f"output folder [$DCUT_VLLM_MODELS or {default_root()}]")
    ap.add_argument("--skip-layers", default=",".join(map(str, DEFAULT_SKIP_LAYERS)),
                    type=comma_list(what="layer indices", item="layer", allow_empty=True), help="decoder layers the draft drops [14,15: the recorded drafter]")
    ap.add_argument("--force", action="store_true", help="rewrite even when current")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        target, draft = write_pair(args.root, args.skip_layers, force=args.force)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    print(f"target: {target}\ndraft:  {draft}\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
