"""build a BM25 or dense FAISS index of a corpus: the `jaxsearch-index` command, whose code is jaxsearch/cli/build_index.py.
`python launch/build_index.py --help` lists its arguments."""

from jaxsearch.cli.build_index import main

if __name__ == "__main__":
    raise SystemExit(main())
