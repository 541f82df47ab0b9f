"""Train a search agent with RL: jaxsearch-train (or python launch/train.py) --config configs/X.py [--config.key=...]

Runs the config's stages (synthetic world, SFT warm start, GRPO / PPO) under --workdir; rerunning the same
command after a crash or preemption resumes from the last checkpoint. A typo in --config.key is an error.
--workdir must be absent, empty or a workdir of this project (anything else is refused, never touched); a run
holds WORKDIR/train.lock, so a second one in the same workdir refuses to start and names the first.
Multi-host: set --config.distributed.coordinator=HOST:PORT, num_processes and process_id, or let
jax.distributed read them from the environment (TPU pods, SLURM).
"""

import os


from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsearch.cli import run_absl  # noqa: E402
from jaxsearch.files import DirLock, claim_output_dir  # noqa: E402

# workdirs written before the marker file (files.MARKER): the config recorded beside a stage (rl/pipeline.py), or
# a world being generated before it
WORKDIR_LAYOUTS = [("config.json", stage) for stage in ("world", "sft", "grpo", "ppo")] + [("world/corpus.jsonl",)]

config_flags.DEFINE_config_file("config", None, "a configs/*.py file with get_config()", lock_config=True)
flags.DEFINE_string("workdir", None, "output directory (default: runs/<config name>)")
flags.DEFINE_bool("progress", True, "show progress bars")


def _run(argv):
    del argv
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every save step at INFO
    import jax

    from jaxsearch import multihost

    cfg = flags.FLAGS.config
    if cfg is None:
        raise app.UsageError("--config is required, e.g. --config configs/tiny_cpu.py")
    multihost.init_distributed(cfg.distributed)
    name = os.path.splitext(os.path.basename(flags.FLAGS["config"].config_filename))[0]
    workdir = flags.FLAGS.workdir or os.path.join("runs", name)
    claim_output_dir(workdir, "--workdir", legacy=WORKDIR_LAYOUTS)
    # one lock per process: each process of a second multi-host run refuses on its own
    lock = "train.lock" if jax.process_count() == 1 else f"train.{jax.process_index()}.lock"
    with DirLock(os.path.join(workdir, lock)):
        from jaxsearch.rl import pipeline  # after the checks: a refusal is quick

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
