"""The drafter's data pipeline: the training prompts' assembly keeps both held-out sets unlike
training (no unlike kind, no near duplicate, no shared template), the data's key hash changes with
every setting, and two generations with the same settings (the real SmolLM2, a tiny scale) give
byte-identical tokens and features, the second read from the cache."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dcut_sched import paths
from dcut_sched.drafters import datagen, sources, textsim
from dcut_sched.traces.prompts import load_prompt_records

REPLIES = ["Sure! Here is a request: How can I get started with {topic} on a small budget?",
           "Write a poem about {topic}.",  # an unlike kind: dropped
           "I'm sorry, but I cannot help with {topic}.",  # a refusal: dropped
           "Why do so many people find {topic} hard at first, and what helps?"]


def fake_instruct(texts: list[str], idx: list[int]) -> list[str]:
    """A stand-in for the target: a reply by key index, about the request's topic."""
    topics = [t.split(" about ", 1)[1].split(" that a user", 1)[0] for t in texts]
    return [REPLIES[j % len(REPLIES)].format(topic=topic) for topic, j in zip(topics, idx)]


@pytest.fixture(scope="module")
def assembled():
    s = datagen.DataSettings()
    held, unlike = datagen.eval_prompts(s)
    train, stats = datagen.training_prompts(s, [p.text for p in held + unlike], fake_instruct)
    return s, held, unlike, train, stats


def test_training_prompts_by_source_and_deterministic(assembled):
    s, held, unlike, train, stats = assembled
    assert stats["by_source"] == {"math": 12, "code": 12, "chat": 12, "rewrite": 12, "gsm8k": s.num_gsm8k,
                                  "mtbench": 39, "self": s.num_self_instruct, "humaneval": 131}
    # the stand-in's replies: a quarter unlike-kind, a quarter refusals, repeats per topic dropped
    assert stats["self_instruct"] == {"candidates": 362, "kept": 96, "reasons": {
        "ok": 96, "near-duplicate": 85, "refusal": 90, "unlike-kind": 91}}
    assert stats["two_turn"] == sum(len(p.turns) == 2 for p in train) >= s.num_followups
    assert len({p.id for p in train}) == len(train)
    again, _ = datagen.training_prompts(s, [p.text for p in held + unlike], fake_instruct)
    assert again == train
    other, _ = datagen.training_prompts(replace(s, seed=1), [p.text for p in held + unlike], fake_instruct)
    assert other != train


def test_truncated_run_takes_every_source_in_turn():
    s = datagen.DataSettings(max_train_prompts=8)
    held, unlike = datagen.eval_prompts(s)
    train, stats = datagen.training_prompts(s, [p.text for p in held + unlike], fake_instruct)
    assert [p.id.split("-")[0] for p in train] == ["gen", "gen", "gsm8k", "gsm8k", "mtbench", "mtbench", "self",
                                                   "HumanEval"]
    assert stats["self_instruct"]["kept"] == 8  # a truncated run asks no more of a source than it can keep


def test_held_out_sets_stay_unlike_training(assembled):
    _, held, unlike, train, _ = assembled
    handwritten = [p.text for p in load_prompt_records(paths.prompts_path())] + [p.text for p in unlike]
    index = textsim.NgramIndex(datagen.HELDOUT_NGRAM, handwritten)
    non_he = [t for p in train if p.category != "humaneval" for t in p.turns]
    assert not [t for t in non_he if index.near_duplicate(t)]
    assert not [t for t in non_he if sources.unlike_kind(t)]
    # HumanEval: the split by index, so no problem is in both
    held_he = {p.text for p in held if p.category == "humaneval"}
    assert len(held_he) == 33 and not held_he & {p.turns[0] for p in train if p.category == "humaneval"}
    # no training prompt fills a template that a held-out prompt fills
    gate = datagen._Gate([p.text for p in held])
    assert len(gate.templates) == 3
    assert not [t for t in non_he for pat in gate.templates if pat.fullmatch(textsim.normalize(t))]
    # the unlike set's kinds are no training category and no self-instruct seed kind
    kinds = {p.category for p in unlike}
    assert {p.category for p in train} <= set(datagen.TRAIN_KINDS)
    assert not kinds & set(datagen.TRAIN_KINDS) and not kinds & set(sources.SEED_KINDS)
    assert not kinds & {c.removeprefix("self-").removeprefix("mtbench-") for c in {p.category for p in train}}


