"""jaxsearch.cli: the commands (console scripts jaxsearch-*; launch/*.py are thin wrappers). Each module has
`main(argv=None)`."""

import sys


def run_absl(run, module, argv=None) -> int | None:
    """`run(argv)` under absl's flag parsing of `argv` (default sys.argv), for the commands whose flags are absl's
    (`--config` files). --help prints `module`'s docstring and flags: absl's own help knows only the flags of the
    script file, which for a console script or launch/*.py is a wrapper."""
    from absl import app, flags

    argv = sys.argv if argv is None else argv
    if any(a in ("-h", "--help") for a in argv[1:]):
        print(sys.modules[module].__doc__.strip() + "\n\nflags:\n" + flags.FLAGS.module_help(module))
        return 0
    app.run(run, argv=argv)
