"""``fine``'s plain probes in the project's engine, with and without, beside plain decoding (design §2.1).

What they cost where drafting pays and what they save where the curve prices plain steps high
(docs/design.md §2.1, "Plain probes"). One command (about 4 minutes on a quiet 2-core machine)::

    python analysis/check_plain_probe.py     # writes analysis/results/plain_probe/plain_probe.{csv,md}

On a host other than the Intel Xeon the project's results come from, profile the host first
(``analysis/profile_cpu_dflash.sh`` with ``--out`` a new file) and pass it as ``--curve``: the default
is that Xeon's curve, and only on the host it describes is the ``paying`` cell priced right.

Two cells, each a wave of bs held-out prompts x ``--max-new-tokens`` greedy tokens (long enough that
``fine`` can draft at least 64 steps in a row), ``--rounds`` interleaved rounds of plain decoding
(``ar``), ``fine`` and ``fine`` without plain probes (``plain_probe_after=None``), in rotating order:

- ``paying``: bs 1 on the curve profiled on this host (``--curve``), where drafting pays: the plain
  probes' cost;
- ``mispriced``: bs 2 on ``--mispriced-curve`` (the shipped CPU curve, profiled on another machine,
  whose plain step at bs 2 is far above this host's): drafting looks paying and loses; the plain
  probes' effect.

Per run: decode tokens/s, drafted steps, the plain probes run (``FineState.plain_probes``),
``cpu_share`` (process CPU time / wall time) and the 1-min load; every run is checked lossless
against the round's plain decoding.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "analysis"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_engine import engine_wave, repo_relative  # noqa: E402
from rounds import rotated  # noqa: E402

DRAFTER = ROOT / "drafters" / "smollm2-135m-dflash"
HOST_CURVE = ROOT / "analysis" / "results" / "curves" / "cpu-smollm2-135m-dflash-b16-intel-xeon.json"
SHIPPED_CURVE = ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-dflash-b16.json"
PROMPTS = ROOT / "dcut_sched" / "data" / "traces" / "prompts.jsonl"
OUT = ROOT / "analysis" / "results" / "plain_probe"
CONFIGS = ("ar", "fine", "fine-no-plain-probe")


def run(args) -> int:
    import torch

    from dcut_sched import policies
    from dcut_sched.cost_curve import CostCurve
    from dcut_sched.drafters.checkpoint import load_checkpoint
    from dcut_sched.model import LlamaModel
    from dcut_sched.model.tokenizer import chat_prompt_ids, load_smollm2_tokenizer
    from dcut_sched.policies.fine import PLAIN_PROBE_AFTER
    from dcut_sched.traces.prompts import load_prompt_records
    from dcut_sched.util.atomic import all_or_none, atomic_write_text, check_writable

    check_writable(Path(args.out) / "plain_probe.csv")  # before minutes of work
    torch.set_num_threads(args.threads)
    model, tok, drafter = LlamaModel.from_smollm2(), load_smollm2_tokenizer(), load_checkpoint(args.drafter)
    records = load_prompt_records(PROMPTS)
    cells = {"paying": (1, CostCurve.load(args.curve)), "mispriced": (2, CostCurve.load(args.mispriced_curve))}

    def one(config: str, bs: int, curve) -> dict:
        policy = "ar" if config == "ar" else policies.get(
            "fine", plain_probe_after=None if config == "fine-no-plain-probe" else PLAIN_PROBE_AFTER)
        prompts = [chat_prompt_ids(tok, p.text) for p in records[:bs]]
        w, ctrl = engine_wave(model, drafter, curve, policy, prompts, args.max_new_tokens, 16)
        return {"tokens_per_s": w["tokens_per_s"], "steps": w["steps"], "drafted_steps": w["drafted_steps"],
                "plain_probes": ctrl.policy.state.plain_probes if config != "ar" else 0,
                "cpu_share": w["cpu_share"], "outputs": w["outputs"]}

    rows = []
    one("ar", 1, cells["paying"][1])  # warm-up
    for cell, (bs, curve) in cells.items():
        for r in range(args.rounds):
            base = None
            for config in rotated(CONFIGS, r):
                load0 = os.getloadavg()[0]
                out = one(config, bs, curve)
                outputs = out.pop("outputs")
                base = outputs if config == "ar" else base
                rows.append({"cell": cell, "batch_size": bs, "round": r, "config": config, **out,
                             "outputs": outputs, "load_start": round(load0, 2), "load_end": round(os.getloadavg()[0], 2)})
            for row in rows[-len(CONFIGS):]:
                row["lossless"] = row.pop("outputs") == base
            print(f"{cell} round {r}: done (load {os.getloadavg()[0]:.2f})", flush=True)
    frame = pd.DataFrame(rows)
    ar = frame[frame.config == "ar"].set_index(["cell", "round"]).tokens_per_s
    frame["x_ar"] = frame.tokens_per_s / frame.set_index(["cell", "round"]).index.map(ar).to_numpy()
    md = summary_markdown(frame, args)
    with all_or_none():
        atomic_write_text(Path(args.out) / "plain_probe.csv", frame.to_csv(index=False))
        atomic_write_text(Path(args.out) / "plain_probe.md", md)
    print(md)
    return 0


def summary_markdown(frame: pd.DataFrame, args) -> str:
    """The per-cell table: median [min-max] over rounds of tokens/s and of the ratio to the same round's
    plain decoding, drafted steps and plain probes per round."""
    lines = ["# `fine`'s plain probes in the project's engine", "",
             f"SmolLM2-135M fp32, the DFlash drafter, B = 16, one wave of bs held-out prompts x {args.max_new_tokens} "
             f"greedy tokens, {args.threads} torch threads, {args.rounds} interleaved rounds (configurations in rotating "
             f"order, a warm-up run first). `paying`: bs 1 on `{repo_relative(args.curve)}`; `mispriced`: bs 2 on "
             f"`{repo_relative(args.mispriced_curve)}`.", "",
             "| cell | config | tokens/s | x plain decoding | drafted steps / steps per round | plain probes |",
             "|---|---|---:|---:|---|---|"]
    for (cell, config), g in frame.groupby(["cell", "config"], sort=False):
        t, x = g.tokens_per_s, g.x_ar
        lines.append(f"| {cell} | `{config}` | {t.median():.1f} [{t.min():.1f}-{t.max():.1f}] | {x.median():.3f} "
                     f"[{x.min():.3f}-{x.max():.3f}] | {', '.join(f'{a}/{b}' for a, b in zip(g.drafted_steps, g.steps))} | "
                     f"{', '.join(str(v) for v in g.plain_probes)} |")
    lines += ["", f"cpu_share per run: min {frame.cpu_share.min():.2f}, median {frame.cpu_share.median():.2f}; 1-min load "
              f"{frame.load_start.min():.2f}-{frame.load_end.max():.2f}; every run lossless: {bool(frame.lossless.all())}; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; `python analysis/check_plain_probe.py --rounds "
              f"{args.rounds} --max-new-tokens {args.max_new_tokens}{_curve_flags(args)}` regenerates this file."]
    return "\n".join(lines) + "\n"


def _curve_flags(args) -> str:
    """The curve flags that differ from the defaults, as command-line text."""
    flags = [(f, v) for f, v, d in (("--curve", args.curve, HOST_CURVE), ("--mispriced-curve", args.mispriced_curve,
                                                                          SHIPPED_CURVE))
             if Path(v).resolve() != d.resolve()]
    return "".join(f" {f} {repo_relative(v)}" for f, v in flags)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="example: python analysis/check_plain_probe.py "
                                "--rounds 3 --max-new-tokens 256", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds [3]")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens per request [256]")
    p.add_argument("--curve", type=Path, default=HOST_CURVE, help="the host's curve (the paying cell)")
    p.add_argument("--mispriced-curve", type=Path, default=SHIPPED_CURVE, help="a curve from another machine")
    p.add_argument("--drafter", type=Path, default=DRAFTER)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=OUT, help="output folder [analysis/results/plain_probe]")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
