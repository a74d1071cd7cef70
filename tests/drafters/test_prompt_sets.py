"""The shipped held-out prompt sets against the drafter's training prompts: the ``unlike`` set's kinds
are none of the training kinds, and none of its prompts shares text or a template with the training
prompts (templated ones, HumanEval, GSM8K, MT-Bench), the project's held-out set or the engine's
default prompts: no equal normalised text, no shared word 5-gram, no full match of a training
template (docs/drafters.md, "Held-out sets")."""

from __future__ import annotations

from collections import Counter

import pytest

from dcut_sched import paths
from dcut_sched.drafters import data, datagen, sources, textsim
from dcut_sched.engine.prompts import DEFAULT_PROMPTS
from dcut_sched.traces.prompts import load_prompt_records

N = 5  # word n-gram length of the near-duplicate check


@pytest.fixture(scope="module")
def unlike():
    return load_prompt_records(paths.prompts_path("unlike"))


@pytest.fixture(scope="module")
def others() -> dict[str, list[str]]:
    """Every other prompt text, by where it comes from: the templated training prompts (more than the
    default count, so every template and word-list entry appears), all 164 HumanEval problems, all
    1319 GSM8K problems, every turn of all 80 MT-Bench questions, the project's held-out set and the
    engine's defaults."""
    every = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
    return {"templated training": [p.text for p in data.generated_prompts(560, seed=0)],
            "humaneval": [p.text for p in data.humaneval_prompts()],
            "gsm8k": [p.turns[0] for p in sources.gsm8k_problems()],
            "mt-bench": [t for p in sources.mtbench_questions(every) for t in p.turns],
            "heldout": [p.text for p in load_prompt_records(paths.prompts_path())],
            "engine defaults": list(DEFAULT_PROMPTS)}


def test_prompt_sets_by_name():
    assert paths.prompts_path() == paths.prompts_path("heldout")
    assert paths.prompts_path().name == "prompts.jsonl"
    assert paths.prompts_path("unlike").name == "prompts-unlike.jsonl"
    with pytest.raises(ValueError, match="unknown prompt set 'nope'; known: heldout, unlike"):
        paths.prompts_path("nope")


def test_unlike_set_has_twelve_kinds_none_a_training_kind(unlike):
    kinds = Counter(p.category for p in unlike)
    assert len(unlike) == 60 and len(kinds) == 12 and set(kinds.values()) == {5}
    assert set(kinds) == {"translation", "structured", "sql", "verse", "list", "long-summary", "riddle",
                          "multilingual", "regex", "shell", "letter", "dialogue"}
    assert not set(kinds) & set(datagen.TRAIN_KINDS)
    assert {p.category for p in data.generated_prompts(360, seed=0)} <= set(datagen.TRAIN_KINDS)
    first = [p.category for p in unlike[:12]]
    assert len(set(first)) == 12  # interleaved: any prefix of 12k prompts is balanced


def test_unlike_prompts_share_no_text_with_training_or_the_other_sets(unlike, others):
    for source, texts in others.items():
        index = textsim.NgramIndex(N, texts)
        hits = {p.id: sorted(" ".join(g) for g in index.shared(p.text)) for p in unlike if index.near_duplicate(p.text)}
        assert not hits, f"unlike prompts near-duplicate {source} prompts: {hits}"


def test_unlike_prompts_fill_no_training_template(unlike):
    for kind, templates in data.PROMPT_TEMPLATES.items():
        for t in templates:
            pattern = textsim.template_pattern(t)
            assert not [p.id for p in unlike if pattern.fullmatch(textsim.normalize(p.text))], (kind, t)
            index = textsim.NgramIndex(N, textsim.template_literals(t))
            assert not [p.id for p in unlike if index.shared(p.text)], (kind, t)


def test_textsim_normalises_and_finds_shared_ngrams():
    assert textsim.normalize("  Ｈello,  WORLD!\n") == "hello world"
    index = textsim.NgramIndex(3, ["The quick brown fox jumps."])
    assert index.near_duplicate("the QUICK, brown... fox")
    assert index.near_duplicate("hello: the quick brown cat")
    assert not index.near_duplicate("quick brown")
    pattern = textsim.template_pattern("Explain {topic} in simple terms.")
    assert pattern.fullmatch(textsim.normalize("Explain black holes in simple terms!"))
    assert not pattern.fullmatch(textsim.normalize("Explain black holes briefly."))
