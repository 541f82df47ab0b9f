"""Reward parsers and reward functions on hand-computed cases, malformed outputs included."""
import numpy as np
import pytest

from jaxsearch.scoring import rewards as R
from jaxsearch.retrieval.base import Doc
from jaxsearch.scoring.rewards import RewardInput
from jaxsearch.agent.protocols import get_protocol

GOLD = ["Paris"]
VALID = (
    "<think>I should search.</think>\n<search>capital of France</search>\n\n"
    "<information>Doc 1: Paris is the capital of France.</information>\n\n"
    "<think>Found it.</think>\n<answer> Paris </answer>"
)
VALID_WRONG_HIT = VALID.replace("<answer> Paris </answer>", "<answer>London</answer>")
VALID_WRONG_MISS = VALID_WRONG_HIT.replace("Paris is", "Lyon is")
DIRECT = "<think>I know this.</think><answer>Paris</answer>"
NO_TAGS = "The answer is Paris."
UNCLOSED = "<think>hmm</think><answer>Paris"
FLOOD = "<think>guess</think><answer>London</answer><answer>Paris</answer>"
NESTED = "<think>x</think><answer>the city <answer>Paris</answer> maybe</answer>"


def batch(*responses, gold=GOLD, **fields):
    return [RewardInput(response=r, golden_answers=gold, **fields) for r in responses]


@pytest.mark.parametrize(
    "response, expected",
    [
        (NO_TAGS, None),
        ("", None),
        (DIRECT, "Paris"),
        (VALID, "Paris"),
        ("<answer>a</answer> text <answer>\n b \n</answer>", "b"),  # the last one
        (NESTED, "the city <answer>Paris"),  # Search-R1's regex: from the first opening to the first close
        ("<answer>a</answer><answer>b", "a"),  # unclosed trailing answer ignored
        (UNCLOSED, None),
        ("</answer>Paris<answer>", None),
        ("<think>q</think><search>q</search><information><answer>fake</answer></information>", None),
    ],
)
def test_extract_answer(response, expected):
    assert R.extract_answer(response) == expected


def test_graded_answer_guards_flooding_and_size():  # the strict rewards' answer
    assert R.graded_answer(DIRECT) == "Paris"
    assert R.graded_answer(FLOOD) is None
    assert R.graded_answer(NESTED) is None  # two <answer> tags
    # the invalid-action hint's "<answer> and </answer>" is not the policy's (the response keeps it)
    from jaxsearch.agent.protocols import SEARCH_R1_INVALID_HINT

    assert R.graded_answer("<search>q" + SEARCH_R1_INVALID_HINT + DIRECT) == "Paris"
    assert R.graded_answer("<search>q" + SEARCH_R1_INVALID_HINT) is None
    huge = "<answer>" + "Paris " * 100 + "</answer>"
    assert R.graded_answer(huge) is None
    assert R.graded_answer(huge, max_answer_chars=10_000) is not None
    # an <answer> inside an observation is not the policy's and does not count as flooding
    obs = "<think>a</think><search>q</search><information>x <answer>y</answer></information><think>b</think><answer>Paris</answer>"
    assert R.graded_answer(obs) == "Paris"


@pytest.mark.parametrize(
    "response, valid",
    [
        (DIRECT, True),
        (VALID, True),
        ("  <think>a</think>\n\n<answer>b</answer>\n", True),
        (NO_TAGS, False),
        ("", False),
        ("<answer>Paris</answer>", False),  # no think before the answer
        ("<think>a</think> stray text <answer>b</answer>", False),
        ("<think>a</think><answer>b</answer> trailing", False),
        (FLOOD, False),
        (UNCLOSED, False),
        ("<think>a<think>b</think></think><answer>c</answer>", False),  # nested
        ("<think>a</think><search>q</search><think>b</think><answer>c</answer>", False),  # no observation
        ("<think>a</think><search>q</search><information>d</information><answer>c</answer>", False),
        ("<think>a</think><search>q</search><information>d", False),  # truncated observation
        # tags inside an observation are the retriever's text, not structure
        ("<think>a</think><search>q</search><information>see <think> and </answer></information>"
         "<think>b</think><answer>c</answer>", True),
    ],
)
def test_is_valid_sequence(response, valid):
    assert R.is_valid_sequence(response) is valid


