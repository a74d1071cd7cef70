"""``dcut-profile --vllm MODEL``: a cost curve measured in vLLM's own forward (dummy batches).

vLLM lives in its own environment (``DCUT_WITH_VLLM=1 bash scripts/install.sh`` builds
``.venv-vllm``), so this runs :mod:`dcut_sched.cli.vllm_profile` with that environment's
python and the CPU settings of :func:`dcut_sched.integrations.vllm_tools.venv.cpu_env`, and checks the
file it wrote. What is timed, and how the draft step is approximated, is documented there and in
docs/vllm.md.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from dcut_sched.cost_curve import CostCurve
from dcut_sched.integrations.vllm_tools.venv import cpu_env, venv_python, vllm_available
from dcut_sched.util.atomic import all_or_none, atomic_path, existing_folder

__all__ = ["profile_vllm", "steps_path_for"]


class VllmProfileError(RuntimeError):
    """The vLLM environment is missing or the profile run failed (the message says why)."""


def profile_vllm(model: str, out: str, *, draft: str | None, block_size: int, batch_sizes: list[int],
                 context_len: int, warmups: int, repeats: int, dtype: str, engine_steps: int = 40,
                 timeout_s: float = 3600.0) -> CostCurve:
    """Run the in-engine profile and return the curve it wrote to ``out``.

    ``engine_steps``: with a draft, also time real engine steps on held-out prompts with that many
    new tokens per request (``draft``, ``draft_first`` and ``step_overhead`` rows); 0 = dummy batches only.
    ``timeout_s``: the most the profile process may run (start-up included; a hung engine is an error).

    Raises:
        VllmProfileError: no vLLM environment, or the profile process failed (its last output lines).
    """
    ok, reason = vllm_available()
    if not ok:
        raise VllmProfileError(reason)
    if not Path(model, "config.json").is_file():
        raise VllmProfileError(f"--vllm {model}: not a Hugging Face model folder (no config.json); "
                               "write the SmolLM2 pair with `python -m dcut_sched.cli.vllm_checkpoint`")
    out = Path(out)
    # The profile process writes into a private folder beside --out; the curve (and its engine-step
    # records) reach their places together, only after the curve loads: a failed run leaves nothing.
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", suffix=".vllm-profile", dir=existing_folder(out.parent)) as tmp:
        staged = Path(tmp) / out.name
        cmd = [str(venv_python()), "-m", "dcut_sched.cli.vllm_profile", "--model", str(model),
               "--block-size", str(block_size), "--batch-sizes", ",".join(map(str, batch_sizes)),
               "--context-len", str(context_len), "--warmups", str(warmups), "--repeats", str(repeats),
               "--dtype", dtype, "--engine-steps", str(int(engine_steps)), "--out", str(staged)]
        if draft:
            cmd += ["--draft", str(draft)]
        try:
            proc = subprocess.run(cmd, env=cpu_env(), capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise VllmProfileError(f"the vLLM profile run did not finish in {timeout_s:g} s (a hung engine?); "
                                   "rerun on a quieter machine or with fewer --batch-sizes") from None
        for line in proc.stdout.splitlines():
            if line.startswith(("bs ", "wrote ", "engine steps")):
                print(line.replace(str(staged), str(out)), flush=True)
        if proc.returncode != 0:
            last = next((line for line in reversed((proc.stdout + proc.stderr).splitlines()) if line.strip()), "")
            raise VllmProfileError(f"vLLM profile run failed (exit {proc.returncode}): {last.strip()[:300]}")
        curve = CostCurve.load(staged, check_hardware=False)
        with all_or_none():
            for produced in sorted(Path(tmp).iterdir()):
                dest = out.parent / produced.name  # OUT and OUT.steps.jsonl (steps_path_for)
                with atomic_path(dest) as part:
                    shutil.copyfile(produced, part)
    return curve


def steps_path_for(out: str | Path) -> Path:
    """The engine-step records the profile writes beside its curve (``OUT.steps.jsonl``)."""
    return Path(out).with_suffix(".steps.jsonl")

