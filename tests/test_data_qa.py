"""QA loaders on the shipped FlashRAG-format samples, Search-R1 parquet rows and malformed files;
QAIterator order and exact resume."""

import json
import os
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxsearch.scoring.metrics import Regex, exact_match
from jaxsearch.data.qa import (
    QADataError,
    QAExample,
    QAIterator,
    find_split,
    iter_examples,
    load_examples,
    write_jsonl,
)
from jaxsearch.agent.protocols import prompt_messages

SAMPLES = os.path.join(os.path.dirname(__file__), "data", "qa")
BENCHMARKS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_shipped_samples_load(name):
    path = find_split(os.path.join(SAMPLES, name), "test")
    examples = load_examples(path)
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    assert len(examples) == len(rows) == 5
    for example, row in zip(examples, rows):
        assert (example.id, example.question, example.golden_answers) == (
            row["id"],
            row["question"],
            row["golden_answers"],
        )
        assert example.metadata == row["metadata"] and example.supporting_ids is None


def test_jsonl_round_trip_keeps_supporting_ids(tmp_path):
    examples = [QAExample("a", "Who?", ["X", "Y"], ["3", "7"], {"hops": 2}), QAExample("b", "What?", ["Z"])]
    write_jsonl(examples, tmp_path / "dev.jsonl")
    row = json.loads((tmp_path / "dev.jsonl").read_text().splitlines()[0])
    assert row == {
        "id": "a",
        "question": "Who?",
        "golden_answers": ["X", "Y"],
        "metadata": {"hops": 2, "supporting_ids": ["3", "7"]},
    }
    loaded = load_examples(find_split(tmp_path, "dev"))
    assert loaded[0].supporting_ids == ["3", "7"] and loaded[1].supporting_ids is None
    assert loaded[0].golden_answers == ["X", "Y"] and loaded[1].question == "What?"


def _search_r1_row(index, question, target, with_flashrag_columns):
    # Layout of Search-R1's scripts/data_process/nq_search.py output (typed out here, not imported).
    prefix = (
        "Answer the given question. You must conduct reasoning inside <think> and </think> first ... "
        f"For example, <answer> Beijing </answer>. Question: {question}\n"
    )
    row = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": prefix}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": target}},
        "extra_info": {"split": "train", "index": index},
    }
    if with_flashrag_columns:
        row.update(
            id=f"train_{index}", question=question, golden_answers=target, metadata={"source": "made-up"}
        )
    return row


