"""Cases of the eleventh hostile pass (docs/reliability.md): a flag one recording backend reads and
another would ignore."""

from __future__ import annotations

from dcut_sched.cli.trace import main


def test_record_hf_refuses_skip_layers_before_loading(tmp_path, capsys):
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    draft.mkdir()
    out = tmp_path / "r.parquet"
    code = main(["record", "--backend", "hf", "--target", str(target), "--draft", str(draft),
                 "--skip-layers", "3,4", "--limit", "1", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "--skip-layers has no effect with --backend hf" in err and "drop --skip-layers" in err
    assert sorted(tmp_path.iterdir()) == [draft, target]  # no trace, no partial recording
