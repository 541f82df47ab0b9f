"""Retrieval throughput: BM25 and FAISS Flat on a synthetic 100k-passage corpus, and the HTTP server
under concurrent clients, each beside a plain brute-force baseline measured in the same run.

    python bench/retrieval.py                    # ~5 min on 2 CPU cores
    python bench/retrieval.py --passages 20000   # quick look

Prints a markdown report (the figures in bench/RESULTS.md, section "Retrieval").
Baselines: BM25 vs rank-bm25 (scores every passage per query term, pure Python/numpy); FAISS Flat
vs numpy (one [queries, N] matmul + argpartition). Dense vectors are random unit rows standing in for
encoder outputs (search cost does not depend on the values); the encoder is timed separately.
"""

import argparse
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_corpus(path: str, n: int, seed: int = 0) -> list[list[str]]:
    """Write n passages (50-100 Zipf-distributed pseudo-words, like wiki-18's 100-word passages)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, size=rng.integers(3, 10))) for _ in range(30000)]
    probs = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05
    probs /= probs.sum()
    words = rng.choice(len(vocab), size=n * 100, p=probs)
    lengths = rng.integers(50, 101, size=n)
    passages, at = [], 0
    with open(path, "w") as f:
        for i, length in enumerate(lengths):
            toks = [vocab[w] for w in words[at : at + length]]
            at += length
            passages.append(toks)
            f.write(json.dumps({"id": str(i), "contents": f'"{toks[0]} {toks[1]}"\n{" ".join(toks)}'}) + "\n")
    return passages


def make_queries(passages: list[list[str]], n: int, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.integers(0, len(passages), size=n):
        toks = passages[i]
        out.append(" ".join(toks[j] for j in rng.choice(len(toks), size=rng.integers(3, 7), replace=False)))
    return out


def timed(fn, repeat: int = 1) -> float:
    """Best wall time of `repeat` calls, seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_bm25(corpus_path, passages, queries, index_dir, rows):
    from rank_bm25 import BM25Okapi

    from jaxsearch.retrieval.bm25 import BM25Retriever
    from jaxsearch.retrieval.build import build_bm25
    from jaxsearch.retrieval.corpus import Corpus

    rss0 = peak_rss_mb()
    start = time.perf_counter()
    corpus = Corpus(corpus_path, progress=False)
    scan_s = time.perf_counter() - start
    build_s = timed(lambda: build_bm25(corpus, index_dir, progress=False))
    rss_build = peak_rss_mb() - rss0
    retriever = BM25Retriever.load(index_dir, corpus)
    retriever.search(queries[:8], 10)
    search_s = timed(lambda: retriever.search(queries, 10), repeat=2)
    terms = retriever.analyzer.terms
    tokens = sum(len(terms(" ".join(p))) for p in passages)
    disk = sum(os.path.getsize(os.path.join(index_dir, f)) for f in os.listdir(index_dir))
    rows.append(("Corpus scan (offsets, validation)", f"{len(corpus) / scan_s:,.0f} passages/s", ""))
    rows.append(
        (
            "BM25 build (bm25s)",
            f"{build_s:.1f} s, peak RSS +{rss_build:,.0f} MB "
            f"({rss_build * 2**20 / tokens:.0f} bytes/token), index on disk {disk / 2**20:,.0f} MB",
            "",
        )
    )
    rows.append(
        ("BM25 search, batch %d, k=10" % len(queries), f"{len(queries) / search_s:,.0f} queries/s", "")
    )

    okapi = BM25Okapi([terms(" ".join(p)) for p in passages])
    sample = queries[:32]
    base_s = timed(lambda: [np.argpartition(-okapi.get_scores(terms(q)), 10)[:10] for q in sample])
    rows.append(
        (
            "  baseline: rank-bm25 brute force",
            f"{len(sample) / base_s:,.0f} queries/s",
            f"{(len(queries) / search_s) / (len(sample) / base_s):.0f}x",
        )
    )
    corpus.close()


