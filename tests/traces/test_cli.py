"""dcut-trace CLI: validate (shipped traces pass, broken corpus fails clearly), stats, synth, fit, record."""

import json
from pathlib import Path

import pytest

from dcut_sched.cli.trace import main
from dcut_sched.traces import Trace
from dcut_sched.traces.synth import SynthParams, generate

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "tests" / "data" / "broken_traces"
SHIPPED = sorted(p for p in (ROOT / "dcut_sched" / "data" / "traces").glob("*.parquet") if not p.name.endswith(".partial.parquet"))


def test_shipped_traces_validate():
    assert len(SHIPPED) >= 3, "dcut_sched/data/traces/ should ship the real and synthetic traces"
    assert main(["validate", *map(str, SHIPPED)]) == 0


def test_every_shipped_trace_has_a_card():
    for f in SHIPPED:
        card = f.with_suffix(".md")
        assert card.is_file(), f"{f.name} has no card {card.name}"


EXPECTED = json.loads((BROKEN / "expected.json").read_text())


def test_corpus_has_at_least_ten_broken_files():
    assert len(EXPECTED) >= 10
    assert sorted(EXPECTED) == sorted(p.name for p in BROKEN.glob("*.parquet"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_validate_reports_each_broken_file_in_one_line_per_fault(name, capsys):
    path = BROKEN / name
    assert main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in out.splitlines() if ln]
    assert lines and all(ln.startswith(str(path)) for ln in lines)
    assert "Traceback" not in out + err
    field = EXPECTED[name]
    if field == "file":
        assert "not a readable Parquet trace file" in lines[0]
    else:
        assert f"field {field!r}" in lines[0]


def test_row_faults_name_request_and_position(capsys):
    main(["validate", str(BROKEN / "nan_confidence.parquet")])
    assert "row 3, request 4, pos 3: field 'c2'" in capsys.readouterr().out


def test_validate_mixed_files_lists_all_and_fails(tmp_path, capsys):
    good = tmp_path / "good.parquet"
    generate(SynthParams(block_size=4), num_requests=2, seed=0).save(good)
    assert main(["validate", str(good), str(BROKEN / "truncated.parquet"), str(BROKEN / "position_gap.parquet")]) == 2
    out = capsys.readouterr().out
    assert f"{good}: OK" in out and "truncated.parquet" in out and "position_gap.parquet" in out


def test_stats_json_and_table(tmp_path, capsys):
    f = tmp_path / "s.parquet"
    generate(SynthParams(block_size=8, accept_logit=2.0), num_requests=6, seed=1).save(f)
    assert main(["stats", str(f), "--json", "--out", str(tmp_path / "s.json")]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["block_size"] == 8 and len(stats["accept_rate_by_depth"]) == 7
    assert len(stats["accept_len_hist"]) == 8 and sum(stats["accept_len_hist"]) == stats["num_steps"]
    assert 1.0 <= stats["tau"] <= 8.0 and 0.0 <= stats["ece"] <= 1.0
    assert json.loads((tmp_path / "s.json").read_text()) == stats
    assert main(["stats", str(f)]) == 0
    out = capsys.readouterr().out
    assert "tau" in out and "Reliability" in out and "Per-depth acceptance" in out


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    cases = [
        ["stats", str(BROKEN / "truncated.parquet")],
        ["stats", str(tmp_path / "missing.parquet")],
        ["fit", str(BROKEN / "not_parquet.parquet")],
        ["synth", "--preset", "no-such-preset", "--out", str(tmp_path / "x.parquet")],
        ["synth", "--params", str(tmp_path / "none.json"), "--out", str(tmp_path / "x.parquet")],
        ["synth", "--preset", "dflash-qwen3-8b-gsm8k", "--out", str(tmp_path / "x.csv")],
        ["record", "--prompts", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "r.parquet")],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"dcut-trace {argv[0]}: error:"), (argv, err)


def test_synth_preset_and_list(tmp_path, capsys):
    out = tmp_path / "g.parquet"
    assert main(["synth", "--preset", "dflash-qwen3-8b-gsm8k", "--num-requests", "5", "--seed", "3",
                 "--out", str(out)]) == 0
    t = Trace.load(out)
    assert t.num_requests == 5 and t.block_size == 16 and t.metadata["dataset"] == "dflash-qwen3-8b-gsm8k"
    assert main(["synth", "--list"]) == 0
    assert "dflash-qwen3-8b-gsm8k" in capsys.readouterr().out


def test_fit_writes_params_that_synth_reads(tmp_path, capsys):
    src = tmp_path / "src.parquet"
    generate(SynthParams(block_size=6, accept_logit=1.0, separation=1.0), num_requests=16, seed=2).save(src)
    params = tmp_path / "p.json"
    assert main(["fit", str(src), "--max-evals", "84", "--out", str(params), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["params"]["block_size"] == 6 and "tau" in result["rel_errors"]
    assert main(["synth", "--params", str(params), "--num-requests", "3", "--out", str(tmp_path / "o.parquet")]) == 0
    assert Trace.load(tmp_path / "o.parquet").block_size == 6


def test_unwritable_output_is_one_line_exit_2(tmp_path, capsys):
    from dcut_sched.cli.trace import main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["synth", "--preset", "dflash-qwen3-8b-gsm8k", "--num-requests", "2",
                 "--out", str(blocker / "sub" / "t.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot write" in err and str(blocker / "sub" / "t.parquet") in err
    assert "Traceback" not in err
