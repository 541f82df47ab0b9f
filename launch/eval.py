"""evaluate a checkpoint on QA datasets: the `jaxsearch-eval` command, whose code is jaxsearch/cli/eval.py.
`python launch/eval.py --help` lists its arguments."""

from jaxsearch.cli.eval import main

if __name__ == "__main__":
    raise SystemExit(main())
