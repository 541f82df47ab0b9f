"""BM25 over a `Corpus` with `bm25s` (the embedded default retriever: no model, CPU only).

Scoring is Lucene BM25 (Pyserini's k1=0.9, b=0.4 by default) over lowercased `\\w\\w+` tokens of
`contents` (title + text) minus English stopwords, no stemming. Memory: see `MEMORY`.
"""
from __future__ import annotations

import json
import os
import re
from array import array

import bm25s
import bm25s.stopwords
import numpy as np
from tqdm.auto import tqdm

from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.corpus import Corpus

TOKEN_PATTERN = re.compile(r"(?u)\b\w\w+\b")
META_FILE = "meta.json"
MEMORY = """bm25   build: peak ~35 bytes per token after stopwords (bench/retrieval.py, 100k passages);
         wiki-18 (21M passages, ~1.3B tokens) wants ~45 GB. Search: the saved index (~6 bytes/token
         on disk, ~8 GB for wiki-18) is memory-mapped; RAM holds the vocabulary plus one float32
         score per passage for the query being scored (84 MB for wiki-18)."""


def tokenize(text: str, stopwords: frozenset[str]) -> list[str]:
    """Lowercase, split on `\\w\\w+`, drop stopwords (the same for passages and queries)."""
    return [w for w in TOKEN_PATTERN.findall(text.lower()) if w not in stopwords]


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Rows of the `k` largest positive scores, best first; ties broken by lower row."""
    k = min(k, int(np.count_nonzero(scores > 0)))
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    part = np.argpartition(-scores, k - 1)[:k]
    kth = scores[part].min()
    cand = np.flatnonzero(scores >= kth)  # every row tied with the k-th, so ties resolve by row
    return cand[np.lexsort((cand, -scores[cand]))][:k]


class BM25Retriever:
    """`search(queries, k)` over a corpus with a bm25s index; only passages with score > 0 return."""

    def __init__(self, corpus: Corpus, model: bm25s.BM25, stopwords: list[str]):
        if model.scores["num_docs"] != len(corpus):
            raise ValueError(f"BM25 index has {model.scores['num_docs']} passages but corpus "
                             f"{corpus.path} has {len(corpus)}: rebuild the index for this corpus")
        self.corpus = corpus
        self.model = model
        self.stopwords = list(stopwords)
        self._stop = frozenset(stopwords)

    @classmethod
    def build(cls, corpus: Corpus, k1: float = 0.9, b: float = 0.4, method: str = "lucene",
              stopwords: list[str] | None = None, progress: bool = True) -> BM25Retriever:
        """Tokenize the corpus in one streaming pass and index it."""
        stopwords = list(bm25s.stopwords.STOPWORDS_EN) if stopwords is None else list(stopwords)
        stop = frozenset(stopwords)
        vocab: dict[str, int] = {"": 0}  # bm25s's empty token, scored for no passage
        ids: list[array] = []
        with tqdm(total=len(corpus), desc="bm25 tokenize", unit="doc", disable=not progress) as bar:
            for batch in corpus.iter_batches(4096):
                for doc in batch:
                    ids.append(array("i", (vocab.setdefault(w, len(vocab)) for w in tokenize(doc.contents, stop))))
                bar.update(len(batch))
        model = bm25s.BM25(k1=k1, b=b, method=method)
        model.index((ids, vocab), show_progress=progress)
        return cls(corpus, model, stopwords)

    def save(self, path: str | os.PathLike) -> None:
        """Write the index files and `meta.json` into directory `path`."""
        os.makedirs(path, exist_ok=True)
        self.model.save(path, show_progress=False)
        meta = {"kind": "bm25", "k1": self.model.k1, "b": self.model.b, "method": self.model.method,
                "num_docs": len(self.corpus), "corpus": os.path.abspath(self.corpus.path),
                "stopwords": self.stopwords}
        with open(os.path.join(path, META_FILE), "w") as f:
            json.dump(meta, f)

    @classmethod
    def load(cls, path: str | os.PathLike, corpus: Corpus, mmap: bool = True) -> BM25Retriever:
        """Open an index saved by `save` (memory-mapped by default)."""
        meta_path = os.path.join(path, META_FILE)
        if not os.path.isfile(meta_path):
            raise FileNotFoundError(f"{path}: not a BM25 index directory (no {META_FILE}); build one "
                                    "with `python launch/build_index.py --retriever bm25`")
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("kind") != "bm25":
            raise ValueError(f"{meta_path}: index kind is {meta.get('kind')!r}, not 'bm25'")
        model = bm25s.BM25.load(path, mmap=mmap)
        return cls(corpus, model, meta["stopwords"])

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for one query: [num_docs] float32."""
        vocab = self.model.vocab_dict
        ids = [vocab[w] for w in tokenize(query, self._stop) if w in vocab]
        if not ids:
            return np.zeros(len(self.corpus), dtype=np.float32)
        return self.model.get_scores_from_ids(ids)

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        out = []
        for q in queries:
            s = self.scores(q)
            rows = top_k(s, k)
            out.append(self.corpus.docs(rows, s[rows]))
        return out
