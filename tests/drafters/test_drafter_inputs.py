"""A drafter given to a command is an input it names: a drafter for another target is refused up front
by ``dcut-drafter eval``, ``dcut-engine``, ``dcut-trace record`` and ``dcut-profile`` with one line
naming ``--draft`` and the folder; checkpoint tensors keep their checkpoint names; ``dcut-profile``
resolves a bare drafter name as ``dcut-engine`` does and checks its block size before measuring; a
resumed recording checks the drafter's weights, not only its folder."""

from __future__ import annotations

import json

import pytest

from dcut_sched.drafters.checkpoint import DraftCheckpointError, hf_config, load_checkpoint, save_checkpoint
from dcut_sched.drafters.dflash import DFlashConfig, DFlashDraftModel
from dcut_sched.model import LlamaConfig, LlamaModel

TINY = LlamaConfig.preset("tiny")  # the profiler's tiny target: width 256, 4 layers


def _no_target(monkeypatch):
    monkeypatch.setattr(LlamaModel, "from_smollm2", classmethod(lambda cls, **k: pytest.fail("loaded the target")))


def _narrow(folder, block_size=8, draft_vocab=None):
    """A drafter for a width-32, 4-layer target."""
    cfg = DFlashConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
                       vocab_size=32, target_num_layers=4, target_layer_ids=(0, 2), mask_token_id=16,
                       block_size=block_size, draft_vocab_size=draft_vocab)
    return save_checkpoint(DFlashDraftModel.random_init(cfg, seed=0), folder)


def _for_tiny(folder, seed=0, block_size=8):
    cfg = DFlashConfig.for_target(TINY, num_layers=1, block_size=block_size, num_target_features=1)
    return save_checkpoint(DFlashDraftModel.random_init(cfg, seed=seed), folder)


def _one_line(status, err, *needles):
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and ": error: " in err, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_eval_of_a_drafter_for_another_width_is_one_line(tmp_path, capsys, monkeypatch):
    from dcut_sched.cli import drafter

    _no_target(monkeypatch)
    folder = _narrow(tmp_path / "narrow")
    _one_line(drafter.main(["eval", str(folder)]), capsys.readouterr().err, f"{folder}: the drafter was made for a "
              "target of width 32, vocabulary 32 and 4 layers", "width 576", "SmolLM2-135M-Instruct")


def test_eval_of_a_drafter_for_a_deeper_target_is_refused_before_its_weights_are_read(tmp_path, capsys, monkeypatch):
    from dcut_sched.cli import drafter

    _no_target(monkeypatch)
    cfg = DFlashConfig(hidden_size=576, num_layers=2, num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=1536,
                       vocab_size=49152, target_num_layers=48, target_layer_ids=(1, 14, 27, 40), mask_token_id=16)
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config(cfg)))
    (folder / "model.safetensors").write_bytes(b"not read")
    _one_line(drafter.main(["eval", str(folder)]), capsys.readouterr().err,
              "48 layers (it reads target layers [1, 14, 27, 40])", "30 layers")


