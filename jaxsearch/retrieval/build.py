"""Index builds that never damage the previous index and resume encoding after an interruption.

A build writes into `<out>.partial/` and swaps it in with renames at the end; `recover(out)` undoes
a swap cut between its two renames. A dense build keeps its passage embeddings in
`<out>.partial/embeddings.npy` (4*d bytes/passage on disk) with a progress file, so rerunning the
same command continues encoding from the last finished batch. The commands call `claim_out(out)` first: `out`
and its `.partial` / `.old` siblings must be absent, empty or this project's (`files.claim_output_dir`), so a
user's directory or file is never replaced.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys

import numpy as np
from tqdm.auto import tqdm

from jaxsearch.files import atomic_write_text, claim_output_dir, mark
from jaxsearch.retrieval.bm25 import Analyzer, BM25Retriever
from jaxsearch.retrieval.corpus import Corpus
from jaxsearch.retrieval.dense import DenseRetriever, fill_index, new_index
from jaxsearch.retrieval.encoders import Encoder

EMBEDDINGS_FILE = "embeddings.npy"
PROGRESS_FILE = "progress.json"
MEMORY = """dense build: passage embeddings go to disk in <out>.partial/embeddings.npy (4*d bytes/passage:
~65 GB for wiki-18 with e5) and are deleted once the index is written; RAM holds the index being
filled (see the kinds above) and one encoder batch."""


# what builds wrote before the marker file (files.MARKER): an index or hypergraph (meta.json), a dense build's
# encoding in progress, a hypergraph build's job (hypergraph_build.JOB_FILE)
INDEX_LAYOUTS = (("meta.json",), (PROGRESS_FILE,), ("job.json",))


def partial_dir(out: str) -> str:
    return out.rstrip("/") + ".partial"


def old_dir(out: str) -> str:
    return out.rstrip("/") + ".old"


def claim_out(out: str, inputs: tuple[str, ...] = (), flag: str = "--out") -> None:
    """Before any work: `out` and its `.partial` / `.old` siblings must be absent, empty or written by this
    project, and no input inside them (`files.OutputDirError` otherwise)."""
    for path in (out, partial_dir(out), old_dir(out)):
        claim_output_dir(path, flag, legacy=INDEX_LAYOUTS, inputs=inputs, create=False)


def recover(out: str) -> None:
    """If a swap was cut after moving the old index aside, put the old index back."""
    old = old_dir(out)
    if not os.path.exists(out) and os.path.exists(old):
        os.rename(old, out)


def commit(tmp: str, out: str) -> None:
    """Replace `out` by the finished build `tmp` (marked as ours; rename old aside, rename new in, delete old)."""
    mark(tmp)
    recover(out)
    old = old_dir(out)
    if os.path.exists(old):
        shutil.rmtree(old)
    if os.path.exists(out):
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def encode_corpus(corpus: Corpus, encoder: Encoder, workdir: str, batch_size: int = 256,
                  progress: bool = True) -> np.ndarray:
    """Embed every passage into `workdir/embeddings.npy` ([N, d] float32 memmap), resuming a matching
    earlier run from its last finished batch."""
    emb_path, prog_path = os.path.join(workdir, EMBEDDINGS_FILE), os.path.join(workdir, PROGRESS_FILE)
    stat = os.stat(corpus.path)
    job = {"corpus": [os.path.abspath(corpus.path), stat.st_size, stat.st_mtime_ns], "num_docs": len(corpus),
           "dim": encoder.dim, "encoder": dataclasses.asdict(encoder.spec)}
    done = 0
    if os.path.isfile(prog_path) and os.path.isfile(emb_path):
        with open(prog_path) as f:
            state = json.load(f)
        if state.get("job") == job:
            done = state["rows_done"]
    if done:
        print(f"resuming encoding at row {done} of {len(corpus)} ({emb_path})", file=sys.stderr)
        emb = np.load(emb_path, mmap_mode="r+")
    else:
        os.makedirs(workdir, exist_ok=True)
        mark(workdir)
        emb = np.lib.format.open_memmap(emb_path, mode="w+", dtype=np.float32, shape=(len(corpus), encoder.dim))
    with tqdm(total=len(corpus), initial=done, desc="encode passages", unit="doc", disable=not progress) as bar:
        for batch in corpus.iter_batches(batch_size, start=done):
            emb[done:done + len(batch)] = encoder.encode_passages([d.contents for d in batch], batch_size)
            done += len(batch)
            emb.flush()
            atomic_write_text(prog_path, json.dumps({"job": job, "rows_done": done}))
            bar.update(len(batch))
    return emb


def build_bm25(corpus: Corpus, out: str, k1: float = 0.9, b: float = 0.4, analyzer: Analyzer | None = None,
               progress: bool = True) -> None:
    """Build a BM25 index of `corpus` into directory `out` (analyzer None: Pyserini's default, recorded)."""
    tmp = partial_dir(out)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    mark(tmp)  # a build killed mid-save leaves a directory that the next one may replace
    BM25Retriever.build(corpus, k1=k1, b=b, analyzer=analyzer, progress=progress).save(tmp)
    commit(tmp, out)


def build_dense(corpus: Corpus, out: str, encoder: Encoder, kind: str = "flat", batch_size: int = 256,
                hnsw_m: int = 32, ivf_nlist: int | None = None, pq_m: int = 64, progress: bool = True) -> None:
    """Encode `corpus` (resumable) and build a FAISS index of `kind` into directory `out`."""
    tmp = partial_dir(out)
    index = new_index(kind, encoder.dim, len(corpus), hnsw_m=hnsw_m, ivf_nlist=ivf_nlist, pq_m=pq_m)
    emb = encode_corpus(corpus, encoder, tmp, batch_size, progress)
    fill_index(index, emb, progress)
    del emb
    os.remove(os.path.join(tmp, EMBEDDINGS_FILE))
    os.remove(os.path.join(tmp, PROGRESS_FILE))
    DenseRetriever.save(tmp, index, encoder.spec, corpus, kind)
    commit(tmp, out)
