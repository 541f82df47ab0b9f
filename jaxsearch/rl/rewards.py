"""Rewards, where DESIGN's public API lists them: they live in `jaxsearch.scoring.rewards` (what RL and
evaluation both use)."""

from jaxsearch.scoring.rewards import REWARDS, RewardInput, combine, get_reward, reward_inputs

__all__ = ["REWARDS", "RewardInput", "combine", "get_reward", "reward_inputs"]