def test_follow_ups_and_seed_kinds_are_clean():
    held = [p.text for p in load_prompt_records(paths.prompts_path())] + \
        [p.text for p in load_prompt_records(paths.prompts_path("unlike"))]
    index = textsim.NgramIndex(datagen.HELDOUT_NGRAM, held)
    for f in sources.FOLLOWUPS:
        assert not index.near_duplicate(f) and sources.unlike_kind(f) is None, f
    for t in sources.SEED_TOPICS:
        for k in sources.SEED_KINDS:
            assert sources.unlike_kind(sources.instruction_request(t, k)) is None, (t, k)


def test_unlike_filter_catches_most_of_the_unlike_set():
    unlike = load_prompt_records(paths.prompts_path("unlike"))
    caught = [p.id for p in unlike if sources.unlike_kind(p.text)]
    assert len(caught) >= 54  # 56 of 60 at the time of writing; riddles without the word are not caught


@pytest.mark.parametrize("raw,want", [
    ("Sure! Here's a request: How do I repot a cactus without hurting my hands?",
     ("How do I repot a cactus without hurting my hands?", "ok")),
    ('1. "What is the difference between a comet and an asteroid?"',
     ("What is the difference between a comet and an asteroid?", "ok")),
    ('A user might ask: "Can you give me some tips on building earthquake-resistant houses?"',
     ("Can you give me some tips on building earthquake-resistant houses?", "ok")),
    ("Hi there", (None, "length")),
    ("Please go ahead and share the specific steps you need, and I'll tailor the", (None, "form")),
    ("Tell me what an AI assistant would say about composting at home.", (None, "meta")),
    ("Qu'est-ce que la photosynthèse et comment fonctionne-t-elle?", (None, "language")),
    ("I'm sorry, I cannot answer questions about that.", (None, "refusal")),
    ("What is the cat the cat the cat doing?", (None, "repeat")),
    ("Write a short poem about the ocean for my class.", (None, "unlike-kind")),
])
def test_clean_instruction(raw, want):
    assert sources.clean_instruction(raw) == want


def test_clean_instruction_keeps_requests_on_the_topic():
    assert sources.clean_instruction("What was life like in the 1800s?", topic="the ocean") == (None, "off-topic")
    assert sources.clean_instruction("Why is home insulation worth it?", topic="home insulation")[1] == "ok"
    assert sources.clean_instruction("How do I compost eggshells?", topic="composting")[1] == "ok"


def test_key_hash_changes_with_every_setting(tmp_path):
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"weights")
    base = datagen.DataSettings(feature_layer_ids=(1, 10, 18, 27))
    h = datagen.key_hash(base.key(model_file))
    assert h == datagen.key_hash(datagen.DataSettings(feature_layer_ids=(1, 10, 18, 27)).key(model_file))
    for change in ({"seed": 1}, {"num_gsm8k": 55}, {"max_new_tokens": 128}, {"temperature": 0.8},
                   {"instruct_temperature": 0.7}, {"feature_layer_ids": (1, 10, 18)}, {"max_train_prompts": 4}):
        assert datagen.key_hash(replace(base, **change).key(model_file)) != h, change
    model_file.write_bytes(b"other weights")
    assert datagen.key_hash(base.key(model_file)) != h
    key = base.key(model_file)
    assert set(key["sources"]) == {"humaneval", "gsm8k", "mtbench"}
    assert key["sources"]["gsm8k"]["version"] == "0.1.4.post7" and len(key["model"]["sha256"]) == 64


