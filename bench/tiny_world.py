"""The main job on the tiny world over seeds: held-out EM / F1 at GRPO's first and last step, and the last
evaluation's behaviour (turns, searches, entropy of think / search / answer tokens, retrieval recall,
fabrication rate), as mean ± std over seeds, one table row per config.

    python bench/tiny_world.py --configs configs/tiny_cpu.py --seeds 0 1 2
    python bench/tiny_world.py --configs configs/tiny_cpu_eka.py configs/tiny_cpu_soar.py --seeds 0
    python bench/tiny_world.py --configs configs/tiny_cpu.py --seeds 0 1 2 --no-run   # table only

Each run is `python launch/train.py --config CONFIG --config.seed=S --workdir OUT/NAME/seedS` (the world is
the config's, the same for every seed; the seed sets the init, the SFT order and the RL sampling). A run whose
workdir already holds a finished job is not redone; an unfinished one resumes from its last checkpoint.
The table goes to stdout and to OUT/table.md; one row per run to OUT/seeds.csv (config, seed, held-out EM / F1
at the RL stage's first and last evaluation and EM at each, the last evaluation's behaviour, wall seconds,
commit): the small record that stays in git when the run logs do not (bench/runs/README.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = (  # (header, metric under eval/synthetic/, at the first evaluation too)
    ("EM", "em", True),
    ("F1", "f1", True),
    ("turns", "turns", False),
    ("searches", "searches", False),
    ("H think", "entropy/think", False),
    ("H search", "entropy/search", False),
    ("H answer", "entropy/answer", False),
    ("recall", "recall", False),
    ("fabrication", "fabrication_rate", False),
)


def run(config: str, seed: int, workdir: str, extra: list[str]) -> float:
    """One main job (skipped when its metrics show the last step); returns its wall seconds (nan if skipped)."""
    if finished(workdir):
        return float("nan")
    cmd = [sys.executable, os.path.join(ROOT, "launch", "train.py"), f"--config={config}"]
    cmd += [f"--config.seed={seed}", f"--workdir={workdir}", "--progress=false", *extra]
    print(" ".join(cmd[1:]), flush=True)
    # a stopped run resumes from its checkpoints: its wall time is then this invocation's only, and says so
    resumed = os.path.exists(os.path.join(workdir, "sft")) or os.path.exists(rl_dir(workdir))
    commit = head_commit()  # the code the run starts with (a checkout may move on while it runs)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    seconds = time.perf_counter() - start
    with open(os.path.join(workdir, "wall_s.json"), "w") as f:
        json.dump({"wall_s": seconds, "commit": commit, **({"resumed": True} if resumed else {})}, f)
    return seconds


def rl_dir(workdir: str) -> str:
    """The RL stage's directory: ppo/ for a PPO run, else grpo/."""
    ppo = os.path.join(workdir, "ppo")
    return ppo if os.path.isdir(ppo) else os.path.join(workdir, "grpo")


def finished(workdir: str) -> bool:
    """The RL stage reached its last step: the trainer exports `params/` only then (a crashed or stopped
    run keeps its checkpoints and evaluations so far, and is resumed instead)."""
    return os.path.exists(os.path.join(rl_dir(workdir), "params"))


