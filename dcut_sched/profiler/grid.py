"""The cells a profile measures: verification (batch_size, num_tokens) pairs, plain decode steps
and draft steps.

Per batch size ``bs`` and block size ``B`` the verification token counts are
    - the autoregressive point ``num_tokens = bs`` (one slot per request, no draft);
    - the D-Cut buckets ``K_q = ceil(rho_q * bs * B)`` for rho_q in ``ratios`` (default 0.25, 0.5,
      0.75, 1.0; :func:`dcut_sched.policies.budget_from_ratio`, so the same K the policies ask for);
    - with ``grid_step > 0``, every multiple of ``grid_step`` in ``[bs, bs*B]`` (the dense measured grid
      ``fine`` prices its budgets on; ``fine`` chooses every count in between too, by the
      curve's interpolation).

and, as their own cell family, the plain autoregressive decode step ``ar:bs`` (one token per
request attending to ``context_len`` cached slots, on the engine's plain-decode path; see
:mod:`dcut_sched.profiler.workload`), which is not the verification cell ``(bs, bs)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcut_sched.policies import budget_from_ratio

__all__ = ["DEFAULT_RATIOS", "Cell", "bucket_tokens", "build_cells", "verify_tokens"]

DEFAULT_RATIOS = (0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True, order=True)
class Cell:
    """One thing to time: a verification forward (``kind="verify"``), a plain decode step (``"ar"``,
    ``num_tokens = batch_size``) or a draft step (``"draft"``, ``num_tokens`` = the tokens its
    forward(s) process in total, for ordering by size)."""

    kind: str
    batch_size: int
    num_tokens: int

    @property
    def key(self) -> str:
        """Stable text key (partial files, logs): ``verify:16:128``, ``ar:16`` or ``draft:16``."""
        if self.kind == "verify":
            return f"verify:{self.batch_size}:{self.num_tokens}"
        return f"{self.kind}:{self.batch_size}"

    def size(self) -> int:
        """Tokens processed (what "largest capture first" orders by)."""
        return self.num_tokens


def bucket_tokens(batch_size: int, block_size: int, ratios=DEFAULT_RATIOS) -> list[int]:
    """The bucket budgets ``K_q`` for ``ratios`` (ascending, de-duplicated)."""
    return sorted({budget_from_ratio(r, batch_size, block_size) for r in ratios})


def verify_tokens(batch_size: int, block_size: int, ratios=DEFAULT_RATIOS, grid_step: int = 0) -> list[int]:
    """Every verification token count measured at ``batch_size`` (module docstring), ascending."""
    if batch_size < 1 or block_size < 1:
        raise ValueError(f"batch_size and block_size must be >= 1, got {batch_size}, {block_size}")
    counts = {batch_size, *bucket_tokens(batch_size, block_size, ratios)}
    if grid_step > 0:
        hi = batch_size * block_size
        first = -(-batch_size // grid_step) * grid_step
        counts.update(range(first, hi + 1, grid_step))
        counts.add(hi)
    return sorted(counts)


def build_cells(batch_sizes, block_size: int, ratios=DEFAULT_RATIOS, grid_step: int = 0,
                draft: bool = True, ar: bool = True) -> list[Cell]:
    """All cells of a profile, in a fixed (sorted) order; the harness shuffles them.

    Plain decode cells (``ar``) process ``bs`` tokens; draft cells ``bs * B`` tokens (the block
    drafter's forward, or B-1 one-token steps).
    """
    cells = [Cell("verify", int(bs), k) for bs in sorted(set(batch_sizes))
             for k in verify_tokens(int(bs), block_size, ratios, grid_step)]
    if ar:
        cells += [Cell("ar", int(bs), int(bs)) for bs in sorted(set(batch_sizes))]
    if draft:
        cells += [Cell("draft", int(bs), int(bs) * block_size) for bs in sorted(set(batch_sizes))]
    return cells
