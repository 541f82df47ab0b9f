"""Serve a retriever over HTTP with Search-R1's API (so Search-R1 clients work against it).

    python launch/serve_retriever.py --corpus wiki-18.jsonl --retriever bm25 --index indexes/wiki18_bm25 --port 8000
    python launch/serve_retriever.py --corpus wiki-18.jsonl --retriever dense --index e5_Flat.index --encoder e5 --port 8000
    python launch/serve_retriever.py --retriever hypergraph --index indexes/2wiki_hg --port 8001

POST /retrieve {"queries": [str], "topk": int, "return_scores": bool} -> {"result": [[...], ...]};
GET /health. Accepts every request Search-R1's own server accepts (any number of queries, of any length;
empty lists; topk 0), and passes each passage's `contents` through byte for byte. Concurrent requests are
answered by one batched search. Binds 127.0.0.1 unless --host.

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
    p.add_argument("--cpu-faiss", action="store_true", help="keep the FAISS index on CPU even with faiss-gpu")
    p.add_argument("--ef-search", type=int, default=128, help="HNSW search breadth")
    p.add_argument("--nprobe", type=int, default=64, help="IVF cells visited per query")
    p.add_argument("--search-topk", type=int, default=10,
                   help="hypergraph: hyperedges per query on Graph-R1's /search (default 10, script_api.py's top_k)")
    args = p.parse_args(argv)
    if args.retriever != "hypergraph" and not args.corpus:
        p.error(f"--retriever {args.retriever} needs --corpus")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
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
                     search_topk=args.search_topk if args.retriever == "hypergraph" else None)
    print(f"serving {args.retriever} over {num_docs} passages on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
