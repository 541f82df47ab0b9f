"""BM25 against independent references: a numpy Lucene BM25 and rank-bm25's Okapi BM25."""
import json
import math
import os
import re
from collections import Counter

import bm25s.stopwords
import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from jaxsearch.retrieval import make_retriever
from jaxsearch.retrieval.bm25 import BM25Retriever
from jaxsearch.retrieval.corpus import Corpus
from jaxsearch.retrieval.metrics import recall_at_k

DATA = os.path.join(os.path.dirname(__file__), "data", "corpus")
CORPUS = os.path.join(DATA, "corpus.jsonl")
QUERIES = [json.loads(line) for line in open(os.path.join(DATA, "queries.jsonl"))]
STOP = set(bm25s.stopwords.STOPWORDS_EN)


def ref_tokens(text):
    return [w for w in re.findall(r"\b\w\w+\b", text.lower()) if w not in STOP]


def ref_passages():
    return [json.loads(line)["contents"] for line in open(CORPUS)]


def lucene_bm25(passages, query, k1, b):
    """Scores of every passage: sum over query terms of idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))."""
    docs = [Counter(ref_tokens(p)) for p in passages]
    lengths = np.array([sum(d.values()) for d in docs], dtype=np.float64)
    n, avgdl = len(docs), lengths.mean()
    scores = np.zeros(n)
    for term in ref_tokens(query):
        tf = np.array([d[term] for d in docs], dtype=np.float64)
        df = np.count_nonzero(tf)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        scores += idf * tf / (tf + k1 * (1 - b + b * lengths / avgdl))
    return scores


def check_against(reference_scores, docs, k):
    """Returned docs are a top-k of the reference: the same scores, and the same row at every rank whose
    reference score is not tied (within 1e-4) with a neighbour. Returns how many ranks were untied."""
    order = np.argsort(-reference_scores, kind="stable")
    top = order[:k][reference_scores[order[:k]] > 0]
    got_rows = [int(d.id) for d in docs]  # the shipped corpus uses row numbers as ids
    np.testing.assert_allclose([d.score for d in docs], reference_scores[top], rtol=1e-5)
    np.testing.assert_allclose(reference_scores[got_rows], reference_scores[top], rtol=1e-5)
    ranked = np.concatenate([[np.inf], reference_scores[order[:k + 1]], [-np.inf]])
    untied = [i for i in range(len(top)) if ranked[i] - ranked[i + 1] > 1e-4 and ranked[i + 1] - ranked[i + 2] > 1e-4]
    assert [got_rows[i] for i in untied] == [int(top[i]) for i in untied]
    return len(untied)


@pytest.fixture(scope="module")
def corpus():
    with Corpus(CORPUS, progress=False) as c:
        yield c


@pytest.fixture(scope="module")
def retriever(corpus):
    return BM25Retriever.build(corpus, progress=False)


def test_matches_numpy_lucene_bm25(retriever):
    passages = ref_passages()
    queries = [q["question"] for q in QUERIES[:40]] + ["kilometres river sea river", "herons barley"]
    results = retriever.search(queries, 10)
    untied = sum(check_against(lucene_bm25(passages, query, k1=0.9, b=0.4), docs, 10)
                 for query, docs in zip(queries, results))
    assert untied >= 45  # enough ranks compared row by row


def test_matches_rank_bm25_okapi(corpus):
    k1, b = 1.5, 0.75
    okapi = BM25Retriever.build(corpus, k1=k1, b=b, method="robertson", progress=False)
    reference = BM25Okapi([ref_tokens(p) for p in ref_passages()], k1=k1, b=b)
    assert min(reference.idf.values()) >= 0  # no term in over half the passages: no idf flooring
    queries = [q["question"] for q in QUERIES[40:80]]
    # rank-bm25 scales every term by (k1 + 1); the ranking is the same.
    untied = sum(check_against(reference.get_scores(ref_tokens(query)) / (k1 + 1), docs, 5)
                 for query, docs in zip(queries, okapi.search(queries, 5)))
    assert untied >= 40


def test_save_load_and_factory(tmp_path, retriever):
    retriever.save(tmp_path / "idx")
    loaded = make_retriever("bm25", corpus=CORPUS, index=str(tmp_path / "idx"), progress=False)
    passages = ref_passages()
    query = QUERIES[0]["question"]
    check_against(lucene_bm25(passages, query, 0.9, 0.4), loaded.search([query], 5)[0], 5)


def test_no_match_and_short_lists(retriever):
    empty, few, none = retriever.search(["zzyzx qwertyuiop", "kilometres", ""], 500)
    assert empty == [] and none == []
    assert len(few) == 40  # only the 40 river passages mention kilometres
    assert retriever.search([], 3) == []


def test_index_of_another_corpus_is_rejected(tmp_path, retriever):
    retriever.save(tmp_path / "idx")
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "0", "contents": '"A"\nb'}) + "\n")
    with pytest.raises(ValueError, match="rebuild the index"):
        make_retriever("bm25", corpus=str(other), index=str(tmp_path / "idx"), progress=False)


def test_recall_on_shipped_queries(retriever):
    results = retriever.search([q["question"] for q in QUERIES], 5)
    recall = np.mean([recall_at_k(d, q["golden_answers"], 5) for d, q in zip(results, QUERIES)])
    assert recall >= 0.9