def test_missing_tensors_are_named_as_in_the_checkpoint(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _narrow(tmp_path / "d", draft_vocab=12)
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["d2t"], tensors["layers.0.self_attn.q_proj.weight"]
    save_file(tensors, str(path))
    with pytest.raises(DraftCheckpointError, match=r"tensors missing \['d2t', 'layers.0.self_attn.q_proj.weight'\]"):
        load_checkpoint(folder)


def test_engine_names_draft_and_folder_of_a_drafter_for_another_target(tmp_path, capsys, monkeypatch):
    from dcut_sched.cli import engine

    _no_target(monkeypatch)
    folder = _narrow(tmp_path / "narrow")
    _one_line(engine.main(["--draft", f"dflash:{folder}"]), capsys.readouterr().err,
              f"--draft dflash:{folder} ({folder}): the drafter was made for a target of width 32")


def test_record_names_draft_and_folder_of_a_drafter_for_another_target(tmp_path, capsys, monkeypatch):
    from dcut_sched.cli import trace

    _no_target(monkeypatch)
    folder = _narrow(tmp_path / "narrow")
    _one_line(trace.main(["record", "--draft", f"dflash:{folder}", "--out", str(tmp_path / "r.parquet")]),
              capsys.readouterr().err, f"--draft dflash:{folder} ({folder}): the drafter was made for a target of width 32")
    (folder / "config.json").write_text("{}")
    _one_line(trace.main(["record", "--draft", f"dflash:{folder}", "--out", str(tmp_path / "r.parquet")]),
              capsys.readouterr().err, f"--draft dflash:{folder} ({folder}): ", "config.json: field")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["narrow"]


@pytest.fixture
def drafters(tmp_path, monkeypatch):
    """``$DCUT_DRAFTERS`` holding ``mini`` (B = 8, for the tiny target) and ``narrow`` (another width)."""
    root = tmp_path / "drafters"
    _for_tiny(root / "mini", block_size=8)
    _narrow(root / "narrow")
    monkeypatch.setenv("DCUT_DRAFTERS", str(root))
    monkeypatch.chdir(tmp_path)
    return root


def test_profile_resolves_a_bare_drafter_name_as_the_engine_does(drafters):
    from dcut_sched.cli import profile as cli
    from dcut_sched.cli.profile_run import resolve
    from dcut_sched.drafters import parse_draft_spec

    args = cli.build_parser().parse_args(["--cpu", "--model", "tiny", "--draft", "dflash:mini", "--block-size", "8",
                                          "--out", "c.json"])
    _, _, draft = resolve(args)
    assert draft.kind == "dflash" and draft.config == str(drafters / "mini")
    assert draft.config == str(parse_draft_spec("dflash:mini").path)  # dcut-engine's lookup
    args = cli.build_parser().parse_args(["--cpu", "--model", "tiny", "--draft", "dflash:tiny", "--out", "c.json"])
    assert resolve(args)[2].config == "tiny"  # a preset stays a preset


@pytest.mark.parametrize("draft, block, needles", [
    ("mini", "16", ["--block-size 16: the DFlash drafter in ", "mini (--draft dflash:mini) drafts blocks of at most 8"]),
    ("narrow", "8", ["--draft dflash:narrow (", "the drafter was made for a target of width 32", "width 256"]),
])
def test_profile_checks_the_drafter_before_measuring(drafters, capsys, draft, block, needles):
    from dcut_sched.cli import profile as cli

    status = cli.main(["--cpu", "--model", "tiny", "--draft", f"dflash:{draft}", "--block-size", block,
                       "--batch-sizes", "1", "--out", "c.json"])
    _one_line(status, capsys.readouterr().err, *needles)
    assert sorted(p.name for p in drafters.parent.iterdir()) == ["drafters"]  # no c.json, no c.json.partial


def test_profile_names_draft_config_when_that_flag_gave_the_drafter(drafters, capsys):
    from dcut_sched.cli import profile as cli

    status = cli.main(["--cpu", "--model", "tiny", "--draft-config", "mini", "--block-size", "16", "--out", "c.json"])
    _one_line(status, capsys.readouterr().err, "mini (--draft-config mini) drafts blocks of at most 8")


class FakeTokenizer:
    eos_id = None

    def chat_ids(self, messages):
        return [1, 2] + [ord(ch) % 4000 + 5 for ch in messages[-1]["content"]]


class Interrupt(Exception):
    pass


def test_record_resume_checks_the_drafters_weights_not_its_folder(tmp_path):
    from dcut_sched.engine.trace_backends import DFlashBackend
    from dcut_sched.traces.prompts import Prompt
    from dcut_sched.traces.record import RecordError, record_trace

    target = LlamaModel.random_init(TINY, seed=3, std=0.05)
    folder = _for_tiny(tmp_path / "mini")
    prompts = [Prompt("a", "math", "one plus one"), Prompt("b", "code", "def f(x):"), Prompt("c", "chat", "hi")]
    out = tmp_path / "t.parquet"

    def backend():
        return DFlashBackend(load_checkpoint(folder), str(folder), model=target, tokenizer=FakeTokenizer(),
                             generate_batch=1, target_name="tiny-random")

    be = backend()
    real, calls = be.draft_positions, []
    be.draft_positions = lambda *a: (calls.append(1), real(*a))[1] if len(calls) < 1 else (_ for _ in ()).throw(Interrupt)
    with pytest.raises(Interrupt):
        record_trace(be, prompts, out, block_size=4, max_new_tokens=6, progress=False)
    assert be.describe()["drafter_sha256"] == backend().describe()["drafter_sha256"]  # same files, same hash
    config = (folder / "config.json").read_text()
    _for_tiny(folder, seed=1)  # new weights in place, same folder and config
    assert (folder / "config.json").read_text() == config
    with pytest.raises(RecordError, match=r"partial file was recorded with other drafter weights .*run with --fresh"):
        record_trace(backend(), prompts, out, block_size=4, max_new_tokens=6, progress=False)
    t = record_trace(backend(), prompts, out, block_size=4, max_new_tokens=6, progress=False, resume=False)
    assert t.num_requests == 3
