"""vLLM 0.32.0 on this CPU with and without D-Cut, and the simulator's prediction of the same runs.

Stages (``--stage all`` runs them in order; each writes under ``--out-dir``):

1. ``profile``: ``dcut-profile --vllm`` of the SmolLM2-135M target with its skip-14-15 draft at
   B = 8 (vLLM's own forward on dummy batches): ``vllm-cpu-smollm2-135m-b8.json``.
2. ``engine``: for each batch size bs, ``bs`` chat prompts (traces/prompts.jsonl) decoded greedily
   to ``--max-tokens`` tokens (EOS ignored, one wave, all admitted at t = 0) by vLLM without
   speculation, with ``full`` verification, with ``dcut`` and with ``fine`` (both planning with the
   curve of stage 1). Measured: output tokens/s (tokens / generate wall time, prefill included),
   accepted drafts per request-step, keep ratio. Every D-Cut step is recorded (JSON lines).
   ``bench_vllm_engine.csv``.
3. ``predict``: a step-indexed trace recorded in vLLM (the ``full`` runs' confidences and
   accepted lengths, ``vllm-trace-b8.parquet``) replayed by ``dcut_sched.simulate`` in the closed
   loop at the same batch sizes with the stage-1 curve; predicted vs measured tokens/s per
   (policy, bs), with ``ar`` predicting vLLM without speculation. ``bench_vllm.csv``,
   ``bench_vllm.md`` (table, median absolute error, machine load) and ``bench_vllm.png``.

The machine is shared (2 cores, other jobs running): every stage logs ``os.getloadavg()`` at start
and end into ``bench_vllm_load.json``; read the figures with that load in mind.

    python analysis/bench_vllm.py --stage all --batch-sizes 1,2,4,8,16 --max-tokens 48
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dcut_sched.integrations.vllm.checkpoint import write_pair  # noqa: E402
from dcut_sched.integrations.vllm.venv import cpu_env, venv_python, vllm_available  # noqa: E402

BLOCK_SIZE = 8
POLICIES = ("nospec", "full", "dcut", "fine")
CURVE_NAME = "vllm-cpu-smollm2-135m-b8.json"


def _load(out: Path, stage: str, when: str) -> None:
    path = out / "bench_vllm_load.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.setdefault(stage, {})[when] = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                       "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
                                       "cpu_count": os.cpu_count()}
    path.write_text(json.dumps(doc, indent=1))


def stage_profile(args, out: Path) -> None:
    target, draft = write_pair()
    bss = ",".join(map(str, args.batch_sizes))
    cmd = [sys.executable, "-m", "dcut_profiler.cli", "--vllm", str(target), "--vllm-draft", str(draft),
           "--block-size", str(BLOCK_SIZE), "--batch-sizes", bss, "--context-len", str(args.context_len),
           "--repeats", str(args.repeats), "--out", str(out / CURVE_NAME)]
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def _rel(path) -> str:
    """``path`` relative to the repository (the driver runs there), so committed job files name no
    machine's folders."""
    return os.path.relpath(Path(path).resolve(), REPO)


