"""Search-R1's prompt as its datasets carry it: the user turn that `make_prefix` (Search-R1's
scripts/data_process/nq_search.py) wraps around each question. The search_r1 protocol prompts with it and
the QA reader finds the question inside it, so it lives here, below both."""

from __future__ import annotations

SEARCH_R1_PROMPT = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> "
    "and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)


def search_r1_question(question: str) -> str:
    """Search-R1's question: stripped, with "?" added when it does not end in one."""
    question = nonempty_question(question)
    return question if question.endswith("?") else question + "?"


def nonempty_question(question: str) -> str:
    """`question` stripped; an empty one is an error."""
    question = question.strip()
    if not question:
        raise ValueError("question is empty")
    return question
