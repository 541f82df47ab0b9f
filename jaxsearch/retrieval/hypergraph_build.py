"""Building Graph-R1's knowledge hypergraph: chunk a corpus, extract hyper-relations, merge, embed, write.

    extractor = WorldExtractor.from_dir("runs/tiny_cpu/world")           # or OpenAIExtractor(url, model, cache)
    build_hypergraph("runs/tiny_cpu/world/corpus.jsonl", "indexes/world_hg", extractor, Encoder("minilm"))

Chunks are windows of 1,200 tokens overlapping by 100 (graphr1/graphr1.py chunk_token_size,
chunk_overlap_token_size; graphr1/operate.py chunking_by_token_size), per corpus document; a chunk whose text
repeats an earlier one is extracted once (Graph-R1 keys chunks by their hash). Merging (graphr1/operate.py
_merge_*_then_upsert): entities by exact upper-cased name (type: the most frequent, the first seen on a tie;
description: the distinct descriptions, sorted, joined by "<SEP>"), hyperedges by exact text (weight: the sum
of completeness scores), entity-hyperedge weight: the sum of key scores. Row order is first appearance in
corpus order, whatever order extraction finished in.

The build is atomic and resumable like `build.py`'s: everything goes to `<out>.partial/` and is swapped in at
the end. There, `extractions.jsonl` gets one line per chunk as it finishes, so a rerun of the same command
extracts only the chunks not yet done (an LLM extractor's reply cache lives outside, so a finished build
rebuilt asks nothing either), and embeddings resume from their last finished batch.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable

import faiss
import numpy as np
from tqdm.auto import tqdm

from jaxsearch.files import atomic_write, atomic_write_text
from jaxsearch.retrieval.base import make_contents
from jaxsearch.retrieval.build import commit, encode_corpus, partial_dir, recover
from jaxsearch.retrieval.corpus import Corpus
from jaxsearch.retrieval.dense import fill_index, new_index
from jaxsearch.retrieval.hypergraph import (ENTITIES_FILE, ENTITY_INDEX, HYPEREDGE_INDEX, HYPEREDGES_FILE,
                                            INCIDENCE_FILE, META_FILE, Incidence)
from jaxsearch.retrieval.hypergraph_extract import HyperRelation

CHUNK_TOKENS = 1200  # graphr1/graphr1.py chunk_token_size
CHUNK_OVERLAP = 100  # graphr1/graphr1.py chunk_overlap_token_size
GRAPH_FIELD_SEP = "<SEP>"  # graphr1/prompt.py: joins an entity's descriptions
EXTRACTIONS_FILE, JOB_FILE = "extractions.jsonl", "job.json"
MEMORY = """hypergraph build: RAM holds the chunk texts, every chunk's extracted facts and the merged graph as
Python objects (100k chunks of the synthetic world, 164k hyperedges, 81k entities: ~0.9 GB more,
bench/RESULTS.md); embeddings go to disk in <out>.partial/ (4*d bytes per entity and per hyperedge) and
into FAISS flat indexes of the same size."""


class TokenChunker:
    """Text -> windows of `size` tokens starting every `size - overlap` tokens, each decoded and stripped
    (graphr1/operate.py chunking_by_token_size). Graph-R1 counts gpt-4o-mini's tokens (tiktoken "o200k_base",
    whose file tiktoken downloads). `encoder`: any tokenizer with encode(text) -> ids and decode(ids) -> text
    (`models.tokenizer.Tokenizer`; the command passes Qwen2.5's for the default "qwen"), recorded by `tokenizer`,
    its name; without one, `tokenizer` names a tiktoken encoding. Retrieval knows no model: it is handed one."""

    def __init__(
        self, tokenizer: str = "qwen", size: int = CHUNK_TOKENS, overlap: int = CHUNK_OVERLAP, encoder=None
    ):
        if not 0 <= overlap < size:
            raise ValueError(f"chunk overlap must be in [0, size); got size {size}, overlap {overlap}")
        self.tokenizer, self.size, self.overlap = tokenizer, size, overlap
        self._codec = None if encoder is None else (encoder.encode, encoder.decode)

    @property
    def spec(self) -> dict:
        return {"tokenizer": self.tokenizer, "size": self.size, "overlap": self.overlap}

    def _encode_decode(self):
        if self._codec is None:
            if self.tokenizer == "qwen":
                raise ValueError("TokenChunker('qwen') needs encoder=models.tokenizer.QwenTokenizer()")
            import tiktoken

            enc = tiktoken.get_encoding(self.tokenizer)
            self._codec = (enc.encode_ordinary, lambda ids: enc.decode(ids, errors="replace"))
        return self._codec

    def split(self, text: str) -> list[str]:
        text = text.strip()
        if len(text.encode("utf-8")) <= self.size:  # a token is at least one byte: one window, no tokenizing
            return [text] if text else []
        encode, decode = self._encode_decode()
        tokens = encode(text)
        windows = (decode(tokens[start:start + self.size]).strip()
                   for start in range(0, len(tokens), self.size - self.overlap))
        return [w for w in windows if w]


@dataclasses.dataclass(frozen=True)
class Chunk:
    id: str  # "<doc id>#<n>": the n-th window of that document
    text: str


def corpus_chunks(corpus: Corpus, chunker: TokenChunker, progress: bool = True) -> list[Chunk]:
    """Every document's windows in corpus order; a window whose text came before is left out."""
    chunks, seen = [], set()
    with tqdm(total=len(corpus), desc="chunk", unit="doc", disable=not progress) as bar:
        for batch in corpus.iter_batches(4096):
            for doc in batch:
                for n, text in enumerate(chunker.split(doc.contents)):
                    if text not in seen:
                        seen.add(text)
                        chunks.append(Chunk(f"{doc.id}#{n}", text))
            bar.update(len(batch))
    return chunks


class GraphAccumulator:
    """Merges chunks' hyper-relations into one hypergraph (see the module docstring for the rules)."""

    def __init__(self):
        self.entity_row: dict[str, int] = {}
        self.entity_types: list[collections.Counter] = []
        self.entity_descriptions: list[set[str]] = []
        self.hyperedge_row: dict[str, int] = {}
        self.hyperedge_weight: list[float] = []
        self.hyperedge_sources: list[dict[str, None]] = []  # ordered set of chunk ids
        self.incidence: dict[tuple[int, int], float] = {}  # (entity, hyperedge) -> sum of key scores

    def add(self, chunk_id: str, facts: Iterable[HyperRelation]) -> None:
        for fact in facts:
            h = self.hyperedge_row.setdefault(fact.text, len(self.hyperedge_row))
            if h == len(self.hyperedge_weight):
                self.hyperedge_weight.append(0.0)
                self.hyperedge_sources.append({})
            self.hyperedge_weight[h] += fact.completeness
            self.hyperedge_sources[h][chunk_id] = None
            for mention in fact.entities:
                e = self.entity_row.setdefault(mention.name, len(self.entity_row))
                if e == len(self.entity_types):
                    self.entity_types.append(collections.Counter())
                    self.entity_descriptions.append(set())
                self.entity_types[e][mention.type] += 1
                self.entity_descriptions[e].add(mention.description)
                self.incidence[e, h] = self.incidence.get((e, h), 0.0) + mention.key_score

    def entity_rows(self) -> Iterable[dict]:
        for e, name in enumerate(self.entity_row):
            entity_type = self.entity_types[e].most_common(1)[0][0]  # Counter keeps first-seen order on ties
            description = GRAPH_FIELD_SEP.join(sorted(self.entity_descriptions[e]))
            yield {"id": str(e), "contents": make_contents(name, description), "name": name, "type": entity_type,
                   "description": description}

    def hyperedge_rows(self) -> Iterable[dict]:
        for h, text in enumerate(self.hyperedge_row):
            yield {"id": str(h), "contents": text, "weight": self.hyperedge_weight[h],
                   "sources": list(self.hyperedge_sources[h])}

    def to_incidence(self) -> Incidence:
        pairs = np.array(list(self.incidence), dtype=np.int64).reshape(-1, 2)
        weights = np.fromiter(self.incidence.values(), np.float64, len(self.incidence))
        order = np.argsort(pairs[:, 0], kind="stable")  # grouped by entity, each in first-seen order
        offsets = np.zeros(len(self.entity_row) + 1, np.int64)
        np.cumsum(np.bincount(pairs[:, 0], minlength=len(self.entity_row)), out=offsets[1:])
        degree = np.bincount(pairs[:, 1], minlength=len(self.hyperedge_row)).astype(np.int32)
        return Incidence(offsets, pairs[order, 1], weights[order], np.array(self.hyperedge_weight, np.float64),
                         degree)


def write_graph(directory: str, graph: GraphAccumulator) -> None:
    """entities.jsonl, hyperedges.jsonl and, last (it marks the graph as written), incidence.npz."""
    for name, rows in ((ENTITIES_FILE, graph.entity_rows()), (HYPEREDGES_FILE, graph.hyperedge_rows())):
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        atomic_write_text(os.path.join(directory, name), text)

    def save(tmp: str) -> None:
        with open(tmp, "wb") as f:
            graph.to_incidence().save(f)

    atomic_write(os.path.join(directory, INCIDENCE_FILE), save)


# --------------------------------------------------------------------------------------------------- the build


def read_extractions(path: str) -> dict[str, list[HyperRelation]]:
    """The chunks already extracted: chunk id -> hyper-relations. A last line cut by a kill is dropped from
    the file; a bad line before it is an error naming the line."""
    done: dict[str, list[HyperRelation]] = {}
    if not os.path.exists(path):
        return done
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines[-1]:  # no newline at the end: the last write was cut
        with open(path, "rb+") as f:
            f.truncate(sum(len(line) + 1 for line in lines[:-1]))
    for line_no, line in enumerate(lines[:-1], start=1):
        try:
            row = json.loads(line)
            done[row["chunk"]] = [HyperRelation.from_json(fact) for fact in row["facts"]]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{line_no}: not an extraction record ({type(e).__name__}: {e}); delete "
                             f"{os.path.dirname(path)} to extract again") from None
    return done


