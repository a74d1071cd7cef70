"""The drafter's card names the held-out prompt file it was evaluated on: with ``--eval-prompts`` it
claimed the shipped 80-prompt set all the same."""

from __future__ import annotations

from tests.drafters.test_workdir import run, target, weights_file  # noqa: F401 - the tiny-target CLI fixtures


def test_the_card_names_the_eval_prompt_file_given(run, tmp_path):  # noqa: F811
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"id": "a", "category": "math", "prompt": "one plus one"}\n'
                       '{"id": "b", "category": "code", "prompt": "def f(x):"}\n', encoding="utf-8")
    assert run("--steps", "1", "--eval-prompts", str(prompts))[0] == 0
    card = (tmp_path / "d" / "README.md").read_text(encoding="utf-8")
    assert f"continuations of {prompts} (2 prompts, --eval-prompts) and the 33 HumanEval" in card
    assert "prompts.jsonl (80 hand-written prompts)" not in card


def test_the_card_names_the_shipped_set_by_default(run, tmp_path):  # noqa: F811
    assert run("--steps", "1", "--max-eval-prompts", "3")[0] == 0
    card = (tmp_path / "d" / "README.md").read_text(encoding="utf-8")
    assert "continuations of dcut_sched/data/traces/prompts.jsonl (80 hand-written prompts) and the 33" in card
    assert "the first 3 of each set (--max-eval-prompts)" in card
