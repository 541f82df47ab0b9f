"""The seeds' central claims in miniature: each method against its backbone on the tiny world, over seeds, as
mean ± 95% CI per config (Student t over seeds) and the method's difference from its backbone with a 95% CI
(Welch's t), beside the direction its paper reports, and the seeds per config that would settle the observed
difference (80% power at the observed seed variance); one plot panel per claimed metric.

    bench/runs/claims.sh                                              # the runs: 6 configs x seeds 0-2
    python bench/claims.py --runs /tmp/claims/out --record bench/runs/claims   # fold them in, table, plot
    python bench/claims.py --record bench/runs/claims                 # table and plot from the record alone

`--runs` holds bench/tiny_world.py workdirs (RUNS/CONFIG/seedS): each finished one's row (tiny_world.seed_row)
replaces the record's row of the same config and seed in RECORD/seeds.csv, so the runs of several machines
add up in git. Writes RECORD/claims.md (the table for bench/RESULTS.md) and RECORD/claims.png.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
from dataclasses import dataclass

import tiny_world  # bench/: the main-job runner, its per-seed rows
from scipy import stats


@dataclass(frozen=True)
class Claim:
    column: str  # a seeds.csv column (the RL stage's last held-out evaluation)
    label: str
    sign: int  # the paper's direction of method - backbone: +1 higher, -1 lower, 0 none claimed
    source: str  # where the paper reports it


@dataclass(frozen=True)
class Comparison:
    name: str
    method: str  # config names (configs/NAME.py)
    backbone: str
    claims: tuple[Claim, ...]


EKA_CLAIMS = (
    Claim("f1_last", "F1", +1, "EKA Table 4, Search-R1 setting; Table 2, Graph-R1 setting"),
    Claim("turns", "turns", -1, "EKA §6.2, Table 6 (Graph-R1): about one turn fewer"),
    Claim("h_think", "H think", -1, "EKA §6.1, Figure 3 (Graph-R1)"),
    Claim("h_search", "H search", -1, "EKA §6.1, Figure 3 (Graph-R1)"),
    Claim("h_answer", "H answer", 0, "EKA Figure 3 plots it, §6.1 claims think and search"),
)
COMPARISONS = (
    Comparison("EKA vs Search-R1 (Search-R1 setting)", "tiny_cpu_eka", "tiny_cpu", EKA_CLAIMS),
    Comparison("EKA vs Graph-R1 (Graph-R1 setting)", "tiny_cpu_eka_graphr1", "tiny_cpu_graphr1", EKA_CLAIMS),
    Comparison(
        "SOAR vs Search-R1",
        "tiny_cpu_soar",
        "tiny_cpu",
        (
            Claim("fabrication_rate", "fabrication", -1, "SOAR Table 4: 16.1% -> 4.1%"),
            Claim("em_last", "EM", +1, "SOAR Table 5: 0.415 -> 0.448; Table 12 over seeds"),
        ),
    ),
    Comparison(
        "R-Search vs Search-R1",
        "tiny_cpu_rsearch",
        "tiny_cpu",
        (Claim("f1_last", "F1", +1, "R-Search §5.1, Table 2"),),
    ),
)
DIRECTION = {1: "higher", -1: "lower", 0: "no direction"}  # Claim.sign in words
CONFIGS = tuple(dict.fromkeys(c for comp in COMPARISONS for c in (comp.backbone, comp.method)))


def t_quantile(df: float, level: float = 0.95) -> float:
    """The two-sided `level` quantile of Student's t with `df` degrees of freedom."""
    return float(stats.t.ppf(0.5 + level / 2, df))


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """(mean, half-width of its `level` CI: t_{n-1} x s / sqrt(n)); the half-width is nan for one value."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, float("nan")
    return mean, t_quantile(n - 1, level) * statistics.stdev(values) / math.sqrt(n)


def diff_ci(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float]:
    """(mean(a) - mean(b), half-width of its Welch `level` CI, with Welch-Satterthwaite's degrees of freedom)."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return diff, float("nan")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se2 = va + vb
    if se2 == 0:
        return diff, 0.0
    df = se2**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return diff, t_quantile(df, level) * math.sqrt(se2)


def seeds_to_settle(a: list[float], b: list[float], power: float = 0.8, level: float = 0.95) -> float:
    """Seeds per config for a two-sided `level` test to find the observed difference with `power`, at the
    observed seed-to-seed variance (normal approximation: 2 (z_level + z_power)^2 s^2 / d^2, s^2 the mean of
    the two variances), at least 2 (an interval needs two); inf when the means are equal, nan with fewer than
    two seeds of either."""
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    d = statistics.fmean(a) - statistics.fmean(b)
    var = (statistics.variance(a) + statistics.variance(b)) / 2
    if d == 0:
        return float("inf")
    z = stats.norm.ppf(0.5 + level / 2) + stats.norm.ppf(power)
    return float(max(2, math.ceil(2 * z**2 * var / d**2)))


def verdict(sign: int, diff: float, half: float) -> str:
    """How the difference stands against the paper's direction."""
    if sign == 0:
        return "no claim"
    if math.isnan(half):  # nan: one seed
        return "paper's way (1 seed)" if diff * sign > 0 else "not the paper's way (1 seed)"
    if diff * sign > 0:
        return "paper's way, CI excludes 0" if abs(diff) > half else "paper's way, within CI"
    return "opposite, CI excludes 0" if abs(diff) > half else "opposite way, within CI"


def read_record(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fold_runs(runs: str, record: list[dict], commit: str) -> list[dict]:
    """The record with each finished run under RUNS/CONFIG/seedS in place of its (config, seed) row, under
    the commit the run recorded (`commit` for a run that recorded none)."""
    rows = {(r["config"], r["seed"]): r for r in record}
    for config in CONFIGS:
        group = os.path.join(runs, config)
        if not os.path.isdir(group):
            continue
        for name in sorted(os.listdir(group)):
            workdir = os.path.join(group, name)
            if name.startswith("seed") and tiny_world.finished(workdir):
                row = tiny_world.seed_row(config, workdir, commit)
                rows[(config, row["seed"])] = {k: str(v) for k, v in row.items()}
    order = {c: i for i, c in enumerate(CONFIGS)}
    return sorted(rows.values(), key=lambda r: (order.get(r["config"], len(order)), r["seed"]))


def values(record: list[dict], config: str, column: str) -> list[float]:
    return [float(r[column]) for r in record if r["config"] == config and r.get(column, "") != ""]


def fmt(mean: float, half: float, digits: int = 3) -> str:
    return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


def settle(a: list[float], b: list[float]) -> str:
    n = seeds_to_settle(a, b)
    return "n/a" if math.isnan(n) else "never" if math.isinf(n) else str(int(n))


def table(record: list[dict]) -> str:
    """One row per claimed metric: backbone and method as mean ± 95% CI, the difference with its Welch CI."""
    lines = [
        "| comparison | metric | backbone | method | method - backbone | paper | verdict | seeds | seeds to settle |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for comp in COMPARISONS:
        for claim in comp.claims:
            a = values(record, comp.method, claim.column)
            b = values(record, comp.backbone, claim.column)
            if not a or not b:
                continue
            diff, half = diff_ci(a, b)
            paper = f"{DIRECTION[claim.sign]} ({claim.source})"
            lines.append(
                f"| {comp.name} | {claim.label} | {fmt(*mean_ci(b))} | {fmt(*mean_ci(a))} | {fmt(diff, half)} | "
                f"{paper} | {verdict(claim.sign, diff, half)} | {len(a)} / {len(b)} | {settle(a, b)} |"
            )
    return "\n".join(lines)


def plot(record: list[dict], out_png: str) -> None:
    """One panel per (comparison, claimed metric) with runs of both configs: each seed's value as a dot, the
    mean with its 95% CI; nothing is written while no comparison has both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (comp, claim)
        for comp in COMPARISONS
        for claim in comp.claims
        if values(record, comp.method, claim.column) and values(record, comp.backbone, claim.column)
    ]
    if not panels:
        return
    cols = 5
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (comp, claim) in zip(axes.flat, panels):
        for x, (config, color) in enumerate(((comp.backbone, "tab:gray"), (comp.method, "tab:blue"))):
            vals = values(record, config, claim.column)
            if not vals:
                continue
            mean, half = mean_ci(vals)
            ax.scatter([x] * len(vals), vals, color=color, alpha=0.5, s=18)
            ax.errorbar(
                [x + 0.15], [mean], yerr=[0 if math.isnan(half) else half], fmt="o", color=color, capsize=4
            )
        ax.set_xticks([0, 1], [comp.backbone, comp.method])
        ax.tick_params(axis="x", labelsize=7)
        arrow = f" (paper: {DIRECTION[claim.sign]})" if claim.sign else ""
        ax.set_title(f"{comp.name.split(' (')[0]}\n{claim.label}{arrow}", fontsize=8)
        ax.set_xlim(-0.5, 1.5)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("Tiny world, last held-out evaluation: seeds (dots), mean ± 95% CI (bars)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--record", default="bench/runs/claims", help="the folder of seeds.csv, claims.md, claims.png"
    )
    parser.add_argument(
        "--runs", default=None, help="tiny_world workdirs RUNS/CONFIG/seedS to fold into the record"
    )
    parser.add_argument(
        "--commit",
        default=None,
        help="the code's commit of runs that record none (older runs; default: this checkout's HEAD)",
    )
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    path = os.path.join(args.record, "seeds.csv")
    record = read_record(path)
    if args.runs is not None:
        if not os.path.isdir(args.runs):
            parser.error(f"--runs {args.runs}: no such folder")
        record = fold_runs(
            args.runs, record, tiny_world.head_commit() if args.commit is None else args.commit
        )
        os.makedirs(args.record, exist_ok=True)
        tiny_world.write_seeds(path, record)
    if not record:
        parser.error(f"{path}: no runs recorded (pass --runs)")
    text = table(record)
    print(text)
    with open(os.path.join(args.record, "claims.md"), "w") as f:
        f.write(text + "\n")
    if not args.no_plot:
        plot(record, os.path.join(args.record, "claims.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
