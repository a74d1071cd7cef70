"""What the deferred drafter context costs where drafting resumes, in real vLLM (docs/vllm.md, "The undrafted step").

With ``defer_undrafted_context`` an undrafted step leaves the DFlash drafter's context K/V to the
request's next drafted pass, which then projects every token that waited. This check runs ``fine``
made to draft one step after every ``--plain-steps`` plain ones (a fixed schedule: no feedback, so both
configurations decide alike) over a wave of bs held-out prompts, with the context deferred (the
default) and written every step (``defer_undrafted_context: false``), in ``--rounds`` interleaved rounds
after a warm-up engine. Per run: the median drafter ``propose`` time of the drafted passes (where the
deferred tokens are written) and of the undrafted ones, and the median step of each kind; per
configuration the median over rounds and its min-max. Every run's output is checked against vLLM
without speculation.

    python analysis/check_deferred_catchup.py                     # bs 16, 16 plain steps, 3 rounds
    python analysis/check_deferred_catchup.py --batch-size 4 --plain-steps 32

Writes ``analysis/results/vllm-dflash/deferred_catchup.{md,csv}`` (``--out-dir``), replacing them;
needs the vLLM environment (``DCUT_WITH_VLLM=1 bash scripts/install.sh``); about 5 min at the defaults.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from bench_undrafted import BLOCK_SIZE, REPO, VLLM_CURVE, _loadavg, _rotate, vllm_wave

CONFIGS = {"deferred": {}, "written": {"defer_undrafted_context": False}}


def run(bs: int, plain_steps: int, rounds: int, max_tokens: int) -> pd.DataFrame:
    from dcut_sched.integrations.vllm_tools.checkpoint import write_pair

    target, _ = write_pair()
    schedule = {"speculate_margin": 1000.0, "probe_interval": plain_steps, "probe_budget": 0.9, "feedback": False}
    fine = {"policy": "fine", "policy_params": schedule, "cost_curve": str(VLLM_CURVE), "log_interval_s": 600.0}
    runs = [{"name": "nospec", "dcut": None}, {"name": "warmup#0", "dcut": fine}]
    for r in range(rounds):
        for name in _rotate(list(CONFIGS), r):
            runs.append({"name": f"{name}#{r}", "dcut": {**fine, **CONFIGS[name]}})
    load0 = _loadavg()
    res = vllm_wave(target, bs, max_tokens, runs)
    load1 = _loadavg()
    base = res["runs"][0]["token_ids"]
    rows = []
    for out in res["runs"][2:]:
        if "error" in out:
            raise RuntimeError(f"{out['name']}: {out['error']['message']}")
        name, r = out["name"].split("#")
        steps = [s for s in out["steps"] if s["num_requests"] == bs]
        row = {"config": name, "round": int(r), "cpu_share": out["generate_cpu_s"] / out["generate_s"],
               "lossless": out["token_ids"] == base, "load_start": load0, "load_end": load1}
        for kind in ("drafted", "undrafted"):
            sel = [s for s in steps if s["kind"] == kind]
            row[f"{kind}_steps"] = len(sel)
            row[f"{kind}_propose_ms"] = float(np.median([s["propose_ms"] for s in sel])) if sel else float("nan")
            row[f"{kind}_step_ms"] = float(np.median([s["step_ms"] for s in sel])) if sel else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame, args: argparse.Namespace, command: str, measured: str) -> str:
    cols = ["drafted_propose_ms", "undrafted_propose_ms", "drafted_step_ms", "undrafted_step_ms"]
    lines = [f"Deferred drafter context where drafting resumes: vLLM, `fine` drafting one step after every "
             f"{args.plain_steps} plain ones, bs {args.batch_size}, {args.max_tokens} tokens per request, B = "
             f"{BLOCK_SIZE}; median over {frame['round'].nunique()} interleaved rounds [min-max] of each run's median (ms).", "",
             "| context | drafted steps | " + " | ".join(c.replace("_", " ") for c in cols) + " |",
             "|---|---:|" + "---:|" * len(cols)]
    for name, g in frame.groupby("config", sort=False):
        cells = [f"{g[c].median():.2f} [{g[c].min():.2f}-{g[c].max():.2f}]" for c in cols]
        lines.append(f"| {name} | {int(g.drafted_steps.median())} | " + " | ".join(cells) + " |")
    lines += ["", f"cpu_share min {frame.cpu_share.min():.2f}, median {frame.cpu_share.median():.2f}; 1-min load "
                  f"{frame.load_start.min():.2f}-{frame.load_end.max():.2f}; every run lossless: "
                  f"{bool(frame.lossless.all())}; {measured}; `{command}` regenerates this file."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", type=int, default=16, help="requests in the wave, 1..64 [16]")
    ap.add_argument("--plain-steps", type=int, default=16, help="plain steps before each drafted one, >= 1 [16]")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds, >= 2 [3]")
    ap.add_argument("--max-tokens", type=int, default=96, help="new tokens per request, >= 16 [96]")
    ap.add_argument("--out-dir", type=Path, default=REPO / "analysis" / "results" / "vllm-dflash",
                    help="[analysis/results/vllm-dflash]")
    args = ap.parse_args(argv)
    if not 1 <= args.batch_size <= 64 or args.plain_steps < 1 or args.rounds < 2 or args.max_tokens < 16:
        ap.error("--batch-size 1..64, --plain-steps >= 1, --rounds >= 2, --max-tokens >= 16")
    command = "python analysis/check_deferred_catchup.py" + (" " + shlex.join(sys.argv[1:] if argv is None else argv)
                                                             if (sys.argv[1:] if argv is None else argv) else "")
    start = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    frame = run(args.batch_size, args.plain_steps, args.rounds, args.max_tokens)
    measured = f"{start}-{time.strftime('%H:%M UTC', time.gmtime())}"
    text = markdown(frame, args, command, measured)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out_dir / "deferred_catchup.csv", index=False)
    (args.out_dir / "deferred_catchup.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
