"""Run vLLM generations for several configurations in one process and write their outputs (JSON).

Used by the vLLM tests and ``analysis/bench_vllm.py``; runs inside the vLLM environment
(:mod:`dcut_sched.cli.vllm_run` reads the job file and writes the result)::

    .venv-vllm/bin/python -m dcut_sched.cli.vllm_run --job job.json --out result.json

The job (JSON object):

- ``target``, ``draft``: model folders; ``block_size``: B (drafts ``B - 1`` tokens);
- ``prompts``: ``{"file": "dcut_sched/data/traces/prompts.jsonl", "n": 16, "chat": true}`` (SmolLM2 chat template
  from the target's tokenizer) or a list of token-id lists;
- ``max_tokens`` per request, ``ignore_eos`` [true], ``max_num_seqs`` (the batch size), ``max_model_len``;
- ``step_timing`` [false]: time every engine step (:class:`.engine_steps.StepTimer`) and return the
  records under ``steps`` (with ``prefill_s``, the wall time of the prefill steps);
- ``runs``: list of ``{"name": str, "dcut": {...} | null}``; ``dcut: null`` runs vLLM without
  speculation, otherwise the D-Cut config of :mod:`.config` (``record_path`` per run is allowed).
  ``{"dcut": null, "vllm_spec": {...}}`` runs vLLM's own speculative decoding over the job's draft
  without D-Cut, its ``speculative_config`` updated with ``vllm_spec`` (e.g.
  ``{"num_speculative_tokens": 2}`` or vLLM's Dynamic SD ``{"num_speculative_tokens_per_batch_size":
  [[1, 4, 3], [5, 16, 0]]}``).
  For start-up failure tests a run may also give ``raw_additional_config`` (passed to vLLM as is,
  skipping :func:`llm_kwargs`' own check) and ``fake_vllm_version`` (vLLM's ``__version__`` is
  set to it while the engine starts), ``speculative_config`` (replaces the one :func:`llm_kwargs`
  builds, e.g. an ngram drafter); ``max_num_seqs`` and ``num_prompts`` override the job's;
  ``engine_args`` (a dict) is passed to ``vllm.LLM`` over everything above (e.g.
  ``{"async_scheduling": false}`` for plain decoding without vLLM's default async scheduling);
- ``import_first``: module names imported before the first engine (``["numba"]`` puts the process
  in the state vLLM's ngram proposer leaves it in: the failed-engine-poisons-the-next case).

The result: per run, its token ids per prompt, start-up and generation seconds, output tokens/s,
the scheduler's D-Cut metrics, or ``error`` (exception type and message) when the engine failed to
start or run. Written atomically.
"""

from __future__ import annotations

import gc
import importlib
import json
import time
import traceback
from pathlib import Path
from typing import Any

from ...defaults import DEFAULT_POLICY
from ..vllm import llm_kwargs
from .engine_steps import StepTimer

__all__ = ["load_prompt_token_ids", "run_job", "run_one"]


def load_prompt_token_ids(spec: Any, target: str) -> list[list[int]]:
    """Token ids per prompt of a job's ``prompts`` spec: a list of token-id lists as is, or
    ``{"file": JSONL with "prompt", "n", "offset"=0, "chat"=True}`` tokenised with the target's
    local tokenizer (chat template unless ``chat`` is false)."""
    if isinstance(spec, list):
        return [list(map(int, p)) for p in spec]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target, local_files_only=True)
    rows = [json.loads(line) for line in Path(spec["file"]).read_text().splitlines() if line.strip()]
    rows = rows[int(spec.get("offset", 0)): int(spec.get("offset", 0)) + int(spec["n"])]
    out = []
    for r in rows:
        if spec.get("chat", True):
            ids = tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                          tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tok(r["prompt"])["input_ids"]
        out.append([int(x) for x in ids])
    return out


def _scheduler(llm):
    core = llm.llm_engine.engine_core
    core = getattr(core, "engine_core", core)  # InprocClient -> EngineCore
    return core.scheduler


