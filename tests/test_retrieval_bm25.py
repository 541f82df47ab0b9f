"""BM25 against independent references: Pyserini's analyzer output and top-10 on the shipped corpus, a numpy
Lucene BM25 and rank-bm25's Okapi BM25; an index saved before analyzers were recorded."""
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
from jaxsearch.retrieval.bm25 import Analyzer, BM25Retriever
from jaxsearch.retrieval.corpus import Corpus
from jaxsearch.retrieval.metrics import recall_at_k

DATA = os.path.join(os.path.dirname(__file__), "data", "corpus")
CORPUS = os.path.join(DATA, "corpus.jsonl")
QUERIES = [json.loads(line) for line in open(os.path.join(DATA, "queries.jsonl"))]
STOP = set(bm25s.stopwords.STOPWORDS_EN)
# Pyserini 0.22.1 (Lucene 9, Java 17) on tests/data/corpus/corpus.jsonl, indexed by `python -m
# pyserini.index.lucene --collection JsonCollection --generator DefaultLuceneDocumentGenerator --storeRaw`:
# Analyzer(get_lucene_analyzer()).analyze of every passage and query, and LuceneSearcher(index).search(q, 10)
# as [docid, score rounded to 4 places] (BM25 k1=0.9, b=0.4).
PYSERINI = json.load(open(os.path.join(DATA, "pyserini_bm25.json"), encoding="utf-8"))
# Indexed by this project's BM25 before analyzers were recorded (commit e0db9ac, `build_bm25` on CORPUS).
OLD_INDEX = os.path.join(DATA, "bm25_index_v0")


def ref_tokens(text):
    return [w for w in re.findall(r"\b\w\w+\b", text.lower()) if w not in STOP]


def ref_passages():
    return [json.loads(line)["contents"] for line in open(CORPUS)]


def lucene_bm25(passages, query, k1, b, tokens=ref_tokens):
    """Scores of every passage: sum over query terms of idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))."""
    docs = [Counter(tokens(p)) for p in passages]
    lengths = np.array([sum(d.values()) for d in docs], dtype=np.float64)
    n, avgdl = len(docs), lengths.mean()
    scores = np.zeros(n)
    for term in tokens(query):
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


PLAIN = Analyzer(tokenizer="word2", stopwords=tuple(bm25s.stopwords.STOPWORDS_EN), stemmer="none")


def pyserini_terms(text):
    """Pyserini's analysis of a shipped passage or query (looked up, not computed)."""
    if text in PYSERINI["query_terms"]:
        return PYSERINI["query_terms"][text]
    return PYSERINI["passage_terms"][ref_passages().index(text)]


def test_analyzer_is_pyserinis_on_every_passage_and_query():
    analyzer = Analyzer()
    assert [analyzer.terms(p) for p in ref_passages()] == PYSERINI["passage_terms"]
    for query, terms in PYSERINI["query_terms"].items():
        assert analyzer.terms(query) == terms, query


# Pyserini 0.22.1's Analyzer(get_lucene_analyzer()).analyze on these strings: StandardTokenizer's word breaks,
# possessives, Lucene's stopwords, Porter stems (words of 1-2 letters unstemmed)
@pytest.mark.parametrize("text, terms", [
    ("U.S.A. don't John's engineers 1,000 3.14 v1.2 a:b foo_bar e-mail x y 1 us as is",
     ["u.s.a", "don't", "john", "engin", "1,000", "3.14", "v1.2", "a:b", "foo_bar", "e", "mail", "x", "y", "1",
      "us"]),
    ("O'Neil's Mary\u2019s dogs' running ran caresses ponies g\u00e9n\u00e9ralisation na\u00efve",
     ["o'neil", "mari", "dog", "run", "ran", "caress", "poni", "g\u00e9n\u00e9ralis", "na\u00efv"]),
    ("hello...world end. (parens) [brackets] 12:30 a.b.c 1.2.3 3,4 a,b a;b 1;2 C++ C# AT&T 50% $5",
     ["hello", "world", "end", "paren", "bracket", "12", "30", "a.b.c", "1.2.3", "3,4", "b", "b", "1;2", "c",
      "c", "t", "50", "5"]),
    ("generalizations relational hopefully agreed happy sky skies dying lying news",
     ["gener", "relat", "hopefulli", "agre", "happi", "sky", "ski", "dy", "ly", "new"]),
])  # fmt: skip
def test_analyzer_hand_cases_from_pyserini(text, terms):
    assert Analyzer().terms(text) == terms


def test_top10_is_pyserinis(retriever):
    """Every query's top-10 has Pyserini's scores, rank by rank, and its passage at every rank not tied with a
    neighbour (Lucene stores passage lengths in one byte, so scores agree to ~1e-4 and ties order differently)."""
    queries = list(PYSERINI["top10"])
    untied = 0
    for query, docs in zip(queries, retriever.search(queries, 10)):
        expected = PYSERINI["top10"][query]
        np.testing.assert_allclose([d.score for d in docs], [s for _, s in expected], atol=2e-4)
        for i, (docid, score) in enumerate(expected):
            neighbours = [expected[j][1] for j in (i - 1, i + 1) if 0 <= j < len(expected)]
            if all(abs(score - n) > 1e-3 for n in neighbours):
                assert docs[i].id == docid, (query, i)
                untied += 1
    assert untied >= 150


