"""Graph-R1's knowledge hypergraph as stored on disk, and its retriever (entity route + hyperedge route, fused).

Built by `jaxsearch.retrieval.hypergraph_build` (`launch/build_hypergraph.py`) into a directory:

  meta.json          {"kind": "hypergraph", counts, "encoder": EncoderSpec, "dim", "extractor", "chunking", ...}
  entities.jsonl     row i is entity i: {"id": "i", "contents": '"NAME"\\ndescription', "name", "type",
                     "description"}; `contents` is what was embedded (name + description, as Graph-R1 embeds
                     `entity_name + description`, graphr1/operate.py extract_entities)
  hyperedges.jsonl   row j is hyperedge j: {"id": "j", "contents": knowledge text, "weight", "sources"}: weight
                     = sum of the completeness scores of its extractions, sources = chunk ids "<doc id>#<n>"
  incidence.npz      entity -> hyperedge incidence, CSR: entity_offsets [E+1] int64, hyperedges [M] int32,
                     weights [M] float64 (sum of key scores); hyperedge_weight [H] float64, hyperedge_degree
                     [H] int32 (distinct entities)
  entities.faiss, hyperedges.faiss   FAISS flat inner-product indexes of the unit embeddings, row = id

Retrieval for one query (graphr1/operate.py _build_query_context; 5 and 5 from script_api.py, 10 its top_k):
the top 5 entities and the top 5 hyperedges by inner product with the query embedding;
entity route = every (entity, incident hyperedge) pair of those entities, ordered by edge degree (degree of the
entity + degree of the hyperedge) then by entity-hyperedge weight, both descending (ties keep entity rank,
then incidence order); hyperedge route = the 5 hyperedges ordered by weight, descending (ties keep rank);
fusion adds 1/(i+1) to a hyperedge for each position i at which it occurs in either route, so a hyperedge
reached twice scores twice; the top k (10) by fused score, ties in order of first occurrence.

Served by `launch/serve_retriever.py --retriever hypergraph` on our `/retrieve` and on Graph-R1's `/search`
(`base.graph_r1_result_string`).

Memory (E entities, H hyperedges, M incidences, d dims): the FAISS indexes 4*d*(E+H) bytes, the incidence
12*M + 16*E + 12*H bytes, the hyperedge text offsets 8*H bytes, each hyperedge's source passage ids (a tuple of
strings); texts stay on disk.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence

import faiss
import numpy as np

from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.corpus import Corpus
from jaxsearch.retrieval.dense import prefer_blas, to_gpu
from jaxsearch.retrieval.encoders import BGE_QUERY_INSTRUCTION, Encoder, EncoderSpec, encoder_spec

META_FILE, INCIDENCE_FILE = "meta.json", "incidence.npz"
ENTITIES_FILE, HYPEREDGES_FILE = "entities.jsonl", "hyperedges.jsonl"
ENTITY_INDEX, HYPEREDGE_INDEX = "entities.faiss", "hyperedges.faiss"
TOP_ENTITIES = 5  # script_api.py: index_entity.search(embeddings, 5)
TOP_HYPEREDGES = 5  # script_api.py: index_hyperedge.search(embeddings, 5)
TOP_K = 10  # script_api.py: QueryParam(top_k=10)
# Graph-R1's embedder (script_build.py, script_api.py): BGE-large, CLS pooling, its query instruction, unit
# vectors; 512 tokens is FlagEmbedding's default length.
BGE_LARGE = EncoderSpec("BAAI/bge-large-en-v1.5", "cls", BGE_QUERY_INSTRUCTION, "", max_length=512)
ENCODERS = {"bge-large": BGE_LARGE}


def hypergraph_encoder_spec(name: str | EncoderSpec | dict) -> EncoderSpec:
    """`bge-large` (Graph-R1's), or anything `encoders.encoder_spec` takes (`minilm`, `bge`, a model dir)."""
    return ENCODERS[name] if isinstance(name, str) and name in ENCODERS else encoder_spec(name)


class Incidence:
    """Entity -> hyperedge incidence (CSR by entity) with the weights and degrees retrieval orders by."""

    def __init__(self, entity_offsets: np.ndarray, hyperedges: np.ndarray, weights: np.ndarray,
                 hyperedge_weight: np.ndarray, hyperedge_degree: np.ndarray):
        self.entity_offsets = np.asarray(entity_offsets, np.int64)  # [E+1]
        self.hyperedges = np.asarray(hyperedges, np.int32)  # [M], grouped by entity
        self.weights = np.asarray(weights, np.float64)  # [M], sum of key scores
        self.hyperedge_weight = np.asarray(hyperedge_weight, np.float64)  # [H], sum of completeness scores
        self.hyperedge_degree = np.asarray(hyperedge_degree, np.int32)  # [H], distinct entities
        self.entity_degree = np.diff(self.entity_offsets)  # [E], distinct hyperedges

    @property
    def num_entities(self) -> int:
        return len(self.entity_offsets) - 1

    @property
    def num_hyperedges(self) -> int:
        return len(self.hyperedge_weight)

    @property
    def nbytes(self) -> int:
        arrays = (self.entity_offsets, self.hyperedges, self.weights, self.hyperedge_weight, self.hyperedge_degree,
                  self.entity_degree)
        return sum(a.nbytes for a in arrays)

    def save(self, path: str) -> None:
        np.savez(path, entity_offsets=self.entity_offsets, hyperedges=self.hyperedges, weights=self.weights,
                 hyperedge_weight=self.hyperedge_weight, hyperedge_degree=self.hyperedge_degree)

    @classmethod
    def load(cls, path: str) -> Incidence:
        with np.load(path) as z:
            names = {"entity_offsets", "hyperedges", "weights", "hyperedge_weight", "hyperedge_degree"}
            missing = names - set(z.files)
            if missing:
                raise ValueError(f"{path}: missing arrays {sorted(missing)}; rebuild the hypergraph")
            incidence = cls(z["entity_offsets"], z["hyperedges"], z["weights"], z["hyperedge_weight"],
                            z["hyperedge_degree"])
        num_incidences = len(incidence.hyperedges)
        if incidence.entity_offsets[-1] != num_incidences or len(incidence.weights) != num_incidences:
            raise ValueError(f"{path}: entity_offsets, hyperedges and weights disagree; rebuild the hypergraph")
        return incidence

    def entity_route(self, entities: Sequence[int]) -> np.ndarray:
        """Hyperedge rows reached from `entities` (best first), one per (entity, hyperedge) pair, ordered by
        edge degree, then entity-hyperedge weight, descending; ties keep entity order, then incidence order."""
        entities = np.asarray(entities, np.int64)
        starts, ends = self.entity_offsets[entities], self.entity_offsets[entities + 1]
        pairs = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)] or [np.zeros(0, np.int64)])
        hyperedges = self.hyperedges[pairs]
        degree = np.repeat(ends - starts, ends - starts) + self.hyperedge_degree[hyperedges]
        order = np.lexsort((np.arange(len(pairs)), -self.weights[pairs], -degree))
        return hyperedges[order]

    def hyperedge_route(self, hyperedges: Sequence[int]) -> np.ndarray:
        """`hyperedges` (best first) reordered by weight, descending; ties keep their order."""
        hyperedges = np.asarray(hyperedges, np.int64)
        return hyperedges[np.lexsort((np.arange(len(hyperedges)), -self.hyperedge_weight[hyperedges]))]