def test_answer_rewards():
    huge = "<think>x</think><answer>Paris" + "!" * 300 + "</answer>"  # normalises to "paris"
    samples = batch(VALID, "<think>x</think><answer>the city of Paris</answer>", FLOOD, NO_TAGS, UNCLOSED, NESTED, huge)
    # Search-R1's rule: the last answer block of any count and length (FLOOD's last is Paris; NESTED's one block
    # normalises to "city answerparis")
    np.testing.assert_allclose(R.get_reward("em")(samples), [1, 0, 1, 0, 0, 0, 1])
    np.testing.assert_allclose(R.get_reward("sub_em")(samples), [1, 1, 1, 0, 0, 1, 1])  # "paris" in "answerparis"
    # "city of paris" vs "paris": p = 1/3, r = 1 -> F1 = 0.5
    np.testing.assert_allclose(R.get_reward("f1")(samples), [1, 0.5, 1, 0, 0, 0, 1])
    # the strict variants: more than one answer tag or over 256 characters scores 0
    np.testing.assert_allclose(R.get_reward("em_strict")(samples), [1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(R.get_reward("f1_strict")(samples), [1, 0.5, 0, 0, 0, 0, 0])


def test_format_and_gated_rewards():
    samples = batch(VALID, "<answer>Paris</answer>", DIRECT, NO_TAGS)
    np.testing.assert_allclose(R.get_reward("format")(samples), [1, 0, 1, 0])
    np.testing.assert_allclose(R.get_reward("em_gated")(samples), [1, 0, 1, 0])
    np.testing.assert_allclose(R.get_reward("f1_gated")(batch("<think>t</think><answer>Paris France</answer>", "<answer>Paris</answer>")), [2 / 3, 0])


@pytest.mark.parametrize(
    "response, expected",
    [
        (VALID, 1.0),  # correct, valid
        (VALID_WRONG_HIT, 0.2),  # wrong, valid (retrieval_score 0 as published: no credit for the hit)
        (VALID_WRONG_MISS, 0.2),  # wrong, valid, no retrieval hit
        ("<answer>Paris</answer>", 1.0 - 0.2),  # correct, invalid format
        ("<answer>London</answer>", 0.1),  # wrong, invalid, has an answer
        (NO_TAGS, 0.1),  # no answer, invalid: the floor (Search-R1 reads its prompt's "Beijing" here)
        (UNCLOSED, 0.1),
        (FLOOD, 0.8),  # the last answer is right, the format invalid
    ],
)
def test_search_r1_score(response, expected):
    assert R.search_r1_score(response, GOLD) == pytest.approx(expected)
    assert R.get_reward("search_r1")(batch(response))[0] == pytest.approx(expected)


def test_search_r1_reward_parameters():
    fn = R.search_r1_reward(structure_format_score=0.0, final_format_score=0.0, retrieval_score=0.0)
    np.testing.assert_allclose(fn(batch(VALID, VALID_WRONG_HIT, "<answer>London</answer>")), [1, 0, 0])
    hit = R.search_r1_reward(retrieval_score=0.1)
    np.testing.assert_allclose(hit(batch(VALID_WRONG_HIT, VALID_WRONG_MISS)), [0.3, 0.2])


EVID = (
    "<think>t</think><search>q</search><information>Paris is the capital.</information>"
    "<think>t</think><evidence>The capital of France is Paris.</evidence><answer>Paris</answer>"
)


@pytest.mark.parametrize(
    "response, expected",
    [
        (EVID, 0.4),
        ("<think>t</think><evidence>e</evidence><answer>a</answer>", 0.2),  # no observation before evidence
        ("<evidence>e</evidence><search>q</search><information>d</information><answer>a</answer>", 0.4),  # order free
        (EVID.replace("<answer>", "<evidence>x</evidence><answer>"), 0.2),  # two evidences
        (EVID + "<answer>b</answer>", 0.2),  # two answers
        (EVID.replace("</answer>", ""), 0.2),  # unclosed answer
        (EVID.replace("</evidence>", ""), 0.2),  # unclosed evidence
        (NO_TAGS, 0.2),  # no search and no evidence earns the evidence credit (qa_f1.py extract_solution)
    ],
)
def test_rsearch_format(response, expected):
    assert R.rsearch_format_score(response) == pytest.approx(expected)
    assert R.get_reward("rsearch_format")(batch(response))[0] == pytest.approx(expected)


class FakeAnswerer:
    """Answers with the last word of the evidence; records every call."""

    def __init__(self):
        self.calls = []

    def answer(self, questions, evidences):
        self.calls.append((list(questions), list(evidences)))
        return [e.split()[-1] for e in evidences]


def test_evidence_reward_batches_one_call():
    answerer = FakeAnswerer()
    samples = [
        RewardInput(EVID, GOLD, question="q0"),
        RewardInput(DIRECT, GOLD, question="q1"),  # no evidence -> 0, not sent
        RewardInput(EVID.replace("Paris.</evidence>", "Lyon city</evidence>"), GOLD, question="q2"),
    ]
    np.testing.assert_allclose(R.evidence_reward(answerer)(samples), [1.0, 0.0, 0.0])
    assert answerer.calls == [(["q0", "q2"], ["The capital of France is Paris.", "The capital of France is Lyon city"])]
    assert R.evidence_reward(answerer)(batch(NO_TAGS)).tolist() == [0.0]
    assert len(answerer.calls) == 1  # nothing to answer -> no call


def test_evidence_reward_checks_answer_count():
    class Broken:
        def answer(self, questions, evidences):
            return []

    with pytest.raises(ValueError, match="0 answers for 1 evidences"):
        R.evidence_reward(Broken())(batch(EVID))


def test_rsearch_total_reward():
    samples = batch(EVID, EVID.replace("<answer>Paris</answer>", "<answer>Paris France</answer>"), NO_TAGS)
    # answer F1 (rounded to 2 decimals) + evidence F1 (fake answers "Paris.") + format; no search, no evidence: 0.2
    np.testing.assert_allclose(R.rsearch_reward(FakeAnswerer())(samples), [1 + 1 + 0.4, 0.67 + 1 + 0.4, 0.2])


def soar(answer, source, internal="", external=""):
    response = (
        "<think>t</think><search>q</search><information>internal and external results</information>"
        f"<think>t</think><information_source>{source}</information_source><answer>{answer}</answer>"
    )
    return RewardInput(response, GOLD, internal_knowledge=internal, external_knowledge=external)


def test_extract_information_source():
    assert R.extract_information_source(soar("a", " External\n").response) == "external"
    assert R.extract_information_source(soar("a", "internal").response) == "internal"
    assert R.extract_information_source(soar("a", "both").response) is None
    assert R.extract_information_source(DIRECT) is None
    assert R.extract_information_source("<information_source>internal") is None


def test_source_consistency():
    internal, external = "1. Lyon is in France.", "Doc 1: Paris is the capital of France."
    samples = [
        soar("Paris", "external", internal, external),  # declared external, answer in external
        soar("Paris", "internal", internal, external),  # declared internal, answer only in external
        soar("Lyon", "internal", internal, external),  # declared internal, answer in internal
        soar("Berlin", "external", internal, external),  # supported by neither
        soar("Paris", "both", internal, external),  # no valid declaration
        RewardInput("<information_source>external</information_source>", GOLD, external_knowledge=external),  # no answer
        soar("the", "external", internal, external),  # empty normalized answer is never supported
        soar("Lyon", "external", internal, external),  # answer only in the internal facts, declared external
        soar("Lyon", "\u201cInternal\u201d ", internal, external),  # curly quotes, case and spaces around it
    ]
    np.testing.assert_allclose(R.get_reward("source_consistency")(samples), [1, 0, 1, 0, 0, 0, 0, 0, 1])


def test_source_consistency_judge():
    """The Table 7 judge check: one batched call for the rows with an answer and a declaration, the declared
    stream (only) shown, the verdict read from its JSON."""
    internal, external = "1. Lyon is in France.", "Doc 1: Paris is the capital of France."
    samples = [
        soar("Paris", "external", internal, external),
        soar("Lyon", "internal", internal, external),
        soar("Paris", "both", internal, external),  # no declaration: 0 without a call
        soar("Berlin", "external", internal, external),
    ]
    judge = FakeJudge(['{"reason": "r", "consistent": true}', '"consistent": TRUE', "no verdict"])
    np.testing.assert_allclose(R.source_consistency_judge_reward(judge)(samples), [1, 1, 0, 0])
    (conversations,) = judge.calls
    assert len(conversations) == 3
    system, user = conversations[1]
    assert system == {"role": "system", "content": R.SOURCE_CONSISTENCY_JUDGE_PROMPT}
    assert user["role"] == "user" and "Final answer: Lyon" in user["content"]
    assert "Declared source: internal" in user["content"] and internal in user["content"]
    assert external not in user["content"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"reason": "uses doc 1", "grounded": true}', 0.0),
        ('```json\n{\n"reason": "guessed",\n"grounded": false\n}\n```', 1.0),
        ("grounded: False", 1.0),
        ("'grounded': 'TRUE'", 0.0),
        ('Format is "grounded": true/false. My verdict: {"grounded": false}', 1.0),
        ('"grounded": true/false', None),
        ("I cannot tell.", None),
        ("", None),
    ],
)
def test_parse_fabrication_verdict(text, expected):
    assert R.parse_fabrication_verdict(text) == expected


