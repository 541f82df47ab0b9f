"""Graph-R1's hypergraph (issue 18): build time, retrieval queries/s and the stored graph's memory.

    python bench/hypergraph.py                         # the tiny world, then ~100k chunks; ~5 min on 2 cores
    python bench/hypergraph.py --scaled-chunks 20000   # quick look

Two parts, each in its own process (so each peak RSS is its own):
- tiny: the tiny world (seed 0) end to end: rule extractor, MiniLM embeddings, retrieval of every question
  (MiniLM query encoding included), and the share of questions whose first-hop passage is the source of one
  of the top-10 hyperedges.
- scaled: a synthetic world scaled to about `--scaled-chunks` passages (one chunk each), rule extractor.
  Embeddings there are hash-seeded random unit rows of MiniLM's width (flat search cost does not depend on the
  values); MiniLM's own passage and query encoding rates are measured on a sample of the graph's texts and
  the full embedding time extrapolated from them.
Prints a markdown report (bench/RESULTS.md, "Graph-R1 hypergraph (issue 18)").
"""

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the launch scripts (bench/retrieval.py)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402


from jaxsearch.data.world.generator import WorldConfig, generate_world, world_config  # noqa: E402
from jaxsearch.retrieval.encoders import Encoder, EncoderSpec  # noqa: E402
from jaxsearch.retrieval.hypergraph import HypergraphRetriever  # noqa: E402
from jaxsearch.retrieval.hypergraph_build import build_hypergraph  # noqa: E402
from jaxsearch.data.world.extractor import WorldExtractor  # noqa: E402

PASSAGES_PER_PERSON = 3.37  # passages of the scaled world per person (measured: 8,000 people -> 26,934)


