"""Build a BM25 or dense (FAISS) index of a JSONL corpus.

    python launch/build_index.py --corpus wiki-18.jsonl --retriever bm25 --out indexes/wiki18_bm25
    python launch/build_index.py --corpus wiki-18.jsonl --retriever dense --encoder e5 --faiss ivfpq \\
        --out indexes/wiki18_e5_ivfpq

The previous index at --out stays loadable until the new one is complete (the build writes
<out>.partial/ and renames at the end). A dense build interrupted while encoding resumes from its
last finished batch when the same command is run again. --out must be absent, empty or an index this
project wrote: anything else is refused before any work, and never deleted.
"""
import argparse
import os
import sys

# FAISS's OpenMP threads spin between calls and starve its BLAS threads: on 2 cores a Flat search ran
# 3-5x slower than with passive waiting (bench/retrieval.py). Must be set before faiss is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from jaxsearch.retrieval import bm25, build, dense  # noqa: E402
from jaxsearch.retrieval.corpus import CorpusError

MEMORY_NOTES = f"""memory (the corpus stays on disk; RAM holds 8 bytes/passage of line offsets):
{bm25.MEMORY}

dense {dense.MEMORY}

{build.MEMORY}
"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, epilog=MEMORY_NOTES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="JSONL corpus: {id, contents} or {id, title, text} per line")
    p.add_argument("--retriever", required=True, choices=["bm25", "dense"])
    p.add_argument("--out", required=True, help="index directory to write: absent, empty or an index built here before")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    g = p.add_argument_group("bm25")
    g.add_argument("--k1", type=float, default=0.9, help="BM25 k1 (default 0.9, Pyserini's)")
    g.add_argument("--b", type=float, default=0.4, help="BM25 b (default 0.4, Pyserini's)")
    g.add_argument("--stemmer", default="porter", choices=["porter", "none"],
                   help="porter (default): Pyserini's default Lucene English analysis; none: the same without "
                        "stemming (Pyserini's -stemmer none). Recorded in the index")
    g = p.add_argument_group("dense")
    g.add_argument("--encoder", default="e5", help="e5 | bge | minilm | a sentence-transformers model id or dir")
    g.add_argument("--faiss", default="flat", choices=dense.KINDS, help="FAISS index kind (see memory below)")
    g.add_argument("--batch-size", type=int, default=256, help="passages per encoder batch")
    g.add_argument("--hnsw-m", type=int, default=32, help="HNSW neighbours per node")
    g.add_argument("--ivf-nlist", type=int, default=None, help="IVF cells (default ~4*sqrt(N), a power of 2)")
    g.add_argument("--pq-m", type=int, default=64, help="PQ bytes per vector (must divide the dim)")
    g.add_argument("--device", default=None, help="encoder device, e.g. cuda or cpu (default: auto)")
    g.add_argument("--fp16", action="store_true", help="encode in float16 on CUDA")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from jaxsearch.retrieval.build import build_bm25, build_dense, claim_out, recover
    from jaxsearch.retrieval.corpus import Corpus

    progress = not args.no_progress
    try:
        claim_out(args.out, inputs=(args.corpus,))
        recover(args.out)
        corpus = Corpus(args.corpus, progress=progress)
        if args.retriever == "bm25":
            analyzer = bm25.Analyzer(stemmer=args.stemmer)
            build_bm25(corpus, args.out, k1=args.k1, b=args.b, analyzer=analyzer, progress=progress)
        else:
            from jaxsearch.retrieval.encoders import Encoder

            build_dense(corpus, args.out, Encoder(args.encoder, device=args.device, fp16=args.fp16), args.faiss,
                        batch_size=args.batch_size, hnsw_m=args.hnsw_m, ivf_nlist=args.ivf_nlist,
                        pq_m=args.pq_m, progress=progress)
    except (CorpusError, ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the previous index at {args.out} is untouched; rerun the same command to resume",
              file=sys.stderr)
        return 130
    print(f"wrote {args.retriever} index of {len(corpus)} passages to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
