"""FlashRAG's retrieval metrics: a passage hits when it contains a normalized golden answer."""
from __future__ import annotations

import re
import string

from jaxsearch.retrieval.base import Doc

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation and articles, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def hits(docs: list[Doc], golden_answers: list[str], k: int) -> list[bool]:
    """For each of the top-`k` docs: does its normalized contents contain a normalized answer?"""
    answers = [a for a in (normalize_answer(g) for g in golden_answers) if a]
    return [any(a in normalize_answer(d.contents) for a in answers) for d in docs[:k]]


def recall_at_k(docs: list[Doc], golden_answers: list[str], k: int) -> float:
    """1.0 if any of the top-`k` docs contains an answer, else 0.0."""
    return float(any(hits(docs, golden_answers, k)))


def precision_at_k(docs: list[Doc], golden_answers: list[str], k: int) -> float:
    """Fraction of the returned top-`k` docs that contain an answer (0.0 when none returned)."""
    h = hits(docs, golden_answers, k)
    return sum(h) / len(h) if h else 0.0
