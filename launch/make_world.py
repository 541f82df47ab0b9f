"""write a synthetic multi-hop world: the `jaxsearch-world` command, whose code is jaxsearch/cli/make_world.py.
`python launch/make_world.py --help` lists its arguments."""

from jaxsearch.cli.make_world import main

if __name__ == "__main__":
    raise SystemExit(main())
