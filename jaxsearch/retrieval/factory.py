"""`make_retriever(kind, ...)`: pick a retriever by name from a config ("bm25", "dense", "remote", "hypergraph")."""
from __future__ import annotations

import os

from jaxsearch.retrieval.base import Retriever

KINDS = ("bm25", "dense", "remote", "hypergraph")


def make_retriever(kind: str, corpus: str | None = None, index: str | None = None, url: str | None = None,
                   encoder: str | None = None, progress: bool = True, deadline_s: float | None = None,
                   attempt_timeout_s: float | None = None, **kwargs) -> Retriever:
    """Build a retriever.

    bm25:   `corpus` (JSONL path) and `index` (dir from build_index.py); without `index`, index in RAM.
    dense:  `corpus`, `index` (dir, or a bare FAISS file like Search-R1's e5_Flat.index with `encoder`);
            without `index`, encode the corpus into an in-RAM Flat index (small corpora only).
            kwargs: ef_search, nprobe, use_gpu.
    remote: `url` of a Search-R1-API server; `deadline_s` per search call and `attempt_timeout_s` per attempt
            (None: the client's defaults; the other kinds ignore them); kwargs: retries, backoff, max_backoff.
    hypergraph: `index` (dir from build_hypergraph.py); `encoder` overrides the one it was built with;
            kwargs: top_entities, top_hyperedges, use_gpu.
    """
    if kind == "remote":
        from jaxsearch.retrieval.client import RemoteRetriever

        if not url:
            raise ValueError("retriever 'remote' needs url= (e.g. http://127.0.0.1:8000/retrieve)")
        for name, value in (("deadline_s", deadline_s), ("attempt_timeout_s", attempt_timeout_s)):
            if value is not None:
                kwargs[name] = value
        return RemoteRetriever(url, **kwargs)
    if kind == "hypergraph":
        from jaxsearch.retrieval.build import recover
        from jaxsearch.retrieval.hypergraph import HypergraphRetriever

        if not index:
            raise ValueError("retriever 'hypergraph' needs index= (a directory from launch/build_hypergraph.py)")
        recover(os.fspath(index))
        return HypergraphRetriever.load(index, encoder, progress=progress, **kwargs)
    if kind not in KINDS:
        raise ValueError(f"unknown retriever kind {kind!r}; choose from {KINDS}")
    if not corpus:
        raise ValueError(f"retriever {kind!r} needs corpus= (a JSONL file)")
    from jaxsearch.retrieval.build import recover
    from jaxsearch.retrieval.corpus import Corpus

    if index:
        recover(os.fspath(index))
    docs = Corpus(corpus, progress=progress)
    if kind == "bm25":
        from jaxsearch.retrieval.bm25 import BM25Retriever

        return BM25Retriever.load(index, docs) if index else BM25Retriever.build(docs, progress=progress, **kwargs)
    from jaxsearch.retrieval.dense import DenseRetriever

    if index:
        return DenseRetriever.load(index, docs, encoder, **kwargs)
    return DenseRetriever.build_flat(docs, encoder or "e5", progress=progress, **kwargs)