class FakeJudge:
    def __init__(self, outputs):
        self.outputs, self.calls = outputs, []

    def judge(self, conversations):
        self.calls.append(list(conversations))
        return self.outputs[: len(conversations)]


def test_fabrication_judge_reward_and_rate():
    judge = FakeJudge(['{"grounded": true}', '{"grounded": false}', "garbage", '{"grounded": false}'])
    samples = [RewardInput(VALID, GOLD, question=f"q{i}") for i in range(4)]
    scores = R.judge_fabrication(judge, samples)
    np.testing.assert_array_equal(np.isnan(scores), [False, False, True, False])
    np.testing.assert_allclose(scores[[0, 1, 3]], [0.0, 1.0, 1.0])
    assert R.fabrication_rate(scores) == pytest.approx(2 / 3)
    np.testing.assert_allclose(R.fabrication_reward(judge)(samples), [1, 0, 0, 0])
    assert len(judge.calls) == 2 and len(judge.calls[0]) == 4  # one batched call per use
    # Table 2 is the system message; the question and the trajectory are the user message
    system, user = judge.calls[0][1]
    assert system == {"role": "system", "content": R.FABRICATION_JUDGE_PROMPT}
    assert user["role"] == "user" and "Question: q1" in user["content"] and VALID in user["content"]
    assert R.FABRICATION_JUDGE_PROMPT not in user["content"]
    assert "Do NOT evaluate whether the final answer is correct." in R.FABRICATION_JUDGE_PROMPT
    assert np.isnan(R.fabrication_rate(np.array([np.nan])))
    with pytest.raises(ValueError, match="judge returned 0 verdicts for 1 conversations"):
        R.judge_fabrication(FakeJudge([]), samples[:1])


