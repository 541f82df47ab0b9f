"""Retrieval split across the hosts of a multi-process run.

Every process of a multi-host run holds the whole rollout batch and needs every row's observation (see
`jaxsearch.multihost`). Plainly, each one searches all the queries: with a local index that is the same work
done on every host; against a shared server it is `num_processes` times the requests. `HostSplitRetriever`
has process p search queries p, p + n, p + 2n, ... and all-gathers the results, so every process ends with
the same full list for 1/n of the search work.

    retriever = HostSplitRetriever(make_retriever("bm25", corpus=...))   # config.retriever.split_across_hosts

With one process it is the wrapped retriever. Every process must call `search` with the same queries, in
the same order (the exchange is a collective).
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxsearch.retrieval.base import Doc, Retriever


class HostSplitRetriever:
    def __init__(self, inner: Retriever):
        self.inner = inner

    def __getattr__(self, name):  # the wrapped retriever's other attributes (e.g. its corpus)
        return getattr(self.inner, name)

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        n, p = jax.process_count(), jax.process_index()
        if n == 1:
            return self.inner.search(queries, k)
        mine = self.inner.search(list(queries[p::n]), k) if queries[p::n] else []
        payload = json.dumps([[dataclasses.astuple(d) for d in docs] for docs in mine]).encode()
        # the collectives need one shape on every process: exchange lengths, then zero-padded bytes
        sizes = multihost_utils.process_allgather(np.array([len(payload)], np.int64)).reshape(n)
        buf = np.zeros(int(sizes.max()), np.uint8)
        buf[: len(payload)] = np.frombuffer(payload, np.uint8)
        gathered = multihost_utils.process_allgather(buf).reshape(n, -1)
        out: list[list[Doc]] = [[] for _ in queries]
        for rank in range(n):
            docs_per_query = json.loads(gathered[rank, : sizes[rank]].tobytes().decode())
            for j, docs in enumerate(docs_per_query):
                out[rank + j * n] = [Doc(*fields) for fields in docs]
        return out
