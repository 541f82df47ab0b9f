"""QA metrics on hand-computed cases (FlashRAG / Search-R1 definitions)."""
import pytest

from jaxsearch.scoring.metrics import (
    Regex,
    answer_in_text,
    exact_match,
    f1_score,
    normalize_answer,
    sub_exact_match,
)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("An apple a day", "apple day"),
        ("  U.S.A. ", "usa"),
        ("theater", "theater"),  # articles only as whole words
        ("", ""),
        ("A", ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match():
    assert exact_match("the Eiffel Tower.", ["Eiffel tower"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel tower"]) == 0.0
    assert exact_match("Paris", "paris") == 1.0  # golden as a plain string
    assert exact_match("Lyon", ["Paris", "lyon!"]) == 1.0  # max over golden answers
    assert exact_match("Lyon", []) == 0.0


def test_sub_exact_match():
    assert sub_exact_match("It is the city of Paris, France", ["paris"]) == 1.0
    assert sub_exact_match("Par", ["paris"]) == 0.0
    assert answer_in_text("anything", ["."]) is False  # the retrieval-side hit never counts "" as found


# (prediction, golden answers, EM, sub-EM, F1) from running FlashRAG's flashrag/evaluator/metrics.py
# (ExactMatch.calculate_em, Sub_ExactMatch.calculate_sub_em, F1_Score.token_level_scores; RUC-NLPIR/FlashRAG
# at 1ee5249) with dataset_name "nq": a golden answer that normalizes to "" is contained in every prediction.
FLASHRAG_CASES = [
    ("Paris", ["."], 0.0, 1.0, 0.0),
    ("", ["the"], 1.0, 1.0, 0.0),
    ("Paris", ["a"], 0.0, 1.0, 0.0),
    ("Paris", ["an", "London"], 0.0, 1.0, 0.0),
    ("", ["."], 1.0, 1.0, 0.0),
    ("x", ["y"], 0.0, 0.0, 0.0),
    ("The Eiffel Tower", ["eiffel tower"], 1.0, 1.0, 1.0),
    ("London", ["the", "Paris"], 0.0, 1.0, 0.0),
]
# The same with dataset_name "curatedtrec": golden answers are regular expressions (re.fullmatch for EM,
# re.search for sub-EM, case-insensitive, on the normalized prediction); F1 reads them as strings.
FLASHRAG_CURATEDTREC_CASES = [
    ("John Lennon", ["(john )?lennon"], 1.0, 1.0, 1.0),
    ("The Lennon", ["(john )?lennon"], 1.0, 1.0, 2 / 3),
    ("it was John Lennon!", ["Lennon"], 0.0, 1.0, 0.4),
    ("1969", ["19[0-9]{2}"], 1.0, 1.0, 0.0),
    ("in 1969", ["19[0-9]{2}"], 0.0, 1.0, 0.0),
    ("LENNON", ["lennon"], 1.0, 1.0, 1.0),
    ("U.S.", ["U\\.S\\."], 0.0, 0.0, 1.0),
    ("US", ["U\\.?S\\.?"], 1.0, 1.0, 1.0),
    ("the beatles", ["The Beatles"], 0.0, 0.0, 1.0),
    ("Paul", ["John|Paul"], 1.0, 1.0, 0.0),
    ("Paula", ["John|Paul"], 0.0, 1.0, 0.0),
]


@pytest.mark.parametrize("prediction, golds, em, sub_em, f1", FLASHRAG_CASES)
def test_flashrag_metrics(prediction, golds, em, sub_em, f1):
    assert exact_match(prediction, golds) == em
    assert sub_exact_match(prediction, golds) == sub_em
    assert f1_score(prediction, golds) == pytest.approx(f1)


@pytest.mark.parametrize("prediction, golds, em, sub_em, f1", FLASHRAG_CURATEDTREC_CASES)
def test_flashrag_curatedtrec_regex_answers(prediction, golds, em, sub_em, f1):
    regexes = [Regex(g) for g in golds]
    assert exact_match(prediction, regexes) == em
    assert sub_exact_match(prediction, regexes) == sub_em
    assert f1_score(prediction, regexes) == pytest.approx(f1)


def test_f1_hand_computed():
    # pred tokens: [barack, obama, jr]; gold: [barack, obama] -> p=2/3, r=1, f1=0.8
    assert f1_score("Barack Obama Jr.", ["Barack Obama"]) == pytest.approx(0.8)
    # max over golden answers: "Obama" gives p=1/3, r=1, f1=0.5; "Michelle" gives 0
    assert f1_score("Barack Obama Jr.", ["Michelle", "Obama"]) == pytest.approx(0.5)
    # tokens count with multiplicity: pred [x x y], gold [x y y] -> common 2, p=r=2/3
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)
    assert f1_score("nothing shared", ["Paris"]) == 0.0
    assert f1_score("", ["Paris"]) == 0.0


def test_f1_yes_no_rule():
    assert f1_score("yes", ["yes"]) == 1.0
    assert f1_score("no", ["no way"]) == 0.0  # shares the token "no" but is a special answer
    assert f1_score("yes it is", ["yes"]) == 0.0  # golden is special and they differ
    assert f1_score("noanswer", ["no answer"]) == 0.0
    assert f1_score("no", ["yes", "no"]) == 1.0


def test_answer_in_text():
    doc = "The Louisiana Purchase was signed in Paris on April 30, 1803."
    assert answer_in_text(doc, ["paris"]) is True
    assert answer_in_text(doc, "April 30 1803") is True  # punctuation removed on both sides
    assert answer_in_text(doc, ["London", "Madrid"]) is False
    assert answer_in_text(doc, ["the"]) is False
