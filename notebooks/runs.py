"""Small helpers for the notebooks: read a training run's logs into columns and pick series from them.

A run directory is what `python launch/train.py --workdir RUN` writes:

    RUN/grpo/metrics.jsonl   one JSON object per logged RL step (RUN/ppo/ for PPO; stage "rl" here) ({"step": 3, "reward": ..., "eval/synthetic/em": ...})
    RUN/sft/metrics.jsonl    the warm start ({"step": 1, "sft/loss": ...})

and, optionally, per-example evaluation files (`<out>/<dataset>.jsonl`, one object per question with
`question` and `prediction` or `response`, e.g. `python launch/eval.py ... --out RUN/eval`) anywhere under RUN.

No jax here (jaxsearch.agent.segments is numpy only; jaxsearch.eval.curves, whose metrics reader this module
re-exports, is numpy, json and matplotlib): the notebooks only read files.
"""

import glob
import json
import os

from jaxsearch.agent.segments import SEGMENT_IDS

# the metrics reader is the plots' own (jaxsearch/eval/curves.py: numpy, json and matplotlib only, no jax)
from jaxsearch.eval.curves import (  # noqa: F401  (re-exported for the notebooks)
    STAGES,
    eval_datasets,
    has,
    load_columns,
    load_run,
    metrics_path,
    read_rows,
    series,
    to_columns,
)


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
