"""Differential tests: the rewards against values obtained by running the authors' own reward functions.

tests/data/reward_cases/*.json hold, per case, the response and `expected_authors`, the value the authors'
function gave on the same trajectory as their pipeline feeds it (each file's `how` says exactly how, and each
case's `source` names the file and function). `expected` is this project's value: equal to the authors' except
where a case names a `deviation`:
  (a) tags inside a complete observation are never read as the policy's (the authors' regexes read them);
  (b) no "Beijing": Search-R1's prompt holds an example answer that its extractor falls back to.
"""

import json
import os

import numpy as np
import pytest

from jaxsearch.scoring import rewards as R
from jaxsearch.scoring.rewards import RewardInput

CASES = os.path.join(os.path.dirname(__file__), "data", "reward_cases")


def load(name):
    with open(os.path.join(CASES, name), encoding="utf-8") as f:
        return json.load(f)["cases"]


SEARCH_R1, RSEARCH, GRAPH_R1 = load("search_r1.json"), load("rsearch.json"), load("graph_r1.json")


def ids(cases):
    return [c["id"] for c in cases]


def check_deviation(case, keys):
    """`expected` equals the authors' values unless the case names why it does not."""
    differs = [k for k in keys if not np.isclose(case["expected"][k], case["expected_authors"][k])]
    if differs:
        assert case.get("deviation", "")[:3] in ("(a)", "(b)"), (case["id"], differs)


def test_enough_cases_per_reward():
    assert len(SEARCH_R1) >= 30 and len(RSEARCH) >= 30 and len(GRAPH_R1) >= 30
    assert sum("deviation" not in c for c in SEARCH_R1) >= 30
    assert sum("deviation" not in c for c in RSEARCH) >= 30


@pytest.mark.parametrize("case", SEARCH_R1, ids=ids(SEARCH_R1))
def test_search_r1_em_and_format(case):
    """`em` = qa_em.compute_score_em, `search_r1` = qa_em_format.compute_score_em (0.2 / 0.1 / 0, and 0.1 for
    the retrieval score as the second key)."""
    check_deviation(case, ("em", "search_r1", "search_r1_retrieval_0.1"))
    sample = [RewardInput(case["response"], case["golden_answers"], case["question"])]
    assert R.get_reward("em")(sample)[0] == pytest.approx(case["expected"]["em"])
    assert R.get_reward("search_r1")(sample)[0] == pytest.approx(case["expected"]["search_r1"])
    with_hit = R.search_r1_reward(retrieval_score=0.1)(sample)[0]
    assert with_hit == pytest.approx(case["expected"]["search_r1_retrieval_0.1"])


class ScriptedAnswerer:
    """The frozen evidence model, replaced by the answer each case recorded; records what it was asked."""

    def __init__(self, answer):
        self.reply, self.calls = answer, []

    def answer(self, questions, evidences):
        self.calls.append((questions, evidences))
        return [self.reply] * len(questions)


@pytest.mark.parametrize("case", RSEARCH, ids=ids(RSEARCH))
def test_rsearch_reward(case):
    """qa_f1.compute_score_f1: answer F1 (rounded to 2 decimals), format (0.2 + 0.2), evidence F1."""
    want = case["expected"]
    check_deviation(case, ("answer_f1", "format", "evidence", "total"))
    sample = [RewardInput(case["response"], case["golden_answers"], case["question"])]
    assert R.get_reward("rsearch_f1")(sample)[0] == pytest.approx(want["answer_f1"])
    assert R.rsearch_format_score(case["response"]) == pytest.approx(want["format"])
    answerer = ScriptedAnswerer(case["evidence_model_answer"])
    assert R.evidence_reward(answerer)(sample)[0] == pytest.approx(want["evidence"])
    assert bool(answerer.calls) == case["parsed"]["evidence_model_called"]
    if answerer.calls:
        model_input = case["parsed"]["evidence_model_input"]
        assert answerer.calls == [([model_input["query"]], [model_input["evidence"]])]
    total = R.rsearch_reward(ScriptedAnswerer(case["evidence_model_answer"]))(sample)[0]
    assert total == pytest.approx(want["total"])


def graph_r1_response(case, closed: bool) -> str:
    """The project's response for a case: the authors' input after the prompt (which ends with the first
    `<|im_start|>assistant\\n`). Graph-R1 closes the last turn with `<|im_end|>`; the project's last segment
    ends at its stop string, unclosed (closed=False) or at the policy's `<|im_end|>` (closed=True)."""
    text = case["authors_input"]
    response = text[text.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n") :]
    if response.endswith("<|im_start|>assistant\n<think>\n<|im_end|>"):
        return response  # an empty last segment can only have ended at the policy's <|im_end|>
    return response if closed else response.removesuffix("<|im_end|>")


@pytest.mark.parametrize("closed", [True, False])
@pytest.mark.parametrize("case", GRAPH_R1, ids=ids(GRAPH_R1))
def test_graph_r1_reward(case, closed):
    """qa_em_and_format.compute_score_format (raw) and compute_score_format_answer (the reward)."""
    response = graph_r1_response(case, closed)
    want = case["expected_authors"]
    assert R.graph_r1_format_score(response) == pytest.approx(want["format"])
    assert R.graph_r1_score(response, case["golden_answers"]) == pytest.approx(want["reward"])
    sample = [RewardInput(response, case["golden_answers"], case["question"])]
    assert R.get_reward("graph_r1")(sample)[0] == pytest.approx(want["reward"])
