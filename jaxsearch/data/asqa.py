"""ASQA rows (long-form answers to ambiguous questions) and the answers SOAR's Table 10 scores them against.

A FlashRAG JSONL row is `{"id", "question", "golden_answers", "metadata"}` (FlashRAG's README; read by
`data.qa`). FlashRAG's processed ASQA file itself is not in its repository (it is on the Hub), so the fields
read here are the ASQA release's own names (google-research/language `asqa`, tfds `asqa`), under `metadata`:

    "qa_pairs":    [{"question", "short_answers": [str, ...], "context", "wikipage"}, ...]  one per reading
    "annotations": [{"long_answer": str, "knowledge": [{"content", "wikipage"}, ...]}, ...]
    "wikipages":   [{"title", "url"}, ...]

SOAR (seed 001, Table 10) reports "F1 score for ASQA" without its rule. Ours: the token F1 of every other
dataset (`scoring.metrics.f1_score`, the max over references), against the short answers of all the question's
readings (`short_answers`: every `qa_pairs[*].short_answers`, in order, duplicates dropped) and not the long
answers, which a short `<answer>` could only score a small recall against. A row without `qa_pairs` has no
short answers here (None): its F1 is the ordinary one against `golden_answers`.
"""

from __future__ import annotations

from jaxsearch.data.qa_example import QADataError, QAExample


def short_answers(example: QAExample) -> list[str] | None:
    """Every short answer of the example's ASQA readings, in order, each once; None without `qa_pairs`."""
    pairs = example.metadata.get("qa_pairs")
    if pairs is None:
        return None
    return list(dict.fromkeys(a for pair in pairs for a in pair["short_answers"]))


def check_qa_pairs(pairs: object, where: str) -> None:
    """A QADataError naming the field unless `pairs` is a list of objects with `short_answers` strings."""
    if not isinstance(pairs, list) or not pairs:
        raise QADataError(f"{where}: field 'metadata.qa_pairs' must be a non-empty list, got {pairs!r:.200}")
    for i, pair in enumerate(pairs):
        answers = pair.get("short_answers") if isinstance(pair, dict) else None
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise QADataError(
                f"{where}: field 'metadata.qa_pairs[{i}].short_answers' must be a list of strings, "
                f"got {answers!r:.200}"
            )