def evaluations(workdir: str) -> list[dict]:
    """The RL stage's rows that hold an evaluation, in step order."""
    path = os.path.join(rl_dir(workdir), "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if any(k.startswith("eval/") for k in r)]


def mean_std(values: list[float], digits: int = 3) -> str:
    values = [v for v in values if v == v]  # drop nan
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def row(name: str, workdirs: list[str]) -> str:
    """One table row: before -> after for EM / F1, the last evaluation for the rest, wall minutes."""
    firsts, lasts = [], []
    for w in workdirs:
        evals = evaluations(w)
        firsts.append(evals[0])
        lasts.append(evals[-1])
    cells = [name, str(len(workdirs)), str(lasts[0]["step"])]
    for _, key, before in COLUMNS:
        key = f"eval/synthetic/{key}"
        after = mean_std([r.get(key, float("nan")) for r in lasts])
        cells.append(
            f"{mean_std([r.get(key, float('nan')) for r in firsts])} -> {after}" if before else after
        )
    gains = [b["eval/synthetic/em"] - a["eval/synthetic/em"] for a, b in zip(firsts, lasts)]
    cells.append(mean_std(gains))
    walls = []  # a resumed run's wall time is its last invocation's only: not a run's time, left out
    for w in workdirs:
        path = os.path.join(w, "wall_s.json")
        wall = json.load(open(path)) if os.path.exists(path) else {}
        walls.append(wall["wall_s"] / 60 if "wall_s" in wall and not wall.get("resumed") else float("nan"))
    cells.append(mean_std(walls, 1))
    return "| " + " | ".join(cells) + " |"


SEED_FIELDS = (
    ["config", "seed", "rl_steps", "em_first", "em_last", "f1_first", "f1_last"]
    + [key.replace("entropy/", "h_") for _, key, before in COLUMNS if not before]
    + ["em_by_step", "sft_loss_last", "wall_s", "resumed", "commit"]
)


def seed_row(name: str, workdir: str, commit: str) -> dict:
    """One run's summary: EM / F1 at the RL stage's first and last evaluation, the last evaluation's
    behaviour, held-out EM at every evaluation ("step:EM ..."), the SFT stage's last loss, its wall seconds
    and the commit of its code: the one the run recorded, else `commit`."""
    evals = evaluations(workdir)
    first, last = evals[0], evals[-1]

    def get(r: dict, key: str):
        value = r.get(f"eval/synthetic/{key}", "")
        return round(value, 4) if isinstance(value, float) else value

    out = {"config": name, "seed": os.path.basename(workdir).removeprefix("seed"), "rl_steps": last["step"]}
    for key in ("em", "f1"):
        out[f"{key}_first"], out[f"{key}_last"] = get(first, key), get(last, key)
    for _, key, before in COLUMNS:
        if not before:
            out[key.replace("entropy/", "h_")] = get(last, key)
    out["em_by_step"] = " ".join(f"{r['step']}:{get(r, 'em')}" for r in evals)
    sft_loss = ""
    sft_path = os.path.join(workdir, "sft", "metrics.jsonl")
    if os.path.exists(sft_path):
        with open(sft_path) as f:
            losses = [json.loads(line).get("sft/loss") for line in f if line.strip()]
        losses = [v for v in losses if v is not None]
        sft_loss = round(losses[-1], 4) if losses else ""
    out["sft_loss_last"] = sft_loss
    path = os.path.join(workdir, "wall_s.json")
    wall = json.load(open(path)) if os.path.exists(path) else {}
    out["wall_s"] = round(wall["wall_s"], 1) if "wall_s" in wall else ""
    out["resumed"] = bool(wall.get("resumed", False))
    out["commit"] = wall.get("commit") or commit
    return out


def write_seeds(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SEED_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def head_commit() -> str:
    """The short commit of this checkout (what a run here runs), or "" outside git."""
    try:
        cmd = ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]
        out = subprocess.run(cmd, capture_output=True, text=True)
    except OSError:
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def table(rows: list[str]) -> str:
    headers = ["config", "seeds", "steps"]
    headers += [f"{h} before -> after" if before else h for h, _, before in COLUMNS]
    headers += ["EM gain", "wall min"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["configs/tiny_cpu.py"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="runs/tiny_world", help="workdirs OUT/NAME/seedS and OUT/table.md")
    parser.add_argument("--no-run", action="store_true", help="only tabulate the runs already there")
    parser.add_argument(
        "--commit",
        default=None,
        help="the code's commit for seeds.csv, of runs that record none (default: this checkout's HEAD)",
    )
    parser.add_argument("overrides", nargs="*", help="extra --config.key=value flags for every run")
    args = parser.parse_args(argv)
    rows, seeds = [], []
    commit = head_commit() if args.commit is None else args.commit
    for config in args.configs:
        name = os.path.splitext(os.path.basename(config))[0]
        workdirs = [os.path.join(args.out, name, f"seed{s}") for s in args.seeds]
        if not args.no_run:
            for seed, workdir in zip(args.seeds, workdirs):
                run(config, seed, workdir, args.overrides)
        done = [w for w in workdirs if len(evaluations(w)) >= 2]
        if done:
            rows.append(row(name, done))
            seeds += [seed_row(name, w, commit) for w in done]
    text = table(rows)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text + "\n")
    write_seeds(os.path.join(args.out, "seeds.csv"), seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
