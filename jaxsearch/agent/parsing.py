"""Reading the policy's tags out of decoded text: one parser for the protocols, the rewards and evaluation.

    policy_view(response)          the response with every complete observation emptied
    blocks(text, "answer")         contents of the complete <answer>...</answer> blocks, in order
    extract_answer(response)       the last <answer> the policy wrote, stripped, or None
    extract_evidence(response)     the last <evidence> (R-Search), stripped, or None
    information_source(response)   SOAR's declared source, "internal" | "external" | None

Blocks are matched as Search-R1 matches them (`verl/utils/reward_score/qa_em.py`, `extract_solution`): the
regex `<tag>(.*?)</tag>` over the whole text, non-greedy, left to right, so `<answer>a<answer>b</answer>`
is one block holding "a<answer>b", and an unclosed trailing `<answer>` is no block. Tags inside a complete
observation (`<information>` for Search-R1's tags, `<knowledge>` for Graph-R1's) are never the policy's:
parsers read `policy_view`, where every complete observation block is emptied.
"""

from __future__ import annotations

import re

OBSERVATION_TAGS = ("information", "knowledge")
_SOURCES = ("internal", "external")
# what may wrap a declared source: whitespace, straight / curly / back quotes
_SOURCE_WRAPPING = " \t\r\n\"'`\u2018\u2019\u201c\u201d"


def _block_pattern(tag: str) -> re.Pattern:
    return re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL)


def policy_view(response: str, tag: str = "information") -> str:
    """`response` with every complete `<tag>...</tag>` observation emptied to `<tag></tag>` (tags kept, so a
    format check still sees where observations were)."""
    return _block_pattern(tag).sub(f"<{tag}></{tag}>", response)


def blocks(text: str, tag: str) -> list[str]:
    """Contents (unstripped) of the complete `<tag>...</tag>` blocks of `text`, in order."""
    return _block_pattern(tag).findall(text)


def last_block(text: str, tag: str) -> str | None:
    """The stripped content of the last complete `<tag>...</tag>` block of `text`, or None."""
    found = blocks(text, tag)
    return found[-1].strip() if found else None


def observations(response: str, tag: str = "information") -> list[str]:
    """Contents of the complete observation blocks of a response, in order."""
    return blocks(response, tag)


def extract_answer(response: str, observation_tag: str = "information") -> str | None:
    """The last complete `<answer>...</answer>` the policy wrote, stripped; None when there is none."""
    return last_block(policy_view(response, observation_tag), "answer")


def extract_evidence(response: str) -> str | None:
    """The last complete `<evidence>...</evidence>` the policy wrote (R-Search), stripped; else None."""
    return last_block(policy_view(response), "evidence")


def information_source(response: str) -> str | None:
    """SOAR's declared source: the last `<information_source>` the policy wrote, read case-blind and without
    the whitespace and quotes (straight or curly) around it: "internal" | "external", else None."""
    source = last_block(policy_view(response), "information_source")
    if source is None:
        return None
    source = source.strip(_SOURCE_WRAPPING).lower()
    return source if source in _SOURCES else None
