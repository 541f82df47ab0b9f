"""A batch of episodes scored: the training step's rewards and metrics, and the periodic held-out evaluation.

scores, metrics = score_rollout(reward_fn, traj, examples)   # [B] rewards; stats + "reward", "reward/TERM"
stats = trajectory_stats(traj, examples)     # Search-R1's rollout metrics + entropy per segment type
metrics = heldout_metrics(engine, params, eval_sets, key, judge)   # {"eval/NAME/em": ..., ...}
"""

from __future__ import annotations

import numpy as np

from jaxsearch.agent import segments
from jaxsearch.agent.engine import AgentEngine
from jaxsearch.agent.trajectories import Trajectories
from jaxsearch.scoring import metrics as qa_metrics
from jaxsearch.scoring import rewards as rewards_lib


def score_rollout(
    reward_fn, traj: Trajectories, examples, special_answers: bool = True
) -> tuple[np.ndarray, dict]:
    """([B] float32 rewards, metrics) of one rollout: `reward_fn` (a `rewards.WeightedSum`) over the episodes,
    then `trajectory_stats` with the mean reward and each reward term's mean ("reward/TERM")."""
    scores, terms = reward_fn.score(rewards_lib.reward_inputs(traj, examples))
    scores = scores.astype(np.float32)
    metrics = trajectory_stats(traj, examples, special_answers)
    metrics["reward"] = float(scores.mean())
    metrics.update({f"reward/{k}": float(v.mean()) for k, v in terms.items()})
    return scores, metrics


def trajectory_stats(traj: Trajectories, examples, special_answers: bool = True) -> dict:
    """Search-R1's rollout metrics (EM, F1, R-Search's Acc, lengths, turns, action ratios), retrieval recall
    of the supporting passages where examples name them, and the entropy of the policy's tokens overall and
    per segment type.
    special_answers: F1 with FlashRAG's yes/no rule, else plain token F1 (protocol.f1_special_answers)."""
    answered = np.asarray([a is not None for a in traj.answers])
    resp_len = traj.attention_mask.sum(1) - traj.prompt_lengths
    pairs = list(zip(traj.answers, examples))
    em = [qa_metrics.exact_match(a or "", ex.golden_answers) for a, ex in pairs]
    f1 = [qa_metrics.f1_score(a or "", ex.golden_answers, special_answers) for a, ex in pairs]
    acc = [qa_metrics.accuracy(a or "", ex.golden_answers) if a else 0.0 for a, ex in pairs]  # R-Search's Acc
    turns = np.maximum(traj.turns, 1)
    stats = {
        "em": float(np.mean(em)),
        "f1": float(np.mean(f1)),
        "acc": float(np.mean(acc)),
        "response_length": float(resp_len.mean()),
        "policy_tokens": float(traj.loss_mask.sum(1).mean()),
        "turns": float(traj.turns.mean()),
        "searches": float(traj.searches.mean()),
        "finish_ratio": float(answered.mean()),
        "valid_action_ratio": float(((traj.searches + answered) / turns).mean()),
        "valid_search_ratio": float((traj.searches / turns).mean()),
        "truncated_ratio": float(traj.truncated.mean()),
        "entropy": float((traj.entropy * traj.loss_mask).sum() / max(traj.loss_mask.sum(), 1)),
    }
    gold = [  # a derived doc (a hyperedge) stands for the passages it came from
        (set(ex.supporting_ids or ()), {p for docs in row for d in docs for p in d.passage_ids})
        for ex, row in zip(examples, traj.docs)
    ]
    if any(g for g, _ in gold):  # retrieval recall: share of the supporting passages a search returned
        stats["recall"] = float(np.mean([len(g & found) / len(g) for g, found in gold if g]))
    for name, sid in segments.SEGMENT_IDS.items():
        sel = (traj.segment_ids == sid) & (traj.loss_mask == 1)
        if sel.any():
            stats[f"entropy/{name}"] = float(traj.entropy[sel].mean())
    return stats


def heldout_metrics(
    engine: AgentEngine, params, eval_sets: dict, key, judge=None, data_prompt: bool = True
) -> dict:
    """`trajectory_stats` per held-out set as "eval/NAME/KEY", with SOAR's fabrication rate when a `judge`
    (`scoring.judge.ChatJudge`) is given. key: the evaluation's PRNG key (row i samples with fold_in(key, i)).
    data_prompt: search_r1 prompts with a dataset's own prompt where it has one."""
    out = {}
    for name, examples in eval_sets.items():
        traj = engine.rollout_examples(params, examples, key, data_prompt)
        stats = trajectory_stats(traj, examples, engine.protocol.f1_special_answers)
        if judge is not None:  # SOAR's evidence-fabrication rate (share of judged-ungrounded episodes)
            scores = rewards_lib.judge_fabrication(judge, rewards_lib.reward_inputs(traj, examples))
            stats["fabrication_rate"] = rewards_lib.fabrication_rate(scores)
        out.update({f"eval/{name}/{k}": v for k, v in stats.items()})
    return out
