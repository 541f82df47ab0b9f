"""Train a search agent with RL: jaxsearch-train (or python launch/train.py) --config configs/X.py [--config.key=...]

Runs the config's stages (synthetic world, SFT warm start, GRPO / PPO) under --workdir; rerunning the same
command after a crash or preemption resumes from the last checkpoint. A typo in --config.key is an error.
Multi-host: set --config.distributed.coordinator=HOST:PORT, num_processes and process_id, or let
jax.distributed read them from the environment (TPU pods, SLURM).
"""

import os


from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsearch.cli import run_absl  # noqa: E402

config_flags.DEFINE_config_file("config", None, "a configs/*.py file with get_config()", lock_config=True)
flags.DEFINE_string("workdir", None, "output directory (default: runs/<config name>)")
flags.DEFINE_bool("progress", True, "show progress bars")


def _run(argv):
    del argv
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every save step at INFO
    from jaxsearch import multihost
    from jaxsearch.rl import pipeline

    cfg = flags.FLAGS.config
    if cfg is None:
        raise app.UsageError("--config is required, e.g. --config configs/tiny_cpu.py")
    multihost.init_distributed(cfg.distributed)
    name = os.path.splitext(os.path.basename(flags.FLAGS["config"].config_filename))[0]
    workdir = flags.FLAGS.workdir or os.path.join("runs", name)
    pipeline.run(cfg, workdir, progress=flags.FLAGS.progress)
    stage = os.path.join(workdir, pipeline.rl_stage(cfg))
    metrics = os.path.join(stage, "metrics.jsonl")
    print(f"done: {workdir}")
    print(pipeline.eval_summary(metrics))
    print(
        f"metrics: {metrics} (TensorBoard: {os.path.join(stage, 'tb')}); "
        f"plots: notebooks/entropy_curves.ipynb with JAXSEARCH_RUNS='{{\"run\": \"{workdir}\"}}'"
    )


def main(argv=None):
    return run_absl(_run, __name__, argv)


if __name__ == "__main__":
    main()
