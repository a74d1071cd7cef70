"""``show_table``: the analysis scripts' print-then-write of a result table."""

from __future__ import annotations

import pandas as pd

from dcut_sched.util.tables import read_table, show_table


def test_show_table_prints_without_index_and_writes_when_asked(tmp_path, capsys):
    frame = pd.DataFrame({"depth": [1, 2], "ece": [0.0125, 0.25]})
    show_table(frame)
    assert capsys.readouterr().out.splitlines() == [" depth    ece", "     1 0.0125", "     2 0.2500"]
    assert not list(tmp_path.iterdir())
    show_table(frame, tmp_path / "t.csv")
    assert read_table(tmp_path / "t.csv").to_dict("list") == {"depth": [1, 2], "ece": [0.0125, 0.25]}
