"""convert between HF safetensors and jaxsearch params dirs: the `jaxsearch-convert` command, whose code is jaxsearch/cli/convert_checkpoint.py.
`python launch/convert_checkpoint.py --help` lists its arguments."""

from jaxsearch.cli.convert_checkpoint import main

if __name__ == "__main__":
    raise SystemExit(main())
