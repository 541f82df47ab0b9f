"""serve a retriever over HTTP (Search-R1's /retrieve API): the `jaxsearch-retriever` command, whose code is jaxsearch/cli/serve_retriever.py.
`python launch/serve_retriever.py --help` lists its arguments."""

from jaxsearch.cli.serve_retriever import main

if __name__ == "__main__":
    raise SystemExit(main())
