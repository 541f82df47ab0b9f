"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476 §3.2, Eq. 11 and Algorithm 1): a group whose
rewards are all equal has zero advantage on every row, so it gives no gradient and only dilutes the batch; it
is dropped, and more questions are rolled out until the step holds `batch_size` groups with a reward spread.

    keep = informative_groups(scores, group_size)        # bool [N / group_size]: rewards not all equal
    groups = select_groups(keep, batch_size)              # which groups (in draw order) the step trains on
    traj, scores, metrics = collect(draw, batch_size, group_size, max_draws)

`draw(attempt)` rolls out and scores the next `batch_size` questions x `group_size` samples and returns
(Trajectories, scores [N], metrics); attempt 0 is the step's ordinary rollout. `collect` draws until enough
groups are informative or `max_draws` rollouts were made (veRL's DAPO recipe: `max_num_gen_batches`, 10 in
its scripts); the scores filtered on are the task reward before DAPO's overlong shaping (the recipe filters on
`acc`). Where the cap is reached short of a batch, veRL stops with an error; here the batch is completed with
the earliest constant groups (zero advantage) so the step keeps its shape, and `dynamic_sampling/filled_groups`
counts them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxsearch.agent.trajectories import Trajectories, concat


def informative_groups(scores: np.ndarray, group_size: int) -> np.ndarray:
    """bool [N / group_size]: the groups (contiguous rows) whose scores are not all equal (Eq. 11's
    0 < |{correct}| < G for a 0/1 reward)."""
    scores = np.asarray(scores)
    if group_size < 2 or scores.ndim != 1 or scores.shape[0] % group_size:
        raise ValueError(f"scores must be [N], N a multiple of group_size={group_size} >= 2; got {scores.shape}")
    grouped = scores.reshape(-1, group_size)
    return grouped.max(axis=1) != grouped.min(axis=1)


def select_groups(informative: Sequence[bool], batch_size: int) -> list[int]:
    """Indices of the groups to train on: the first `batch_size` informative ones in draw order; if fewer
    were drawn, then the earliest constant groups until there are `batch_size`."""
    informative = [bool(x) for x in informative]
    if len(informative) < batch_size:
        raise ValueError(f"{len(informative)} groups drawn, fewer than batch_size={batch_size}")
    kept = [g for g, ok in enumerate(informative) if ok][:batch_size]
    fill = [g for g, ok in enumerate(informative) if not ok][: batch_size - len(kept)]
    return kept + fill


def take_rows(traj: Trajectories, rows: Sequence[int]) -> Trajectories:
    """The trajectories of `rows`, in that order (timings kept whole)."""
    rows = np.asarray(rows, dtype=np.int64)
    out = {}
    for f in dataclasses.fields(Trajectories):
        value = getattr(traj, f.name)
        if isinstance(value, list):
            out[f.name] = [value[i] for i in rows]
        elif isinstance(value, dict):
            out[f.name] = value
        else:
            out[f.name] = value[rows]
    return Trajectories(**out)


def collect(
    draw: Callable[[int], tuple[Trajectories, np.ndarray, dict]],
    batch_size: int,
    group_size: int,
    max_draws: int,
) -> tuple[Trajectories, np.ndarray, dict]:
    """A step's batch of `batch_size` groups by dynamic sampling (see the module docstring). Returns the kept
    rows' trajectories and scores, and the first draw's metrics (the policy's ordinary sample, as a GRPO step
    logs it) with dynamic_sampling/draws, /informative (share of drawn groups kept as informative) and
    /filled_groups (constant groups completing a batch the cap left short)."""
    parts, scores, informative, first = [], [], [], None
    for attempt in range(max_draws):
        traj, s, metrics = draw(attempt)
        parts.append(traj)
        scores.append(np.asarray(s))
        informative.extend(informative_groups(s, group_size))
        first = metrics if first is None else first
        if sum(informative) >= batch_size:
            break
    groups = select_groups(informative, batch_size)
    rows = [g * group_size + j for g in groups for j in range(group_size)]
    filled = sum(not informative[g] for g in groups)
    stats = {
        "dynamic_sampling/draws": float(len(parts)),
        "dynamic_sampling/informative": float(np.mean(informative)),
        "dynamic_sampling/filled_groups": float(filled),
    }
    return take_rows(concat(parts), rows), np.concatenate(scores)[rows], dict(first, **stats)
