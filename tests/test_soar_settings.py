"""SOAR's remaining settings (seed 001; issue 39, item 8(c)): disturbed-source training (Tables 5-6), ASQA's F1
(Table 10) and the token cost per reasoning turn (Table 11).

Expected values are counted by hand on small cases (each beside its assert); the episodes run through
`AgentEngine` with test_graphr1_setting's scripted sampler: no model.
"""

import json
import types
from pathlib import Path

import pytest
from test_graphr1_setting import TOK, ScriptedSampler

from configs import soar_7b_disturb, tiny_cpu_soar, tiny_cpu_soar_disturb
from jaxsearch.agent.build import for_evaluation, with_disturbance
from jaxsearch.agent.engine import AgentEngine
from jaxsearch.agent.protocols import get_protocol
from jaxsearch.config import ConfigError, EpisodeConfig, RunConfig
from jaxsearch.data import asqa, qa
from jaxsearch.data.qa_example import QADataError, QAExample
from jaxsearch.eval import evaluate as ev
from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.disturb import DisturbedRetriever, undisturbed

ASQA = Path(__file__).parent / "data" / "asqa" / "dev.jsonl"


class TopicRetriever:
    """k passages per query, ids "{query}#{rank}": a passage's id names the query it was retrieved for."""

    def __init__(self):
        self.calls = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [[Doc(f"{q}#{j}", q, f"passage {j} about {q}") for j in range(k)] for q in queries]


def owner(doc):
    return doc.id.rsplit("#", 1)[0]


# ------------------------------------------------------------------------------------- disturbed training


SHARES = [(0.5, 4, 2), (0.25, 4, 1), (1 / 3, 3, 1), (1.0, 3, 3), (0.0, 3, 0)]  # (rate, k, replaced by hand)


@pytest.mark.parametrize("rate, k, replaced", SHARES)
def test_disturbance_replaces_exactly_the_configured_share(rate, k, replaced):
    questions = [f"question {i}" for i in range(3)]
    donors = [f"donor {i}" for i in range(5)]
    disturbed = DisturbedRetriever(TopicRetriever(), rate, seed=0, donors=donors)
    results = disturbed.search(questions, k)
    for q, docs in zip(questions, results):
        assert len(docs) == k
        swapped = [rank for rank, d in enumerate(docs) if owner(d) != q]
        assert len(swapped) == replaced  # rate x k of the k passages, counted by hand: 2, 1, 1, 3, 0
        for rank, d in enumerate(docs):
            if rank not in swapped:
                assert d.id == f"{q}#{rank}"  # the rest stay where they were
        # the swapped ranks hold one donor question's passages, best first, in rank order
        donor = {owner(docs[r]) for r in swapped}
        assert donor <= set(donors) and len(donor) <= 1
        assert [docs[r].id.rsplit("#", 1)[1] for r in swapped] == [str(j) for j in range(replaced)]
    # 3 queries x k passages, rate of them replaced: 6 of 12, 3 of 12, 3 of 9, 9 of 9, 0 of 9
    assert sum(owner(d) != q for q, docs in zip(questions, results) for d in docs) == 3 * replaced
    # one extra search call holds the turn's donors (none when nothing is replaced)
    assert len(disturbed.inner.calls) == (2 if replaced else 1)


def test_a_query_is_never_its_own_donor_and_a_fractional_share_holds_on_average():
    only_itself = DisturbedRetriever(TopicRetriever(), 1.0, 0, donors=["q"])
    assert [d.id for d in only_itself.search(["q"], 2)[0]] == ["q#0", "q#1"]
    # rate 1/3 of a single passage: a passage is replaced in about one search in three (binomial, n=600:
    # sd 0.019, the bound is 4 sd)
    disturbed = DisturbedRetriever(TopicRetriever(), 1 / 3, 7, donors=[f"donor {i}" for i in range(10)])
    queries = [f"q{i}" for i in range(600)]
    share = sum(owner(docs[0]) != q for q, docs in zip(queries, disturbed.search(queries, 1))) / len(queries)
    assert abs(share - 1 / 3) < 0.08


