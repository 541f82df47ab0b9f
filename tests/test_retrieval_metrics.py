"""FlashRAG retrieval metrics on hand-computed cases."""
from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.metrics import normalize_answer, precision_at_k, recall_at_k

DOCS = [
    Doc("1", "France", "Its capital is Paris, on the Seine."),
    Doc("2", "Spain", "Its capital is Madrid."),
    Doc("3", "Paris (mythology)", "A prince of Troy."),
    Doc("4", "Berlin", "A city in Germany."),
]


def test_normalize_answer_is_squad_normalization():
    assert normalize_answer("  The Eiffel  Tower! ") == "eiffel tower"
    assert normalize_answer("An apple, a day.") == "apple day"
    assert normalize_answer("Théâtre") == "théâtre"


def test_recall_and_precision_by_normalized_containment():
    answers = ["paris"]
    assert recall_at_k(DOCS, answers, 1) == 1.0
    assert precision_at_k(DOCS, answers, 1) == 1.0
    assert precision_at_k(DOCS, answers, 3) == 2 / 3  # doc 3 contains "paris" in its title
    assert precision_at_k(DOCS, answers, 4) == 2 / 4
    assert recall_at_k(DOCS[1:], ["Madrid"], 1) == 1.0
    assert recall_at_k(DOCS[2:], ["Madrid"], 2) == 0.0
    assert recall_at_k(DOCS, ["The Seine!"], 1) == 1.0  # article and punctuation insensitive
    assert recall_at_k(DOCS, ["Rome", "Germany"], 3) == 0.0
    assert recall_at_k(DOCS, ["Rome", "Germany"], 4) == 1.0


def test_fewer_docs_than_k_and_no_docs():
    assert precision_at_k(DOCS[:2], ["madrid"], 5) == 1 / 2  # FlashRAG divides by the docs returned
    assert precision_at_k([], ["madrid"], 5) == 0.0
    assert recall_at_k([], ["madrid"], 5) == 0.0
    assert recall_at_k(DOCS, [""], 4) == 0.0  # an empty answer matches nothing
