"""Plots of training runs from their logs: the learning curve and the policy's entropy per tag over RL steps.

A run is a `python launch/train.py --workdir RUN` directory:

    RUN/grpo/metrics.jsonl   one JSON object per logged RL step (RUN/ppo/ for PPO: the stage "rl" here),
                             e.g. {"step": 3, "reward": 0.6, "entropy/think": 0.11, "eval/synthetic/em": 0.3}
    RUN/sft/metrics.jsonl    the SFT warm start ({"step": 1, "sft/loss": ...})

A directory whose sub-directories are runs (bench/tiny_world.py's `OUT/CONFIG/` with `seed0/ seed1/ ...`) is a
group: its runs are drawn as one mean line with a ±1 std band (and, for a single group, each run thinly).

    python -m jaxsearch.eval.curves --runs runs/tiny_cpu --out docs/
    python -m jaxsearch.eval.curves --curve-runs bench/runs/papers_settings/tiny_cpu \\
        --entropy-runs bench/runs/papers_settings/tiny_cpu bench/runs/papers_settings/tiny_cpu_eka \\
        --smooth 5 --out docs/

write OUT/learning_curve.png (held-out EM and training reward against the RL step) and OUT/entropy_per_tag.png
(mean entropy of the policy's <think> / <search> / <answer> tokens against the RL step, one panel per tag).

This module reads files and draws; it imports numpy, json and matplotlib only (no jax, nothing else of
jaxsearch), so notebooks/runs.py and the notebooks share its reader and its plots. Figures are
`matplotlib.figure.Figure` objects on the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

STAGES = ("rl", "sft")
TAGS = ("think", "search", "answer")  # the entropy panels by default (jaxsearch.agent.segments' names)
LEARNING_CURVE_PNG = "learning_curve.png"
ENTROPY_PNG = "entropy_per_tag.png"

# ------------------------------------------------------------------------------------------------ reading


def metrics_path(run_dir: str, stage: str = "rl") -> str:
    """RUN/<stage>/metrics.jsonl; the "rl" stage is RUN/ppo/ for a PPO run, else RUN/grpo/."""
    if stage == "rl":
        stage = "ppo" if os.path.isdir(os.path.join(run_dir, "ppo")) else "grpo"
    return os.path.join(run_dir, stage, "metrics.jsonl")


def read_rows(path: str) -> list[dict]:
    """The JSON objects of a metrics.jsonl file, in file order.

    A malformed line is an error naming the file and line, except an unterminated last line (a write cut
    short by a kill), which is skipped with a warning.
    """
    with open(path) as f:
        lines = f.readlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines) and not line.endswith("\n"):
                warnings.warn(f"{path}:{number}: skipping an unterminated last line ({e})")
                continue
            raise ValueError(f"{path}:{number}: not a JSON object: {e}") from None
        if not isinstance(row, dict) or "step" not in row:
            raise ValueError(
                f"{path}:{number}: expected a JSON object with a 'step' field, got {line[:80]!r}"
            )
        rows.append(row)
    return rows


def to_columns(rows: list[dict]) -> dict[str, list]:
    """Rows -> {key: [value per step]} sorted by step; None where a step did not log that key.

    Rows with the same step are merged (a later row's value wins), so "step" holds each step once.
    """
    by_step = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), {}).update(row)
    steps = sorted(by_step)
    keys = sorted({k for row in by_step.values() for k in row if k != "step"})
    columns = {"step": steps}
    for key in keys:
        columns[key] = [by_step[s].get(key) for s in steps]
    return columns


def load_columns(path: str) -> dict[str, list]:
    """A metrics.jsonl file as columns (see `to_columns`); {"step": []} if the file does not exist."""
    if not os.path.exists(path):
        return {"step": []}
    return to_columns(read_rows(path))


def load_run(run_dir: str) -> dict[str, dict[str, list]]:
    """{stage: columns} for the stages in STAGES; a stage that has not run yet has an empty "step" column."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory {run_dir!r} does not exist (train with --workdir {run_dir})")
    return {stage: load_columns(metrics_path(run_dir, stage)) for stage in STAGES}


