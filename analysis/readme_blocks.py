"""Regenerate a ``<!-- generated:NAME -->`` block of the README or a docs page from a result file (never by hand).

:data:`BLOCK_FILES` names the page each block lives on; a block not named there lives in README.md.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"

#: The page of each block that does not live on the README's front page.
BLOCK_FILES = {
    "drafter": ROOT / "docs" / "drafters.md",
    "fidelity-dflash": BENCHMARKS,
    "engine-dflash": BENCHMARKS,
    "ci-time": BENCHMARKS,
    "test-suite": BENCHMARKS,
    "test-suite-loaded": BENCHMARKS,
    "vllm-test-time": ROOT / "docs" / "vllm.md",
}


def replace_block(name: str, body: str, path: Path | None = None) -> None:
    """Put ``body`` between the ``<!-- generated:NAME -->`` markers of ``path`` (atomically); by default
    the block's page in :data:`BLOCK_FILES`, else README.md.

    Raises:
        SystemExit: the page has no such block.
    """
    from dcut_sched.util.atomic import atomic_write_text

    path = path if path is not None else BLOCK_FILES.get(name, README)
    text = path.read_text()
    pat = re.compile(rf"<!-- generated:{re.escape(name)} -->\n.*?<!-- /generated:{re.escape(name)} -->", re.S)
    if not pat.search(text):
        raise SystemExit(f"{path}: no <!-- generated:{name} --> block to regenerate")
    block = f"<!-- generated:{name} -->\n{body.rstrip()}\n<!-- /generated:{name} -->"
    atomic_write_text(path, pat.sub(lambda _: block, text))


def drafter_block(folder: Path = README.parent / "drafters" / "smollm2-135m-dflash") -> str:
    """The summary of the shipped drafter, from its ``heldout.json`` (written by dcut-drafter train)."""
    import json

    m = json.loads((folder / "heldout.json").read_text())
    tau = m["tau"]
    cats = [c for c in sorted(tau["B16/greedy"]) if c != "all"]
    lines = [f"The shipped drafter: `{m['command']}`, seed {m['settings']['seed']}, {m['wall_seconds'] / 60:.0f} min "
             f"wall on this 2-core CPU ({m['data_seconds'] / 60:.0f} min generating the data, "
             f"{m['train_seconds'] / 60:.0f} min training; 1-min load {m['load_at_end']:.2f} at the end). "
             f"Held-out tau (1 + mean accepted drafts, every anchor of {m['eval_sequences']} held-out continuations):",
             "", "| block / continuation | all | " + " | ".join(cats) + " |", "|---|---:|" + "---:|" * len(cats)]
    for key, v in tau.items():
        lines.append(f"| {key} | **{v['all']:.2f}** | " + " | ".join(f"{v[c]:.2f}" for c in cats) + " |")
    return "\n".join(lines)


def fidelity_dflash_block(path: Path = README.parent / "analysis" / "results" / "fidelity_dflash.json") -> str:
    """The engine-fidelity figure for the DFlash drafter runs (analysis/fidelity_dflash.py)."""
    import json

    import pandas as pd

    s = json.loads(path.read_text())
    res = pd.read_csv(path.with_suffix(".csv"))
    small = res[res["batch_size"] <= 2]["error"].abs().median()
    large = res[res["batch_size"] >= 4]["error"].abs().median()
    big = res[res["batch_size"] >= 4]
    ratio = (big["engine_verify_plan_ms"] / big["sim_verify_ms"]).median()
    ar = res[res["policy"] == "ar"]["error"].abs()
    return (f"With the DFlash drafter (`python analysis/fidelity_dflash.py`, from the `analysis/bench_engine.py` runs, "
            f"cpu_share {s['cpu_share_range'][0]:.2f}-{s['cpu_share_range'][1]:.2f}): the simulator, replaying the "
            f"drafter's recorded trace of the same prompts over the curve the engine planned with, takes exactly the "
            f"engine's steps in every run ({'all' if s['steps_match'] else 'not all'} {s['runs']}) and predicts "
            f"decode tokens/s with a median |error| of **{100 * s['median_abs_error']:.1f} %** "
            f"({100 * small:.1f} % at bs 1-2, {100 * large:.1f} % at bs 4-16, always over-predicting there; the "
            f"goal of 10 % is missed). `ar`, which keeps no drafter context, is within {100 * ar.max():.0f} % at every "
            f"bs; in the speculative runs at bs >= 4 the engine's verify phase takes a median {ratio:.2f}x the curve's "
            f"verify forward: per-step work the curve does not time (the target's feature capture and the drafter's "
            f"context update on every step, packing, acceptance); every cell: `analysis/results/fidelity_dflash.md`.")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(README.parent))
    blocks = {"drafter": drafter_block, "fidelity-dflash": fidelity_dflash_block}
    for name in sys.argv[1:] or list(blocks):
        replace_block(name, blocks[name]())
        print(f"regenerated block {name} in {BLOCK_FILES.get(name, README).relative_to(ROOT)}")
