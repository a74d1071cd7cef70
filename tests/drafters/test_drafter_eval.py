"""``dcut-drafter eval`` on the shipped drafter: tau per block size and category, as a table on
stdout and as JSON (``--json PATH`` atomically, ``--json -`` to stdout), with progress on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dcut_sched.cli import drafter

SHIPPED = Path(__file__).resolve().parents[2] / "drafters" / "smollm2-135m-dflash"

pytestmark = pytest.mark.slow


def test_eval_table_and_json(tmp_path, capsys):
    out = tmp_path / "tau.json"
    assert drafter.main(["eval", str(SHIPPED), "--max-eval-prompts", "3", "--max-new-tokens", "8",
                         "--json", str(out), "--threads", "1"]) == 0
    captured = capsys.readouterr()
    tau = json.loads(out.read_text())
    assert sorted(tau) == ["B16/greedy", "B8/greedy"]
    for name, row in tau.items():
        block = int(name[1:name.index("/")])
        assert "all" in row and len(row) >= 2
        # tau counts the bonus token: at least 1, at most the block size
        assert all(1.0 <= v <= block for v in row.values()), row
    assert sorted(tau["B8/greedy"]) == sorted(tau["B16/greedy"])  # the same prompts, the same categories
    # the table prints each value at 2 decimals, the JSON keeps them whole
    assert "held-out tau (3 prompts x 8 greedy tokens)" in captured.out
    assert f"{tau['B16/greedy']['all']:.2f}" in captured.out and f"wrote {out}" in captured.out
    assert "dcut-drafter eval smollm2-135m-dflash: 3/3 prompts" in captured.err
    # the phase change is a progress line like the others, not a bare line
    assert ("dcut-drafter eval smollm2-135m-dflash: 3 target continuations done; next: the target's features and "
            "the drafts\n") in captured.err
    assert "target features and drafts" not in captured.err.splitlines()


def test_eval_refuses_an_unknown_json_suffix_before_loading(tmp_path, capsys, monkeypatch):
    from dcut_sched.model import LlamaModel

    monkeypatch.setattr(LlamaModel, "from_smollm2", classmethod(lambda cls, **k: pytest.fail("loaded the target")))
    assert drafter.main(["eval", str(SHIPPED), "--json", str(tmp_path / "tau.txt")]) == 2
    err = capsys.readouterr().err
    assert "--json" in err and "'.txt'" in err and not (tmp_path / "tau.txt").exists()
