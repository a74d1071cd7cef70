"""Start-up in real vLLM 0.32.0 on CPU, without generating: a failed engine leaves the process clean,
and under multiprocessing the user's process sees the D-Cut config error itself.

Each test is one short subprocess in the vLLM environment; no engine core is started (the checks
fire before), so the module costs seconds, not minutes.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from dcut_sched.integrations.vllm_tools.venv import cpu_env, venv_python

from .test_vllm_engine import REPO_ROOT, _require_vllm

pytestmark = pytest.mark.slow

_REBIND = """
import json
import numba  # noqa: F401  (vLLM's ngram proposer imports it: llvmlite's ffi.lib joins sys.modules)
from vllm.triton_utils.dispatcher import register_kernels
from dcut_sched.integrations.vllm.cpu_kernels import EXPAND_KERNEL, expand_kernel, install
import vllm.v1.sample.rejection_sampler as rs

out = {}
try:
    register_kernels({EXPAND_KERNEL: expand_kernel})
    out["vllm_scan"] = "ok"
except AttributeError as exc:
    out["vllm_scan"] = str(exc)
install()
register_kernels({EXPAND_KERNEL: expand_kernel})  # what every later engine's worker does
out["kernel"] = type(rs.expand_kernel).__name__
print("RESULT " + json.dumps(out))
"""


def _result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_kernel_registration_survives_numba_in_the_process():
    """vLLM's own rebinding scan fails once numba is imported (the poisoned-process case); the
    plugin's scan registers the kernel in the same process."""
    _require_vllm()
    proc = subprocess.run([str(venv_python()), "-c", _REBIND], env=cpu_env(), capture_output=True, text=True,
                          timeout=300)
    out = _result(proc)
    assert out["vllm_scan"] == "'_lib_fn_wrapper' object has no attribute 'get'", out
    assert out["kernel"] == "KernelOverride"


def test_multiprocessing_front_end_raises_the_dcut_error(tmp_path):
    """VLLM_ENABLE_V1_MULTIPROCESSING=1: bad configs fail in the user's process with DCutConfigError
    (not vLLM's "Engine core initialization failed"), before any engine core starts."""
    _require_vllm()
    from dcut_sched.integrations.vllm_tools.checkpoint import write_pair

    target, draft = write_pair()
    runs = [
        {"name": "bad_policy", "dcut": {}, "raw_additional_config": {"dcut": {"policy": "nonesuch"}}},
        {"name": "bad_type", "dcut": {}, "raw_additional_config": {"dcut": {"calibrate": "false"}}},
        {"name": "no_config", "dcut": {}, "raw_additional_config": {}},
        {"name": "ngram", "dcut": {"policy": "full"},
         "speculative_config": {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 3}},
    ]
    job = {"target": str(target), "draft": str(draft), "block_size": 8, "prompts": [[1, 2, 3]], "max_tokens": 4,
           "max_num_seqs": 1, "max_model_len": 128, "runs": runs}
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = cpu_env()
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    proc = subprocess.run([str(venv_python()), "-m", "dcut_sched.cli.vllm_run", "--job",
                           str(tmp_path / "job.json"), "--out", str(tmp_path / "out.json")],
                          env=env, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    got = {r["name"]: r.get("error") for r in json.loads((tmp_path / "out.json").read_text())["runs"]}
    expected = {"bad_policy": r"unknown policy 'nonesuch' in key 'policy'",
                "bad_type": r"key 'calibrate': Input should be a valid boolean \(got 'false'\)",
                "no_config": r"no D-Cut config",
                "ngram": r"speculative method 'ngram' proposes drafts without logits"}
    import re

    for name, pattern in expected.items():
        err = got[name]
        assert err is not None, f"{name}: the engine started"
        assert err["type"] == "DCutConfigError" and re.search(pattern, err["message"]), err
        assert "EngineCore" not in err["traceback"], f"{name}: failed inside the engine core, not the front end"