@pytest.mark.parametrize("with_flashrag_columns", [True, False])
def test_search_r1_parquet(tmp_path, with_flashrag_columns):
    rows = [
        _search_r1_row(0, "who founded velmora?", ["Ada Quill"], with_flashrag_columns),
        _search_r1_row(1, "when was tarnomar built?", ["1801", "in 1801"], with_flashrag_columns),
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    examples = load_examples(path)
    assert (
        [e.id for e in examples] == ["train_0", "train_1"]
        if with_flashrag_columns
        else ["nq_train_0", "nq_train_1"]
    )
    assert [e.question for e in examples] == ["who founded velmora?", "when was tarnomar built?"]
    assert [e.golden_answers for e in examples] == [["Ada Quill"], ["1801", "in 1801"]]
    assert examples[1].metadata["data_source"] == "nq"
    assert examples[1].metadata["extra_info"] == {"split": "train", "index": 1}


def test_flashrag_parquet_and_streaming(tmp_path):
    rows = [{"id": f"dev_{i}", "question": f"q{i}?", "golden_answers": [f"a{i}"]} for i in range(3000)]
    path = tmp_path / "dev.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=700)
    stream = iter_examples(path)
    assert next(stream).id == "dev_0"
    assert [e.golden_answers[0] for e in stream][-1] == "a2999"


# Search-R1's merged test set: the output of its scripts/data_process/qa_search_test_merge.py (see
# tests/data/search_r1/README.md). Its rows' `question` column is what make_prefix put in the prompt.
MERGED = os.path.join(os.path.dirname(__file__), "data", "search_r1", "test_merged.parquet")


def test_search_r1_merged_test_set_keys_by_data_source_and_id():
    rows = pq.read_table(MERGED).to_pylist()
    examples = load_examples(MERGED)
    assert [e.id for e in examples].count("test_0") == 3  # nq, triviaqa and custom
    assert [e.key for e in examples] == [(r["data_source"], r["id"]) for r in rows]
    assert len({e.key for e in examples}) == len(rows) == 12
    assert [e.question for e in examples] == [r["question"] for r in rows]
    assert [e.prompt for e in examples] == [r["prompt"] for r in rows]
    assert [e.golden_answers for e in examples] == [r["reward_model"]["ground_truth"]["target"] for r in rows]


def test_question_recovered_exactly_from_search_r1s_prompt(tmp_path):
    # Without the question column, the question is what make_prefix put between its prefix and the final
    # newline, even when the question itself contains "Question:".
    table = pq.read_table(MERGED)
    path = tmp_path / "test.parquet"
    pq.write_table(table.drop(["question", "id"]), path)
    examples = load_examples(path)
    assert [e.question for e in examples] == table.column("question").to_pylist()
    assert examples[10].question == "Question: what does the sign over the Ostral gate say?"
    assert examples[11].question == "Answer this. Question: who keeps the lantern of Velmora?"
    assert examples[10].id == "custom_test_0"  # {data_source}_{split}_{index}


def test_prompt_messages_use_the_datasets_prompt_for_search_r1_only():
    examples = load_examples(MERGED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the parquet's prompts are the built-in template: no warning
        assert prompt_messages(examples, "search_r1") == [e.prompt for e in examples]
    assert prompt_messages(examples, "search_r1", use_data_prompt=False) is None
    assert prompt_messages(examples, "eka") is None
    assert prompt_messages([QAExample("1", "Who?", ["X"])], "search_r1") is None
    custom = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who? Use <search>."}]
    mixed = [QAExample("1", "Who?", ["X"], prompt=custom), QAExample("2", "What?", ["Y"])]
    with pytest.warns(UserWarning, match="differs from the built-in search_r1 template"):
        assert prompt_messages(mixed, "search_r1") == [custom, None]


def test_prompt_round_trips_through_jsonl_and_bad_prompt_names_the_field(tmp_path):
    custom = [{"role": "user", "content": "Question: Who?"}]
    write_jsonl([QAExample("1", "Who?", ["X"], prompt=custom)], tmp_path / "dev.jsonl")
    assert load_examples(tmp_path / "dev.jsonl")[0].prompt == custom
    (tmp_path / "bad.jsonl").write_text(
        '{"id": "1", "question": "Who?", "golden_answers": ["X"], "prompt": [{"role": "user"}]}\n'
    )
    with pytest.raises(QADataError, match=r"bad\.jsonl:1: field 'prompt\[0\]'"):
        load_examples(tmp_path / "bad.jsonl")


def test_curatedtrec_answers_are_regexes(tmp_path):
    # FlashRAG picks the regex rule by dataset name (ExactMatch.is_regex: dataset_name == "curatedtrec")
    rows = [{"id": "test_0", "question": "Who?", "golden_answers": ["(John )?Lennon", "19[0-9]{2}"]}]
    (tmp_path / "curatedtrec").mkdir()
    for name in ("curatedtrec/test.jsonl", "nq.jsonl"):
        write_rows = "".join(json.dumps(r) + "\n" for r in rows)
        (tmp_path / name).write_text(write_rows)
    (ex,) = load_examples(tmp_path / "curatedtrec" / "test.jsonl")
    assert ex.golden_answers == rows[0]["golden_answers"]
    assert all(isinstance(g, Regex) for g in ex.golden_answers)
    assert exact_match("Lennon", ex.golden_answers) == 1.0
    (plain,) = load_examples(tmp_path / "nq.jsonl")
    assert not any(isinstance(g, Regex) for g in plain.golden_answers)
    assert exact_match("Lennon", plain.golden_answers) == 0.0
    parquet = [dict(rows[0], data_source="curatedtrec", reward_model={"ground_truth": {"target": ["Paul"]}})]
    pq.write_table(pa.Table.from_pylist(parquet), tmp_path / "test.parquet")
    assert isinstance(load_examples(tmp_path / "test.parquet")[0].golden_answers[0], Regex)
    (tmp_path / "curatedtrec" / "dev.jsonl").write_text(
        '{"id": "1", "question": "Who?", "golden_answers": ["ok", "(unclosed"]}\n'
    )
    match = r"dev\.jsonl:1: field 'golden_answers\[1\]' is not a valid regular expression"
    with pytest.raises(QADataError, match=match):
        load_examples(tmp_path / "curatedtrec" / "dev.jsonl")


GOOD = '{"id": "1", "question": "Who?", "golden_answers": ["X"]}'


@pytest.mark.parametrize(
    "lines, line_no, field",
    [
        ([GOOD, '{"id": "2", "golden_answers": ["X"]}'], 2, "'question'"),
        ([GOOD, GOOD, '{"id": "3", "question": "Who?"}'], 3, "'golden_answers'"),
        (['{"question": "Who?", "golden_answers": ["X"]}'], 1, "'id'"),
        ([GOOD, '{"id": "2", "question": "Who?", "golden_answers": "X"}'], 2, "'golden_answers'"),
        ([GOOD, '{"id": "2", "question": "Who?", "golden_answers": []}'], 2, "'golden_answers'"),
        (
            [GOOD, '{"id": "2", "question": "Who?", "golden_answers": ["X"], "metadata": [1]}'],
            2,
            "'metadata'",
        ),
        (
            ['{"id": "1", "question": "Who?", "golden_answers": ["X"], "metadata": {"supporting_ids": 4}}'],
            1,
            "'metadata.supporting_ids'",
        ),
        ([GOOD, "", '{"id": "2", "question": '], 3, "not valid JSON"),
    ],
)
def test_malformed_jsonl_names_file_line_and_field(tmp_path, lines, line_no, field):
    path = tmp_path / "test.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(QADataError) as info:
        load_examples(path)
    assert f"{path}:{line_no}:" in str(info.value) and field in str(info.value)


def test_malformed_parquet_names_row_and_field(tmp_path):
    rows = [_search_r1_row(0, "q?", ["a"], False), _search_r1_row(1, "q?", ["a"], False)]
    rows[1]["reward_model"] = {"style": "rule", "ground_truth": {"other": ["a"]}}
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(QADataError, match=r"train\.parquet: row 2: .*'reward_model\.ground_truth\.target'"):
        load_examples(path)


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "test.jsonl").write_text("\n\n")
    with pytest.raises(QADataError, match="test.jsonl: the file has no examples"):
        load_examples(tmp_path / "test.jsonl")
    with pytest.raises(QADataError, match="no such QA file"):
        load_examples(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(QADataError, match="unknown QA file type"):
        load_examples(tmp_path / "x.csv")
    with pytest.raises(QADataError, match="none of train.jsonl, train.parquet, qa_train.json"):
        find_split(tmp_path, "train")


def test_graph_r1_qa_json(tmp_path):
    # Graph-R1's datasets/NAME/raw/qa_{split}.json: a JSON array of question / golden_answers / context
    rows = [
        {"question": " Who directed Jaws? ", "golden_answers": ["Steven Spielberg"], "context": ["P1", "P2", "P1"]},
        {"question": "Where?", "golden_answers": ["Paris", "France"], "context": "One passage."},
        {"id": "own", "question": "When?", "golden_answers": ["1975"]},
    ]
    (tmp_path / "qa_dev.json").write_text(json.dumps(rows))
    path = find_split(tmp_path, "dev")
    assert path == str(tmp_path / "qa_dev.json")
    a, b, c = load_examples(path)
    assert (a.id, a.question, a.golden_answers, a.metadata) == (
        "qa_dev_0",  # numbered from 0 as datasets.Dataset numbers the rows
        "Who directed Jaws?",
        ["Steven Spielberg"],
        {"context": ["P1", "P2"]},  # deduplicated in order, as EKA's compute_rs.py does
    )
    assert (b.id, b.golden_answers, b.metadata["context"]) == ("qa_dev_1", ["Paris", "France"], ["One passage."])
    assert (c.id, c.metadata) == ("own", {})
    again = tmp_path / "again.jsonl"  # the context survives a FlashRAG round trip
    write_jsonl([a], again)
    assert load_examples(again)[0].metadata == {"context": ["P1", "P2"]}


@pytest.mark.parametrize(
    "text, where",
    [
        ('{"question": "q"}', "expected a JSON array"),
        ('[{"question": "q", "golden_answers": ["a"]}, {"question": "q", "golden_answers": ["a"], "context": [1]}]',
         "row 2: field 'context'"),
        ('[{"question": "q", "golden_answers": ["a"]},\n {"question": ', "qa_test.json:2: not valid JSON"),
        ("[]", "the file has no examples"),
    ],
)
def test_malformed_graph_r1_qa_json_names_row_and_field(tmp_path, text, where):
    (tmp_path / "qa_test.json").write_text(text)
    with pytest.raises(QADataError, match=where):
        load_examples(tmp_path / "qa_test.json")


def _examples(n):
    return [QAExample(str(i), f"q{i}", [f"a{i}"]) for i in range(n)]


def test_iterator_groups_and_epochs():
    examples = _examples(7)
    it = QAIterator(examples, batch_size=3, group_size=4, seed=0)
    seen = []
    for _ in range(7):  # 21 draws = 3 epochs
        batch = next(it)
        assert len(batch) == 12
        groups = [batch[i : i + 4] for i in range(0, 12, 4)]
        assert all(len({id(e) for e in g}) == 1 for g in groups)  # q0 x group, q1 x group, ...
        seen.extend(int(g[0].id) for g in groups)
    for epoch in range(3):  # each epoch is a permutation of all examples
        assert sorted(seen[7 * epoch : 7 * epoch + 7]) == list(range(7))
    assert seen[:7] != seen[7:14]  # reshuffled per epoch
    assert it.state()["epoch"] == 2 and it.state()["index"] == 7

    plain = QAIterator(examples, batch_size=2, group_size=1, seed=0, shuffle=False)
    assert [[e.id for e in next(plain)] for _ in range(4)] == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "0"]]


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_iterator_exact_resume(k):
    examples = _examples(11)
    reference = QAIterator(examples, batch_size=4, group_size=2, seed=123)
    for _ in range(k):
        next(reference)
    state = json.loads(json.dumps(reference.state()))  # as a checkpoint would store it
    expected = [[e.id for e in next(reference)] for _ in range(6)]

    fresh = QAIterator(examples, batch_size=4, group_size=2, seed=123)
    fresh.restore(state)
    assert [[e.id for e in next(fresh)] for _ in range(6)] == expected

    other_seed = QAIterator(examples, batch_size=4, group_size=2, seed=124)
    with pytest.raises(ValueError, match="seed"):
        other_seed.restore(state)
    with pytest.raises(ValueError, match="num_examples"):
        QAIterator(_examples(10), batch_size=4, group_size=2, seed=123).restore(state)
