"""jaxsearch.cli: the commands (console scripts jaxsearch-*; launch/*.py are thin wrappers). Each module has
`main(argv=None)`. Bad input (a flag, a config key, an output directory) is one line on stderr, `error: ...`
naming the culprit, and exit status 2."""

import re
import sys

USAGE_ERROR = 2  # the exit status of bad input, as argparse's


def run_absl(run, module, argv=None) -> int | None:
    """`run(argv)` under absl's flag parsing of `argv` (default sys.argv), for the commands whose flags are absl's
    (`--config` files). --help prints `module`'s docstring and flags: absl's own help knows only the flags of the
    script file, which for a console script or launch/*.py is a wrapper. A --config.key override that the config
    file lacks, and a `ConfigError` / `OutputDirError` / `LockedError` from `run`, exit with one line naming it."""
    from absl import app, flags

    argv = sys.argv if argv is None else argv
    if any(a in ("-h", "--help") for a in argv[1:]):
        print(sys.modules[module].__doc__.strip() + "\n\nflags:\n" + flags.FLAGS.module_help(module))
        return 0
    app.run(_reporting_errors(run), argv=argv, flags_parser=_parse_flags)


def _parse_flags(argv):
    """absl's parsing, with an unknown --config.key in one line (ml_collections raises a KeyError or an
    AttributeError with a traceback). ml_collections reads the overrides from sys.argv: it is `argv` meanwhile.
    The override flags of an earlier call in this process are removed first (each parse defines its own)."""
    from absl import app, flags

    for name in [n for n in flags.FLAGS if n.startswith("config.")]:
        delattr(flags.FLAGS, name)
    saved, sys.argv = sys.argv, list(argv)
    try:
        return app.parse_flags_with_usage(argv)
    except (KeyError, AttributeError):
        message = _unknown_override(argv)
        if message is None:
            raise
        _fail(message)
    finally:
        sys.argv = saved


def _unknown_override(argv) -> str | None:
    """'--config.KEY: why' for the first --config.KEY override that the --config file lacks, else None."""
    from absl import flags

    from jaxsearch.config import unknown_key

    if "config" not in flags.FLAGS:
        return None
    path = None
    for i, a in enumerate(argv):
        if a in ("--config", "-config") and i + 1 < len(argv):
            path = argv[i + 1]
        elif re.match(r"-{1,2}config=", a):
            path = a.split("=", 1)[1]
    if path is None:
        return None
    tree = flags.FLAGS["config"].parser.parse(path)
    for a in argv:
        match = re.match(r"-{1,2}(?:no)?config\.([^=]+)", a)
        reason = match and unknown_key(tree, match.group(1), prefix="--config.")
        if reason:
            return f"--config.{match.group(1)}: {reason} (config {path})"
    return None


def _reporting_errors(run):
    """`run` with the errors of bad input (a config value, an output directory, a held lock) in one line."""

    def wrapped(argv):
        from jaxsearch.config import ConfigError
        from jaxsearch.files import LockedError, OutputDirError

        try:
            return run(argv)
        except (ConfigError, OutputDirError, LockedError) as e:
            _fail(str(e))

    return wrapped


def _fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USAGE_ERROR)
