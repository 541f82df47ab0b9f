"""Policy, KL, entropy and value losses (device side): pure jnp, differentiable, jittable.

All per-token inputs are [B, T] aligned with `loss_mask` [B, T] (1 on tokens the policy wrote, 0 on
prompt, retrieved observations and padding); only mask-1 tokens count, in losses and statistics.
Keyword options (clip bounds, aggregation mode, KL kind) are static: bind them before `jax.jit`.

    agg_loss(loss_mat, loss_mask, mode, norm)                     -> scalar
    ppo_policy_loss(logp, old_logp, advantages, loss_mask, ...)   -> (loss, stats)   (POLICY_LOSSES["ppo"])
    gspo_policy_loss(logp, old_logp, advantages, loss_mask, ...)  -> (loss, stats)   (POLICY_LOSSES["gspo"])
    kl_penalty(logp, ref_logp, kind)                              -> [B, T]
    entropy_from_logits(logits [B, T, V])                         -> [B, T]
    value_loss(values, old_values, returns, loss_mask, ...)       -> (loss, stats)

A train step combines them, e.g.
    pg, stats = get_policy_loss("ppo")(logp, old_logp, adv, mask, clip_eps=0.2)
    loss = pg + kl_coef * agg_loss(kl_penalty(logp, ref_logp, "low_var_kl"), mask, mode)
              - entropy_coef * agg_loss(entropy_from_logits(logits), mask, mode)
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxsearch.registry import Registry

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")

POLICY_LOSSES: Registry[Callable] = Registry("policy loss")


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register a policy loss `fn(logp, old_logp, advantages, loss_mask, **kw) -> (loss, stats)`."""
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as `name`; a clear error lists the known names."""
    return POLICY_LOSSES.get(name)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of x over mask-1 entries (0 when the mask is empty)."""
    mask = mask.astype(x.dtype)
    return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def agg_loss(
    loss_mat: jax.Array, loss_mask: jax.Array, mode: str = "token-mean", norm: float | None = None
) -> jax.Array:
    """Aggregate a [B, T] loss over mask-1 tokens into a scalar (veRL's `agg_loss` modes).

    token-mean:               sum over all mask-1 tokens / their count (DAPO's token-level loss, Eq. 12
                              of arXiv 2503.14476).
    seq-mean-token-sum:       per-row sum, then mean over rows.
    seq-mean-token-mean:      per-row mean, then mean over rows (GRPO's 1/G sum_i 1/|o_i| sum_t; GSPO's).
    seq-mean-token-sum-norm:  per-row sum / `norm` (a constant: the most tokens a row can generate), then
                              mean over rows: Dr.GRPO's loss without per-sequence length normalisation
                              (arXiv 2503.20783 §3.2 and its Listing 1, `masked_sum(..) / MAX_TOKENS`).
    The seq-mean modes average over rows with at least one mask-1 token, so batch-padding rows
    (static shapes) change nothing.
    """
    mask = loss_mask.astype(loss_mat.dtype)
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    row_count = mask.sum(axis=-1)
    row_sum = (loss_mat * mask).sum(axis=-1)
    if mode == "seq-mean-token-sum":
        row_loss = row_sum
    elif mode == "seq-mean-token-mean":
        row_loss = row_sum / jnp.maximum(row_count, 1.0)
    elif mode == "seq-mean-token-sum-norm":
        if norm is None or norm <= 0:
            raise ValueError(f"agg mode {mode!r} needs a constant norm > 0 (tokens), got {norm}")
        row_loss = row_sum / norm
    else:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; known: {AGG_MODES}")
    return masked_mean(row_loss, row_count > 0)


def clipped_surrogate(
    ratio: jax.Array,
    advantages: jax.Array,
    clip_eps: float,
    clip_eps_low: float | None = None,
    clip_eps_high: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """PPO's pessimistic surrogate max(-A r, -A clip(r, 1 - low, 1 + high)), elementwise, the bounds
    low / high defaulting to clip_eps -> (loss, where the clipped branch is the larger). Per token (ppo) or
    per sequence (gspo)."""
    low = clip_eps if clip_eps_low is None else clip_eps_low
    high = clip_eps if clip_eps_high is None else clip_eps_high
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - low, 1.0 + high)
    return jnp.maximum(unclipped, clipped), clipped > unclipped


