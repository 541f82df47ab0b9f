"""serve a trained agent behind the OpenAI chat API: the `jaxsearch-serve` command, whose code is jaxsearch/cli/serve_agent.py.
`python launch/serve_agent.py --help` lists its arguments."""

from jaxsearch.cli.serve_agent import main

if __name__ == "__main__":
    raise SystemExit(main())
