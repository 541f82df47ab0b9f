"""Advantage estimators (device side): pure jnp functions, jittable, in a registry by name.

    grpo_advantages(rewards [N], group_size)                  -> [N]       GRPO / Dr.GRPO
    gae_advantages(token_rewards, values, mask, gamma, lam)   -> ([B, T], [B, T])   PPO with a critic

GRPO returns one advantage per sequence; the caller broadcasts it over the sequence's tokens
(`adv[:, None] * loss_mask`). Rows of one group are contiguous: rewards.reshape(-1, group_size).
Python-valued options (group_size, normalize_std, whiten) are static under jit; gamma and lam may be
traced.

GAE follows veRL's `compute_gae_advantage_return` for multi-turn rollouts: a token with mask 0 (an
observation the retriever wrote, or padding) is skipped, the recursion passes through it unchanged,
so the last policy token before an observation bootstraps from the first policy token after it.
Rewards and values at mask-0 tokens are ignored; put the sequence reward on a mask-1 token.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxsearch.registry import Registry

ADVANTAGE_ESTIMATORS: Registry[Callable] = Registry("advantage estimator")


def register_advantage(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under `name`."""
    return ADVANTAGE_ESTIMATORS.register(name)


def get_advantage_fn(name: str) -> Callable:
    """The estimator registered as `name`; a clear error lists the known names."""
    return ADVANTAGE_ESTIMATORS.get(name)


@register_advantage("grpo")
def grpo_advantages(
    rewards: jax.Array, group_size: int, normalize_std: bool = True, eps: float = 1e-6
) -> jax.Array:
    """Group-relative advantages: (r - group mean) / (group std + eps). rewards [N] -> [N]. Also DAPO's
    (arXiv 2503.14476 Eq. 9) and GSPO's (arXiv 2507.18071 Eq. 6) advantage.

    The std is the unbiased one (ddof=1, as torch.std in veRL). `normalize_std=False` is Dr.GRPO
    (centering only). A group whose rewards are all equal gets exactly 0, never NaN.
    """
    if group_size < 2:
        raise ValueError(f"GRPO needs group_size >= 2, got {group_size}")
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards must be [N] with N divisible by group_size={group_size}, got {rewards.shape}"
        )
    grouped = rewards.reshape(-1, group_size)
    adv = grouped - grouped.mean(axis=1, keepdims=True)
    if normalize_std:
        adv = adv / (grouped.std(axis=1, ddof=1, keepdims=True) + eps)
    constant = grouped.max(axis=1, keepdims=True) == grouped.min(axis=1, keepdims=True)
    return jnp.where(constant, 0.0, adv).reshape(-1)


@register_advantage("dr_grpo")
def dr_grpo_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """Dr.GRPO: A_i = r_i - mean(r of the group), without std scaling (Liu et al. 2025, arXiv 2503.20783
    §3.2: the std division weights questions by their reward spread). rewards [N] -> [N]. Its loss drops the
    per-sequence length normalisation too: `losses.agg_loss` mode "seq-mean-token-sum-norm"."""
    return grpo_advantages(rewards, group_size, normalize_std=False)


def masked_whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(x - mean) / sqrt(var + eps) with mean and unbiased var over mask-1 entries (veRL's rule)."""
    mask = mask.astype(x.dtype)
    count = mask.sum()
    mean = (x * mask).sum() / jnp.maximum(count, 1.0)
    var = (jnp.square(x - mean) * mask).sum() / jnp.maximum(count - 1.0, 1.0)
    return (x - mean) * jax.lax.rsqrt(var + eps)


@register_advantage("gae")
def gae_advantages(
    token_rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation over policy tokens. All inputs and outputs are [B, T].

    Reverse `lax.scan` over time: delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lam
    * A_next, where V_next / A_next come from the next mask-1 token (0 after the last one).
    Returns (advantages, returns) with returns = A + V computed before whitening; `whiten` normalizes
    the advantages over mask-1 tokens (veRL always does). Both outputs are 0 where mask is 0.
    """
    mask = mask.astype(values.dtype)

    def step(carry, xs):
        next_value, next_adv = carry
        reward, value, m = xs
        adv = reward + gamma * next_value - value + gamma * lam * next_adv
        next_value = m * value + (1.0 - m) * next_value
        next_adv = m * adv + (1.0 - m) * next_adv
        return (next_value, next_adv), next_adv

    zeros = jnp.zeros(values.shape[0], values.dtype)
    _, adv_t = jax.lax.scan(step, (zeros, zeros), (token_rewards.T, values.T, mask.T), reverse=True)
    advantages = adv_t.T
    returns = (advantages + values) * mask
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages * mask, returns
