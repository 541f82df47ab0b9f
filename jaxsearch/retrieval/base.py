"""The retriever interface: `Doc`, the `Retriever` protocol, and Search-R1's passage strings."""
from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Doc:
    """One retrieved passage. `score` is the retriever's relevance (higher is better; 0.0 when unscored)."""

    id: str
    title: str
    text: str
    score: float = 0.0

    @property
    def contents(self) -> str:
        """The Search-R1 / FlashRAG `contents` string: quoted title, newline, text."""
        return make_contents(self.title, self.text)


class Retriever(Protocol):
    """Anything with a batched `search`: one host call per rollout turn for the whole batch."""

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """Top-`k` docs per query, best first; a list may be shorter than k (e.g. BM25 with no match)."""
        ...


def make_contents(title: str, text: str) -> str:
    """Build the corpus `contents` string: `"Title"\\ntext` (the wiki-18 convention)."""
    return f'"{title}"\n{text}'


def split_contents(contents: str) -> tuple[str, str]:
    """Inverse of `make_contents`: (title without its surrounding quotes, text)."""
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text


def format_passages(docs: list[Doc]) -> str:
    """Search-R1's observation text: one `Doc i(Title: "t") text` line per doc, i from 1.

    Search-R1 takes the title as the first line of `contents`, quotes included; so do we.
    """
    return "".join(f'Doc {i}(Title: "{d.title}") {d.text}\n' for i, d in enumerate(docs, start=1))
