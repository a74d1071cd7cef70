"""The sizes every step uses, on the GPU and in the CPU dry run (one place, so the two stay alike).

GPU: a Qwen3-8B-shaped target (random weights, bf16), B = 16, context 1024, a 5-layer DFlash-style
draft step, bs 1..64, the profiler's GPU defaults (5 warm-ups, 20 repeats in one round).
Dry run: the ``tiny`` preset (4 layers, hidden 256) in float32 on the CPU, same B and the same
structure at bs 1..4, with one or two repeats, so the whole dry run takes well under a minute.
"""

from __future__ import annotations

from dataclasses import dataclass

from common import REPO


@dataclass(frozen=True)
class Settings:
    """Sizes of one run (module docstring).

    Attributes:
        dry_run: CPU dry run (eager equivalents of the CUDA steps).
        device: ``"cuda"`` or ``"cpu"``.
        model, dtype, context_len, block_size, draft: the profiled model (``dcut-profile`` options).
        bucket_batch_sizes: the timed profile of the AR point + 4 buckets + draft + AR step.
        curve_batch_sizes, grid_step: the full curve (AR point, buckets, every multiple of grid_step).
        interp_batch_sizes: where the coarse-vs-dense interpolation error is judged.
        warmups, repeats: per profile cell (``None`` = the profiler's defaults for the mode).
        bank_layers, bank_context_len, bank_batch_sizes: the graph-bank model (the target's width,
            fewer layers: the same kernels, a smaller bf16 error budget) and its captured batch sizes.
        controller_batch_sizes, controller_steps: the controller's plan() checks.
        controller_curve: the cost curve the controller plans with.
    """

    dry_run: bool
    device: str
    model: str
    dtype: str
    context_len: int
    block_size: int
    draft: str
    bucket_batch_sizes: tuple[int, ...]
    curve_batch_sizes: tuple[int, ...]
    grid_step: int
    interp_batch_sizes: tuple[int, int]
    warmups: int | None
    repeats: int | None
    bank_layers: int
    bank_context_len: int
    bank_batch_sizes: tuple[int, int]
    controller_batch_sizes: tuple[int, ...]
    controller_steps: int
    controller_curve: str

    def profile_args(self, batch_sizes, grid_step: int) -> list[str]:
        """``dcut-profile`` arguments (without ``--out``) for one profile of this run."""
        args = ["--cpu" if self.dry_run else "--gpu", "--model", self.model, "--dtype", self.dtype,
                "--block-size", str(self.block_size), "--context-len", str(self.context_len),
                "--batch-sizes", ",".join(str(b) for b in batch_sizes), "--grid-step", str(grid_step),
                "--draft", self.draft, "--no-progress"]
        if self.warmups is not None:
            args += ["--warmups", str(self.warmups)]
        if self.repeats is not None:
            args += ["--repeats", str(self.repeats), "--rounds", "1"]
        if self.dry_run:
            args += ["--threads", "1"]
        return args


def settings_for(dry_run: bool) -> Settings:
    curve = str(REPO / "dcut_sched" / "profiler" / "profiles" / "h20-qwen3-8b-published.json")
    if dry_run:
        return Settings(dry_run=True, device="cpu", model="tiny", dtype="float32", context_len=32, block_size=16,
                        draft="dflash:1", bucket_batch_sizes=(1, 2, 4), curve_batch_sizes=(1, 2, 4), grid_step=4,
                        interp_batch_sizes=(2, 4), warmups=1, repeats=2, bank_layers=2, bank_context_len=16,
                        bank_batch_sizes=(2, 4), controller_batch_sizes=(4, 16, 64), controller_steps=12,
                        controller_curve=curve)
    return Settings(dry_run=False, device="cuda", model="qwen3-8b", dtype="bfloat16", context_len=1024, block_size=16,
                    draft="dflash:5", bucket_batch_sizes=(4, 8, 16, 32, 64), curve_batch_sizes=(1, 2, 4, 8, 16, 32, 64),
                    grid_step=16, interp_batch_sizes=(16, 64), warmups=None, repeats=None, bank_layers=4,
                    bank_context_len=256, bank_batch_sizes=(4, 16), controller_batch_sizes=(4, 16, 64),
                    controller_steps=60, controller_curve=curve)