def extract_chunks(chunks: list[Chunk], extractor, log_path: str,
                   progress: bool = True) -> dict[str, list[HyperRelation]]:
    """Every chunk's hyper-relations: those in `log_path` as they are, the rest from `extractor`, each appended
    to the log as it finishes."""
    done = read_extractions(log_path)
    todo = [c for c in chunks if c.id not in done]
    if done and todo:
        print(f"resuming extraction: {len(chunks) - len(todo)} of {len(chunks)} chunks done ({log_path})",
              file=sys.stderr)
    with open(log_path, "a", encoding="utf-8") as log, \
            tqdm(total=len(chunks), initial=len(chunks) - len(todo), desc="extract", unit="chunk",
                 disable=not progress) as bar:
        for i, facts in extractor.extract_many([c.text for c in todo]):
            row = {"chunk": todo[i].id, "facts": [f.to_json() for f in facts]}
            log.write(json.dumps(row, ensure_ascii=False) + "\n")
            log.flush()
            done[todo[i].id] = facts
            bar.update(1)
            if counts := getattr(extractor, "counts", None):
                bar.set_postfix(counts, refresh=False)
    return done


def embed_rows(directory: str, rows_file: str, index_file: str, encoder, batch_size: int, progress: bool) -> None:
    """Embed the `contents` of every row of `rows_file` (resumable) into a FAISS flat index `index_file`."""
    path = os.path.join(directory, rows_file)
    if os.path.getsize(path) == 0:  # no entities: an empty index
        faiss.write_index(new_index("flat", encoder.dim, 0), os.path.join(directory, index_file))
        return
    with Corpus(path, progress=False) as rows:
        if progress:
            print(f"embedding {len(rows)} {rows_file.split('.')[0]}", file=sys.stderr)
        index = new_index("flat", encoder.dim, len(rows))  # script_build.py: faiss 'Flat', METRIC_INNER_PRODUCT
        workdir = os.path.join(directory, "encode_" + rows_file.split(".")[0])
        fill_index(index, encode_corpus(rows, encoder, workdir, batch_size, progress), progress)
    faiss.write_index(index, os.path.join(directory, index_file))


