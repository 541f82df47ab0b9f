"""Retrieval for search agents: corpora, BM25 / dense / remote retrievers, server, metrics.

    from jaxsearch.retrieval import Doc, make_retriever
    retriever = make_retriever("bm25", corpus="wiki-18.jsonl", index="indexes/bm25")
    docs = retriever.search(["who wrote hamlet"], k=3)   # list[list[Doc]]
"""
from jaxsearch.retrieval.base import Doc, Retriever, format_passages, make_contents, split_contents
from jaxsearch.retrieval.factory import make_retriever

__all__ = ["Doc", "Retriever", "format_passages", "make_contents", "make_retriever", "split_contents"]
