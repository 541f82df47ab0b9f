"""QA metrics on hand-computed cases (FlashRAG / Search-R1 definitions)."""
import pytest

from jaxsearch.eval.metrics import (
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
    assert sub_exact_match("anything", ["."]) == 0.0  # empty normalized golden never matches


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