def run_one(job: dict, run: dict, prompts: list[list[int]]) -> dict:
    from vllm import LLM, SamplingParams, TokensPrompt

    t0 = time.perf_counter()
    common = {"max_model_len": int(job.get("max_model_len", 1024)),
              "max_num_seqs": int(run.get("max_num_seqs", job["max_num_seqs"])),
              "seed": 0, "disable_log_stats": False}
    dcut = run.get("dcut")
    if dcut is None:
        kw = {"model": job["target"], "dtype": job.get("dtype", "float32"), "enforce_eager": True}
        if "vllm_spec" in run:  # vLLM's own speculative decoding, without D-Cut (the peers of a benchmark)
            draft = str(job["draft"])
            method, _, path = draft.partition(":") if draft.startswith("dflash:") else ("draft_model", "", draft)
            kw["speculative_config"] = {"method": method, "model": path,
                                        "num_speculative_tokens": int(job["block_size"]) - 1, **run["vllm_spec"]}
            kw["async_scheduling"] = False
    else:
        dcut = dict(dcut)
        kw = llm_kwargs(job["target"], job["draft"], int(job["block_size"]), dcut.pop("policy", DEFAULT_POLICY),
                        cost_curve=dcut.pop("cost_curve", None), dtype=job.get("dtype", "float32"), **dcut)
        if "raw_additional_config" in run:  # bypass llm_kwargs' own check: test the engine's start-up
            kw["additional_config"] = run["raw_additional_config"]
        if "speculative_config" in run:
            kw["speculative_config"] = run["speculative_config"]
    import vllm

    real_version = vllm.__version__
    if run.get("fake_vllm_version"):  # test the version pin at start-up
        vllm.__version__ = run["fake_vllm_version"]
    try:
        llm = LLM(**{**kw, **common, **run.get("engine_args", {})})
    finally:
        vllm.__version__ = real_version
    t1 = time.perf_counter()
    sp = SamplingParams(temperature=0.0, max_tokens=int(job["max_tokens"]), ignore_eos=bool(job.get("ignore_eos", True)))
    prompts = prompts[: int(run.get("num_prompts", len(prompts)))]
    timer = None
    if job.get("step_timing"):
        timer = StepTimer(llm)
        timer.wave = len(prompts)
    t1 = time.perf_counter()
    c1 = time.process_time()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    t2 = time.perf_counter()
    cpu_s = time.process_time() - c1
    if timer is not None:
        timer.restore()
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    sched = _scheduler(llm)
    metrics = dict(sched.dcut_metrics) if hasattr(sched, "dcut_metrics") else None
    n_out = sum(len(t) for t in tokens)
    result = {"name": run["name"], "token_ids": tokens, "startup_s": t1 - t0, "generate_s": t2 - t1,
              "output_tokens": n_out, "tok_per_s": n_out / (t2 - t1), "dcut_metrics": metrics,
              "generate_cpu_s": cpu_s}
    if timer is not None:
        result["steps"] = [r.to_dict() for r in timer.records]
        result["prefill_s"] = sum(r.step_ms for r in timer.records if r.kind == "prefill") / 1e3
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort between runs
        pass
    del llm, sched
    gc.collect()
    return result


def run_job(job: dict) -> dict:
    """Run every ``runs`` entry of ``job`` (module docstring) in this process, one engine at a time.

    A run that fails to start or run is recorded with its ``error`` (type, message, traceback); the
    others still run. Prints one summary line per run (its result without the token ids).

    Returns:
        ``{"prompts": token ids per prompt, "runs": one result per run}``.
    """
    for name in job.get("import_first", ()):
        importlib.import_module(name)
    prompts = load_prompt_token_ids(job["prompts"], job["target"])
    results = []
    for run in job["runs"]:
        try:
            results.append(run_one(job, run, prompts))
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which asserts on it
            results.append({"name": run["name"], "error": {"type": type(exc).__name__, "message": str(exc),
                                                           "traceback": traceback.format_exc()}})
        print(json.dumps({k: v for k, v in results[-1].items() if k != "token_ids"})[:2000], flush=True)
    return {"prompts": prompts, "runs": results}
