"""train a search agent: the config's stages (world, SFT, GRPO / PPO), resumable: the `jaxsearch-train` command, whose code is jaxsearch/cli/train.py.
`python launch/train.py --help` lists its arguments."""

from jaxsearch.cli.train import main

if __name__ == "__main__":
    raise SystemExit(main())
