"""BM25 over a `Corpus` with `bm25s` (the embedded default retriever: no model, CPU only).

Scoring is Lucene BM25 (Pyserini's k1=0.9, b=0.4 by default) over the terms of `contents` (title + text).
Terms come from an `Analyzer`, recorded in the index's meta.json. New indexes use Pyserini's default, Lucene's
English analyzer: StandardTokenizer words (Unicode word-break rules: "U.S.A", "don't", "1,000", "a:b" stay
whole), possessive 's dropped, lowercase, Lucene's 33 English stopwords, Porter stemming (PyStemmer's
"porter"; words of 1-2 letters unstemmed, as in Lucene's PorterStemmer). `Analyzer(stemmer="none")` turns
stemming off (Pyserini's `-stemmer none`). An index saved before analyzers were recorded keeps the analysis
it was built with (lowercased `\\w\\w+` tokens minus its stored stopwords, no stemming). Memory: see `MEMORY`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from array import array

import bm25s
import bm25s.stopwords
import numpy as np
import Stemmer
from tqdm.auto import tqdm

from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.corpus import Corpus

TOKEN_PATTERN = re.compile(r"(?u)\b\w\w+\b")  # the "word2" tokenizer (indexes saved before analyzers)
# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET: Pyserini's default stopwords
LUCENE_STOPWORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not",
    "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was",
    "will", "with",
)  # fmt: skip
# Lucene's StandardTokenizer (UAX #29 word breaks) for the cases English text has: letters, digits and "_"
# make words; . ' ’ : join two letters ("u.s.a", "don't", "a:b"); . , ; ' ’ join two digits ("1,000",
# "3.14"); each Hiragana character or CJK ideograph is a word of its own.
_SINGLE = "\u3040-\u309f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_WORD = rf"(?:[^\W{_SINGLE}]|[\u0300-\u036f])+"  # combining accents stay inside their word
_JOIN = r"(?:(?<=[^\W\d_])[.'\u2019:](?=[^\W\d_])|(?<=\d)[.,;'\u2019](?=\d))"
STANDARD_TOKEN = re.compile(rf"[{_SINGLE}]|{_WORD}(?:{_JOIN}{_WORD})*")
POSSESSIVE = ("'s", "\u2019s", "\uff07s")  # EnglishPossessiveFilter
META_FILE = "meta.json"
_SPACE = re.compile(r"\s")
_UP_TO_LAST_SPACE = re.compile(r".*\s", re.DOTALL)
# Index entries (term, passage) one `np.add.at` call adds at most, bar a term that has more (added from the
# index as it is): bounds the copies a query's scoring makes (16 bytes an entry) on a large index
POSTINGS_PER_CALL = 1 << 18
MEMORY = """bm25   build: peak ~35 bytes per token after stopwords (bench/retrieval.py, 100k passages);
         wiki-18 (21M passages, ~1.3B tokens) wants ~45 GB. Search: the saved index (~6 bytes/token
         on disk, ~8 GB for wiki-18) is memory-mapped; RAM holds the vocabulary plus one float32
         score per passage for the query being scored (84 MB for wiki-18); the server scores a
         query longer than --max-batch-chars in pieces: one such array per request with one
         in progress."""


def tokenize(text: str, stopwords: frozenset[str]) -> list[str]:
    """The "word2" tokenizer: lowercase, split on `\\w\\w+`, drop stopwords."""
    return [w for w in TOKEN_PATTERN.findall(text.lower()) if w not in stopwords]


@dataclasses.dataclass(frozen=True)
class Analyzer:
    """Text -> terms, the same for passages and queries; an index records it (`dataclasses.asdict`).

    tokenizer: "standard" (Lucene's StandardTokenizer + EnglishPossessiveFilter) or "word2" (`\\w\\w+`);
    stopwords: dropped after lowercasing; stemmer: "porter" or "none". `Analyzer()` is Pyserini's default.
    """

    tokenizer: str = "standard"
    stopwords: tuple[str, ...] = LUCENE_STOPWORDS
    stemmer: str = "porter"

    def __post_init__(self):
        if self.tokenizer not in ("standard", "word2"):
            raise ValueError(f"analyzer tokenizer must be 'standard' or 'word2', got {self.tokenizer!r}")
        if self.stemmer not in ("porter", "none"):
            raise ValueError(f"analyzer stemmer must be 'porter' or 'none', got {self.stemmer!r}")
        object.__setattr__(self, "stopwords", tuple(self.stopwords))

    def terms(self, text: str) -> list[str]:
        if self.tokenizer == "word2":
            words = tokenize(text, self._stop)
        else:
            words = [w[:-2] if w.lower().endswith(POSSESSIVE) else w for w in STANDARD_TOKEN.findall(text)]
            words = [w for w in (w.lower() for w in words) if w.strip("_") and w not in self._stop]
        return words if self.stemmer == "none" else [self._stem(w) for w in words]

    @functools.cached_property
    def _stop(self) -> frozenset[str]:
        return frozenset(self.stopwords)

    @functools.cached_property
    def _stem(self):
        stemmer = Stemmer.Stemmer("porter")
        return functools.lru_cache(maxsize=1 << 20)(lambda w: w if len(w) <= 2 else stemmer.stemWord(w))

    @classmethod
    def from_meta(cls, meta: dict) -> Analyzer:
        """The analyzer an index was built with; one saved before the record: `\\w\\w+`, its stopwords, no stem."""
        if "analyzer" not in meta:
            return cls(tokenizer="word2", stopwords=tuple(meta["stopwords"]), stemmer="none")
        return cls(**meta["analyzer"])


def split_at_spaces(text: str, max_chars: int) -> list[str]:
    """`text` in pieces of at most `max_chars` characters, each cut just after a whitespace character.
    No term spans whitespace and the analysis of a word does not look past it, so the pieces' terms, in
    order, are the text's. A stretch of more than `max_chars` characters without whitespace stays whole."""
    pieces, start = [], 0
    while len(text) - start > max_chars:
        cut = _UP_TO_LAST_SPACE.match(text, start, start + max_chars) or _SPACE.search(text, start + max_chars)
        if cut is None:
            break
        pieces.append(text[start:cut.end()])
        start = cut.end()
    pieces.append(text[start:])
    return pieces


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

    def __init__(self, corpus: Corpus, model: bm25s.BM25, analyzer: Analyzer):
        if model.scores["num_docs"] != len(corpus):
            raise ValueError(f"BM25 index has {model.scores['num_docs']} passages but corpus "
                             f"{corpus.path} has {len(corpus)}: rebuild the index for this corpus")
        self.corpus = corpus
        self.model = model
        self.analyzer = analyzer

    @classmethod
    def build(cls, corpus: Corpus, k1: float = 0.9, b: float = 0.4, method: str = "lucene",
              analyzer: Analyzer | None = None, progress: bool = True) -> BM25Retriever:
        """Analyze the corpus in one streaming pass and index it (analyzer None: Pyserini's, `Analyzer()`)."""
        analyzer = Analyzer() if analyzer is None else analyzer
        vocab: dict[str, int] = {"": 0}  # bm25s's empty token, scored for no passage
        ids: list[array] = []
        with tqdm(total=len(corpus), desc="bm25 tokenize", unit="doc", disable=not progress) as bar:
            for batch in corpus.iter_batches(4096):
                for doc in batch:
                    terms = analyzer.terms(doc.contents)
                    ids.append(array("i", (vocab.setdefault(w, len(vocab)) for w in terms)))
                bar.update(len(batch))
        model = bm25s.BM25(k1=k1, b=b, method=method)
        model.index((ids, vocab), show_progress=progress)
        return cls(corpus, model, analyzer)

    def save(self, path: str | os.PathLike) -> None:
        """Write the index files and `meta.json` into directory `path`."""
        os.makedirs(path, exist_ok=True)
        self.model.save(path, show_progress=False)
        meta = {"kind": "bm25", "k1": self.model.k1, "b": self.model.b, "method": self.model.method,
                "num_docs": len(self.corpus), "corpus": os.path.abspath(self.corpus.path),
                "stopwords": list(self.analyzer.stopwords), "analyzer": dataclasses.asdict(self.analyzer)}
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
        try:
            analyzer = Analyzer.from_meta(meta)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{meta_path}: field 'analyzer' is not a valid analyzer ({e})") from None
        model = bm25s.BM25.load(path, mmap=mmap)
        return cls(corpus, model, analyzer)

    def split_query(self, query: str, max_chars: int) -> list[str]:
        """`query` in pieces whose `scores` add up to its own, bit for bit (`split_at_spaces`); whole for
        bm25l / bm25+, whose per-query constant is summed over all the terms at once."""
        if self.model.nonoccurrence_array is not None:
            return [query]
        return split_at_spaces(query, max_chars)

    def scores(self, query: str, into: np.ndarray | None = None) -> np.ndarray:
        """BM25 score of every passage for `query`: [num_docs] float32, added into `into` in place when given.

        bm25s's `get_scores_from_ids` in fewer numpy calls, the same float32 additions in the same order (so
        the same bits): each term's postings added in query order, up to `POSTINGS_PER_CALL` at a time."""
        scores = np.zeros(len(self.corpus), dtype=self.model.dtype) if into is None else into
        vocab = self.model.vocab_dict
        ids = np.array([vocab[w] for w in self.analyzer.terms(query) if w in vocab], dtype=np.int64)
        if not len(ids):
            return scores
        indptr, indices, data = (self.model.scores[key] for key in ("indptr", "indices", "data"))
        starts = indptr[ids].astype(np.int64)
        lengths = indptr[ids + 1] - starts
        ends = np.cumsum(lengths)  # in the terms' postings laid end to end
        i = 0
        while i < len(ids):  # terms i..j-1 at a time
            j = max(i + 1, int(np.searchsorted(ends, ends[i] - lengths[i] + POSTINGS_PER_CALL, "right")))
            if j == i + 1:  # one term: its postings as they are in the index (no copy)
                at = slice(starts[i], starts[i] + lengths[i])
            else:  # their postings' positions, term after term
                at = np.repeat(starts[i:j] - (ends[i:j] - lengths[i:j]), lengths[i:j]) + np.arange(
                    ends[i] - lengths[i], ends[j - 1])
            np.add.at(scores, indices[at], data[at])
            i = j
        if self.model.nonoccurrence_array is not None:  # bm25l / bm25+: as bm25s adds it
            scores += self.model.nonoccurrence_array[ids].sum()
        return scores

    def top_docs(self, scores: np.ndarray, k: int) -> list[Doc]:
        """The passages of the `k` largest positive `scores`, best first (ties by lower row)."""
        rows = top_k(scores, k)
        return self.corpus.docs(rows, scores[rows])

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        return [self.top_docs(self.scores(q), k) for q in queries]
