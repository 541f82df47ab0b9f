"""Client for a retrieval server speaking Search-R1's `/retrieve` API (ours or Search-R1's own).

Documents may come with or without `id` (Search-R1's Pyserini server on a `--storeRaw` index returns
`{title, text, contents}`; its online search servers `{contents}`): a missing id becomes
`base.content_id(contents)`. `contents` is taken as given; without it, built from `title` and `text`.
"""
from __future__ import annotations

import json
import random
import time

import httpx

from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.corpus import CorpusError, doc_from_dict


class RetrieverUnavailable(RuntimeError):
    """The server did not answer (connection errors, timeouts or 5xx) within the search call's deadline."""


class _AttemptTimeout(Exception):
    """An attempt's response kept coming past the attempt's time."""


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


# Config keys that bound a search call, named in the error (configs/base.py; `RetrieverConfig`)
DEADLINE_KEYS = "config.retriever.deadline_s / config.retriever.attempt_timeout_s"


class RemoteRetriever:
    """`search(queries, k)` over HTTP, retrying connection errors, timeouts and 5xx until a deadline.

    A search call gives up after `deadline_s` seconds in all, raising `RetrieverUnavailable` (naming the URL,
    the attempts, the time spent and the config keys to change); each attempt after `attempt_timeout_s` (or
    what is left of the deadline), the whole response included. Between attempts it waits with exponential
    back-off and jitter: attempt n waits a random time in [c/2, c], c = min(max_backoff, backoff * 2**(n-1)),
    so that clients that failed together do not retry together. `retries`: at most this many retries (None:
    as many as the deadline allows). A 4xx is not retried and raises ValueError.

    In training the error ends the run (rl/trainer.py): nothing hangs, and the checkpoints already written
    are kept, so the same command resumes from the last one once the server answers again.
    """

    def __init__(self, url: str, deadline_s: float = 30.0, attempt_timeout_s: float = 15.0,
                 backoff: float = 0.25, max_backoff: float = 4.0, retries: int | None = None):
        for name, value in (("deadline_s", deadline_s), ("attempt_timeout_s", attempt_timeout_s)):
            if not value > 0:
                raise ValueError(f"config.retriever.{name} must be > 0 seconds, got {value!r}")
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.deadline_s, self.attempt_timeout_s = float(deadline_s), float(attempt_timeout_s)
        self.backoff, self.max_backoff, self.retries = backoff, max_backoff, retries
        self._random = random.Random()
        self._http = httpx.Client()

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        if not queries:
            return []
        payload = {"queries": list(queries), "topk": int(k), "return_scores": True}
        start = time.monotonic()
        end, attempts, error = start + self.deadline_s, 0, ""
        while True:
            attempts += 1
            try:
                status, body = self._attempt(payload, min(self.attempt_timeout_s, end - time.monotonic()))
            except (httpx.TransportError, _AttemptTimeout) as e:
                error = f"{type(e).__name__}: {e}"
            else:
                if status < 400:
                    return parse_response(json.loads(body), len(queries), self.url)
                text = body[:500].decode("utf-8", "replace")
                if status < 500:
                    raise ValueError(f"{self.url} rejected the request (HTTP {status}): {text}")
                error = f"HTTP {status}: {text[:200]}"
            cap = min(self.max_backoff, self.backoff * 2 ** (attempts - 1))
            wait = self._random.uniform(cap / 2, cap)
            if (self.retries is not None and attempts > self.retries) or time.monotonic() + wait >= end - 0.01:
                break
            time.sleep(wait)
        raise RetrieverUnavailable(
            f"retrieval server {self.url} is down: {attempts} attempts over {time.monotonic() - start:.1f}s failed "
            f"(deadline {self.deadline_s:g}s per search, {self.attempt_timeout_s:g}s per attempt); last error: "
            f"{error}. Start it (`python launch/serve_retriever.py ...`) or fix config.retriever.url; to wait "
            f"longer raise {DEADLINE_KEYS} (e.g. --config.retriever.deadline_s=120)")

    def _attempt(self, payload: dict, timeout: float) -> tuple[int, bytes]:
        """(status, body) of one POST, within `timeout` seconds in all (httpx's own timeout is per operation)."""
        end = time.monotonic() + timeout
        with self._http.stream("POST", self.url, json=payload, timeout=timeout) as response:
            chunks = []
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > end:
                    raise _AttemptTimeout(f"the response took over {timeout:.1f}s")
            return response.status_code, b"".join(chunks)

    def close(self) -> None:
        self._http.close()
