"""The retriever interface: `Doc`, the `Retriever` protocol, and the observation strings of Search-R1
(passages) and Graph-R1 (its `/search` results)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Doc:
    """One retrieved passage. `score` is the retriever's relevance (higher is better; 0.0 when unscored).
    `raw_contents`: the `contents` string exactly as the corpus or server gave it (None: built from title/text).
    `sources`: for a document derived from passages (a hypergraph's hyperedge), the ids of those passages."""

    id: str
    title: str
    text: str
    score: float = 0.0
    raw_contents: str | None = None
    sources: tuple[str, ...] = ()

    @property
    def passage_ids(self) -> tuple[str, ...]:
        """The corpus passages this document stands for: its sources, else itself."""
        return self.sources or (self.id,)

    @property
    def contents(self) -> str:
        """The Search-R1 / FlashRAG `contents` string: as given, else quoted title, newline, text."""
        return make_contents(self.title, self.text) if self.raw_contents is None else self.raw_contents

    @classmethod
    def from_contents(cls, doc_id: str, contents: str, score: float = 0.0) -> Doc:
        """A passage whose `contents` is kept byte for byte (title and text split off for display)."""
        return cls(doc_id, *split_contents(contents), score, contents)

    def with_score(self, score: float) -> Doc:
        return dataclasses.replace(self, score=float(score))


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


def content_id(contents: str) -> str:
    """The id given to a document that comes without one (Search-R1's Pyserini server on a `--storeRaw`
    index, its online search servers): `sha1:` and the first 16 hex digits of the contents' SHA-1."""
    return "sha1:" + hashlib.sha1(contents.encode("utf-8")).hexdigest()[:16]


def format_passages(docs: list[Doc]) -> str:
    """Search-R1's observation text (`_passages2string`): one `Doc i(Title: t) text` line per doc, i from 1,
    where t is the first line of `contents` as it is (wiki-18 titles keep their quotes) and text the rest."""
    lines = []
    for i, d in enumerate(docs, start=1):
        title, _, text = d.contents.partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(lines)


COHERENCE_DECIMALS = 3  # graphr1/operate.py _build_query_context: round(score, 3)


def graph_r1_results(docs: list[Doc]) -> list[dict]:
    """Graph-R1's result items: `{"<knowledge>": contents, "<coherence>": score rounded to 3 decimals}`."""
    return [{"<knowledge>": d.contents, "<coherence>": round(d.score, COHERENCE_DECIMALS)} for d in docs]


def graph_r1_result_string(docs: list[Doc]) -> str:
    """One query's answer in Graph-R1's `POST /search` reply: the JSON string of `{"results": [...]}`
    (script_api.py `json.dumps`: default separators, ASCII-escaped); Graph-R1's agent shows it to the model
    verbatim inside `<knowledge>` (agent/tool/tool_env.py, the tool_custom_response_template)."""
    return json.dumps({"results": graph_r1_results(docs)})
