"""``dcut-profile --resume`` types the partial file strictly before any work: a partial with a field
of the wrong type is refused in one line naming the file and the field, exit 2, and is left
byte-identical; ``--fresh`` is the way out."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from dcut_sched.cli import profile as cli
from dcut_sched.profiler.grid import build_cells
from dcut_sched.profiler.harness import EagerTimer, PartialMismatch, load_partial, run_profile

GOOD = {"schema": "dcut.profile-partial/1",
        "settings": {"mode": "cpu", "backend": "cpu-eager", "block_size": 16, "seed": 0},
        "samples_ms": {"verify:1:1": [1.5, 1.25], "ar:1": [0.75]},
        "skipped": {"verify:8:128": "out of memory: ..."},
        "measure_seconds": 2.5}


def _set(doc, path, value):
    doc = copy.deepcopy(doc)
    *head, last = path
    node = doc
    for key in head:
        node = node[key]
    node[last] = value
    return doc


# (id, partial text, the field the message names)
CASES = [
    ("samples-number", _set(GOOD, ["samples_ms"], 5), "field samples_ms: Input should be a valid dictionary"),
    ("samples-null", _set(GOOD, ["samples_ms"], None), "field samples_ms: Input should be a valid dictionary"),
    ("cell-number", _set(GOOD, ["samples_ms", "ar:1"], 0.75), "field samples_ms.ar:1: Input should be a valid list"),
    ("cell-null", _set(GOOD, ["samples_ms", "ar:1"], None), "field samples_ms.ar:1: Input should be a valid list"),
    ("nested-lists", _set(GOOD, ["samples_ms", "ar:1"], [[0.75]]), "field samples_ms.ar:1.0: Input should be a valid number"),
    ("settings-list", _set(GOOD, ["settings"], ["cpu"]), "field settings: Input should be a valid dictionary"),
    ("settings-null", _set(GOOD, ["settings"], None), "field settings: Input should be a valid dictionary"),
    ("sample-bool", _set(GOOD, ["samples_ms", "ar:1"], [True]), "field samples_ms.ar:1.0: Input should be a valid number"),
    ("sample-string", _set(GOOD, ["samples_ms", "ar:1"], ["0.75"]), "field samples_ms.ar:1.0: Input should be a valid number"),
    ("sample-zero", _set(GOOD, ["samples_ms", "ar:1"], [0.0]), "field samples_ms.ar:1.0: Input should be greater than 0"),
    ("sample-negative", _set(GOOD, ["samples_ms", "ar:1"], [-1.0]), "field samples_ms.ar:1.0: Input should be greater than 0"),
    ("sample-nan", json.dumps(_set(GOOD, ["samples_ms", "ar:1"], [float("nan")])),
     "field samples_ms.ar:1.0: Input should be a finite number"),
    ("sample-inf", json.dumps(_set(GOOD, ["samples_ms", "ar:1"], [float("inf")])),
     "field samples_ms.ar:1.0: Input should be a finite number"),
    ("skipped-list", _set(GOOD, ["skipped"], [1]), "field skipped: Input should be a valid dictionary"),
    ("skipped-number", _set(GOOD, ["skipped", "verify:8:128"], 1), "field skipped.verify:8:128: Input should be a valid string"),
    ("seconds-negative", _set(GOOD, ["measure_seconds"], -1.0), "field measure_seconds: Input should be greater than or equal to 0"),
    ("seconds-string", _set(GOOD, ["measure_seconds"], "2.5"), "field measure_seconds: Input should be a valid number"),
    ("seconds-bool", _set(GOOD, ["measure_seconds"], True), "field measure_seconds: Input should be a valid number"),
    ("schema-other", _set(GOOD, ["schema"], "dcut.profile-partial/9"), "field schema: Input should be 'dcut.profile-partial/1'"),
    ("missing-field", {k: v for k, v in GOOD.items() if k != "skipped"}, "field skipped: missing"),
    ("extra-field", _set(GOOD, ["rows"], []), "field rows: is not a field of a partial file"),
    ("top-level-list", [GOOD], "field (top level): Input should be a valid dictionary"),
    ("duplicate-key", '{"schema": "dcut.profile-partial/1", "schema": "x"}', "key 'schema' appears twice"),
    ("not-json", "{", "not valid JSON"),
]


def _text(doc) -> str:
    return doc if isinstance(doc, str) else json.dumps(doc)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("doc, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_partial_is_refused_before_any_work_and_kept(tmp_path, capsys, monkeypatch, doc, needle):
    def no_model(*a, **k):
        raise AssertionError("the model was built: the partial was not checked first")

    monkeypatch.setattr("dcut_sched.profiler.workload.ForwardWorkload", no_model)
    out = tmp_path / "o.json"
    partial = tmp_path / "o.json.partial"
    partial.write_text(_text(doc))
    before = _digest(partial)
    status = cli.main(["--cpu", "--model", "tiny", "--out", str(out), "--resume", "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"dcut-profile: error: partial file {partial}: ")
    assert needle in err and "--fresh" in err, err
    assert _digest(partial) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.json.partial"]


def test_what_the_writer_writes_loads_back(tmp_path):
    partial = tmp_path / "c.json.partial"
    partial.write_text(json.dumps(GOOD, indent=1) + "\n")
    assert load_partial(partial) == GOOD


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _Work:
    def __init__(self, clock):
        self.clock = clock

    def fn_for(self, cell):
        def run():
            self.clock.now += cell.num_tokens / 1e3
        return run


def test_resume_in_the_harness_refuses_and_does_not_rewrite(tmp_path):
    partial = tmp_path / "c.json.partial"
    partial.write_text(json.dumps(_set(GOOD, ["samples_ms", "ar:1"], ["0.75"])))
    before = _digest(partial)
    clock = _Clock()
    with pytest.raises(PartialMismatch, match=r"field samples_ms\.ar:1\.0"):
        run_profile(EagerTimer(_Work(clock), clock=clock), build_cells([1], 4), warmups=0, repeats=1,
                    partial_path=partial, settings=GOOD["settings"], resume=True, progress=False)
    assert _digest(partial) == before


def test_without_resume_the_harness_replaces_a_bad_partial(tmp_path):
    """What --fresh does: the measurement starts over and its first write replaces the file."""
    partial = tmp_path / "c.json.partial"
    partial.write_text('{"samples_ms": 5}')
    clock = _Clock()
    run_profile(EagerTimer(_Work(clock), clock=clock), build_cells([1], 4), warmups=0, repeats=1,
                partial_path=partial, settings={"model": "x"}, resume=False, progress=False)
    assert load_partial(partial)["settings"] == {"model": "x"}


def test_fresh_gets_past_a_bad_partial_to_the_model_build(tmp_path, capsys, monkeypatch):
    def stop(*a, **k):
        raise ValueError("stopped at the model build")

    monkeypatch.setattr("dcut_sched.profiler.workload.ForwardWorkload", stop)
    partial = tmp_path / "o.json.partial"
    partial.write_text('{"samples_ms": 5}')
    assert cli.main(["--cpu", "--model", "tiny", "--out", str(tmp_path / "o.json"), "--fresh", "--no-progress"]) == 2
    assert capsys.readouterr().err == "dcut-profile: error: stopped at the model build\n"
    assert partial.read_text() == '{"samples_ms": 5}'  # replaced only when a measurement is written


def test_resume_and_fresh_together_are_refused(tmp_path, capsys):
    assert cli.main(["--cpu", "--out", str(tmp_path / "o.json"), "--resume", "--fresh"]) == 2
    assert "give --resume (continue OUT.partial) or --fresh (ignore and replace it), not both" in capsys.readouterr().err


def test_existing_partial_without_resume_names_both_ways(tmp_path, capsys):
    partial = tmp_path / "o.json.partial"
    partial.write_text(json.dumps(GOOD))
    assert cli.main(["--cpu", "--out", str(tmp_path / "o.json"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{partial} exists from an interrupted run; add --resume to continue it, or --fresh" in err


def test_help_names_fresh():
    text = " ".join(cli.build_parser().format_help().split())
    assert "--fresh ignore an existing OUT.partial and replace it" in text
