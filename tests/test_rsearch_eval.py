"""R-Search's evaluation loop (QingFei1/R-Search `src/eval/main.py`, `utils.py`, `config.yaml`; issue 39
defect 7): no turn cap, 1,024 new tokens per call, per-dataset corpora, Acc beside EM and F1, the authors' tags.

Expected values come from running the authors' functions on the same input (main.py `R_Search` with vLLM and
the retriever replaced by the same scripts; utils.py's metrics), cited beside each.
"""

import json

from configs import rsearch_7b
from jaxsearch.agent.build import for_evaluation
from jaxsearch.agent.protocols import get_protocol
from jaxsearch.config import RunConfig
from jaxsearch.data.qa_example import QAExample
from jaxsearch.eval import evaluate as ev
from jaxsearch.retrieval.base import Doc
from jaxsearch.scoring.metrics import accuracy
from test_graphr1_setting import FixedAnswers, QueryRetriever, scripted_engine

CFG = RunConfig.from_dict(rsearch_7b.get_config())

SIX_SEARCHES = [f"Step {i}. <search> query {i} </search> ignored tail" for i in range(1, 7)] + [
    "<original_evidence>e</original_evidence> <answer>first</answer> then <answer>Paris</answer> bye"
]
NO_QUERY = ["I will look. </search> oops", "So the answer is Paris, France."]


class StubSearch(QueryRetriever):
    """main.py's `search` as the scratch run stubbed it: the n-th query gets `(Title: "Tn") text about q`."""

    def search(self, queries, k):
        self.queries += list(queries)
        n = len(self.queries)
        return [[Doc(f"d{n}", f"T{n}", f"text about {q.strip()}")] for q in queries]


def eval_engine(scripts):
    engine = scripted_engine(
        get_protocol("rsearch_eval"), scripts, CFG.rollout.episode, cache_len=CFG.rollout.cache_len,
        max_segment=CFG.rollout.cache_len,
    )
    engine = for_evaluation(engine.replace(retriever=StubSearch()), CFG.rollout)  # the evaluation's limits
    return engine.replace(limits=engine.limits.replace(scheduler="lockstep"))


def test_config_holds_the_authors_evaluation_loop():
    r = CFG.rollout
    assert r.eval_max_segment_tokens == 1024  # main.py --max_tokens default 1024
    assert r.eval_max_turns >= r.cache_len  # main.py: no turn cap (`if cnt>4: break` is commented out)
    assert (r.max_turns, r.max_segment_tokens) == (4, CFG.rollout.max_segment_tokens)  # training unchanged
    # config.yaml search + main.py retri_url: own corpora for three datasets, wiki-18 for the rest
    urls = ev.dataset_urls(CFG.data.eval_retrievers, ["2wikimultihopqa", "hotpotqa", "musique", "nq", "popqa"])
    assert urls == {
        "2wikimultihopqa": "http://127.0.0.1:8000/retrieve",
        "hotpotqa": "http://127.0.0.1:8003/retrieve",
        "musique": "http://127.0.0.1:8002/retrieve",
        "nq": "http://127.0.0.1:8001/retrieve",
        "popqa": "http://127.0.0.1:8001/retrieve",
    }


def test_six_searches_then_the_last_answer():
    engine = eval_engine([SIX_SEARCHES])
    traj = engine.rollout(None, ["Q?"], 0)
    # main.py R_Search on the same script: answer "Paris", searched [" query 1 ", ..., " query 6 "], and its
    # thought below, where each of the policy's turns follows a blank line (main.py rebuilds its prompt as text
    # as '\n\n{output_text}<observation>...'); the policy wrote its turns without one
    thought = "".join(
        f'\n\nStep {i}. <search> query {i} </search><observation>(Title: "T{i}") text about query {i}\n'
        "</observation>\n\n"
        for i in range(1, 7)
    ) + "<original_evidence>e</original_evidence> <answer>first</answer> then <answer>Paris</answer> bye"
    assert traj.answers == ["Paris"]
    assert engine.retriever.queries == [f" query {i} " for i in range(1, 7)]
    assert (int(traj.searches[0]), int(traj.turns[0])) == (6, 7)  # past training's max_turns=4
    assert traj.responses[0] == thought.replace("\n\nStep", "Step") + "<|im_end|>"
    assert traj.evidence == ["e"]  # the authors' <original_evidence> tag


