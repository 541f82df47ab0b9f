"""Serve a retriever over HTTP with Search-R1's API (so Search-R1 clients work against it).

    python launch/serve_retriever.py --corpus wiki-18.jsonl --retriever bm25 --index indexes/wiki18_bm25 --port 8000
    python launch/serve_retriever.py --corpus wiki-18.jsonl --retriever dense --index e5_Flat.index --encoder e5 --port 8000
    python launch/serve_retriever.py --retriever hypergraph --index indexes/2wiki_hg --port 8001

POST /retrieve {"queries": [str], "topk": int, "return_scores": bool} -> {"result": [[...], ...]};
GET /health. Accepts every request Search-R1's own server accepts (empty lists; topk 0) within the limits
below, and passes each passage's `contents` through byte for byte. Concurrent requests are answered by
batched searches; a large request is searched in parts (--max-batch queries, --max-batch-chars characters
per search), requests least served first, so it does not hold up a small one. Binds 127.0.0.1 unless --host.

Limits, checked before the work they bound (a request over one gets a 413 or 400 naming it): --max-body-bytes
(from Content-Length, before reading), JSON nested at most 32 levels and UTF-8 (before parsing),
--max-queries per request and --max-query-chars per query (before searching).

--retriever hypergraph (a directory from launch/build_hypergraph.py; no --corpus) also serves Graph-R1's
POST /search {"queries": [str]} -> ['{"results": [{"<knowledge>": text, "<coherence>": score}, ...]}', ...],
so Graph-R1's and EKA's own clients work against it.
"""
import argparse
import os
import sys

# FAISS's OpenMP threads spin between calls and starve its BLAS threads: on 2 cores a Flat search ran
# 3-5x slower than with passive waiting (bench/retrieval.py). Must be set before faiss is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from jaxsearch.retrieval import bm25, dense  # noqa: E402
from jaxsearch.retrieval.server import Limits  # noqa: E402

MEMORY_NOTES = f"""memory (the corpus stays on disk; RAM holds 8 bytes/passage of line offsets):
{bm25.MEMORY}

dense {dense.MEMORY}
"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, epilog=MEMORY_NOTES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=None, help="JSONL corpus: {id, contents} or {id, title, text} per line "
                   "(bm25, dense)")
    p.add_argument("--retriever", required=True, choices=["bm25", "dense", "hypergraph"])
    p.add_argument("--index", default=None, help="index dir from build_index.py, or a bare FAISS file "
                   "(e.g. Search-R1's e5_Flat.index); without it the corpus is indexed in RAM at start")
    p.add_argument("--encoder", default=None, help="dense: e5 | bge | minilm | model (default: the index's, else e5); "
                   "hypergraph: bge-large | minilm | model (default: the one it was built with)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--default-topk", type=int, default=3, help="topk when a request omits it")
    p.add_argument("--max-topk", type=int, default=0, help="refuse a larger topk (0: no limit but the corpus)")
    p.add_argument("--max-batch", type=int, default=1024,
                   help="queries per batched search (a larger request is searched in parts)")
    p.add_argument("--max-batch-chars", type=int, default=256,
                   help="characters per batched search (at least one query): how long a large request may hold "
                   "a small one (BM25 on 2 cores: ~0.1-0.3 ms a call; a longer BM25 query is scored in pieces of "
                   "this many characters); raise it (e.g. 100000) for bigger encoder "
                   "batches when a dense index on a GPU serves one trainer")
    p.add_argument("--max-body-bytes", type=int, default=Limits.max_body_bytes,
                   help=f"refuse a larger request body (413; default {Limits.max_body_bytes:,})")
    p.add_argument("--max-queries", type=int, default=Limits.max_queries,
                   help=f"refuse a request with more queries (400; default {Limits.max_queries:,}; Search-R1 "
                   "sends 2,560 per turn)")
    p.add_argument("--max-query-chars", type=int, default=Limits.max_query_chars,
                   help=f"refuse a longer query (400; default {Limits.max_query_chars:,} characters)")
    p.add_argument("--cpu-faiss", action="store_true", help="keep the FAISS index on CPU even with faiss-gpu")
    p.add_argument("--ef-search", type=int, default=128, help="HNSW search breadth")
    p.add_argument("--nprobe", type=int, default=64, help="IVF cells visited per query")
    p.add_argument("--search-topk", type=int, default=10,
                   help="hypergraph: hyperedges per query on Graph-R1's /search (default 10, script_api.py's top_k)")
    args = p.parse_args(argv)
    for flag in ("max_batch", "max_batch_chars", "max_body_bytes", "max_queries", "max_query_chars"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.retriever != "hypergraph" and not args.corpus:
        p.error(f"--retriever {args.retriever} needs --corpus")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # The search thread holds the GIL between its numpy calls; the event loop answering a small request beside
    # a large one waited up to the 5 ms default switch interval at each step: 0.1 ms took a one-word query
    # beside 8,192 others from 3.7x to 2.0x its latency alone, the large one no slower (bench/server_latency.py)
    sys.setswitchinterval(0.0001)
    import uvicorn

    from jaxsearch.retrieval.corpus import CorpusError
    from jaxsearch.retrieval.factory import make_retriever
    from jaxsearch.retrieval.server import create_app

    kwargs = {}
    if args.retriever == "hypergraph":
        kwargs = {"encoder": args.encoder, "use_gpu": not args.cpu_faiss}
    if args.retriever == "dense":
        kwargs = {"encoder": args.encoder, "use_gpu": not args.cpu_faiss, "ef_search": args.ef_search,
                  "nprobe": args.nprobe}
    try:
        retriever = make_retriever(args.retriever, corpus=args.corpus, index=args.index, **kwargs)
    except (CorpusError, ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # what a search returns from: the passages, or the hypergraph's hyperedges
    num_docs = len(retriever.hyperedges if args.retriever == "hypergraph" else retriever.corpus)
    app = create_app(retriever, args.retriever, num_docs=num_docs, default_topk=args.default_topk,
                     max_topk=args.max_topk or None, max_batch=args.max_batch,
                     search_topk=args.search_topk if args.retriever == "hypergraph" else None,
                     limits=Limits(args.max_body_bytes, args.max_queries, args.max_query_chars),
                     max_batch_chars=args.max_batch_chars)
    print(f"serving {args.retriever} over {num_docs} passages on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
