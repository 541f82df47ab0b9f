"""The synthetic world: determinism, answerability by an independent resolver over the written corpus,
BM25 (rank_bm25) retrieval of every hop's passage from its solution-trace query, split hygiene; the word
tokenizer; launch/make_world.py."""

import collections
import dataclasses
import json
import re

import pytest
from rank_bm25 import BM25Okapi

from jaxsearch.data.qa import load_examples
from jaxsearch.data.world.generator import generate_world, world_config
from jaxsearch.data.world.oracle import solution_trace
from jaxsearch.models.word_tokenizer import WordTokenizer
from jaxsearch.models.tokenizer import Tokenizer

SPLITS = ("train", "dev", "test")


@pytest.fixture(scope="module", params=[0, 1], ids=["seed0", "seed1"])
def world(request):
    return generate_world(world_config("tiny", seed=request.param))


@pytest.fixture(scope="module")
def written(world, tmp_path_factory):
    """The tiny world as written on disk: (passage id -> (title, text), split -> examples)."""
    out = tmp_path_factory.mktemp("world")
    world.write(out)
    corpus = {}
    with open(out / "corpus.jsonl") as f:
        for line in f:
            row = json.loads(line)
            assert set(row) == {"id", "contents"}
            title, text = row["contents"].split("\n", 1)
            assert title.startswith('"') and title.endswith('"')
            corpus[row["id"]] = (title[1:-1], text)
    return corpus, {split: load_examples(out / f"{split}.jsonl") for split in SPLITS}