def _same_job(job_path: str, job: dict) -> bool:
    if not os.path.exists(job_path):
        return False
    with open(job_path, encoding="utf-8") as f:
        return json.load(f) == job


def build_hypergraph(corpus_path: str, out: str, extractor, encoder, chunker: TokenChunker | None = None,
                     batch_size: int = 256, progress: bool = True) -> dict:
    """Build the hypergraph of a JSONL corpus into directory `out` (see the module docstring); returns counts
    and seconds per stage. `encoder`: an `Encoder`, or any object with `dim`, `spec`, `encode_passages`."""
    seconds = {}
    start = time.perf_counter()
    out = out.rstrip("/")
    recover(out)
    tmp = partial_dir(out)
    chunker = chunker or TokenChunker()
    with Corpus(corpus_path, progress=progress) as corpus:  # a bad line stops the build before it writes
        chunks = corpus_chunks(corpus, chunker, progress)
        num_docs = len(corpus)
    seconds["chunk"] = time.perf_counter() - start
    stat = os.stat(corpus_path)
    job = {"corpus": [os.path.abspath(corpus_path), stat.st_size, stat.st_mtime_ns], "chunking": chunker.spec,
           "extractor": extractor.spec}
    job_path = os.path.join(tmp, JOB_FILE)
    if os.path.exists(tmp) and not _same_job(job_path, job):
        shutil.rmtree(tmp)  # another corpus, chunking or extractor: nothing there can be reused
    os.makedirs(tmp, exist_ok=True)
    atomic_write_text(job_path, json.dumps(job))

    if not os.path.exists(os.path.join(tmp, INCIDENCE_FILE)):
        start = time.perf_counter()
        extracted = extract_chunks(chunks, extractor, os.path.join(tmp, EXTRACTIONS_FILE), progress)
        seconds["extract"] = time.perf_counter() - start
        start = time.perf_counter()
        graph = GraphAccumulator()
        for chunk in chunks:
            graph.add(chunk.id, extracted[chunk.id])
        if not graph.hyperedge_row:
            raise ValueError(f"{corpus_path}: extraction found no hyper-relation in {len(chunks)} chunks: check "
                             "the extractor (an LLM's replies are in its cache file)")
        write_graph(tmp, graph)
        seconds["merge"] = time.perf_counter() - start

    start = time.perf_counter()
    embed_rows(tmp, ENTITIES_FILE, ENTITY_INDEX, encoder, batch_size, progress)
    embed_rows(tmp, HYPEREDGES_FILE, HYPEREDGE_INDEX, encoder, batch_size, progress)
    seconds["embed"] = time.perf_counter() - start
    incidence = Incidence.load(os.path.join(tmp, INCIDENCE_FILE))
    summary = {"kind": "hypergraph", "num_entities": incidence.num_entities,
               "num_hyperedges": incidence.num_hyperedges, "num_incidences": len(incidence.hyperedges),
               "num_chunks": len(chunks), "num_docs": num_docs, "corpus": os.path.abspath(corpus_path),
               "dim": encoder.dim, "encoder": dataclasses.asdict(encoder.spec), "extractor": extractor.spec,
               "chunking": chunker.spec}
    with open(os.path.join(tmp, META_FILE), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    for name in (EXTRACTIONS_FILE, JOB_FILE):
        if os.path.exists(os.path.join(tmp, name)):
            os.remove(os.path.join(tmp, name))
    for name in ("encode_entities", "encode_hyperedges"):
        shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
    commit(tmp, out)
    return {**summary, "seconds": seconds}
