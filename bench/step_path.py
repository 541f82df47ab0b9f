"""The files one RL step of the trainer passes through, as a reader follows it: which jaxsearch files the
step loop of `rl/trainer.py` calls into, in order, and every jaxsearch file that runs during the step.

    python bench/step_path.py [--config configs/tiny_cpu.py] [--step 2]

Runs a shortened tiny-world job (its SFT stage 10 steps, 3 RL steps) under `sys.setprofile` and traces the
`--step`-th loop iteration (from one `StepTimer()` to the next). Prints the sections (each call from the
trainer's loop into another file; a file called again right after itself counts once) and the whole set.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

SHORT = [
    "--config.total_steps=3", "--config.sft.steps=10", "--config.sft.batch_size=4", "--config.data.batch_size=4",
    "--config.data.group_size=2", "--config.data.eval_examples=4", "--config.eval_every=2",
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/tiny_cpu.py")
    parser.add_argument("--step", type=int, default=2, help="which loop iteration to trace (1 = the first)")
    args, overrides = parser.parse_known_args(argv)

    import importlib
    import json

    import jaxsearch
    from jaxsearch.rl import pipeline

    package = os.path.dirname(jaxsearch.__file__) + os.sep
    trainer = os.path.join(package, "rl", "trainer.py")
    cfg = importlib.import_module(args.config.removesuffix(".py").replace("/", ".")).get_config()
    for flag in SHORT + overrides:  # --config.a.b=v, v parsed as JSON where it can be
        path, _, value = flag.removeprefix("--config.").partition("=")
        *parents, leaf = path.split(".")
        node = cfg
        for name in parents:
            node = node[name]
        try:
            node[leaf] = json.loads(value)
        except json.JSONDecodeError:
            node[leaf] = value
    iteration, sections, everything = [0], [], []

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = frame.f_code.co_filename
        if not callee.startswith(package):
            return
        caller = frame.f_back.f_code.co_filename if frame.f_back else ""
        if caller == trainer and frame.f_code.co_name == "__init__" and callee.endswith("step_log.py"):
            iteration[0] += 1  # the loop's `StepTimer()`: a new iteration
        if iteration[0] != args.step:
            return
        rel = os.path.relpath(callee, package)
        if rel not in everything:
            everything.append(rel)
        if caller == trainer and callee != trainer and (not sections or sections[-1] != rel):
            sections.append(rel)

    with tempfile.TemporaryDirectory() as workdir:
        sys.setprofile(profile)
        try:
            pipeline.run(cfg, workdir, progress=False)
        finally:
            sys.setprofile(None)
    print(f"step {args.step}: the trainer's loop calls into {len(sections)} places, {len(set(sections))} files:")
    print("  rl/trainer.py -> " + " -> ".join(sections))
    print(f"files read by a reader of the step: {1 + len(set(sections))} (rl/trainer.py and the above)")
    print(f"every jaxsearch file that runs during the step: {len(everything)}")
    print("  " + " ".join(everything))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