def test_cached_data_of_other_settings_is_refused_never_regenerated(tmp_path):
    from dcut_sched.drafters.data import DraftSequence
    from dcut_sched.drafters.workdir import WorkDirError

    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"weights")
    s = datagen.DataSettings(feature_layer_ids=(1, 2))
    key = s.key(model_file)
    seq = DraftSequence("p0", "test", "greedy", torch.tensor([1, 2, 3]), 1, torch.zeros(3, 4))
    path = tmp_path / "data.pt"
    torch.save({"sha256": datagen.key_hash(key), "key": key, "train": [seq], "eval": [seq], "stats": {}}, path)
    before = path.read_bytes()
    logs: list[str] = []
    same = datagen.load_or_generate(s, None, None, path, model_file=model_file, log=logs.append)  # no target: read
    assert same["key"] == key and "reusing it" in logs[-1] and (tmp_path / "data.json").is_file()
    with pytest.raises(WorkDirError, match=r"data.pt: data generated with settings.seed=0, not 1; pass --fresh"):
        datagen.load_or_generate(replace(s, seed=1), None, None, path, model_file=model_file)
    model_file.write_bytes(b"other weights")
    with pytest.raises(WorkDirError, match=r"data generated with model.sha256="):
        datagen.load_or_generate(s, None, None, path, model_file=model_file)
    assert path.read_bytes() == before


@pytest.fixture(scope="module")
def smollm2():
    try:
        from dcut_sched.model.gguf_weights import smollm2_gguf_path

        smollm2_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    from dcut_sched.model.llama import LlamaModel
    from dcut_sched.model.tokenizer import load_smollm2_tokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny generation: one thread is fastest, most of all on shared cores
    yield LlamaModel.from_smollm2(), load_smollm2_tokenizer()
    torch.set_num_threads(threads)


def test_generation_is_byte_identical_and_cached(tmp_path, smollm2):
    target, tok = smollm2
    s = datagen.DataSettings(num_templated=1, num_gsm8k=1, num_mtbench=1, num_self_instruct=1, num_followups=1,
                             max_new_tokens=6, eval_max_new_tokens=4, instruct_max_new_tokens=16,
                             feature_layer_ids=(1, 10, 18, 27), max_train_prompts=4, max_eval_prompts=2)
    logs: list[str] = []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = datagen.load_or_generate(s, target, tok, tmp_path / "a" / "data.pt", log=logs.append)
    b = datagen.load_or_generate(s, target, tok, tmp_path / "b" / "data.pt", fresh=True)
    assert a["sha256"] == b["sha256"] and (tmp_path / "a" / "data.json").is_file()
    for split in ("train", "eval", "eval_unlike"):
        assert datagen.sequence_bytes(a[split]) == datagen.sequence_bytes(b[split]), split
    train = a["train"]
    # 4 conversations (templated, gsm8k, mtbench with its second turn, self-instruct), greedy and sampled
    assert {q.category.split("-")[0] for q in train} == {"math", "gsm8k", "mtbench", "self"}
    assert {q.mode for q in train} == {"greedy", "t0.7"}
    second = [q for q in train if q.prompt_id.endswith("/turn2")]
    assert second and all(q.prompt_len > 40 for q in second)
    assert all(q.length - q.prompt_len <= 6 and q.features.shape == (q.length, 4 * 576) for q in train)
    assert len(a["eval"]) == len(a["eval_unlike"]) == 4 and all(q.length - q.prompt_len <= 4 for q in a["eval"])
    cached = datagen.load_or_generate(s, None, None, tmp_path / "a" / "data.pt", log=logs.append)  # no target: read
    assert datagen.sequence_bytes(cached["train"]) == datagen.sequence_bytes(train)
    assert "reusing it" in logs[-1]