def stage_engine(args, out: Path) -> None:
    target, draft = (_rel(p) for p in write_pair())
    rows = []
    for bs in args.batch_sizes:
        runs = []
        for policy in POLICIES:
            if policy == "nospec":
                runs.append({"name": policy, "dcut": None})
                continue
            dcut = {"policy": policy, "record_path": _rel(out / "records" / f"{policy}-bs{bs}.jsonl"),
                    "log_interval_s": 60.0}
            if policy in ("dcut", "fine"):
                dcut["cost_curve"] = _rel(out / CURVE_NAME)
            runs.append({"name": policy, "dcut": dcut})
        for r in runs:
            if r["dcut"]:
                (REPO / r["dcut"]["record_path"]).unlink(missing_ok=True)
                (REPO / (r["dcut"]["record_path"] + ".worker.jsonl")).unlink(missing_ok=True)
        job = {"target": str(target), "draft": str(draft), "block_size": BLOCK_SIZE,
               "prompts": {"file": "traces/prompts.jsonl", "n": bs, "chat": True},
               "max_tokens": args.max_tokens, "max_num_seqs": bs, "max_model_len": 1024, "runs": runs}
        (out / "records").mkdir(parents=True, exist_ok=True)
        jf, rf = out / "records" / f"job-bs{bs}.json", out / "records" / f"result-bs{bs}.json"
        jf.write_text(json.dumps(job))
        load0 = os.getloadavg()[0]
        subprocess.run([str(venv_python()), "-m", "dcut_sched.integrations.vllm.run", "--job", str(jf), "--out", str(rf)],
                       check=True, cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        res = json.loads(rf.read_text())
        base = res["runs"][0]["token_ids"]
        for r in res["runs"]:
            if "error" in r:
                raise RuntimeError(f"bs {bs} {r['name']}: {r['error']['message']}")
            m = r["dcut_metrics"] or {}
            rows.append({"batch_size": bs, "policy": r["name"], "tokens_per_s": r["tok_per_s"],
                         "generate_s": r["generate_s"], "output_tokens": r["output_tokens"],
                         "accepted_per_request_step": m.get("accepted_per_request_step", 0.0),
                         "keep_ratio": m.get("keep_ratio", float("nan")), "steps": m.get("steps"),
                         "drafted_steps": m.get("drafted_steps"),
                         "lossless": r["token_ids"] == base, "load_1min_start": round(load0, 2),
                         "load_1min_end": round(os.getloadavg()[0], 2)})
        print(pd.DataFrame(rows[-len(runs):]).to_string(index=False), flush=True)
    pd.DataFrame(rows).to_csv(out / "bench_vllm_engine.csv", index=False)


def recorded_trace(out: Path, batch_sizes):
    """Step-indexed trace from the ``full`` runs: one row per (request, drafted step)."""
    from dcut_sched.traces.format import TRACE_VERSION, VERSION_KEY, Trace, conf_columns

    rows, rid_of = [], {}
    for bs in batch_sizes:
        path = out / "records" / f"full-bs{bs}.jsonl"
        for line in path.read_text().splitlines():
            step = json.loads(line)
            for rid, conf in (step.get("conf") or {}).items():
                if rid in step.get("dropped", []):
                    continue
                key = (bs, rid)
                gid = rid_of.setdefault(key, len(rid_of))
                rows.append({"request_id": gid, "accept_len": int(step["accepted"].get(rid, 0)),
                             **dict(zip(conf_columns(BLOCK_SIZE), conf))})
    df = pd.DataFrame(rows)
    df["pos"] = df.groupby("request_id").cumcount()
    meta = {VERSION_KEY: TRACE_VERSION, "indexing": "step", "block_size": str(BLOCK_SIZE),
            "target_model": "SmolLM2-135M-Instruct (fp32, vLLM 0.32.0 CPU)",
            "draft_model": "SmolLM2-135M minus decoder layers 14,15 (vLLM draft_model)",
            "dataset": "dcut-prompts-v1", "temperature": "0", "source": "recorded"}
    return Trace.from_frame(df[["request_id", "pos", "accept_len", *conf_columns(BLOCK_SIZE)]], meta)


def stage_predict(args, out: Path) -> None:
    import dcut_sched as d

    trace = recorded_trace(out, args.batch_sizes)
    trace.save(out / "vllm-trace-b8.parquet")
    curve = d.CostCurve.load(out / CURVE_NAME, check_hardware=False)
    sim = d.simulate(trace, curve, policies=["ar", "full", "dcut", "fine"], batch_sizes=args.batch_sizes,
                     mode="closed", seed=0)
    eng = pd.read_csv(out / "bench_vllm_engine.csv")
    eng["sim_policy"] = eng["policy"].replace({"nospec": "ar"})
    merged = eng.merge(sim[["policy", "batch_size", "tokens_per_s", "mean_tokens_per_step", "mean_ratio"]]
                       .rename(columns={"policy": "sim_policy", "tokens_per_s": "predicted_tokens_per_s",
                                        "mean_tokens_per_step": "predicted_tokens_per_request_step",
                                        "mean_ratio": "predicted_ratio"}), on=["sim_policy", "batch_size"])
    merged["rel_error"] = merged["predicted_tokens_per_s"] / merged["tokens_per_s"] - 1.0
    merged.to_csv(out / "bench_vllm.csv", index=False)
    med = float(np.median(np.abs(merged["rel_error"])))
    load = json.loads((out / "bench_vllm_load.json").read_text())
    cols = ["batch_size", "policy", "tokens_per_s", "predicted_tokens_per_s", "rel_error",
            "accepted_per_request_step", "keep_ratio", "lossless", "load_1min_start"]
    md = ["# vLLM 0.32.0 on CPU: measured vs simulated", "",
          f"SmolLM2-135M fp32 target, skip-14-15 draft, B = {BLOCK_SIZE}, {args.max_tokens} tokens per request, "
          f"one wave of bs requests. Median |error| of the simulator's tokens/s: **{med:.1%}** (goal <= 10%).", "",
          merged[cols].to_markdown(index=False, floatfmt=".3g"), "",
          f"Machine load (1/5/15 min, {os.cpu_count()} cores, shared with other jobs): "
          + "; ".join(f"{k} {v.get('start', {}).get('loadavg_1_5_15')} -> {v.get('end', {}).get('loadavg_1_5_15')}"
                      for k, v in load.items())]
    (out / "bench_vllm.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for pol, g in merged.groupby("policy"):
        line, = ax.plot(g["batch_size"], g["tokens_per_s"], "o-", label=f"{pol} measured")
        ax.plot(g["batch_size"], g["predicted_tokens_per_s"], "x--", color=line.get_color(), label=f"{pol} simulated")
    ax.set_xlabel("batch size"), ax.set_ylabel("output tokens/s"), ax.set_xscale("log", base=2)
    ax.set_title(f"vLLM CPU vs dcut-sim (median |err| {med:.0%})"), ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "bench_vllm.png", dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="see the module docstring")
    ap.add_argument("--stage", choices=["profile", "engine", "predict", "all"], default="all")
    ap.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--context-len", type=int, default=96, help="profile: cached tokens per request")
    ap.add_argument("--repeats", type=int, default=7, help="profile: timed calls per cell")
    ap.add_argument("--out-dir", default=str(REPO / "analysis" / "results" / "vllm"))
    args = ap.parse_args(argv)
    ok, reason = vllm_available()
    if not ok:
        print(f"bench_vllm: {reason}", file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stage, fn in (("profile", stage_profile), ("engine", stage_engine), ("predict", stage_predict)):
        if args.stage in (stage, "all"):
            _load(out, stage, "start")
            fn(args, out)
            _load(out, stage, "end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
