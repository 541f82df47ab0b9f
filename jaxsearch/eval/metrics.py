"""QA answer metrics as FlashRAG and Search-R1 define them (host side, plain Python).

Every metric normalizes with SQuAD's rule (lowercase, drop punctuation, drop the articles a/an/the,
collapse whitespace) and takes the max over the golden answers, which may be one string or a list.

    exact_match(prediction, golden_answers)      1.0 if the normalized strings are equal
    sub_exact_match(prediction, golden_answers)  1.0 if a normalized golden answer is a substring
    f1_score(prediction, golden_answers)         token-level F1 (FlashRAG's yes/no/noanswer rule)
    answer_in_text(text, golden_answers)         retrieval-side hit: a golden answer occurs in text

An empty normalized golden answer (e.g. "." or "the") never counts as contained in anything: it would
otherwise match every string. Exact match keeps FlashRAG's plain equality.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL_ANSWERS = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lowercase, remove punctuation, remove articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _as_list(golden_answers: str | Sequence[str]) -> list[str]:
    return [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)


def exact_match(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """1.0 if the normalized prediction equals any normalized golden answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _as_list(golden_answers)))


def sub_exact_match(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """1.0 if any non-empty normalized golden answer is a substring of the normalized prediction."""
    return float(answer_in_text(prediction, golden_answers))


def answer_in_text(text: str, golden_answers: str | Sequence[str]) -> bool:
    """True if any non-empty normalized golden answer occurs in the normalized text.

    This is FlashRAG's retrieval-recall hit test for one passage (and SOAR's EM check of an answer
    against a knowledge stream).
    """
    norm_text = normalize_answer(text)
    return any(g and g in norm_text for g in (normalize_answer(a) for a in _as_list(golden_answers)))


def f1_score(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """Max token-level F1 over golden answers.

    FlashRAG's rule: when either normalized side is "yes", "no" or "noanswer" and the two differ, that
    golden answer scores 0.
    """
    pred = normalize_answer(prediction)
    best = 0.0
    for golden in _as_list(golden_answers):
        gold = normalize_answer(golden)
        if (pred in _SPECIAL_ANSWERS or gold in _SPECIAL_ANSWERS) and pred != gold:
            continue
        pred_tokens, gold_tokens = pred.split(), gold.split()
        common = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