def fuse(entity_route: Sequence[int], hyperedge_route: Sequence[int], k: int) -> list[tuple[int, float]]:
    """Reciprocal-rank fusion as Graph-R1 does it: each occurrence at position i of either route adds 1/(i+1);
    the top `k` (hyperedge, score), best first, ties in order of first occurrence."""
    scores: dict[int, float] = {}
    for route in (entity_route, hyperedge_route):
        for i, hyperedge in enumerate(route):
            scores[int(hyperedge)] = scores.get(int(hyperedge), 0.0) + 1 / (i + 1)
    return sorted(scores.items(), key=lambda item: item[1], reverse=True)[:k]


class HypergraphRetriever:
    """`search(queries, k)`: Graph-R1's hypergraph retrieval; each Doc is a hyperedge (id = row, `contents` =
    its knowledge text, `sources` = the passages it came from), scored by the fused rank score. `hyperedges`
    reads their texts by row; `sources[row]` are the ids of the passages hyperedge `row` came from. (No
    `corpus` attribute: `launch/eval.py` takes a retriever's `corpus` as the passages that supporting ids name.)"""

    default_k = TOP_K

    def __init__(self, hyperedges: Corpus, sources: list[tuple[str, ...]], incidence: Incidence,
                 entity_index: faiss.Index, hyperedge_index: faiss.Index, encoder, top_entities: int = TOP_ENTITIES,
                 top_hyperedges: int = TOP_HYPEREDGES, use_gpu: bool = True):
        sizes = {"hyperedges.jsonl rows": len(hyperedges), "hyperedge sources": len(sources),
                 "hyperedge index vectors": hyperedge_index.ntotal, "incidence hyperedges": incidence.num_hyperedges}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"the hypergraph's files disagree on the number of hyperedges: {sizes}; rebuild it")
        if entity_index.ntotal != incidence.num_entities:
            raise ValueError(f"the entity index has {entity_index.ntotal} vectors for {incidence.num_entities} "
                             "entities; rebuild the hypergraph")
        for name, index in (("entity", entity_index), ("hyperedge", hyperedge_index)):
            if index.d != encoder.dim:
                raise ValueError(f"{name} index dim {index.d} != encoder {encoder.spec.model} dim {encoder.dim}")
        prefer_blas()
        self.hyperedges, self.sources, self.incidence, self.encoder = hyperedges, sources, incidence, encoder
        self.entity_index = to_gpu(entity_index) if use_gpu else entity_index
        self.hyperedge_index = to_gpu(hyperedge_index) if use_gpu else hyperedge_index
        self.top_entities, self.top_hyperedges = top_entities, top_hyperedges

    @classmethod
    def load(cls, path: str | os.PathLike, encoder: str | EncoderSpec | dict | Encoder | None = None,
             progress: bool = True, **kwargs) -> HypergraphRetriever:
        """Open a directory written by `launch/build_hypergraph.py` (`encoder`: default the one it was built
        with; any object with `dim`, `spec` and `encode_queries` works)."""
        path = os.fspath(path)
        meta = read_meta(path)
        if encoder is None:
            encoder = meta["encoder"]
        if not hasattr(encoder, "encode_queries"):
            encoder = Encoder(hypergraph_encoder_spec(encoder))
        hyperedges = Corpus(os.path.join(path, HYPEREDGES_FILE), progress=progress)
        sources = read_sources(os.path.join(path, HYPEREDGES_FILE))
        incidence = Incidence.load(os.path.join(path, INCIDENCE_FILE))
        entity_index = faiss.read_index(os.path.join(path, ENTITY_INDEX))
        hyperedge_index = faiss.read_index(os.path.join(path, HYPEREDGE_INDEX))
        return cls(hyperedges, sources, incidence, entity_index, hyperedge_index, encoder, **kwargs)

    def search(self, queries: list[str], k: int = TOP_K) -> list[list[Doc]]:
        if not queries:
            return []
        return self.search_vectors(self.encoder.encode_queries(list(queries)), k)

    def search_vectors(self, vectors: np.ndarray, k: int = TOP_K) -> list[list[Doc]]:
        """[n, d] query embeddings -> the top-k fused hyperedges per query."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        entity_rows = self._top(self.entity_index, vectors, self.top_entities)
        hyperedge_rows = self._top(self.hyperedge_index, vectors, self.top_hyperedges)
        out = []
        for entities, hyperedges in zip(entity_rows, hyperedge_rows):
            fused = fuse(self.incidence.entity_route(entities), self.incidence.hyperedge_route(hyperedges), k)
            out.append([self._doc(row, score) for row, score in fused])
        return out

    @staticmethod
    def _top(index: faiss.Index, vectors: np.ndarray, n: int) -> list[np.ndarray]:
        if index.ntotal == 0 or n == 0:
            return [np.zeros(0, np.int64)] * len(vectors)
        _, rows = index.search(vectors, min(n, index.ntotal))
        return [r[r >= 0] for r in rows]

    def _doc(self, row: int, score: float) -> Doc:
        contents = self.hyperedges[row].contents
        return Doc(str(row), "", contents, float(score), contents, self.sources[row])


def read_sources(hyperedges_path: str) -> list[tuple[str, ...]]:
    """Per hyperedge row, the ids of the passages it was extracted from: its `sources` chunk ids
    ("<doc id>#<n>") without the chunk number, in order, each once."""
    with open(hyperedges_path, encoding="utf-8") as f:
        return [tuple(dict.fromkeys(c.rpartition("#")[0] for c in json.loads(line).get("sources", ()))) for line in f]


def read_meta(path: str) -> dict:
    meta_path = os.path.join(path, META_FILE)
    if not os.path.isfile(meta_path):
        raise FileNotFoundError(f"{path}: not a hypergraph directory (no {META_FILE}); build one with "
                                "`python launch/build_hypergraph.py`")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("kind") != "hypergraph":
        raise ValueError(f"{meta_path}: index kind is {meta.get('kind')!r}, not 'hypergraph'")
    return meta