class HashEncoder:
    """Random unit rows seeded by each text's hash: stands in for an encoder where only the cost of search
    matters."""

    spec = EncoderSpec("bench-hash-384")
    dim = 384

    def _encode(self, texts):
        out = np.empty((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            out[row] = np.random.default_rng(seed).standard_normal(self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def encode_passages(self, texts, batch_size=256):
        return self._encode(texts)

    def encode_queries(self, queries, batch_size=256):
        return self._encode(queries)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stored_memory(path: str, retriever: HypergraphRetriever) -> dict:
    """Bytes on disk per file, and what a loaded retriever holds in RAM (indexes, incidence, text offsets)."""
    disk = {name: os.path.getsize(os.path.join(path, name)) for name in sorted(os.listdir(path))}
    d = retriever.encoder.dim
    ram = {"faiss": 4 * d * (retriever.entity_index.ntotal + retriever.hyperedge_index.ntotal),
           "incidence": retriever.incidence.nbytes, "text offsets": 8 * (len(retriever.hyperedges) + 1)}
    return {"disk": disk, "ram": ram}


def time_search(retriever, queries=None, vectors=None, batch=256, reps=2) -> float:
    """Queries per second of `search` (texts) or `search_vectors` (embeddings), batches of `batch`, best of reps."""
    items = queries if queries is not None else vectors
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for i in range(0, len(items), batch):
            if queries is not None:
                retriever.search(queries[i:i + batch], 10)
            else:
                retriever.search_vectors(vectors[i:i + batch], 10)
        best = min(best, time.perf_counter() - start)
    return len(items) / best


def part_tiny(tmp: str) -> dict:
    world = generate_world(world_config("tiny", 0))
    world.write(os.path.join(tmp, "world"))
    out = os.path.join(tmp, "graph")
    start = time.perf_counter()
    encoder = Encoder("minilm")
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    summary = build_hypergraph(os.path.join(tmp, "world", "corpus.jsonl"), out, WorldExtractor.from_dir(
        os.path.join(tmp, "world")), encoder, progress=False)
    build_s = time.perf_counter() - start
    retriever = HypergraphRetriever.load(out, encoder=encoder, progress=False)
    questions = [q for split in ("train", "dev", "test") for q in world.questions[split]]
    texts = [q.question for q in questions]
    qps = time_search(retriever, queries=texts)
    vectors = encoder.encode_queries(texts)
    graph_qps = time_search(retriever, vectors=vectors)
    sources = [json.loads(line)["sources"] for line in open(os.path.join(out, "hyperedges.jsonl"))]
    found = 0
    for q, docs in zip(questions, retriever.search_vectors(vectors, 10)):
        passages = {s.split("#")[0] for d in docs for s in sources[int(d.id)]}
        found += q.supporting_ids[0] in passages
    return {"chunks": summary["num_chunks"], "entities": summary["num_entities"],
            "hyperedges": summary["num_hyperedges"], "incidences": summary["num_incidences"],
            "encoder_load_s": load_s, "build_s": build_s, "stages": summary["seconds"], "queries": len(texts),
            "qps": qps, "graph_qps": graph_qps, "hop1_recall": found / len(questions),
            "memory": stored_memory(out, retriever), "peak_rss_mb": peak_rss_mb()}


def part_scaled(tmp: str, chunks: int) -> dict:
    people = max(60, round(chunks / PASSAGES_PER_PERSON))
    config = dataclasses.replace(WorldConfig(), n_people=people, n_cities=people // 8, n_countries=40,
                                 n_orgs=people // 5, n_films=people // 6, n_books=people // 6,
                                 n_distractors=people // 4, split_sizes=(20, 5, 5))
    start = time.perf_counter()
    world = generate_world(config)
    world.write(os.path.join(tmp, "world"))
    world_s = time.perf_counter() - start
    del world
    out = os.path.join(tmp, "graph")
    rss_before = peak_rss_mb()
    start = time.perf_counter()
    summary = build_hypergraph(os.path.join(tmp, "world", "corpus.jsonl"), out, WorldExtractor.from_dir(
        os.path.join(tmp, "world")), HashEncoder(), progress=False)
    build_s = time.perf_counter() - start
    build_rss = peak_rss_mb()

    start = time.perf_counter()
    retriever = HypergraphRetriever.load(out, encoder=HashEncoder(), progress=False)
    open_s = time.perf_counter() - start
    vectors = HashEncoder().encode_queries([f"query {i}" for i in range(1024)])
    graph_qps = time_search(retriever, vectors=vectors)
    start = time.perf_counter()  # the two FAISS searches alone
    for i in range(0, len(vectors), 256):
        retriever.entity_index.search(vectors[i:i + 256], 5)
        retriever.hyperedge_index.search(vectors[i:i + 256], 5)
    faiss_qps = len(vectors) / (time.perf_counter() - start)

    minilm = Encoder("minilm")
    rng = np.random.default_rng(0)
    texts = [retriever.hyperedges[int(r)].contents for r in rng.choice(len(retriever.hyperedges), 1024, replace=False)]
    minilm.encode_passages(texts[:64])
    start = time.perf_counter()
    minilm.encode_passages(texts)
    passage_rate = len(texts) / (time.perf_counter() - start)
    start = time.perf_counter()
    minilm.encode_queries([f"Who directed {t.split()[0]}?" for t in texts[:512]])
    query_rate = 512 / (time.perf_counter() - start)
    n_texts = summary["num_entities"] + summary["num_hyperedges"]
    return {"chunks": summary["num_chunks"], "entities": summary["num_entities"],
            "hyperedges": summary["num_hyperedges"], "incidences": summary["num_incidences"],
            "world_s": world_s, "build_s": build_s, "stages": summary["seconds"],
            "build_peak_rss_mb": build_rss, "rss_before_mb": rss_before, "open_s": open_s, "graph_qps": graph_qps,
            "faiss_qps": faiss_qps, "minilm_passages_per_s": passage_rate, "minilm_queries_per_s": query_rate,
            "minilm_embed_s_estimate": n_texts / passage_rate, "memory": stored_memory(out, retriever),
            "max_degree": int(retriever.incidence.entity_degree.max()),
            "mean_degree": float(retriever.incidence.entity_degree.mean())}


def mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB" if n >= 2**20 else f"{n / 2**10:,.1f} KB"


def cpu_name() -> str:
    """The CPU's model name (`lscpu`'s "Model name", from /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_line(ram: dict) -> str:
    return (f"{mb(sum(ram.values()))} (FAISS {mb(ram['faiss'])}, incidence {mb(ram['incidence'])}, "
            f"text offsets {mb(ram['text offsets'])})")


def disk_line(disk: dict) -> str:
    return f"{mb(sum(disk.values()))} (" + ", ".join(f"{name} {mb(n)}" for name, n in disk.items()) + ")"


def report(tiny: dict, scaled: dict, args) -> str:
    command = f"python bench/hypergraph.py --scaled-chunks {args.scaled_chunks}"
    lines = [f"CPU: {cpu_name()}, {os.cpu_count()} cores; command: {command}", "",
             "| what | tiny world (MiniLM) | scaled world (hash embeddings) |", "|---|---|---|"]

    def row(name, a, b):
        lines.append(f"| {name} | {a} | {b} |")

    row("chunks (one per passage)", f"{tiny['chunks']:,}", f"{scaled['chunks']:,}")
    row("entities / hyperedges / incidences", f"{tiny['entities']:,} / {tiny['hyperedges']:,} / {tiny['incidences']:,}",
        f"{scaled['entities']:,} / {scaled['hyperedges']:,} / {scaled['incidences']:,}")
    st, ss = tiny["stages"], scaled["stages"]
    row("build: scan + chunk / extract / merge + write", f"{st['chunk']:.2f} / {st['extract']:.2f} / {st['merge']:.2f} s",
        f"{ss['chunk']:.1f} / {ss['extract']:.1f} / {ss['merge']:.1f} s")
    row("build: embed + FAISS", f"{st['embed']:.1f} s (MiniLM)",
        f"{ss['embed']:.1f} s (hash); MiniLM: ~{scaled['minilm_embed_s_estimate'] / 60:.0f} min at "
        f"{scaled['minilm_passages_per_s']:.0f} texts/s")
    row("build total", f"{tiny['build_s']:.1f} s (+{tiny['encoder_load_s']:.1f} s loading MiniLM)",
        f"{scaled['build_s']:.1f} s (world generation {scaled['world_s']:.1f} s not included)")
    row("build peak RSS", f"{tiny['peak_rss_mb']:,.0f} MB (process, MiniLM included)",
        f"{scaled['build_peak_rss_mb']:,.0f} MB (process; {scaled['rss_before_mb']:,.0f} MB before the build)")
    row("open the graph", "", f"{scaled['open_s']:.1f} s")
    row("retrieval, batch 256, k=10, from text", f"{tiny['qps']:,.0f} queries/s ({tiny['queries']} questions)",
        f"MiniLM query encoding alone: {scaled['minilm_queries_per_s']:,.0f} queries/s")
    row("retrieval from query vectors (2 FAISS searches + routes + fusion)", f"{tiny['graph_qps']:,.0f} queries/s",
        f"{scaled['graph_qps']:,.0f} queries/s (the 2 FAISS searches alone: {scaled['faiss_qps']:,.0f})")
    row("first-hop passage among the top-10 hyperedges' sources", f"{tiny['hop1_recall']:.3f}", "")
    row("entity degree (mean / max)", "", f"{scaled['mean_degree']:.1f} / {scaled['max_degree']:,}")
    row("stored graph in RAM when loaded", ram_line(tiny["memory"]["ram"]), ram_line(scaled["memory"]["ram"]))
    row("stored graph on disk", disk_line(tiny["memory"]["disk"]), disk_line(scaled["memory"]["disk"]))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scaled-chunks", type=int, default=100_000, help="about how many chunks the scaled world has")
    p.add_argument("--part", choices=["tiny", "scaled"], default=None, help="run one part here, print its JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.part == "tiny":
            print(json.dumps(part_tiny(tmp)))
            return 0
        if args.part == "scaled":
            print(json.dumps(part_scaled(tmp, args.scaled_chunks)))
            return 0
    results = {}
    for part in ("tiny", "scaled"):
        cmd = [sys.executable, os.path.abspath(__file__), "--part", part, "--scaled-chunks", str(args.scaled_chunks)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            print(done.stderr, file=sys.stderr)
            return done.returncode
        results[part] = json.loads(done.stdout.strip().splitlines()[-1])
    print(report(results["tiny"], results["scaled"], args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
