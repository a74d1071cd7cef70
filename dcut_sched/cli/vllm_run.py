"""``python -m dcut_sched.cli.vllm_run --job FILE --out FILE``: run vLLM with and without D-Cut on a
job file in the vLLM environment (:func:`dcut_sched.integrations.vllm_tools.run.run_job`, whose
module docstring defines the job and the result) and write the result JSON atomically."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..integrations.vllm_tools.run import run_job
from ..util.atomic import atomic_write_text

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dcut_sched.cli.vllm_run",
                                 description="Run vLLM (with and without D-Cut) on a job file; write outputs as JSON.")
    ap.add_argument("--job", required=True, help="job JSON (dcut_sched.integrations.vllm_tools.run's docstring)")
    ap.add_argument("--out", required=True, help="result JSON (written atomically)")
    args = ap.parse_args(argv)

    job = json.loads(Path(args.job).read_text())
    atomic_write_text(args.out, json.dumps(run_job(job)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