def test_a_search_without_query_gets_an_empty_observation_and_no_answer_tag_answers_the_text():
    engine = eval_engine([NO_QUERY])
    traj = engine.rollout(None, ["Q?"], 0)
    # main.py R_Search: answer "So the answer is Paris, France.", searched [], thought "\n\nI will look.
    # </search><observation></observation>\n\nSo the answer is Paris, France."
    assert traj.answers == ["So the answer is Paris, France."]
    assert engine.retriever.queries == [] and int(traj.searches[0]) == 0
    assert traj.responses[0] == (
        "I will look. </search><observation></observation>\n\nSo the answer is Paris, France.<|im_end|>"
    )


def test_a_call_decodes_at_most_1024_tokens():
    long_answer = "word " * 1100  # no </search>: main.py's call stops at max_tokens, stop_reason None
    engine = eval_engine([[long_answer]])
    traj = engine.rollout(None, ["Q?"], 0)
    assert int(traj.attention_mask[0].sum() - traj.prompt_lengths[0]) == 1024
    assert traj.answers[0] == ("word " * 1024).strip()  # main.py: no <answer>, the response is the answer


# (prediction, golden answers) -> utils.py acc_score / f1_scorer / compute_exact on the one example (x 100)
METRIC_CASES = [
    ("Paris", ["paris"], 100.0, 100.0, 100.0),
    ("the city of Paris", ["Paris"], 100.0, 50.0, 0.0),
    ("no", ["no way"], 0.0, 66.67, 0.0),
    ("London", ["Paris", "paris, France"], 0.0, 0.0, 0.0),
]


def test_acc_em_f1_as_the_authors_compute_them(tmp_path):
    for pred, gold, acc, _, _ in METRIC_CASES:
        assert 100 * accuracy(pred, gold) == acc
    examples = [QAExample(f"q{i}", f"Question {i}?", gold) for i, (_, gold, *_) in enumerate(METRIC_CASES)]
    answers = {ex.question: case[0] for ex, case in zip(examples, METRIC_CASES)}
    records = ev.run_batch(FixedAnswers(get_protocol("rsearch_eval"), answers), None, examples, 0, 4)
    for record, (_, _, acc, f1, em) in zip(records, METRIC_CASES):
        m = record["metrics"]
        assert (100 * m["acc"], round(100 * m["f1"], 2), 100 * m["em"]) == (acc, f1, em)
    # utils.py over the four: {"Acc": 50.0, "F1": 54.17, "EM": 25.0}
    summary = ev.summarize(records)
    assert (100 * summary["acc"], round(100 * summary["f1"], 2), 100 * summary["em"]) == (50.0, 54.17, 25.0)
    assert "| Acc |" in ev.markdown_table({"datasets": {"x": summary}, "average": summary})


def test_each_dataset_searches_its_own_corpus(tmp_path):
    examples = {name: [QAExample(f"{name}1", f"{name} question?", ["Paris"])] for name in ("hotpotqa", "nq")}
    script = ["<search> q </search>", "<answer>Paris</answer>"]
    engine = eval_engine([script + script])  # one row per dataset, one dataset after the other
    own = StubSearch()
    ev.evaluate(engine, None, examples, str(tmp_path), batch_size=1, progress=False, retrievers={"hotpotqa": own})
    assert own.queries == [" q "] and engine.retriever.queries == [" q "]
    records = {name: json.loads((tmp_path / f"{name}.jsonl").read_text()) for name in examples}
    assert all(r["metrics"]["acc"] == 1.0 for r in records.values())
    assert "<observation>" in records["nq"]["response"]  # the authors' tag names in what the eval writes