def _files(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_same_seed_same_files_other_seed_other_world(tmp_path):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        generate_world(world_config("tiny", seed=seed)).write(tmp_path / name)
    a, b, c = (_files(tmp_path / name) for name in "abc")
    assert set(a) == {"corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "world_config.json"}
    assert a == b
    assert a["corpus.jsonl"] != c["corpus.jsonl"] and a["test.jsonl"] != c["test.jsonl"]


def _mentions(name, text):
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def test_every_question_is_answerable_from_its_passages(world, written):
    corpus, splits = written
    kinds = collections.defaultdict(set)  # entity kind -> names: what the resolver may read off a passage
    for entity in world.entities.values():
        kinds[entity.kind].add(entity.name)
    object_kind = {"born_in": "city", "headquartered_in": "city", "located_in": "country", "works_for": "org"}
    n_checked = collections.Counter()
    for examples in splits.values():
        for q in examples:
            meta, answer = q.metadata, q.golden_answers[0]
            hops, names = meta["hops"], meta["hop_entities"]
            assert len(q.supporting_ids) == len(names) == len(meta["relations"]) == hops
            texts = [corpus[pid][1] for pid in q.supporting_ids]
            for name, pid in zip(names, q.supporting_ids):  # each hop's passage is about its entity
                assert corpus[pid][0] == name and _mentions(name, corpus[pid][1])
            if meta["type"] != "comparison":
                assert _mentions(names[0], q.question) and not _mentions(answer, q.question)
                for text, next_name in zip(texts, names[1:]):  # each passage leads to the next hop's entity
                    assert _mentions(next_name, text)
                assert _mentions(answer, texts[-1]), (q.question, answer, texts[-1])
            elif answer in ("yes", "no"):
                kind = object_kind[meta["relations"][0]]
                objects = [{n for n in kinds[kind] if _mentions(n, t) and n not in names} for t in texts]
                assert all(len(o) == 1 for o in objects), (q.question, texts)
                assert answer == ("yes" if objects[0] == objects[1] else "no"), q.question
            else:
                years = [re.findall(r"\b\d{4}\b", t) for t in texts]
                assert all(len(y) == 1 for y in years), texts
                earlier = names[0] if int(years[0][0]) < int(years[1][0]) else names[1]
                later = names[1] if earlier == names[0] else names[0]
                asks_first = re.search(r"\b(first|older)\b", q.question) is not None
                assert answer == (earlier if asks_first else later), (q.question, texts)
                assert _mentions(names[0], q.question) and _mentions(names[1], q.question)
            n_checked[meta["type"]] += 1
    assert set(n_checked) == {"single", "bridge", "comparison", "compositional"}


def test_bm25_finds_each_hop_passage_from_the_trace_query(world, written):
    corpus, splits = written
    ids = list(corpus)
    tokenize = lambda s: re.findall(r"\w+", s.lower())  # noqa: E731
    bm25 = BM25Okapi([tokenize(f'"{title}"\n{text}') for title, text in corpus.values()])  # k1=1.5, b=0.75
    hits = total = 0
    for examples in splits.values():
        for q in examples:
            steps = solution_trace(q, world)
            searches = [s for s in steps if s.action == "search"]
            assert [s.passage_id for s in searches] == q.supporting_ids
            assert steps[-1].action == "answer" and steps[-1].text == q.golden_answers[0]
            assert len(steps) == q.metadata["hops"] + 1
            for step in searches:
                assert step.fact in corpus[step.passage_id][1] and _mentions(step.found, step.fact)
                scores = bm25.get_scores(tokenize(step.text))
                top5 = sorted(range(len(ids)), key=lambda i: -scores[i])[:5]
                hits += step.passage_id in {ids[i] for i in top5}
                total += 1
    print(f"BM25 top-5 hop hits: {hits}/{total}")
    assert hits / total >= 0.9, f"{hits}/{total}"


def _key(q):
    """What a question asks, independent of wording: its facts."""
    names, relations = q.metadata["hop_entities"], q.metadata["relations"]
    if q.metadata["type"] == "comparison":
        return relations[0], frozenset(names)
    return names[0], tuple(relations)


def test_splits_sizes_mix_and_no_shared_questions(world, written):
    _, splits = written
    config = world.config
    seen_text, seen_key = {}, {}
    for split, size in zip(SPLITS, config.split_sizes):
        examples = splits[split]
        assert len(examples) == size and len({q.id for q in examples}) == size
        hops = collections.Counter(q.metadata["hops"] for q in examples)
        for h, share in zip((1, 2, 3, 4), config.hop_mix):
            assert abs(hops[h] - share * size) <= 1, (split, hops)
        for q in examples:
            assert seen_text.setdefault(q.question, split) == split, q.question
            assert seen_key.setdefault(_key(q), split) == split, q.question
    assert len(seen_key) == sum(
        config.split_sizes
    )  # no two questions ask the same facts, even within a split


def test_distractors_look_alike_but_are_never_asked(world, written):
    _, splits = written
    real = [e for e in world.entities.values() if not e.distractor]
    distractors = [e for e in world.entities.values() if e.distractor]
    assert len(distractors) == world.config.n_distractors
    real_words = {w for e in real for w in e.name.split() if w not in ("The", "of")}
    for d in distractors:
        assert d.name not in {e.name for e in real}
        assert set(d.name.split()) & real_words, d.name
    distractor_names = {d.name for d in distractors}
    for examples in splits.values():
        for q in examples:
            assert not distractor_names & (set(q.metadata["hop_entities"]) | set(q.golden_answers))


def test_small_world_sizes():
    config = world_config("small", seed=1)
    small = generate_world(dataclasses.replace(config, split_sizes=(1500, 200, 200)))
    assert len(small.passages) > 1500
    assert [len(small.questions[s]) for s in SPLITS] == [1500, 200, 200]


def test_too_many_questions_is_a_clear_error():
    config = dataclasses.replace(
        world_config("tiny"),
        n_people=8,
        n_orgs=2,
        n_films=1,
        n_books=1,
        n_distractors=0,
        split_sizes=(5000, 10, 10),
    )
    with pytest.raises(ValueError, match="too few"):
        generate_world(config)


@pytest.fixture(scope="module")
def tokenizer(world):
    return WordTokenizer.build(world.texts())


TAGS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
    "<knowledge>",
    "</knowledge>",
    "<evidence>",
    "</evidence>",
    "<information_source>",
    "</information_source>",
)


def test_word_tokenizer_round_trip_and_single_token_words(world, tokenizer):
    assert isinstance(tokenizer, Tokenizer) and 300 < tokenizer.vocab_size < 5000
    for text in [p.contents for p in world.passages] + [q.question for q in world.questions["dev"]]:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text == b"".join(tokenizer.token_bytes(i) for i in ids).decode()
        # Every vocabulary word, number, punctuation mark and newline is one token; single spaces are free.
        assert len(ids) == len(re.findall(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]|\n", text)), text
        assert tokenizer.unk_id not in ids


def test_word_tokenizer_tags_specials_and_fallbacks(world, tokenizer):
    q = world.questions["test"][0]
    steps = solution_trace(q, world)
    trajectory = (
        f"<|im_start|>user\n{q.question}<|im_end|>\n<|im_start|>assistant\n<knowledge>x</knowledge>"
        f"<think> first </think>\n<search> {steps[0].text} </search>\n\n<information>Doc 1(Title: "
        f"\"{steps[0].subject}\") {steps[0].fact}\n</information>\n\n<evidence>{steps[0].fact}</evidence>"
        f"<information_source>external</information_source><answer> {steps[-1].text} </answer><|im_end|>"
    )
    for allow_special in (True, False):
        assert tokenizer.decode(tokenizer.encode(trajectory, allow_special)) == trajectory
    for tag in TAGS:
        assert tokenizer.encode(tag) == [tokenizer.token_to_id(tag)]
        assert tokenizer.encode(f"a {tag}") == [tokenizer.token_to_id("a"), tokenizer.token_to_id(" " + tag)]
    ids = tokenizer.encode(trajectory, allow_special=True)
    assert ids.count(tokenizer.eos_id) == 2 and tokenizer.eos_id not in tokenizer.encode(trajectory)
    assert tokenizer.encode("<|im_end|>", allow_special=True) == [tokenizer.eos_id]
    plain = tokenizer.decode(ids, skip_special=True)
    assert plain == trajectory.replace("<|im_start|>", "").replace("<|im_end|>", "") and "<search>" in plain

    for text in ("Zyzzyva 2077  x\ty \n\n", "a  <|im_end|>  b", "<foo> </bar>"):  # unknown words: characters
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert len(tokenizer.encode("Zyzzyva")) == 7
    assert tokenizer.decode(tokenizer.encode("caf\u00e9 a\r\nb\rc")) == "caf<unk> a\nb\nc"


def test_word_tokenizer_save_load_batch_and_chat(tmp_path, tokenizer):
    tokenizer.save(tmp_path / "tok.json")
    loaded = WordTokenizer.load(tmp_path / "tok.json")
    assert loaded.vocab_size == tokenizer.vocab_size
    assert [loaded.id_to_token(i) for i in range(loaded.vocab_size)] == [
        tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)
    ]
    (tmp_path / "bad.json").write_text('{"tokens": []}')
    with pytest.raises(ValueError, match="bad.json"):
        WordTokenizer.load(tmp_path / "bad.json")

    a, b = tokenizer.encode("Who is"), tokenizer.encode("Who is married to")
    ids, mask = tokenizer.batch_encode(["Who is", "Who is married to"], padding_side="left")
    pad = tokenizer.pad_id
    assert ids.tolist() == [[pad, pad] + a, b] and mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert tokenizer.pad_id == 0 and tokenizer.id_to_token(tokenizer.eos_id) == "<|im_end|>"

    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert chat == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tokenizer.unk_id not in tokenizer.encode(chat.replace("Hi", "user"), allow_special=True)


def test_make_world_cli(tmp_path, capsys):
    from jaxsearch.cli import make_world  # launch/make_world.py's command
    from jaxsearch.files import MARKER
    assert make_world.main(["--out", str(tmp_path), "--seed", "5", "--size", "tiny"]) == 0
    assert "passages" in capsys.readouterr().out
    assert {p.name for p in tmp_path.iterdir()} == {
        "corpus.jsonl",
        "train.jsonl",
        "dev.jsonl",
        "test.jsonl",
        "world_config.json",
        "tokenizer.json",
        MARKER,  # the directory is marked as written by jaxsearch (files.claim_output_dir)
    }
    assert json.loads((tmp_path / "world_config.json").read_text())["seed"] == 5
    tokenizer = WordTokenizer.load(tmp_path / "tokenizer.json")
    question = load_examples(tmp_path / "dev.jsonl")[0].question
    assert tokenizer.decode(tokenizer.encode(question)) == question
    before = (tmp_path / "corpus.jsonl").read_bytes()
    assert make_world.main(["--out", str(tmp_path), "--seed", "6"]) == 2  # refuses to replace a world
    assert "--overwrite" in capsys.readouterr().err and (tmp_path / "corpus.jsonl").read_bytes() == before


def test_solution_trace_rejects_a_question_from_another_world(world):
    other = generate_world(world_config("tiny", seed=9))
    with pytest.raises(ValueError, match="in this world"):
        solution_trace(other.questions["test"][0], world)
