"""The trace package holds the format, statistics and the recorder's driver: importing it loads no torch."""

from __future__ import annotations

import json
import subprocess
import sys

MODULES = ["dcut_sched.traces", "dcut_sched.traces.format", "dcut_sched.traces.trace", "dcut_sched.traces.stats",
           "dcut_sched.traces.synth", "dcut_sched.traces.fit", "dcut_sched.traces.prompts", "dcut_sched.traces.record"]


def test_trace_modules_do_not_import_torch():
    code = ("import importlib, json, sys\n"
            f"mods = {MODULES!r}\n"
            "for m in mods:\n"
            "    importlib.import_module(m)\n"
            "print(json.dumps(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_model_backends_live_with_the_engine():
    from dcut_sched.engine import trace_backends
    from dcut_sched.traces import record

    for name in ("NativeBackend", "HFBackend", "draft_all_positions", "draft_positions_reference",
                 "target_probs_all_positions"):
        assert hasattr(trace_backends, name) and not hasattr(record, name)
