"""Dense retrieval: an `Encoder` for queries and a FAISS inner-product index over passage rows.

Index kinds: flat (exact), hnsw, ivfpq; their memory is in `MEMORY`. With `faiss-gpu` installed and
a GPU visible, flat and ivfpq indexes are sharded over the GPUs.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

import faiss
import numpy as np
from tqdm.auto import tqdm

from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.corpus import Corpus
from jaxsearch.retrieval.encoders import Encoder, EncoderSpec, encoder_spec

KINDS = ("flat", "hnsw", "ivfpq")
INDEX_FILE = "faiss.index"
META_FILE = "meta.json"
ADD_CHUNK = 65536  # vectors added to an index per call
MEMORY = """(d = embedding dim: e5-base/bge-base 768, MiniLM 384; wiki-18 = 21M passages)
  flat   exact; 4*d bytes/passage: wiki-18 with e5 ~65 GB (60 GiB; Search-R1's e5_Flat.index).
  hnsw   approximate, fastest on CPU; 4*d + 8*M bytes/passage (M=32: ~70 GB for wiki-18); slow build.
  ivfpq  approximate; pq_m + 8 bytes/passage plus nlist*d*4 for centroids (pq_m=64: ~1.5 GB for
         wiki-18): fits a small host. Training reads a sample of 39*max(nlist, 256) vectors.
  GPU    faiss-gpu holds the same bytes in GPU memory (flat and ivfpq; hnsw stays on CPU)."""


def default_nlist(num_vectors: int) -> int:
    """IVF cells: ~4*sqrt(N) rounded down to a power of two, at most N/39 (k-means wants 39 points a cell)."""
    target = min(4 * math.sqrt(num_vectors), num_vectors / 39)
    return 2 ** max(0, int(math.log2(max(target, 1))))


def new_index(kind: str, dim: int, num_vectors: int, hnsw_m: int = 32, ivf_nlist: int | None = None,
              pq_m: int = 64) -> faiss.Index:
    """An empty inner-product index of `kind` for `num_vectors` vectors of `dim` float32."""
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        return faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    if kind == "ivfpq":
        if dim % pq_m:
            raise ValueError(f"ivfpq: pq_m={pq_m} must divide the embedding dim {dim}")
        if num_vectors < 256 * 39:
            raise ValueError(f"ivfpq needs >= {256 * 39} passages to train its 256-centroid codebooks; "
                             f"got {num_vectors}: use flat or hnsw")
        nlist = ivf_nlist or default_nlist(num_vectors)
        return faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, pq_m, 8, faiss.METRIC_INNER_PRODUCT)
    raise ValueError(f"unknown FAISS index kind {kind!r}; choose from {KINDS}")


def fill_index(index: faiss.Index, vectors: np.ndarray, progress: bool = True, seed: int = 0) -> None:
    """Train `index` if it needs it (on a random sample) and add `vectors` [N, d] (array or memmap) in chunks."""
    n = len(vectors)
    if not index.is_trained:
        nlist = faiss.extract_index_ivf(index).nlist
        sample = np.sort(np.random.default_rng(seed).choice(n, size=min(n, 39 * max(nlist, 256)), replace=False))
        index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
    with tqdm(total=n, desc="faiss add", unit="vec", disable=not progress) as bar:
        for start in range(0, n, ADD_CHUNK):
            chunk = np.ascontiguousarray(vectors[start:start + ADD_CHUNK], dtype=np.float32)
            index.add(chunk)
            bar.update(len(chunk))


def configure(index: faiss.Index, ef_search: int = 128, nprobe: int = 64) -> None:
    """Set search breadth: HNSW `efSearch` candidates, IVF `nprobe` cells (no-op for flat)."""
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexHNSW):
        inner.hnsw.efSearch = ef_search
    if isinstance(inner, faiss.IndexIVF):
        inner.nprobe = nprobe


def prefer_blas() -> None:
    """Score every query batch with BLAS (process-wide FAISS setting).

    FAISS 1.15 uses its own SIMD loop while queries * dim < 128000 (batch 256 of dim 384: 98304);
    bench/retrieval.py measures BLAS ~12x faster there and no slower from 4 queries up.
    """
    faiss.cvar.distance_compute_blas_threshold = 1


def to_gpu(index: faiss.Index) -> faiss.Index:
    """Shard `index` over all visible GPUs when faiss-gpu is installed; otherwise return it unchanged."""
    if not hasattr(faiss, "index_cpu_to_all_gpus") or faiss.get_num_gpus() == 0:
        return index
    if isinstance(faiss.downcast_index(index), faiss.IndexHNSW):
        return index  # FAISS has no GPU HNSW
    options = faiss.GpuMultipleClonerOptions()
    options.shard = True
    return faiss.index_cpu_to_all_gpus(index, co=options)


class DenseRetriever:
    """`search(queries, k)`: encode queries, search the FAISS index, fetch passages by row.

    On CPU, start the process with OMP_WAIT_POLICY=PASSIVE (the launch scripts do): otherwise FAISS's
    spinning OpenMP threads slow its BLAS searches several-fold on small hosts (bench/RESULTS.md).
    """

    def __init__(self, corpus: Corpus, index: faiss.Index, encoder: Encoder, ef_search: int = 128,
                 nprobe: int = 64, use_gpu: bool = True):
        if index.ntotal != len(corpus):
            raise ValueError(f"FAISS index has {index.ntotal} vectors but corpus {corpus.path} has "
                             f"{len(corpus)} passages: rebuild the index for this corpus")
        if index.d != encoder.dim:
            raise ValueError(f"FAISS index dim {index.d} != encoder {encoder.spec.model} dim {encoder.dim}")
        configure(index, ef_search, nprobe)
        prefer_blas()
        self.corpus = corpus
        self.encoder = encoder
        self.index = to_gpu(index) if use_gpu else index

    @classmethod
    def load(cls, path: str | os.PathLike, corpus: Corpus, encoder: str | EncoderSpec | Encoder | None = None,
             **kwargs) -> DenseRetriever:
        """Open an index directory written by `launch/build_index.py`, or a bare FAISS file such as
        Search-R1's `e5_Flat.index` (then `encoder` says how it was built; default "e5")."""
        path = os.fspath(path)
        if os.path.isdir(path):
            meta_path = os.path.join(path, META_FILE)
            if not os.path.isfile(meta_path):
                raise FileNotFoundError(f"{path}: not a dense index directory (no {META_FILE})")
            with open(meta_path) as f:
                meta = json.load(f)
            if meta.get("kind") != "dense":
                raise ValueError(f"{meta_path}: index kind is {meta.get('kind')!r}, not 'dense'")
            index_path, encoder = os.path.join(path, INDEX_FILE), encoder or meta["encoder"]
        elif os.path.isfile(path):
            index_path, encoder = path, encoder or "e5"
        else:
            raise FileNotFoundError(f"{path}: no such FAISS index file or directory")
        if not isinstance(encoder, Encoder):
            encoder = Encoder(encoder)
        return cls(corpus, faiss.read_index(index_path), encoder, **kwargs)

    @classmethod
    def build_flat(cls, corpus: Corpus, encoder: str | EncoderSpec | Encoder, batch_size: int = 256,
                   progress: bool = True, **kwargs) -> DenseRetriever:
        """Encode the whole corpus into an in-RAM Flat index (small corpora; no resume)."""
        encoder = encoder if isinstance(encoder, Encoder) else Encoder(encoder)
        index = new_index("flat", encoder.dim, len(corpus))
        with tqdm(total=len(corpus), desc="encode passages", unit="doc", disable=not progress) as bar:
            for batch in corpus.iter_batches(batch_size):
                index.add(encoder.encode_passages([d.contents for d in batch], batch_size))
                bar.update(len(batch))
        return cls(corpus, index, encoder, **kwargs)

    @staticmethod
    def save(path: str | os.PathLike, index: faiss.Index, spec: EncoderSpec, corpus: Corpus, kind: str) -> None:
        """Write `faiss.index` and `meta.json` (encoder spec, kind, corpus size) into directory `path`."""
        os.makedirs(path, exist_ok=True)
        faiss.write_index(index, os.path.join(path, INDEX_FILE))
        meta = {"kind": "dense", "faiss": kind, "encoder": dataclasses.asdict(encoder_spec(spec)), "dim": index.d,
                "num_docs": len(corpus), "corpus": os.path.abspath(corpus.path)}
        with open(os.path.join(path, META_FILE), "w") as f:
            json.dump(meta, f)

    def search_vectors(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """[n, d] float32 query vectors -> (scores [n, k], rows [n, k]); row -1 where fewer than k found."""
        k = min(k, self.index.ntotal)
        return self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        if not queries:
            return []
        scores, rows = self.search_vectors(self.encoder.encode_queries(queries), k)
        return [self.corpus.docs(r[r >= 0], s[r >= 0]) for s, r in zip(scores, rows)]