def test_fabrication_judge_sees_the_external_stream_only():
    """SOAR's judge is shown E_ext: the trajectory with each observation cut to the retrieved passages."""
    soar = get_protocol("soar")
    obs = soar.format_observation([Doc("d1", "France", "Paris is the capital.")], "1. Lyon is the capital.")
    response = f"<think>t</think><search>q</search>{obs}<think>t</think><answer>Lyon</answer>"
    external = response.replace(obs, soar.external_view(obs))
    assert "Lyon is the capital" not in external and "Paris is the capital." in external
    judge = FakeJudge(['{"grounded": false}'])
    R.judge_fabrication(judge, [RewardInput(response, GOLD, "q", external_response=external)])
    (((_, user),),) = judge.calls
    assert external in user["content"] and "Lyon is the capital" not in user["content"]


def test_combine_and_registry():
    samples = batch(VALID, "<answer>Paris</answer>", NO_TAGS)
    fn = R.combine([("em", 1.0), ("format", 0.2)])
    np.testing.assert_allclose(fn(samples), [1.2, 1.0, 0.0])
    custom = R.combine([(lambda s: np.full(len(s), 2.0), 0.5), ("sub_em", 2.0)])
    np.testing.assert_allclose(custom(samples), [3.0, 3.0, 1.0])
    assert R.combine([])(samples).tolist() == [0.0, 0.0, 0.0]

    # score gives each term's own, unweighted values by name: a function's name, or its position when
    # that name is taken
    def em(s):
        return np.full(len(s), 0.5)

    def ones(s):
        return np.ones(len(s))

    total, by_term = R.combine([("em", 1.0), ("format", 0.2), (em, 3.0), (ones, -1.0)]).score(samples)
    np.testing.assert_allclose(total, [1.7, 1.5, 0.5])
    assert list(by_term) == ["em", "format", "term2", "ones"]
    np.testing.assert_allclose(by_term["em"], [1, 1, 0])
    np.testing.assert_allclose(by_term["format"], [1, 0, 0])
    np.testing.assert_allclose(by_term["term2"], [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="each name may appear once"):
        R.WeightedSum((("em", R.REWARDS["em"], 1.0), ("em", R.REWARDS["f1"], 1.0)))
    assert fn([]).shape == (0,)
    assert set(R.REWARDS) >= {"em", "f1", "sub_em", "format", "search_r1", "rsearch_format", "source_consistency"}
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        R.get_reward("nope")
    with pytest.raises(ValueError, match="unknown reward"):
        R.combine([("nope", 1.0)])
