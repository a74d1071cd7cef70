"""The corpus of hostile inputs (tests/data/broken/, made by tests/data/make_broken.py): every CLI
refuses each with exit 2 and one line naming the file, flag or field, before any work, and leaves
every input file byte-identical and no output or temp file behind.

Classes (issue "Reliability"): 1 an output path that is an input, 2 values the loader must not
truncate/merge/wrap (also: a JSON key given twice, a repeated ``--param``, sampled ``p`` columns
stored as strings or booleans), 4 parameters that make results meaningless (also: a trace
temperature that is not finite, ``--graph-tokens`` that cannot hold a step), 5 outputs checked
before work, 6 malformed files and flags (also: a symlink loop, made by the fixture as
``{T}/loop``, and 5,000-digit numbers). Classes 3 (calibrator lock-out) and 7 (API contracts) are
library behaviour, tested in test_calibrator_recovery.py and test_api_contracts.py.

A needle starting with ``!`` must not appear (a 5,000-digit value is not echoed back).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

BROKEN = Path(__file__).resolve().parents[1] / "data" / "broken"
GOOD = ("good.parquet", "good-cost.json", "good-prompts.jsonl")
FAST = ["--steps", "12", "--warmup", "2", "--batch-sizes", "2", "--quiet"]
SIM = ["--trace", "{T}/good.parquet", "--cost", "{T}/good-cost.json"]
DIGITS = "1" * 5000
LOOP = "symlink loop (a link on the path leads back to itself)"


def _main(cli: str):
    if cli == "sim":
        from dcut_sched.cli.sim import main
    elif cli == "trace":
        from dcut_sched.cli.trace import main
    elif cli == "engine":
        from dcut_sched.cli.engine import main
    else:
        from dcut_sched.cli.profile import main
    return main


# (id, class, cli, argv, needles): exit status 2 for all.
CASES = [
    # 1: an output path that is an input
    ("sim-out-is-trace", 1, "sim", [*SIM, "--out", "{T}/good.parquet", *FAST], ["--out", "--trace", "good.parquet"]),
    ("sim-out-is-cost", 1, "sim", [*SIM, "--out", "{T}/good-cost.json", *FAST], ["--out", "--cost"]),
    ("sim-out-is-trace-by-symlink", 1, "sim", [*SIM, "--out", "{T}/link.parquet", *FAST], ["--out", "--trace"]),
    ("sim-out-is-trace-other-spelling", 1, "sim", [*SIM, "--out", "{T}/sub/../good.parquet", *FAST], ["--out", "--trace"]),
    ("sim-selection-is-cost", 1, "sim", [*SIM, "--selection-curve", "{T}/good-cost.json"], ["--selection-curve", "--cost"]),
    ("sim-selection-is-trace", 1, "sim", [*SIM, "--selection-curve", "{T}/good.parquet"], ["--selection-curve", "--trace"]),
    ("trace-stats-out-is-input", 1, "trace", ["stats", "{T}/good.parquet", "--out", "{T}/good.parquet"], ["--out", "FILE"]),
    ("trace-fit-out-is-input", 1, "trace", ["fit", "{T}/good.parquet", "--out", "{T}/good.parquet"], ["--out", "FILE"]),
    ("trace-synth-out-is-params", 1, "trace", ["synth", "--params", "{T}/good.parquet", "--out", "{T}/good.parquet"],
     ["--out", "--params"]),
    ("trace-record-out-is-prompts", 1, "trace", ["record", "--prompts", "{T}/good.parquet", "--out", "{T}/good.parquet"],
     ["--out", "--prompts"]),
    ("engine-out-is-prompts", 1, "engine", ["--prompts", "{T}/prompts.json", "--out", "{T}/prompts.json"],
     ["--out", "--prompts"]),
    ("engine-steps-is-cost", 1, "engine", ["--cost", "{T}/good-cost.json", "--steps", "{T}/good-cost.json"],
     ["--steps", "--cost"]),
    ("engine-steps-is-out", 1, "engine", ["--out", "{T}/s.json", "--steps", "{T}/s.json"], ["--steps", "--out"]),
    ("profile-out-is-fit", 1, "profile",
     ["--analytic", "--device", "h20", "--fit", "{T}/good-cost.json", "--out", "{T}/good-cost.json"], ["--out", "--fit"]),
    ("profile-report-is-out", 1, "profile",
     ["--analytic", "--device", "h200", "--out", "{T}/p.json", "--report", "{T}/p.json"], ["--report", "--out"]),
    # 2: values the loader must not truncate, merge or wrap
    ("accept-len-null", 2, "trace", ["stats", "{B}/accept_len_null.parquet"],
     ["accept_len_null.parquet", "row 5", "'accept_len'", "null"]),
    ("accept-len-float", 2, "trace", ["stats", "{B}/accept_len_float.parquet"],
     ["accept_len_float.parquet", "row 3", "'accept_len'", "2.7", "not a whole number"]),
    ("request-id-float", 2, "sim", ["--trace", "{B}/request_id_float.parquet", "--cost", "{T}/good-cost.json", *FAST],
     ["request_id_float.parquet", "row 0", "'request_id'", "1.25"]),
    ("request-id-int64-wraps", 2, "trace", ["fit", "{B}/request_id_int64_wraps.parquet"],
     ["request_id_int64_wraps.parquet", "'request_id'", "4294967296", "does not fit int32"]),
    ("request-id-string", 2, "sim", ["--trace", "{B}/request_id_string.parquet", "--cost", "{T}/good-cost.json", *FAST],
     ["request_id_string.parquet", "'request_id'", "'r0'"]),
    ("accept-len-int8-wraps-b200", 2, "trace", ["stats", "{B}/accept_len_int8_wraps_b200.parquet"],
     ["accept_len_int8_wraps_b200.parquet", "'accept_len'", "-106"]),
    ("sampled-p-string", 2, "sim", ["--trace", "{B}/sampled_p_string.parquet", "--cost", "{T}/good-cost.json", *FAST],
     ["sampled_p_string.parquet", "field 'p1'", "column of type", "(e.g. '0.5')", "store target probabilities as float32"]),
    ("sampled-p-bool", 2, "trace", ["stats", "{B}/sampled_p_bool.parquet"],
     ["sampled_p_bool.parquet", "field 'p1'", "column of type bool (e.g. True)"]),
    ("sim-cost-duplicate-key", 2, "sim", ["--trace", "{T}/good.parquet", "--cost", "{B}/cost-duplicate-key.json", *FAST],
     ["--cost", "cost-duplicate-key.json", "key 'median_ms' appears twice in one object"]),
    ("profile-fit-duplicate-key", 2, "profile", ["--analytic", "--device", "h20", "--fit", "{B}/cost-duplicate-key.json",
                                                 "--out", "{T}/c.json"],
     ["--fit", "cost-duplicate-key.json", "key 'median_ms' appears twice"]),
    ("synth-params-duplicate-key", 2, "trace", ["synth", "--params", "{B}/params-duplicate-key.json", "--out",
                                                "{T}/o.parquet"],
     ["--params", "params-duplicate-key.json", "key 'block_size' appears twice"]),
    ("sim-param-repeated", 2, "sim", [*SIM, "--param", "uniform.rho=0.2", "--param", "uniform.rho=0.9", *FAST],
     ["--param uniform.rho is given twice (0.2 and 0.9); give it once"]),
    ("engine-param-repeated", 2, "engine", ["--policy", "uniform", "--param", "rho=0.2", "--param", "rho=0.3"],
     ["--param rho is given twice (0.2 and 0.3); give it once"]),
    ("sim-param-duplicate-json-key", 2, "sim", [*SIM, "--param", 'dcut.ratios={"a": 1, "a": 2}', *FAST],
     ["argument --param", "dcut.ratios", "key 'a' appears twice"]),
    # 4: parameters that make results meaningless
    ("overhead-inf", 4, "sim", [*SIM, "--overhead-ms", "inf", *FAST], ["--overhead-ms", "not finite"]),
    ("load-nan", 4, "sim", [*SIM, "--mode", "open", "--load", "nan", *FAST], ["--load", "not finite"]),
    ("param-nan", 4, "sim", [*SIM, "--param", "fine.speculate_margin=NaN", *FAST],
     ["--param", "speculate_margin", "not finite"]),
    ("param-policy-not-run", 4, "sim", [*SIM, "--policies", "dcut", "--param", "fine.granularity=4", *FAST],
     ["--param fine.granularity", "not run"]),
    ("param-unknown-policy", 4, "sim", [*SIM, "--param", "dcutt.ratios=[1.0]", *FAST], ["--param dcutt.ratios", "unknown policy"]),
    ("param-wrong-key", 4, "sim", [*SIM, "--param", "dcut.rho=0.5", *FAST], ["--param", "'rho'", "valid keys: ratios"]),
    ("engine-param-wrong-key", 4, "engine", ["--policy", "fine", "--param", "rho=0.5"],
     ["--param", "'rho'", "valid keys: granularity"]),
    ("temperature-inf", 4, "sim", ["--trace", "{B}/temperature_inf.parquet", "--cost", "{T}/good-cost.json", *FAST],
     ["temperature_inf.parquet", "field 'temperature'", "'inf' is not a finite number >= 0", "(0 for greedy)"]),
    ("temperature-1e400", 4, "trace", ["stats", "{B}/temperature_1e400.parquet"],
     ["temperature_1e400.parquet", "field 'temperature'", "'1e400' is not a finite number >= 0"]),
    ("temperature-nan", 4, "sim", ["--trace", "{B}/temperature_nan.parquet", "--cost", "{T}/good-cost.json", *FAST],
     ["temperature_nan.parquet", "field 'temperature'", "'nan' is not a finite number", "!greedy trace"]),
    ("graph-tokens-above-curve", 4, "sim", [*SIM, "--graph-tokens", "1000000", *FAST],
     ["--graph-tokens 1000000: at batch size 2", "2 x B=4", "needs a count in 8..8", "bs 2: 8..8"]),
    ("graph-tokens-below-step", 4, "sim", [*SIM, "--graph-tokens", "3", *FAST],
     ["--graph-tokens 3: at batch size 2", "policy full can verify up to 8 tokens", "needs a count in 8..8"]),
    ("graph-tokens-below-anchors", 4, "sim", [*SIM, "--policies", "fine", "--graph-tokens", "1", *FAST],
     ["--graph-tokens 1: at batch size 2", "at least 2 tokens (one per request)", "needs a count in 2..8"]),
    ("graph-tokens-open-loop", 4, "sim", [*SIM, "--mode", "open", "--requests", "20", "--graph-tokens", "2,4,8",
                                          "--batch-sizes", "4", "--quiet"],
     ["--graph-tokens 2,4,8: at batch size 3", "needs a count in 12..12", "bs 4: 16..16"]),
    # 5: outputs checked before any work
    ("out-in-a-file", 5, "sim", [*SIM, "--out", "{T}/good.parquet/r.csv", *FAST], ["--out", "cannot write"]),
    ("bad-plot-after-out", 5, "sim", [*SIM, "--out", "{T}/r.csv", "--plot", "{T}/r.txt", *FAST],
     ["--plot", "unknown output format"]),
    ("engine-trace-unwritable", 5, "engine", ["--trace", "{T}/good.parquet/t.parquet"], ["--trace", "cannot write"]),
    ("profile-report-unwritable", 5, "profile",
     ["--analytic", "--device", "h200", "--out", "{T}/p.json", "--report", "{T}/good.parquet/r.csv"],
     ["--report", "cannot write"]),
    # 6: malformed files and flags
    ("metadata-not-utf8", 6, "trace", ["stats", "{B}/metadata_not_utf8.parquet"],
     ["metadata_not_utf8.parquet", "b'dataset'", "not UTF-8"]),
    ("engine-prompts-is-parquet", 6, "engine", ["--prompts", "{B}/good.parquet"], ["--prompts", "good.parquet", "Parquet"]),
    ("record-prompts-is-parquet", 6, "trace", ["record", "--prompts", "{B}/good.parquet", "--out", "{T}/o.parquet"],
     ["--prompts", "good.parquet", "Parquet"]),
    ("record-prompts-not-utf8", 6, "trace", ["record", "--prompts", "{B}/prompts-not-utf8.jsonl", "--out", "{T}/o.parquet"],
     ["--prompts", "prompts-not-utf8.jsonl", "not UTF-8"]),
    ("record-prompts-nested", 6, "trace", ["record", "--prompts", "{B}/prompts-nested.jsonl", "--out", "{T}/o.parquet"],
     ["--prompts", "prompts-nested.jsonl", "nested too deeply"]),
    ("engine-prompts-not-utf8", 6, "engine", ["--prompts", "{B}/prompts-not-utf8.jsonl"],
     ["--prompts", "prompts-not-utf8.jsonl", "not UTF-8"]),
    ("synth-params-is-parquet", 6, "trace", ["synth", "--params", "{B}/good.parquet", "--out", "{T}/o.parquet"],
     ["--params", "good.parquet", "Parquet"]),
    ("synth-params-nested", 6, "trace", ["synth", "--params", "{B}/params-nested.json", "--out", "{T}/o.parquet"],
     ["--params", "params-nested.json", "nested too deeply"]),
    ("synth-params-string", 6, "trace", ["synth", "--params", "{B}/params-string.json", "--out", "{T}/o.parquet"],
     ["--params", "params-string.json", "JSON object"]),
    ("synth-params-nan", 6, "trace", ["synth", "--params", "{B}/params-nan.json", "--out", "{T}/o.parquet"],
     ["--params", "params-nan.json", "'separation'", "not a finite"]),
    ("sim-cost-is-parquet", 6, "sim", ["--trace", "{T}/good.parquet", "--cost", "{B}/good.parquet", *FAST],
     ["--cost", "good.parquet", "Parquet"]),
    ("sim-cost-nested", 6, "sim", ["--trace", "{T}/good.parquet", "--cost", "{B}/params-nested.json", *FAST],
     ["--cost", "params-nested.json", "nested too deeply"]),
    ("profile-fit-is-parquet", 6, "profile", ["--analytic", "--device", "h20", "--fit", "{B}/good.parquet", "--out",
                                              "{T}/c.json"], ["--fit", "good.parquet", "Parquet"]),
    ("engine-cost-not-utf8", 6, "engine", ["--policy", "dcut", "--cost", "{B}/prompts-not-utf8.jsonl"],
     ["--cost", "prompts-not-utf8.jsonl", "not UTF-8"]),
    ("profile-model-is-parquet", 6, "profile", ["--cpu", "--model", "{B}/good.parquet", "--out", "{T}/c.json"],
     ["good.parquet", "Parquet"]),
    ("profile-model-config-bad", 6, "profile",
     ["--analytic", "--device", "h200", "--model", "{B}/model-config-bad.json", "--out", "{T}/c.json"],
     ["model-config-bad.json", "text_config"]),
    ("profile-threads-negative", 6, "profile", ["--cpu", "--threads", "-1", "--out", "{T}/c.json"], ["--threads", ">= 1"]),
    ("record-threads-negative", 6, "trace", ["record", "--threads", "-1", "--out", "{T}/o.parquet"], ["--threads", ">= 1"]),
    ("sim-seed-negative", 6, "sim", [*SIM, "--seed", "-1", *FAST], ["--seed", ">= 0"]),
    ("sim-jobs-zero", 6, "sim", [*SIM, "--sweep", "--jobs", "0", *FAST], ["--jobs", ">= 1"]),
    ("profile-seed-negative", 6, "profile", ["--analytic", "--device", "h200", "--seed", "-1", "--out", "{T}/c.json"],
     ["--seed", ">= 0"]),
    ("engine-threads-zero", 6, "engine", ["--threads", "0"], ["--threads", ">= 1"]),
    # 6: symlink loops, as an input or an output
    ("sim-trace-loop", 6, "sim", ["--trace", "{T}/loop", "--cost", "{T}/good-cost.json", "--out", "{T}/o.csv", *FAST],
     [f"--trace {{T}}/loop: is a {LOOP}; give --trace a real file"]),
    ("sim-cost-loop", 6, "sim", ["--trace", "{T}/good.parquet", "--cost", "{T}/loop", "--out", "{T}/o.csv", *FAST],
     [f"--cost {{T}}/loop: is a {LOOP}"]),
    ("sim-out-loop", 6, "sim", [*SIM, "--out", "{T}/loop", *FAST], [f"--out {{T}}/loop: is a {LOOP}; give --out another path"]),
    ("sim-out-under-loop", 6, "sim", [*SIM, "--out", "{T}/loop/r.csv", *FAST], ["--out {T}/loop/r.csv", LOOP]),
    ("sim-seeds-out-loop", 6, "sim", [*SIM, "--seeds", "2", "--out", "{T}/loop", *FAST], ["--out {T}/loop", LOOP]),
    ("trace-stats-loop", 6, "trace", ["stats", "{T}/loop", "--out", "{T}/x.csv"], ["FILE {T}/loop", LOOP]),
    ("trace-fit-loop", 6, "trace", ["fit", "{T}/loop"], ["FILE {T}/loop", LOOP]),
    ("profile-fit-loop", 6, "profile", ["--analytic", "--device", "h20", "--fit", "{T}/loop", "--out", "{T}/c.json"],
     ["--fit {T}/loop", LOOP]),
    ("record-prompts-loop", 6, "trace", ["record", "--prompts", "{T}/loop", "--out", "{T}/o.parquet"],
     ["--prompts {T}/loop", LOOP]),
    ("synth-params-loop", 6, "trace", ["synth", "--params", "{T}/loop", "--out", "{T}/o.parquet"], ["--params {T}/loop", LOOP]),
    ("engine-cost-loop", 6, "engine", ["--policy", "dcut", "--cost", "{T}/loop"], ["--cost {T}/loop", LOOP]),
    ("engine-prompts-loop", 6, "engine", ["--prompts", "{T}/loop"], ["--prompts {T}/loop", LOOP]),
    # 6: 5,000-digit numbers: refused naming the file or key, never echoed
    ("sim-cost-5000-digits", 6, "sim", ["--trace", "{T}/good.parquet", "--cost", "{B}/cost-5000-digits.json", *FAST],
     ["--cost", "cost-5000-digits.json", "a number with 5000 characters; at most 64 digits are read", "!99999999999"]),
    ("profile-fit-5000-digits", 6, "profile", ["--analytic", "--device", "h20", "--fit", "{B}/cost-5000-digits.json",
                                               "--out", "{T}/c.json"],
     ["--fit", "cost-5000-digits.json", "at most 64 digits", "!Exceeds the limit"]),
    ("engine-cost-5000-digits", 6, "engine", ["--policy", "dcut", "--cost", "{B}/cost-5000-digits.json"],
     ["--cost", "cost-5000-digits.json", "at most 64 digits"]),
    ("synth-params-5000-digits", 6, "trace", ["synth", "--params", "{B}/params-5000-digits.json", "--out", "{T}/o.parquet"],
     ["--params", "params-5000-digits.json", "at most 64 digits", "!88888888888"]),
    ("record-prompts-5000-digits", 6, "trace", ["record", "--prompts", "{B}/prompts-5000-digits.jsonl", "--out",
                                                "{T}/o.parquet"],
     ["--prompts", "prompts-5000-digits.jsonl, line 1", "at most 64 digits", "!77777777777"]),
    ("sim-param-5000-digits", 6, "sim", [*SIM, "--param", f"uniform.rho={DIGITS}", *FAST],
     ["argument --param: uniform.rho: a number with 5000 characters; at most 64 digits are read", "!11111111111"]),
    ("sim-param-5000-fraction-digits", 6, "sim", [*SIM, "--param", f"uniform.rho=0.{DIGITS}", *FAST],
     ["argument --param: uniform.rho: a number with 5002 characters", "!11111111111"]),
    ("engine-param-5000-digits", 6, "engine", ["--policy", "uniform", "--param", f"rho={DIGITS}"],
     ["argument --param: rho: a number with 5000 characters", "!11111111111"]),
]


def _digests(*folders: Path) -> dict[str, str]:
    out = {}
    for folder in folders:
        for root, _dirs, files in os.walk(folder):
            for name in files:
                p = Path(root) / name
                out[str(p)] = f"-> {os.readlink(p)}" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def inputs(tmp_path):
    for name in GOOD:
        shutil.copy(BROKEN / name, tmp_path / name)
    shutil.copy(BROKEN / "good-prompts.jsonl", tmp_path / "prompts.json")
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "good.parquet", tmp_path / "link.parquet")
    os.symlink("loop", tmp_path / "loop")  # a link to itself: opening it fails with ELOOP
    return tmp_path


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_broken_input_exits_2_naming_it_and_changes_nothing(case, inputs, capsys):
    _id, _cls, cli, argv, needles = case
    argv = [a.replace("{B}", str(BROKEN)).replace("{T}", str(inputs)) for a in argv]
    before = _digests(BROKEN, inputs)
    status = _main(cli)(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert ": error: " in err
    for needle in needles:
        if needle.startswith("!"):
            assert needle[1:] not in err, (needle, err)
        else:
            assert needle.replace("{T}", str(inputs)) in err, (needle, err)
    assert _digests(BROKEN, inputs) == before  # inputs byte-identical, no output or temp file left


def test_validate_names_a_symlink_loop(inputs, capsys):
    """``dcut-trace validate`` reads its files without the flag check: the trace reader reports ELOOP."""
    from dcut_sched.cli.trace import main

    assert main(["validate", str(inputs / "loop")]) == 2
    out = capsys.readouterr().out
    assert f"{inputs / 'loop'}: is a symlink loop (the link leads back to itself); give a trace file" in out


def test_library_readers_name_a_symlink_loop(inputs):
    from dcut_sched.cli.args import same_file
    from dcut_sched.cli.errors import UsageError
    from dcut_sched.traces import Trace, TraceError
    from dcut_sched.traces.synth import SynthParams, SynthParamsError
    from dcut_sched.util.inputs import InputFileError, is_symlink_loop, read_json_strict

    loop = inputs / "loop"
    assert is_symlink_loop(loop) and is_symlink_loop(loop / "x.json") and not is_symlink_loop(inputs / "none")
    with pytest.raises(InputFileError, match=r"loop: is a symlink loop .*; give a JSON file$"):
        read_json_strict(loop)
    with pytest.raises(SynthParamsError, match="loop: is a symlink loop"):
        SynthParams.load(loop)
    with pytest.raises(TraceError, match="loop: is a symlink loop"):
        Trace.load(loop)
    with pytest.raises(UsageError, match=r"^--out .*loop: is a symlink loop .*; give --out a real file$"):
        same_file(loop, inputs / "good.parquet", flags=("--out", "--trace"))
    assert same_file(inputs / "link.parquet", inputs / "good.parquet")


def test_every_class_has_a_case():
    assert {c[1] for c in CASES} == {1, 2, 4, 5, 6}
    assert {c[2] for c in CASES} == {"sim", "trace", "engine", "profile"}


def test_corpus_is_current(tmp_path, monkeypatch):
    """The committed corpus is what make_broken.py writes (file names)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_broken", BROKEN.parent / "make_broken.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "OUT", tmp_path)
    mod.main()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in BROKEN.iterdir())
