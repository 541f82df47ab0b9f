"""QA answer metrics as FlashRAG and Search-R1 define them (host side, plain Python).

Every metric normalizes with SQuAD's rule (lowercase, drop punctuation, drop the articles a/an/the,
collapse whitespace) and takes the max over the golden answers, which may be one string or a list.

    exact_match(prediction, golden_answers)      1.0 if the normalized strings are equal
    sub_exact_match(prediction, golden_answers)  1.0 if a normalized golden answer is a substring
    f1_score(prediction, golden_answers)         token-level F1 (FlashRAG's yes/no/noanswer rule)
    answer_in_text(text, golden_answers)         retrieval-side hit: a golden answer occurs in text
    words_in_text(text, answer)                  the answer's words occur as a run of whole words in text
    accuracy(prediction, golden_answers)         R-Search's Acc: a golden answer occurs in the raw prediction

sub_exact_match is FlashRAG's `Sub_ExactMatch`: a golden answer that normalizes to "" (e.g. "." or "the") is
contained in every prediction. `answer_in_text` (FlashRAG's retrieval hits) never counts one.

A golden answer may be a `Regex` (FlashRAG's rule for curatedtrec, whose answers are patterns;
`data.qa` marks them): exact match is then `re.fullmatch` and sub-exact match `re.search` of the pattern,
case-insensitive, on the normalized prediction (the pattern itself is not normalized); F1 and
`answer_in_text` read it as a plain string.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Sequence

from jaxsearch.data.qa_example import Regex

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
    """1.0 if the normalized prediction equals any normalized golden answer (fully matches a `Regex`)."""
    pred = normalize_answer(prediction)
    return float(
        any(
            g.pattern.fullmatch(pred) is not None if isinstance(g, Regex) else pred == normalize_answer(g)
            for g in _as_list(golden_answers)
        )
    )


def sub_exact_match(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """1.0 if any normalized golden answer (even "") is a substring of the normalized prediction (a `Regex`:
    occurs in it)."""
    pred = normalize_answer(prediction)
    return float(
        any(
            g.pattern.search(pred) is not None if isinstance(g, Regex) else normalize_answer(g) in pred
            for g in _as_list(golden_answers)
        )
    )


def answer_in_text(text: str, golden_answers: str | Sequence[str]) -> bool:
    """True if any non-empty normalized golden answer occurs in the normalized text.

    This is FlashRAG's retrieval-recall hit test for one passage (and SOAR's EM check of an answer
    against a knowledge stream).
    """
    norm_text = normalize_answer(text)
    return any(g and g in norm_text for g in (normalize_answer(a) for a in _as_list(golden_answers)))


def words_in_text(text: str, answer: str) -> bool:
    """True if the normalized answer's words occur in the normalized text as a run of whole words: "new york"
    in "New York City", never "no" in "nothing" nor "york new"; an answer normalizing to "" is in nothing."""
    words, target = normalize_answer(text).split(), normalize_answer(answer).split()
    n = len(target)
    return n > 0 and any(words[i : i + n] == target for i in range(len(words) - n + 1))


def f1_score(prediction: str, golden_answers: str | Sequence[str], special_answers: bool = True) -> float:
    """Max token-level F1 over golden answers.

    FlashRAG's rule (special_answers): when either normalized side is "yes", "no" or "noanswer" and the two
    differ, that golden answer scores 0. Without it: SQuAD's plain token F1 (R-Search's `F1_check` before its
    rounding, Graph-R1's `cal_f1`).
    """
    pred = normalize_answer(prediction)
    best = 0.0
    for golden in _as_list(golden_answers):
        gold = normalize_answer(golden)
        if special_answers and (pred in _SPECIAL_ANSWERS or gold in _SPECIAL_ANSWERS) and pred != gold:
            continue
        pred_tokens, gold_tokens = pred.split(), gold.split()
        common = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def accuracy(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """R-Search's Acc (QingFei1/R-Search src/eval/utils.py `acc_score`, per example): 1.0 if a golden answer,
    lowercased, is a substring of the lowercased prediction; no other normalization (an empty golden answer
    is in every prediction). A `Regex` golden answer: its pattern found in the lowercased prediction."""
    pred = prediction.lower()
    return float(
        any(
            g.pattern.search(pred) is not None if isinstance(g, Regex) else g.lower() in pred
            for g in _as_list(golden_answers)
        )
    )