@register_policy_loss("ppo")
def ppo_policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_low: float | None = None,
    clip_eps_high: float | None = None,
    dual_clip_c: float | None = None,
    agg_mode: str = "token-mean",
    agg_norm: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped PPO surrogate. logp, old_logp, loss_mask [B, T]; advantages [B, T] or [B] (per sequence).

    ratio = exp(logp - old_logp) (log-ratio clamped to [-20, 20]); per token `clipped_surrogate`:
    loss = max(-A * ratio, -A * clip(ratio, 1 - clip_eps_low, 1 + clip_eps_high)), the low/high bounds
    defaulting to clip_eps (DAPO's clip-higher sets them apart: Eq. 10 of arXiv 2503.14476). With
    `dual_clip_c` (> 1), tokens with A < 0 are further bounded by -A * dual_clip_c (Ye et al. 2020, veRL's
    clip_ratio_c).
    Returns (loss, stats); stats are masked means, without gradient: clip_frac (the clipped branch
    is active), clip_frac_lower (dual clip active), approx_kl (mean old_logp - logp), ratio_mean,
    ratio_max.
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    advantages = jnp.broadcast_to(advantages, logp.shape)
    mask = loss_mask.astype(logp.dtype)

    log_ratio = jnp.clip(logp - old_logp, -20.0, 20.0)
    ratio = jnp.exp(log_ratio)
    per_token, clipped = clipped_surrogate(ratio, advantages, clip_eps, clip_eps_low, clip_eps_high)
    clip_frac = masked_mean(clipped.astype(logp.dtype), mask)
    clip_frac_lower = jnp.zeros((), logp.dtype)
    if dual_clip_c is not None:
        lower_bound = -advantages * dual_clip_c
        dual_active = (advantages < 0) & (per_token > lower_bound)
        per_token = jnp.where(advantages < 0, jnp.minimum(per_token, lower_bound), per_token)
        clip_frac_lower = masked_mean(dual_active.astype(logp.dtype), mask)

    loss = agg_loss(per_token, mask, agg_mode, agg_norm)
    stats = {
        "clip_frac": clip_frac,
        "clip_frac_lower": clip_frac_lower,
        "approx_kl": masked_mean(-log_ratio, mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": jnp.max(jnp.where(mask > 0, ratio, 0.0)),
    }
    return loss, jax.lax.stop_gradient(stats)


@register_policy_loss("gspo")
def gspo_policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_low: float | None = None,
    clip_eps_high: float | None = None,
    dual_clip_c: float | None = None,
    agg_mode: str = "seq-mean-token-mean",
    agg_norm: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GSPO's sequence-level clipped surrogate (Zheng et al. 2025, arXiv 2507.18071, Eqs. 5 and 7).
    logp, old_logp, loss_mask [B, T]; advantages [B] (one per sequence, GRPO's group-normalised reward).

    s_i = (pi(y_i) / pi_old(y_i))^(1 / |y_i|) = exp(mean over row i's mask-1 tokens of logp - old_logp),
    the log clamped to [-20, 20]; row loss = max(-A_i s_i, -A_i clip(s_i, 1 - clip_eps_low,
    1 + clip_eps_high)), spread over the row's tokens and aggregated by `agg_mode`: the paper's
    1/G sum_i is "seq-mean-token-mean" (every token of a row carries the row's loss). The paper's clip
    ranges are 3e-4 / 4e-4 (§5.1). Only mask-1 tokens (what the policy wrote: never retrieved text) enter
    |y_i| and the ratio. Stats as `ppo_policy_loss`'s, over rows: clip_frac is the share of clipped
    sequences, ratio_mean / ratio_max are of s_i.
    """
    if dual_clip_c is not None:
        raise ValueError("gspo has no dual clip: leave dual_clip_c unset")
    if advantages.ndim != 1:
        raise ValueError(f"gspo takes one advantage per sequence, [B]; got shape {advantages.shape}")
    mask = loss_mask.astype(logp.dtype)
    count = mask.sum(axis=-1)
    token_log_ratio = logp - old_logp
    seq_log_ratio = (token_log_ratio * mask).sum(axis=-1) / jnp.maximum(count, 1.0)
    ratio = jnp.exp(jnp.clip(seq_log_ratio, -20.0, 20.0))  # [B]
    per_row, clipped = clipped_surrogate(ratio, advantages, clip_eps, clip_eps_low, clip_eps_high)
    loss = agg_loss(jnp.broadcast_to(per_row[:, None], logp.shape), mask, agg_mode, agg_norm)
    rows = (count > 0).astype(logp.dtype)
    stats = {
        "clip_frac": masked_mean(clipped.astype(logp.dtype), rows),
        "clip_frac_lower": jnp.zeros((), logp.dtype),
        "approx_kl": masked_mean(-token_log_ratio, mask),
        "ratio_mean": masked_mean(ratio, rows),
        "ratio_max": jnp.max(jnp.where(rows > 0, ratio, 0.0)),
    }
    return loss, jax.lax.stop_gradient(stats)


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, kind: str = "low_var_kl") -> jax.Array:
    """Per-token KL estimate of the policy to a frozen reference (Schulman's k1/k2/k3). [B, T] -> [B, T].

    "kl"/"k1": logp - ref_logp.  "abs": |logp - ref_logp|.  "mse"/"k2": 0.5 (logp - ref_logp)^2.
    "low_var_kl"/"k3": exp(d) - d - 1 with d = ref_logp - logp clamped to [-20, 20], result
    clamped to [-10, 10] (veRL's `core_algos.kl_penalty`).
    """
    diff = logp - ref_logp
    if kind in ("kl", "k1"):
        return diff
    if kind == "abs":
        return jnp.abs(diff)
    if kind in ("mse", "k2"):
        return 0.5 * jnp.square(diff)
    if kind in ("low_var_kl", "k3"):
        d = jnp.clip(-diff, -20.0, 20.0)
        return jnp.clip(jnp.exp(d) - d - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown KL kind {kind!r}; known: {KL_KINDS}")


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Entropy of softmax(logits) per position, in float32. [B, T, V] -> [B, T].

    The entropy bonus is `-entropy_coef * agg_loss(entropy_from_logits(logits), loss_mask, mode)`.
    """
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    loss_mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    agg_mode: str = "token-mean",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO critic loss with value clipping. All inputs [B, T].

    loss = 0.5 * agg(max((V - R)^2, (clip(V, V_old - clip_eps, V_old + clip_eps) - R)^2)).
    Returns (loss, {"vf_clip_frac": fraction of mask-1 tokens where the clipped term is larger}).
    """
    clipped_values = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
    loss_unclipped = jnp.square(values - returns)
    loss_clipped = jnp.square(clipped_values - returns)
    loss = 0.5 * agg_loss(jnp.maximum(loss_unclipped, loss_clipped), loss_mask, agg_mode)
    clip_frac = masked_mean((loss_clipped > loss_unclipped).astype(values.dtype), loss_mask)
    return loss, {"vf_clip_frac": jax.lax.stop_gradient(clip_frac)}
