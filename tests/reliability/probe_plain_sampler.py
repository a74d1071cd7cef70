"""Hostile probe of the plain-sampler wrapper (commit 8247013). Run in .venv-vllm with cpu_env():
    .venv-vllm/bin/python tests/reliability/probe_plain_sampler.py OUTDIR
Builds nospec / switch (skip_undrafted_block true) / switch-block (false) engines and runs several
SamplingParams phases on each; writes OUTDIR/result.json (tokens, logprobs, worker-record slices)."""
import gc
import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
ROOT = Path(__file__).resolve().parents[2]
N = int(os.environ.get("PROBE_N", "8")); MAXT = 24
from vllm import LLM, SamplingParams, TokensPrompt  # noqa: E402 - after VLLM_ENABLE_V1_MULTIPROCESSING is set

from dcut_sched.integrations.vllm import llm_kwargs  # noqa: E402 - after VLLM_ENABLE_V1_MULTIPROCESSING is set
from dcut_sched.integrations.vllm_tools.checkpoint import write_pair  # noqa: E402 - after VLLM_ENABLE_V1_MULTIPROCESSING is set
from dcut_sched.integrations.vllm_tools.run import load_prompt_token_ids  # noqa: E402 - after VLLM_ENABLE_V1_MULTIPROCESSING is set

target = Path(os.environ.get("PROBE_TARGET") or write_pair()[0])
prompts = load_prompt_token_ids({"file": str(ROOT / "dcut_sched/data/traces/prompts.jsonl"), "n": N, "offset": 48,
                                 "chat": True}, str(target))
SW = {"speculate_margin": 1000.0, "probe_interval": 1, "probe_budget": 0.9, "feedback": False}
CURVE = str(ROOT / "dcut_sched/profiler/profiles/cpu-smollm2-135m-b8.json")
DRAFT = f"dflash:{ROOT / 'drafters/smollm2-135m-dflash'}"

def phases():
    P = {}
    P["greedy"] = [SamplingParams(temperature=0.0, max_tokens=MAXT, ignore_eos=True) for i in range(N)]
    P["logprobs"] = [SamplingParams(temperature=0.0, max_tokens=MAXT, ignore_eos=True, logprobs=2) for i in range(N)]
    P["seeded"] = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=MAXT, ignore_eos=True) for i in range(N)]
    P["seeded_again"] = P["seeded"]
    P["penalties"] = [SamplingParams(temperature=0.0, max_tokens=MAXT, ignore_eos=True, repetition_penalty=1.3,
                                     presence_penalty=0.5, frequency_penalty=0.3) for i in range(N)]
    P["mixed"] = [SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=2) if i % 2 == 0 else
                  SamplingParams(temperature=0.0, max_tokens=MAXT, ignore_eos=True) for i in range(N)]
    P["seeded_mix"] = [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7 + i, max_tokens=MAXT if i % 3 else 6,
                                      ignore_eos=True, repetition_penalty=1.2) for i in range(N)]
    P["unseeded"] = [SamplingParams(temperature=1.0, max_tokens=MAXT, ignore_eos=True) for i in range(N)]
    P["bad_words"] = [SamplingParams(temperature=0.0, max_tokens=MAXT, ignore_eos=True, bad_words=["the", " the", "The"]) for i in range(N)]
    P["tokids"] = [SamplingParams(temperature=0.0, max_tokens=MAXT, ignore_eos=True, logprob_token_ids=[10, 20, 30]) for i in range(N)]
    P["tokids_mix"] = [SamplingParams(temperature=0.0, max_tokens=MAXT, ignore_eos=True, logprob_token_ids=[10, 20, 30])
                       if i % 2 == 0 else SamplingParams(temperature=0.0, max_tokens=MAXT, ignore_eos=True) for i in range(N)]
    P["logit_bias_min_tokens"] = [SamplingParams(temperature=0.0, max_tokens=MAXT, ignore_eos=True, min_tokens=4,
                                                 logit_bias={198: 5.0, 13: 3.0}) for i in range(N)]
    from vllm.sampling_params import StructuredOutputsParams
    P["regex"] = [SamplingParams(temperature=0.0, max_tokens=MAXT, ignore_eos=False,
                                 structured_outputs=StructuredOutputsParams(regex=r"(yes|no|maybe)[a-z ]{3,30}\\.")) for i in range(N)]
    P["regex_seeded"] = [SamplingParams(temperature=1.0, seed=3 + i, max_tokens=MAXT, ignore_eos=False,
                                 structured_outputs=StructuredOutputsParams(regex=r"[a-z ]{5,40}\\.")) for i in range(N)]
    if os.environ.get("PROBE_PHASES"):
        P = {k: P[k] for k in os.environ["PROBE_PHASES"].split(",")}
    return P

def lines(p):
    try:
        return [json.loads(l) for l in Path(p).read_text().splitlines() if l.strip()]
    except FileNotFoundError:
        return []

engines = [("nospec", None), ("switch", True), ("switch-block", False)]
if os.environ.get("PROBE_ENGINES"):
    engines = [e for e in engines if e[0] in os.environ["PROBE_ENGINES"].split(",")]
result = {"prompts": prompts, "engines": {}}
for name, skip in engines:
    rec = str(out_dir / f"{name}.jsonl")
    if skip is None:
        kw = {"model": str(target), "dtype": "float32", "enforce_eager": True}
    else:
        kw = llm_kwargs(str(target), DRAFT, 8, "fine", cost_curve=CURVE, policy_params=SW, record_path=rec,
                        log_interval_s=1e-6, skip_undrafted_block=skip)
    llm = LLM(**{**kw, "max_model_len": 512, "max_num_seqs": N, "seed": 0})
    eres = {}
    for ph, sps in phases().items():
        before = len(lines(rec + ".worker.jsonl"))
        try:
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sps, use_tqdm=False)
            r = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
                 "logprobs_len": [None if o.outputs[0].logprobs is None else len(o.outputs[0].logprobs) for o in outs],
                 "logprobs": [None if o.outputs[0].logprobs is None else
                              [{str(k): v.logprob for k, v in d.items()} for d in o.outputs[0].logprobs] for o in outs]}
        except Exception as exc:  # noqa: BLE001
            import traceback
            r = {"error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()}
        r["worker"] = lines(rec + ".worker.jsonl")[before:]
        eres[ph] = r
        print(name, ph, r.get("error", "ok"), flush=True)
    result["engines"][name] = eres
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm; gc.collect()
    (out_dir / "result.json").write_text(json.dumps(result))