def bench_flat(n, batch) -> list[tuple[str, str, str]]:
    """FAISS Flat as the retriever configures it (BLAS), FAISS's default dispatch, and numpy."""
    import faiss

    from jaxsearch.retrieval.dense import fill_index, new_index, prefer_blas

    faiss_default = faiss.cvar.distance_compute_blas_threshold
    rng = np.random.default_rng(0)
    rows = []
    for dim in (384, 768):
        base = rng.standard_normal((n, dim), dtype=np.float32)
        base /= np.linalg.norm(base, axis=1, keepdims=True)
        queries = rng.standard_normal((batch, dim), dtype=np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        index = new_index("flat", dim, n)
        fill_index(index, base, progress=False)
        faiss.cvar.distance_compute_blas_threshold = faiss_default
        default_s = timed(lambda: index.search(queries, 10), repeat=3)
        prefer_blas()
        search_s = timed(lambda: index.search(queries, 10), repeat=3)
        _, rows_faiss = index.search(queries, 10)

        def numpy_topk():
            scores = queries @ base.T
            top = np.argpartition(-scores, 10, axis=1)[:, :10]
            return np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1), 1)

        base_s = timed(numpy_topk, repeat=3)
        assert (numpy_topk() == rows_faiss).mean() > 0.99  # same answers
        rows.append(
            (
                f"FAISS Flat search (retriever: BLAS), d={dim}, batch {batch}, k=10",
                f"{batch / search_s:,.0f} queries/s",
                f"{base_s / search_s:.1f}x",
            )
        )
        rows.append(
            (
                f"  FAISS default dispatch (SIMD below queries*dim={faiss_default})",
                f"{batch / default_s:,.0f} queries/s",
                f"{base_s / default_s:.1f}x",
            )
        )
        rows.append(("  baseline: numpy matmul + argpartition", f"{batch / base_s:,.0f} queries/s", ""))
        del index, base
    return rows


def flat_rows_in_child(n, batch, wait_policy) -> list[tuple[str, str, str]]:
    """Run `bench_flat` in a fresh process: OMP_WAIT_POLICY only takes effect at process start."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    out = subprocess.run(
        [sys.executable, __file__, "--flat-only", "--passages", str(n), "--batch", str(batch)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    label = f"OMP_WAIT_POLICY={wait_policy}" if wait_policy else "OMP_WAIT_POLICY unset"
    return [(f"[{label}] {what}", result, ratio) for what, result, ratio in json.loads(out)]


def bench_encoder(batch, rows):
    from jaxsearch.retrieval.encoders import Encoder

    enc = Encoder("minilm", device="cpu")
    queries = [f"who founded the town number {i} on the river" for i in range(batch)]
    enc.encode_queries(queries[:8])
    s = timed(lambda: enc.encode_queries(queries))
    rows.append((f"MiniLM-L6 query encoding (CPU), batch {batch}", f"{batch / s:,.0f} queries/s", ""))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_server(corpus_path, index_dir, queries, clients_list, per_client, rows):
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "serve_retriever.py"),
            "--corpus",
            corpus_path,
            "--retriever",
            "bm25",
            "--index",
            index_dir,
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        for clients in clients_list:
            before = httpx.get(url + "/health").json()

            def client(i):
                lat = []
                with httpx.Client(timeout=60) as http:
                    for j in range(per_client):
                        q = queries[(i * per_client + j) % len(queries)]
                        start = time.perf_counter()
                        http.post(
                            url + "/retrieve", json={"queries": [q], "topk": 3, "return_scores": True}
                        ).raise_for_status()
                        lat.append(time.perf_counter() - start)
                return lat

            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                lat = np.concatenate(list(pool.map(client, range(clients)))) * 1000
            wall = time.perf_counter() - start
            after = httpx.get(url + "/health").json()
            avg_batch = (after["queries"] - before["queries"]) / max(1, after["batches"] - before["batches"])
            rows.append(
                (
                    f"Server BM25, {clients} clients x 1 query, k=3",
                    f"p50 {np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms, "
                    f"{len(lat) / wall:,.0f} queries/s",
                    f"avg batch {avg_batch:.1f}",
                )
            )
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=256, help="queries per search call")
    p.add_argument("--clients", default="1,16,64", help="concurrent server clients to try")
    p.add_argument("--requests-per-client", type=int, default=40)
    p.add_argument("--flat-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.flat_only:
        print(json.dumps(bench_flat(args.passages, args.batch)))
        return

    rows = []
    with tempfile.TemporaryDirectory() as work:
        corpus_path = os.path.join(work, "corpus.jsonl")
        passages = make_corpus(corpus_path, args.passages)
        queries = make_queries(passages, args.batch)
        index_dir = os.path.join(work, "bm25")
        bench_bm25(corpus_path, passages, queries, index_dir, rows)
        del passages
        import faiss

        rows.append(("FAISS OpenMP threads", str(faiss.omp_get_max_threads()), ""))
        for policy in ("", "PASSIVE"):
            rows += flat_rows_in_child(args.passages, args.batch, policy)
        bench_encoder(args.batch, rows)
        bench_server(
            corpus_path,
            index_dir,
            queries,
            [int(c) for c in args.clients.split(",")],
            args.requests_per_client,
            rows,
        )

    print(
        f"{args.passages:,} passages; {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores\n"
    )
    print("| what | result | vs baseline |\n|---|---|---|")
    for what, result, ratio in rows:
        print(f"| {what} | {result} | {ratio} |")


if __name__ == "__main__":
    main()