def test_disturbance_is_reproducible_with_its_seed_whatever_the_batch():
    donors = [f"donor {i}" for i in range(50)]
    queries = [f"who wrote book {i}" for i in range(40)]

    def ids(seed, qs):
        out = DisturbedRetriever(TopicRetriever(), 0.5, seed, donors).search(qs, 4)
        return {q: [d.id for d in docs] for q, docs in zip(qs, out)}

    first = ids(3, queries)
    assert ids(3, queries) == first
    other_batch = queries[::-1][:25]  # another batch: the same picks for the same queries
    assert ids(3, other_batch) == {q: first[q] for q in other_batch}
    assert ids(4, queries) != first  # another seed, other ranks or donors


def _engine(retriever, scripts, k=2):
    protocol = get_protocol("search_r1")
    train, evaluation = (ScriptedSampler(TOK, protocol.stop_strings, scripts) for _ in range(2))
    limits = EpisodeConfig(max_turns=2, retrieval_k=k, max_segment_tokens=64, scheduler="lockstep")
    return AgentEngine(TOK, protocol, retriever, train, limits, internal_sampler=evaluation)


def test_disturbance_is_on_in_training_rollouts_and_off_in_evaluation():
    search = "<search> Jaws director </search>"
    scripts = [[search, "<answer> Spielberg </answer>"]]
    rcfg = types.SimpleNamespace(disturb_rate=1.0, disturb_seed=0)
    engine = with_disturbance(_engine(TopicRetriever(), scripts), rcfg, donors=["Who wrote Dune?"])
    rollout = types.SimpleNamespace(eval_retrieval_k=2, eval_max_turns=0, max_turns=2,
                                    eval_max_segment_tokens=0, max_segment_tokens=64)  # fmt: skip
    evaluation = for_evaluation(engine, rollout)
    assert isinstance(engine.retriever, DisturbedRetriever)
    assert evaluation.retriever is undisturbed(engine.retriever) is engine.retriever.inner
    trained = engine.rollout(None, ["Who directed Jaws?"], 0)
    evaluated = evaluation.rollout(None, ["Who directed Jaws?"], 0)
    assert [d.id for d in trained.docs[0][0]] == ["Who wrote Dune?#0", "Who wrote Dune?#1"]  # rate 1: all
    assert [d.id for d in evaluated.docs[0][0]] == ["Jaws director#0", "Jaws director#1"]
    assert with_disturbance(evaluation, types.SimpleNamespace(disturb_rate=0.0), ["x"]) is evaluation


def test_disturb_configs_differ_from_their_base_only_in_the_disturbance():
    base = RunConfig.from_dict(tiny_cpu_soar.get_config()).to_dict()
    disturbed = RunConfig.from_dict(tiny_cpu_soar_disturb.get_config()).to_dict()
    assert disturbed["retriever"].pop("disturb_rate") == pytest.approx(1 / 3)
    assert base["retriever"].pop("disturb_rate") == 0
    assert disturbed == base
    assert RunConfig.from_dict(soar_7b_disturb.get_config()).retriever.disturb_rate == pytest.approx(1 / 3)
    bad = tiny_cpu_soar_disturb.get_config()
    bad.retriever.disturb_rate = 1.5
    with pytest.raises(ConfigError, match="retriever.disturb_rate"):
        RunConfig.from_dict(bad)


# ------------------------------------------------------------------------------------- ASQA (Table 10)


def test_asqa_rows_load_with_their_readings_short_answers(tmp_path):
    examples = qa.load_examples(ASQA)
    assert [e.id for e in examples] == ["asqa-hand-1", "asqa-hand-2", "asqa-hand-3"]
    # every qa_pairs[*].short_answers of the row, in order, each once (row 3 repeats "Ada Quill")
    assert [asqa.short_answers(e) for e in examples] == [
        ["Mira Estes", "Tomas Rell", "T. Rell"], ["1871", "1902", "March 1902"], ["Ada Quill", "the Lantern Boys"]
    ]  # fmt: skip
    assert asqa.short_answers(QAExample("x", "q?", ["a"])) is None  # not an ASQA row
    row = json.loads(ASQA.read_text().splitlines()[0])
    row["metadata"]["qa_pairs"][1]["short_answers"] = "Tomas Rell"
    bad = tmp_path / "asqa.jsonl"
    bad.write_text("\n" + json.dumps(row) + "\n")
    with pytest.raises(QADataError, match=r"asqa.jsonl:2: field 'metadata.qa_pairs\[1\].short_answers'"):
        qa.load_examples(bad)


def _records(engine, examples, tmp_path):
    summary = ev.evaluate(engine, None, {"asqa": examples}, str(tmp_path), len(examples), progress=False)
    return [json.loads(line) for line in (tmp_path / "asqa.jsonl").read_text().splitlines()], summary


