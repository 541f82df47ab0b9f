"""Client for a retrieval server speaking Search-R1's `/retrieve` API (ours or Search-R1's own).

Documents may come with or without `id` (Search-R1's Pyserini server on a `--storeRaw` index returns
`{title, text, contents}`; its online search servers `{contents}`): a missing id becomes
`base.content_id(contents)`. `contents` is taken as given; without it, built from `title` and `text`.
"""
from __future__ import annotations

import time

import httpx

from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.corpus import CorpusError, doc_from_dict


class RetrieverUnavailable(RuntimeError):
    """The server did not answer (connection errors, timeouts or 5xx) through every retry."""


def parse_response(body: object, num_queries: int, where: str) -> list[list[Doc]]:
    """Search-R1's `{"result": [[{"document": {...}, "score": s} | {...}, ...], ...]}` -> docs."""
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, list) or len(result) != num_queries:
        raise ValueError(f"{where}: expected 'result' with {num_queries} lists, got {str(body)[:200]!r}")
    out = []
    for i, items in enumerate(result):
        if not isinstance(items, list):
            raise ValueError(f"{where}: result[{i}] must be a list of documents, got {str(items)[:200]!r}")
        docs = []
        for j, item in enumerate(items):
            at = f"{where}: result[{i}][{j}]"
            if not isinstance(item, dict):
                raise CorpusError(f"{at}: expected a document object, got {str(item)[:200]!r}")
            doc, score = (item["document"], item.get("score", 0.0)) if "document" in item else (item, 0.0)
            if isinstance(score, bool) or not isinstance(score, (int, float)):
                raise CorpusError(f"{at}: field 'score' must be a number, got {score!r}")
            docs.append(doc_from_dict(doc, at, float(score), require_id=False))
        out.append(docs)
    return out


class RemoteRetriever:
    """`search(queries, k)` over HTTP, retrying connection errors, timeouts and 5xx with backoff.

    Waits at most about `backoff * (2**retries - 1)` seconds (capped per wait at `max_backoff`)
    before raising `RetrieverUnavailable`; a 4xx is not retried and raises ValueError.
    """

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 6, backoff: float = 0.5,
                 max_backoff: float = 8.0):
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self._http = httpx.Client(timeout=timeout)

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        if not queries:
            return []
        payload = {"queries": list(queries), "topk": int(k), "return_scores": True}
        start, error = time.monotonic(), ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))
            try:
                response = self._http.post(self.url, json=payload)
            except httpx.TransportError as e:
                error = f"{type(e).__name__}: {e}"
                continue
            if response.status_code >= 500:
                error = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                raise ValueError(f"{self.url} rejected the request (HTTP {response.status_code}): {response.text[:500]}")
            return parse_response(response.json(), len(queries), self.url)
        raise RetrieverUnavailable(f"retrieval server {self.url} is down: {self.retries + 1} attempts over "
                                   f"{time.monotonic() - start:.1f}s failed; last error: {error}. "
                                   "Start it with `python launch/serve_retriever.py ...` or check --search-url.")

    def close(self) -> None:
        self._http.close()