def test_stemming_finds_inflections_and_can_be_turned_off(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [{"id": "0", "contents": '"Bridge"\nThe engineer designed the bridge.'}, {"id": "1", "contents": '"X"\ny'}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with Corpus(str(path), progress=False) as corpus:
        assert [d.id for d in BM25Retriever.build(corpus, progress=False).search(["engineers"], 3)[0]] == ["0"]
        plain = BM25Retriever.build(corpus, analyzer=Analyzer(stemmer="none"), progress=False)
        assert plain.search(["engineers"], 3) == [[]] and len(plain.search(["engineer"], 3)[0]) == 1
        plain.save(tmp_path / "idx")
        meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
        assert meta["analyzer"] == {"tokenizer": "standard", "stopwords": list(Analyzer().stopwords),
                                    "stemmer": "none"}  # fmt: skip
        assert BM25Retriever.load(tmp_path / "idx", corpus).analyzer == Analyzer(stemmer="none")


def test_index_saved_before_analyzers_keeps_its_analysis(corpus):
    old = make_retriever("bm25", corpus=CORPUS, index=OLD_INDEX, progress=False)
    assert old.analyzer == PLAIN  # `\w\w+`, bm25s's stopwords from its meta.json, no stemming
    passages = ref_passages()
    queries = [q["question"] for q in QUERIES[:20]] + ["kilometres river sea river"]
    untied = sum(check_against(lucene_bm25(passages, query, 0.9, 0.4), docs, 10)
                 for query, docs in zip(queries, old.search(queries, 10)))
    assert untied >= 20


def test_matches_numpy_lucene_bm25(retriever):
    passages = ref_passages()
    queries = [q["question"] for q in QUERIES[:40]] + ["kilometres river sea river", "herons barley"]
    results = retriever.search(queries, 10)
    untied = sum(check_against(lucene_bm25(passages, query, k1=0.9, b=0.4, tokens=pyserini_terms), docs, 10)
                 for query, docs in zip(queries, results))
    assert untied >= 45  # enough ranks compared row by row


def test_matches_rank_bm25_okapi(corpus):
    k1, b = 1.5, 0.75
    okapi = BM25Retriever.build(corpus, k1=k1, b=b, method="robertson", analyzer=PLAIN, progress=False)
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
    check_against(lucene_bm25(passages, query, 0.9, 0.4, pyserini_terms), loaded.search([query], 5)[0], 5)
    assert loaded.analyzer == Analyzer()


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


def test_a_long_query_scored_in_pieces_is_the_whole_query(retriever, monkeypatch):
    """The server scores a query longer than --max-batch-chars piece by piece (`split_query`, then `scores`
    into the same array): the same float32 bits as bm25s's own scoring of the whole query, whatever the cut
    or the postings per numpy call, and the numpy Lucene BM25 of Pyserini's terms."""
    shipped = list(PYSERINI["query_terms"])
    parts = []  # whole shipped queries (their terms are Pyserini's) up to the server's longest query
    while sum(len(q) + 2 for q in parts) + len(shipped[len(parts) % len(shipped)]) <= 16384:
        parts.append(shipped[len(parts) % len(shipped)])
    long_query = "\n ".join(parts)
    whole_terms = [t for q in parts for t in PYSERINI["query_terms"][q]]
    vocab = retriever.model.vocab_dict
    bm25s_scores = retriever.model.get_scores_from_ids([vocab[t] for t in whole_terms if t in vocab])
    for max_chars in (1, 37, 256, 4096):
        pieces = retriever.split_query(long_query, max_chars)
        assert "".join(pieces) == long_query
        assert all(len(p) <= max_chars or not any(c.isspace() for c in p[:-1]) for p in pieces)
        scores = None
        for piece in pieces:
            scores = retriever.scores(piece, into=scores)
        assert scores.dtype == np.float32 and scores.tobytes() == bm25s_scores.tobytes()
    monkeypatch.setattr("jaxsearch.retrieval.bm25.POSTINGS_PER_CALL", 7)  # each term's postings a call
    assert retriever.scores(long_query).tobytes() == bm25s_scores.tobytes()
    reference = lucene_bm25(ref_passages(), long_query, 0.9, 0.4,
                            tokens=lambda text: whole_terms if text == long_query else pyserini_terms(text))
    np.testing.assert_allclose(bm25s_scores, reference, rtol=1e-5)
    assert check_against(reference, retriever.search([long_query], 10)[0], 10) >= 5


def test_cutting_at_whitespace_keeps_the_terms():
    """Cut only after whitespace, a text's pieces have its terms in order: Lucene's word joins (U.S.A, don't,
    1,000), possessives, CJK characters (a word each, no whitespace: a stretch longer than a piece stays
    whole), a final sigma, combining accents, and every kind of whitespace."""
    from jaxsearch.retrieval.bm25 import split_at_spaces

    words = ["U.S.A.", "don't", "John's", "1,000", "3.14", "a:b", "foo_bar", "e-mail", "\u039f\u0394\u039f\u03a3",
             "\u039f\u0394\u039f\u03a3's", "cafe\u0301", "\u6771\u4eac\u5927\u5b66" * 20, "(parens)", "C++", "x"]
    spaces = [" ", "\t", "\n", "\u00a0", "\u3000", "\u2029", "  \n"]
    text = "".join(words[i % len(words)] + spaces[i % len(spaces)] for i in range(300)) + "end"
    for analyzer in (Analyzer(), PLAIN):
        terms = analyzer.terms(text)
        for max_chars in (1, 5, 50, 256):
            pieces = split_at_spaces(text, max_chars)
            assert "".join(pieces) == text
            assert [t for p in pieces for t in analyzer.terms(p)] == terms
            # longer only where no whitespace was within reach: a stretch without it, up to the first after it
            assert all(len(p) <= max_chars or not any(c.isspace() for c in p[:-1]) for p in pieces)
    assert split_at_spaces("\u6771" * 300, 256) == ["\u6771" * 300]
    assert split_at_spaces("", 256) == [""] and split_at_spaces("ab cd", 3) == ["ab ", "cd"]