def test_asqa_f1_reads_the_short_answers(tmp_path):
    examples = qa.load_examples(ASQA)
    answers = ["Rell", "in March 1902", "Lantern Boys"]
    engine = _engine(TopicRetriever(), [[f"<answer> {a} </answer>"] for a in answers])
    records, summary = _records(engine, examples, tmp_path)
    # token F1 (SQuAD normalization), max over the short answers, by hand:
    #   "rell" vs "tomas rell" / "t rell": P 1, R 1/2 -> 2/3
    #   "in march 1902" vs "march 1902": P 2/3, R 1 -> 0.8 (vs "1902": 0.5)
    #   "lantern boys" vs "the Lantern Boys" -> "lantern boys": 1
    expected = [2 / 3, 0.8, 1.0]
    assert [r["metrics"]["asqa_f1"] for r in records] == pytest.approx(expected)
    # the sample's golden_answers hold the long answer: "rell" is 1 of its 19 normalized tokens, F1 2/20
    assert records[0]["metrics"]["f1"] == pytest.approx(0.1)
    assert summary["datasets"]["asqa"]["asqa_f1"] == pytest.approx(sum(expected) / 3)
    assert summary["datasets"]["asqa"]["asqa_f1_n"] == 3
    table = (tmp_path / "results.md").read_text().splitlines()
    header = [h.strip() for h in table[0].split("|")]
    assert table[2].split("|")[header.index("F1 (ASQA short)")].strip() == f"{sum(expected) / 3:.3f}"


# ------------------------------------------------------------------------------------- token cost (Table 11)


def test_token_cost_of_hand_counted_records():
    # record 1: prompt 3 tokens, response 9 (policy 5, observation 4) in 2 turns; record 2: prompt 2, response 4
    # (all policy) in 1 turn -> response tokens 13 over 3 turns, policy 9 over 3 turns
    records = [
        {"tokens": [0] * 12, "prompt_length": 3, "turns": 2, "policy_tokens": 5},
        {"tokens": [0] * 6, "prompt_length": 2, "turns": 1, "policy_tokens": 4},
    ]
    assert ev.token_cost(records) == {"token_cost": 13 / 3, "policy_tokens_per_turn": 3.0}
    del records[1]["policy_tokens"]  # a record written before policy_tokens: no policy figure
    assert ev.token_cost(records)["policy_tokens_per_turn"] is None
    assert ev.token_cost([]) == {"token_cost": None, "policy_tokens_per_turn": None}


def test_token_cost_per_dataset_and_on_average(tmp_path):
    search, answer = "<search> Jaws director </search>", "<answer> Spielberg </answer>"
    engine = _engine(TopicRetriever(), [[search, answer], [answer]], k=1)
    examples = [QAExample("a", "Who directed Jaws?", ["Steven Spielberg"]), QAExample("b", "Jaws?", ["x"])]
    summary = ev.evaluate(engine, None, {"two": examples}, str(tmp_path / "two"), 2, progress=False)
    # by hand: row a writes the search (ends at its stop string) and the answer, and reads one observation;
    # row b writes the answer only. 3 turns in all.
    observation = engine.protocol.format_observation([Doc("Jaws director#0", "Jaws director",
                                                          "passage 0 about Jaws director")])  # fmt: skip
    policy = 2 * len(TOK.encode(answer)) + len(TOK.encode(search))
    s = summary["datasets"]["two"]
    assert s["policy_tokens_per_turn"] == pytest.approx(policy / 3)
    assert s["token_cost"] == pytest.approx((policy + len(TOK.encode(observation))) / 3)
    # the average row: the mean over datasets
    one = ev.evaluate(_engine(TopicRetriever(), [[answer]]), None, {"one": examples[1:]}, str(tmp_path / "one"),
                      1, progress=False)  # fmt: skip
    both = ev.average({"two": s, "one": one["datasets"]["one"]})
    assert one["datasets"]["one"]["token_cost"] == len(TOK.encode(answer))
    assert both["token_cost"] == pytest.approx((s["token_cost"] + len(TOK.encode(answer))) / 2)
    header = (tmp_path / "two" / "results.md").read_text().splitlines()[0]
    assert "| token cost |" in header and "| policy tokens/turn |" in header and "ASQA" not in header
