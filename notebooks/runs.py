"""Small helpers for the notebooks: read a training run's logs into columns and pick series from them.

A run directory is what `python launch/train.py --workdir RUN` writes:

    RUN/grpo/metrics.jsonl   one JSON object per logged RL step (RUN/ppo/ for PPO; stage "rl" here) ({"step": 3, "reward": ..., "eval/synthetic/em": ...})
    RUN/sft/metrics.jsonl    the warm start ({"step": 1, "sft/loss": ...})

and, optionally, per-example evaluation files (`<out>/<dataset>.jsonl`, one object per question with
`question` and `prediction` or `response`, e.g. `python launch/eval.py ... --out RUN/eval`) anywhere under RUN.

No jax here (jaxsearch.agent.segments is numpy only): the notebooks only read files.
"""

import glob
import json
import os
import warnings

from jaxsearch.agent.segments import SEGMENT_IDS

STAGES = ("rl", "sft")


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


# ------------------------------------------------------------------------------------ evaluation examples


def find_example_files(run_dir: str) -> list[str]:
    """Per-example evaluation JSONL files under `run_dir` (launch/eval.py's `<out>/<dataset>.jsonl`).

    A file counts if its first object has a `question` and a `prediction` or `response`; metrics files
    and the synthetic world's QA splits (questions without predictions) do not.
    """
    found = []
    for path in sorted(glob.glob(os.path.join(run_dir, "**", "*.jsonl"), recursive=True)):
        if os.path.basename(path) == "metrics.jsonl":
            continue
        with open(path) as f:
            first = f.readline()
        try:
            row = json.loads(first)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "question" in row and ("prediction" in row or "response" in row):
            found.append(path)
    return found


def read_examples(path: str, n: int) -> list[dict]:
    """The first `n` objects of an evaluation JSONL file."""
    out = []
    with open(path) as f:
        for line in f:
            if len(out) >= n:
                break
            if line.strip():
                out.append(json.loads(line))
    return out


def segment_entropy(row: dict) -> dict[str, float]:
    """Mean entropy of the policy's own tokens (loss mask 1) per segment name, from a record's token row
    (`segment_ids`, `entropy`, `loss_mask`); {} if the record has no token row."""
    if not all(k in row for k in ("segment_ids", "entropy", "loss_mask")):
        return {}
    names = {sid: name for name, sid in SEGMENT_IDS.items()}
    values = {}
    for sid, entropy, mask in zip(row["segment_ids"], row["entropy"], row["loss_mask"]):
        if mask:
            values.setdefault(names.get(sid, str(sid)), []).append(entropy)
    return {name: sum(v) / len(v) for name, v in values.items()}


def format_example(row: dict, max_chars: int = 1500) -> str:
    """A readable block: question, golden answers, prediction, scores, entropy by segment, the response text.

    Takes launch/eval.py's records (scores under "metrics", turns / searches beside them) and flat rows.
    """
    lines = [f"Q: {row.get('question')}"]
    golden = row.get("golden_answers", row.get("answers", row.get("golden_answer")))
    if golden is not None:
        lines.append(f"gold: {golden}")
    lines.append(f"prediction: {row.get('prediction')}")
    scores = dict(row.get("metrics") or {})
    scores.update({k: row[k] for k in ("em", "f1", "turns", "searches", "truncated") if k in row})
    scores = {k: v for k, v in scores.items() if v is not None}
    if scores:
        lines.append(
            "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in scores.items())
        )
    entropy = segment_entropy(row)
    if entropy:
        lines.append("entropy: " + "  ".join(f"{k}={v:.4g}" for k, v in entropy.items()))
    response = row.get("response")
    if response:
        text = str(response)
        if len(text) > max_chars:
            text = text[:max_chars] + f" ... [{len(text) - max_chars} more characters]"
        lines.append("response:")
        lines.append(text)
    return "\n".join(lines)
