"""GRPO beside DAPO, Dr.GRPO and GSPO: the tiny world's main job (configs/tiny_cpu.py) under each objective
(configs/tiny_cpu_dapo.py, tiny_cpu_drgrpo.py, tiny_cpu_gspo.py), over seeds, their learning curves in one plot.

    python bench/objectives.py --seeds 0 --out bench/runs/objectives
    python bench/objectives.py --seeds 0 1 2 --out bench/runs/objectives --smooth 5
    python bench/objectives.py --seeds 0 --out bench/runs/objectives --no-run     # table and plot only
    python bench/objectives.py --out /tmp/objectives -- --config.total_steps=2 --config.sft.steps=10   # smoke

Each run is bench/tiny_world.py's (`launch/train.py --config CONFIG --config.seed=S --workdir OUT/NAME/seedS`,
about 11 minutes each on 2 CPU cores; a finished run is not redone, a stopped one resumes). Writes
OUT/table.md and OUT/seeds.csv (tiny_world's: held-out EM / F1 before -> after, behaviour) and
OUT/objectives.png: held-out EM (greedy) and the training reward against the RL step, one line per objective
(mean ± std over seeds). A DAPO step's logged reward is its ordinary rollout's, before dynamic sampling's
refills and the overlong penalty, so the training curves compare the same quantity.
"""

from __future__ import annotations

import argparse
import os
import sys

import tiny_world  # bench/: the main-job runner and its table

from jaxsearch.eval import curves

OBJECTIVES = {  # plot label -> config
    "GRPO": "configs/tiny_cpu.py",
    "DAPO": "configs/tiny_cpu_dapo.py",
    "Dr.GRPO": "configs/tiny_cpu_drgrpo.py",
    "GSPO": "configs/tiny_cpu_gspo.py",
}
PLOT = "objectives.png"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--out", default="bench/runs/objectives", help="workdirs OUT/NAME/seedS, the table, the plot")
    parser.add_argument("--smooth", type=int, default=1, help="trailing window (steps) for the training reward")
    parser.add_argument("--no-run", action="store_true", help="only tabulate and plot the runs already there")
    parser.add_argument("overrides", nargs="*", help="extra --config.key=value flags for every run (after --)")
    args = parser.parse_args(argv)
    configs = [os.path.join(tiny_world.ROOT, c) for c in OBJECTIVES.values()]
    flags = ["--configs", *configs, "--seeds", *map(str, args.seeds), "--out", args.out]
    tiny_world.main(flags + (["--no-run"] if args.no_run else []) + (["--", *args.overrides] if args.overrides else []))
    runs = {}
    for label, config in OBJECTIVES.items():
        group = os.path.join(args.out, os.path.splitext(os.path.basename(config))[0])
        if os.path.isdir(group) and any(curves.is_run(os.path.join(group, d)) for d in os.listdir(group)):
            runs[label] = group
    if not runs:
        print(f"no runs under {args.out}: nothing to plot")
        return 1
    out_png = os.path.join(args.out, PLOT)
    title = "Objectives on the tiny world: " + ", ".join(runs)
    curves.plot_learning_curve(runs, out_png, smooth=args.smooth, title=title)
    print(f"wrote {out_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