def series(columns: dict[str, list], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the steps that logged `key`; two empty lists if none did."""
    values = columns.get(key)
    if values is None:
        return [], []
    pairs = [(s, v) for s, v in zip(columns["step"], values) if v is not None]
    return [s for s, _ in pairs], [float(v) for _, v in pairs]


def has(columns: dict[str, list], key: str) -> bool:
    """Whether any step logged `key`."""
    return any(v is not None for v in columns.get(key, ()))


def eval_datasets(columns: dict[str, list], metric: str | None = None) -> list[str]:
    """Dataset names of the `eval/<dataset>/<metric>` keys (any metric if None), sorted."""
    names = set()
    for key in columns:
        parts = key.split("/", 2)
        if len(parts) == 3 and parts[0] == "eval" and (metric is None or parts[2] == metric):
            names.add(parts[1])
    return sorted(names)


# ------------------------------------------------------------------------------------------------ runs


def is_run(path: str) -> bool:
    """A training workdir: it has an RL or SFT stage's metrics.jsonl."""
    return any(os.path.exists(metrics_path(path, stage)) for stage in ("rl", "ppo", "sft"))


def _stages(item) -> dict[str, dict[str, list]]:
    """A run as {stage: columns}, from a run directory, a metrics.jsonl path, RL columns or stage columns."""
    if isinstance(item, str):
        if os.path.isfile(item):
            return {"rl": load_columns(item), "sft": {"step": []}}
        return load_run(item)
    if isinstance(item, Mapping) and "step" in item:  # one stage's columns: the RL stage
        return {"rl": dict(item), "sft": {"step": []}}
    if isinstance(item, Mapping):
        return {stage: dict(item.get(stage, {"step": []})) for stage in STAGES}
    raise TypeError(f"not a run: {type(item).__name__} (a run directory, metrics.jsonl path or columns)")


def _group_of_dir(path: str) -> list[tuple[str, dict]]:
    """A run directory -> [(its name, stages)]; a directory of runs (seed0/, seed1/, ...) -> each run."""
    if not os.path.isdir(path) or is_run(path):
        return [(os.path.basename(os.path.normpath(path)), _stages(path))]
    subdirs = sorted(d for d in os.listdir(path) if is_run(os.path.join(path, d)))
    if not subdirs:
        raise FileNotFoundError(f"{path!r} is no run (no grpo/, ppo/ or sft/ metrics.jsonl) and holds none")
    return [(d, _stages(os.path.join(path, d))) for d in subdirs]


class Groups(dict):
    """{group label: [(run label, {stage: columns}), ...]}: runs already resolved (`resolve_runs`)."""


def resolve_runs(runs) -> Groups:
    """What the plots take -> {group label: [(run label, {stage: columns}), ...]}.

    `runs` is a run directory, a directory of runs, or a list of them (`NAME=PATH` names one), each its own
    group labelled by its directory name; or a dict {label: run dir | directory of runs | metrics.jsonl path |
    columns | {stage: columns} | a list of those (one group of several runs)}.
    """
    if isinstance(runs, Groups):
        return runs
    if isinstance(runs, str):
        runs = [runs]
    if isinstance(runs, Mapping):
        items = list(runs.items())
    else:
        items = []
        for spec in runs:
            if isinstance(spec, str) and "=" in spec and not os.path.exists(spec):
                label, _, spec = spec.partition("=")
            elif isinstance(spec, str):
                label = os.path.basename(os.path.normpath(spec))
            else:
                raise TypeError("a list of runs holds paths; pass a dict {label: columns} for columns")
            items.append((label, spec))
    groups = Groups()
    for label, spec in items:
        if isinstance(spec, str):
            groups[label] = _group_of_dir(spec)
        elif isinstance(spec, Sequence):
            groups[label] = [
                (os.path.basename(os.path.normpath(s)) if isinstance(s, str) else f"run{i}", _stages(s))
                for i, s in enumerate(spec)
            ]
        else:
            groups[label] = [(label, _stages(spec))]
    return groups


# ------------------------------------------------------------------------------------------------ plotting


def smoothed(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average: point i is the mean of points max(0, i - window + 1) .. i."""
    values = [float(v) for v in values]
    if window <= 1:
        return values
    cumsum = np.concatenate([[0.0], np.cumsum(values)])
    return [
        float((cumsum[i + 1] - cumsum[max(0, i - window + 1)]) / (i + 1 - max(0, i - window + 1)))
        for i in range(len(values))
    ]


def _new_figure(n_panels: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.6 * n_panels, 3.9), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, n_panels, squeeze=False)[0]


def plot_panels(
    runs,
    panels: Sequence[tuple],
    out_png: str | None = None,
    *,
    title: str = "",
    stage: str = "rl",
    smooth: int = 1,
    show_runs: bool | None = None,
    xlabel: str | None = None,
):
    """One panel per (panel title, keys[, y label[, smooth]]); in each, per group and key, one line.

    A group of one run draws that run's values; a group of several draws their mean at the steps every run
    logged, with a ±1 std band, and (`show_runs`, by default when there is one group) each run thinly.
    `smooth` > 1 draws a trailing moving average of each run's values (`smoothed`) before the mean; a panel's
    own fourth item overrides it for that panel.
    A run that did not log a key is skipped with a printed note. Saves `out_png` if given.

    Returns (figure, plotted): plotted[panel][line label] = {"key", "x", "y"} (and "std" for a mean),
    exactly what each line draws. Line labels: the group's label for a group of one run ("GROUP: KEY" when a
    panel has several keys); for several runs "GROUP (mean ± std of N)" and "GROUP RUN" per run, or, when
    there is one group and one key, "mean ± std of N" and the run's label (the group is the title's).
    """
    from matplotlib.ticker import MaxNLocator

    groups = resolve_runs(runs)
    if show_runs is None:
        show_runs = len(groups) == 1
    fig, axes = _new_figure(len(panels))
    colors = [f"C{i}" for i in range(10)]
    plotted = {}
    for ax, panel in zip(axes, panels):
        name, keys = panel[0], list(panel[1])
        ylabel = panel[2] if len(panel) > 2 else None
        window = panel[3] if len(panel) > 3 and panel[3] is not None else smooth
        record = plotted[name] = {}
        line_index = 0
        for group, members in groups.items():
            for key in keys:
                color = colors[line_index % len(colors)]
                line_index += 1
                label = group if len(keys) == 1 else f"{group}: {key}"
                per_run = []
                for run_label, stages in members:
                    steps, values = series(stages.get(stage, {"step": []}), key)
                    who = group if len(members) == 1 else f"{group} {run_label}"
                    if not steps:
                        print(f"note: {who} logged no {key!r} ({stage}); not plotted")
                        continue
                    per_run.append((run_label, steps, smoothed(values, window)))
                if not per_run:
                    continue
                if len(members) == 1:
                    _, x, y = per_run[0]
                    ax.plot(x, y, color=color, marker="o", markersize=3 if len(x) <= 20 else 2, label=label)
                    record[label] = {"key": key, "x": [int(s) for s in x], "y": y}
                    continue
                if show_runs:
                    for run_label, x, y in per_run:
                        run_line = run_label if len(groups) == len(keys) == 1 else f"{label} {run_label}"
                        ax.plot(x, y, color=color, alpha=0.35, linewidth=0.9, marker=".", markersize=3,
                                label=run_line)
                        record[run_line] = {"key": key, "x": [int(s) for s in x], "y": y}
                common = sorted(set.intersection(*(set(x) for _, x, _ in per_run)))
                stacked = np.array([[dict(zip(x, y))[s] for s in common] for _, x, y in per_run])
                mean = stacked.mean(axis=0)
                std = stacked.std(axis=0, ddof=1) if len(per_run) > 1 else np.zeros_like(mean)
                mean_label = f"mean ± std of {len(per_run)}"
                if len(groups) > 1 or len(keys) > 1:
                    mean_label = f"{label} ({mean_label})"
                size = 4 if len(common) <= 20 else 2.5
                ax.plot(common, mean, color=color, linewidth=2, marker="o", markersize=size, label=mean_label)
                ax.fill_between(common, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)
                record[mean_label] = {
                    "key": key, "x": [int(s) for s in common], "y": mean.tolist(), "std": std.tolist()
                }
        ax.set_title(name)
        ax.set_xlabel(xlabel or ("RL step" if stage == "rl" else f"{stage} step"))
        if ylabel:
            ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.legend(fontsize=7.5)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    if title:
        fig.suptitle(title)
    if out_png:
        os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
        fig.savefig(out_png, dpi=110)
    return fig, plotted


def _datasets(groups, metric: str) -> list[str]:
    return sorted({
        d
        for members in groups.values()
        for _, stages in members
        for d in eval_datasets(stages["rl"], metric)
    })


def plot_learning_curve(runs, out_png: str | None = None, *, smooth: int = 1, title: str | None = None):
    """The main job's learning curve: held-out EM (`eval/<dataset>/em`, every dataset evaluated) and the
    training rollouts' reward against the RL step. Several runs of a group (seeds): mean ± std, each seed
    thinly. `smooth` averages the reward over a trailing window of steps (the evaluations are not smoothed).

    Returns (figure, plotted) as `plot_panels`; the panels are "held-out EM (greedy)" and "training reward"
    (with " (moving average of N steps)" when smoothed).
    """
    groups = resolve_runs(runs)
    em_keys = [f"eval/{d}/em" for d in _datasets(groups, "em")] or ["eval/synthetic/em"]
    names = ", ".join(f"{g} ({len(m)} seeds)" if len(m) > 1 else g for g, m in groups.items())
    reward_title = "training reward" + (f" (moving average of {smooth} steps)" if smooth > 1 else "")
    return plot_panels(
        groups,
        [
            ("held-out EM (greedy)", em_keys, "exact match", 1),
            (reward_title, ["reward"], "mean reward of the step's rollouts", smooth),
        ],
        out_png,
        title=title if title is not None else f"Learning curve: {names}",
    )


def plot_entropy_per_tag(
    runs,
    out_png: str | None = None,
    *,
    tags: Sequence[str] = TAGS,
    source: str = "train",
    smooth: int = 1,
    show_runs: bool | None = None,
    title: str | None = None,
    panel_titles: Sequence[str] | None = None,
):
    """Mean entropy of the policy's own tokens per tag (segment) against the RL step, one panel per tag, one
    line per group (e.g. the Search-R1 baseline against EKA; several seeds: mean ± std).

    source "train": the training rollouts' `entropy/<tag>`, every step; "eval": the held-out evaluations'
    `eval/<dataset>/entropy/<tag>` (every dataset evaluated). Panel titles default to "<tag> tokens".
    Returns (figure, plotted) as `plot_panels`.
    """
    groups = resolve_runs(runs)
    if source == "train":
        keys = [[f"entropy/{tag}"] for tag in tags]
    elif source == "eval":
        datasets = sorted({d for tag in tags for d in _datasets(groups, f"entropy/{tag}")}) or ["synthetic"]
        keys = [[f"eval/{d}/entropy/{tag}" for d in datasets] for tag in tags]
    else:
        raise ValueError(f"source must be 'train' or 'eval', not {source!r}")
    titles = list(panel_titles) if panel_titles is not None else [f"<{tag}> tokens" for tag in tags]
    ylabel = "mean entropy per token (nats)"
    where = "training rollouts" if source == "train" else "held-out evaluation"
    if smooth > 1:
        where += f", moving average of {smooth} steps"
    return plot_panels(
        groups,
        [(t, k, ylabel) for t, k in zip(titles, keys)],
        out_png,
        title=title if title is not None else f"Policy entropy per tag ({where}): {' vs '.join(groups)}",
        smooth=smooth,
        show_runs=show_runs,
    )


# ------------------------------------------------------------------------------------------------ command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxsearch.eval.curves",
        description="Write OUT/learning_curve.png (held-out EM and training reward against the RL step) and "
        "OUT/entropy_per_tag.png (policy entropy per tag against the RL step) from training runs' "
        "metrics.jsonl. A RUN is a launch/train.py --workdir, or a directory of such runs (seed0/ seed1/ "
        "...: one group, drawn as mean ± std); NAME=RUN labels it.",
    )
    parser.add_argument("--runs", nargs="+", default=[], metavar="RUN", help="runs for both pictures")
    parser.add_argument(
        "--curve-runs", nargs="+", metavar="RUN", help="runs for the learning curve (default: --runs)"
    )
    parser.add_argument(
        "--entropy-runs", nargs="+", metavar="RUN", help="runs for the entropy per tag (default: --runs)"
    )
    parser.add_argument("--out", default=".", help="directory for the two PNGs (default: .)")
    parser.add_argument(
        "--smooth", type=int, default=1, metavar="N", help="trailing moving average over N training steps"
    )
    parser.add_argument(
        "--tags", nargs="+", default=list(TAGS), help=f"entropy panels (default: {' '.join(TAGS)})"
    )
    parser.add_argument(
        "--entropy-source", choices=("train", "eval"), default="train",
        help="entropy of the training rollouts (every step) or of the held-out evaluations",
    )
    args = parser.parse_args(argv)
    curve_runs, entropy_runs = args.curve_runs or args.runs, args.entropy_runs or args.runs
    if not curve_runs and not entropy_runs:
        parser.error("give --runs (or --curve-runs / --entropy-runs)")
    if curve_runs:
        path = os.path.join(args.out, LEARNING_CURVE_PNG)
        plot_learning_curve(curve_runs, path, smooth=args.smooth)
        print(f"wrote {path}")
    if entropy_runs:
        path = os.path.join(args.out, ENTROPY_PNG)
        plot_entropy_per_tag(
            entropy_runs, path, tags=args.tags, source=args.entropy_source, smooth=args.smooth
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
