"""Our BM25 against Pyserini's (the Lucene index Search-R1's BM25 server reads) on a real-text corpus sample.

    pip install "pyserini==0.22.*"      # bench only (needs Java 17); not in any extra
    python bench/bm25_pyserini.py --out /tmp/bm25_vs_pyserini

Corpus: the English text of Vim's help files (/usr/share/vim/vim90/doc/*.txt, shipped with the OS), cut into
passages of up to 100 words at blank lines, `contents` = '"file"\\ntext'. Queries: the first 4-10 words of
passages drawn with a fixed seed. Both sides index the same corpus.jsonl with BM25 k1=0.9, b=0.4; Pyserini
with its default analyzer (`DefaultLuceneDocumentGenerator`), ours with `Analyzer()` (and, for comparison,
the analysis of indexes saved before analyzers were recorded). Reports overlap@10 (mean |ours & Pyserini's|
/ |Pyserini's| over queries with results), identical top-10 lists, the share of passages analyzed to exactly
Pyserini's terms, and build time and single-process queries/s of each.
"""

import argparse
import glob
import json
import os
import random
import re
import subprocess
import sys
import time



def make_corpus(doc_dir: str, path: str, max_words: int = 100) -> list[str]:
    """Write corpus.jsonl from the help files; return the passages' texts."""
    texts = []
    with open(path, "w", encoding="utf-8") as f:
        for name in sorted(glob.glob(os.path.join(doc_dir, "*.txt"))):
            title = os.path.basename(name)[:-4]
            with open(name, encoding="utf-8", errors="replace") as src:
                paragraphs = re.split(r"\n\s*\n", src.read())
            for para in paragraphs:
                words = para.split()
                for i in range(0, len(words), max_words):
                    chunk = words[i : i + max_words]
                    if len(chunk) < 8:
                        continue
                    text = " ".join(chunk)
                    f.write(json.dumps({"id": str(len(texts)), "contents": f'"{title}"\n{text}'}) + "\n")
                    texts.append(text)
    return texts


def make_queries(texts: list[str], n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    queries = []
    for text in rng.sample(texts, n):
        words = [w for w in re.findall(r"[A-Za-z][A-Za-z'-]*", text)]
        queries.append(" ".join(words[: rng.randint(4, 10)]) or text[:40])
    return queries


def ours(corpus_path, out, queries, analyzer):
    from jaxsearch.retrieval.bm25 import BM25Retriever
    from jaxsearch.retrieval.build import build_bm25
    from jaxsearch.retrieval.corpus import Corpus

    corpus = Corpus(corpus_path, progress=False)
    start = time.perf_counter()
    build_bm25(corpus, out, analyzer=analyzer, progress=False)
    build_s = time.perf_counter() - start
    retriever = BM25Retriever.load(out, corpus)
    retriever.search(queries[:8], 10)
    start = time.perf_counter()
    results = retriever.search(queries, 10)
    search_s = time.perf_counter() - start
    return [[d.id for d in docs] for docs in results], build_s, len(queries) / search_s


def pyserini(corpus_path, out, queries):
    from pyserini.search.lucene import LuceneSearcher

    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pyserini.index.lucene", "--collection", "JsonCollection", "--input",
         os.path.dirname(corpus_path), "--index", out, "--generator", "DefaultLuceneDocumentGenerator",
         "--threads", "1", "--storeRaw"],
        check=True, capture_output=True,
    )  # fmt: skip
    build_s = time.perf_counter() - start  # includes the JVM start
    searcher = LuceneSearcher(out)  # BM25 k1=0.9, b=0.4
    for q in queries[:8]:
        searcher.search(q, 10)
    start = time.perf_counter()
    results = [[h.docid for h in searcher.search(q, 10)] for q in queries]
    search_s = time.perf_counter() - start
    return results, build_s, len(queries) / search_s


def overlap(a: list[list[str]], b: list[list[str]]) -> tuple[float, float]:
    """(mean |a & b| / |b| over queries where b has results, share of identical lists)."""
    scored = [len(set(x) & set(y)) / len(y) for x, y in zip(a, b) if y]
    return sum(scored) / len(scored), sum(x == y for x, y in zip(a, b)) / len(b)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="work directory (corpus, both indexes)")
    p.add_argument("--docs", default="/usr/share/vim/vim90/doc", help="directory of English .txt files")
    p.add_argument("--queries", type=int, default=2000)
    args = p.parse_args()
    import bm25s.stopwords
    from pyserini.analysis import Analyzer as LuceneAnalyzer
    from pyserini.analysis import get_lucene_analyzer

    from jaxsearch.retrieval.bm25 import Analyzer

    os.makedirs(os.path.join(args.out, "corpus"), exist_ok=True)
    corpus_path = os.path.join(args.out, "corpus", "corpus.jsonl")
    texts = make_corpus(args.docs, corpus_path)
    queries = make_queries(texts, args.queries)
    lucene = LuceneAnalyzer(get_lucene_analyzer())
    sample = random.Random(1).sample(range(len(texts)), min(2000, len(texts)))
    with open(corpus_path, encoding="utf-8") as f:
        contents = [json.loads(line)["contents"] for line in f]
    same_terms = sum(Analyzer().terms(contents[i]) == lucene.analyze(contents[i]) for i in sample) / len(sample)

    theirs, p_build, p_qps = pyserini(corpus_path, os.path.join(args.out, "lucene"), queries)
    mine, o_build, o_qps = ours(corpus_path, os.path.join(args.out, "ours"), queries, Analyzer())
    legacy = Analyzer(tokenizer="word2", stopwords=tuple(bm25s.stopwords.STOPWORDS_EN), stemmer="none")
    old, _, _ = ours(corpus_path, os.path.join(args.out, "ours_legacy"), queries, legacy)
    ov, same = overlap(mine, theirs)
    ov_old, same_old = overlap(old, theirs)
    print(f"corpus: {len(texts):,} passages from {args.docs}; {len(queries):,} queries")
    print(f"passages analyzed to exactly Pyserini's terms: {same_terms:.4f} (sample of {len(sample)})")
    print("| retriever | overlap@10 with Pyserini | identical top-10 | build | queries/s (1 process) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| Pyserini 0.22.1 (Lucene) | 1 | 1 | {p_build:.1f} s | {p_qps:,.0f} |")
    print(f"| jaxsearch bm25s, Analyzer() | {ov:.4f} | {same:.4f} | {o_build:.1f} s | {o_qps:,.0f} |")
    print(f"| jaxsearch bm25s, analysis before this change | {ov_old:.4f} | {same_old:.4f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
