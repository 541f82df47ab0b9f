"""Dense retrieval against numpy brute force and a hand-written transformers encoder."""
import json
import os

import faiss
import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from jaxsearch.retrieval import make_retriever
from jaxsearch.retrieval.dense import configure, fill_index, new_index
from jaxsearch.retrieval.encoders import BGE_QUERY_INSTRUCTION, Encoder, EncoderSpec, minilm_path

DATA = os.path.join(os.path.dirname(__file__), "data", "corpus")


def unit_rows(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force(base, queries, k):
    scores = queries @ base.T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, rows, axis=1), rows


def recall(approx_rows, exact_rows):
    return np.mean([len(set(a) & set(e)) / len(e) for a, e in zip(approx_rows, exact_rows)])


@pytest.fixture(scope="module")
def vectors():
    rng = np.random.default_rng(0)
    return unit_rows(rng, 20000, 64), unit_rows(rng, 200, 64)


def test_flat_equals_numpy_brute_force(vectors):
    base, queries = vectors
    index = new_index("flat", 64, len(base))
    fill_index(index, base[:5000], progress=False)
    scores, rows = index.search(queries, 10)
    ref_scores, ref_rows = brute_force(base[:5000], queries, 10)
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-6)


def test_hnsw_recall_at_10_vs_flat(vectors):
    base, queries = vectors
    index = new_index("hnsw", 64, len(base))
    fill_index(index, base, progress=False)
    configure(index)  # the retriever's default efSearch
    _, rows = index.search(queries, 10)
    assert recall(rows, brute_force(base, queries, 10)[1]) >= 0.95


def test_ivfpq_trains_and_searches(vectors):
    base, queries = vectors[0][:10000, :32].copy(), vectors[1][:, :32].copy()
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    index = new_index("ivfpq", 32, len(base), ivf_nlist=64, pq_m=16)
    fill_index(index, base, progress=False)
    configure(index, nprobe=16)
    _, rows = index.search(queries, 10)
    assert index.ntotal == len(base)
    assert recall(rows, brute_force(base, queries, 10)[1]) >= 0.5  # compressed: 16 bytes per vector
    with pytest.raises(ValueError, match="use flat or hnsw"):
        new_index("ivfpq", 32, 500, pq_m=16)
    with pytest.raises(ValueError, match="must divide"):
        new_index("ivfpq", 32, 20000, pq_m=12)


def hf_embed(texts, pooling):
    """Reference sentence embedding with plain transformers: mean (masked) or CLS pooling, L2 norm."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    model = AutoModel.from_pretrained(minilm_path()).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    if pooling == "mean":
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * mask).sum(1) / mask.sum(1)
    else:
        pooled = hidden[:, 0]
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_encoder_prefixes_and_pooling_match_transformers():
    queries, passages = ["who founded velmora", "a longer query about rivers and seas"], ['"T"\nsome passage']
    e5_style = Encoder(EncoderSpec(minilm_path(), "mean", "query: ", "passage: "))
    np.testing.assert_allclose(e5_style.encode_queries(queries), hf_embed(["query: " + q for q in queries], "mean"),
                               atol=1e-5)
    np.testing.assert_allclose(e5_style.encode_passages(passages), hf_embed(["passage: " + passages[0]], "mean"),
                               atol=1e-5)
    bge_style = Encoder(EncoderSpec(minilm_path(), "cls", BGE_QUERY_INSTRUCTION, ""))
    np.testing.assert_allclose(bge_style.encode_queries(queries),
                               hf_embed([BGE_QUERY_INSTRUCTION + q for q in queries], "cls"), atol=1e-5)


def test_prebuilt_search_r1_style_index(tmp_path):
    """A bare FAISS Flat file + a {id, contents} corpus, as Search-R1 ships e5_Flat.index + wiki-18.jsonl."""
    lines = open(os.path.join(DATA, "corpus.jsonl")).read().splitlines()[:60]
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    contents = [json.loads(line)["contents"] for line in lines]
    passage_emb = hf_embed(contents, "mean")
    index = faiss.IndexFlatIP(passage_emb.shape[1])
    index.add(passage_emb)
    faiss.write_index(index, str(tmp_path / "minilm_Flat.index"))

    retriever = make_retriever("dense", corpus=str(corpus), index=str(tmp_path / "minilm_Flat.index"),
                               encoder="minilm", progress=False)
    queries = [json.loads(line)["question"] for line in open(os.path.join(DATA, "queries.jsonl"))][:20]
    results = retriever.search(queries, 5)
    ref_scores, ref_rows = brute_force(passage_emb, hf_embed(queries, "mean"), 5)
    for docs, scores, rows in zip(results, ref_scores, ref_rows):
        assert [d.contents for d in docs] == [contents[r] for r in rows]
        np.testing.assert_allclose([d.score for d in docs], scores, atol=1e-4)
