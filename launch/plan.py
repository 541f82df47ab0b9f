"""memory plan of a config on a mesh, without weights: the `jaxsearch-plan` command, whose code is jaxsearch/cli/plan.py.
`python launch/plan.py --help` lists its arguments."""

from jaxsearch.cli.plan import main

if __name__ == "__main__":
    raise SystemExit(main())
