"""build a Graph-R1 hypergraph of a corpus: the `jaxsearch-hypergraph` command, whose code is jaxsearch/cli/build_hypergraph.py.
`python launch/build_hypergraph.py --help` lists its arguments."""

from jaxsearch.cli.build_hypergraph import main

if __name__ == "__main__":
    raise SystemExit(main())
