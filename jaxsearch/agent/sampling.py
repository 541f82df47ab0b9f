"""Sampling one token per row from next-token logits [B, V]: greedy (the first argmax), temperature, top-k and
top-p, or per-row settings; with the token's log-prob and the distribution's entropy, without [B, V]
log-probs in memory. The decode loop (`agent.sampler`) calls `sample_tokens` once a step."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy. top_k 0 and top_p 1.0 switch those filters off. Static under jit."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RowSampling:
    """Per-row sampling settings (the per-row mode; `agent.requests.row_sampling` builds them): traced, so
    rows of different settings share a decode call and its compile. temperature [B] (0: greedy), top_p [B]
    in (0, 1]; request stop strings stops [B, R, M] uint8 with stop_mask [B, R, M] (an all-False row of the
    mask: no string). Stop code of request string r: `StopTable.request_stop_code(r)`."""

    temperature: jax.Array
    top_p: jax.Array
    stops: jax.Array
    stop_mask: jax.Array

    def take(self, rows) -> "RowSampling":
        """The settings of `rows` (host index / slice)."""
        return jax.tree.map(lambda x: x[rows], self)


def _filter_logits(logits, sampling: SamplingParams):
    """Temperature-scaled logits [B, V] with top-k / top-p filtered entries at -inf (fp32)."""
    scaled = logits / sampling.temperature
    if sampling.top_k > 0:
        kth = jax.lax.top_k(scaled, sampling.top_k)[0][:, -1:]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    if sampling.top_p < 1.0:
        scaled = jnp.where(scaled < top_p_cutoff(scaled, sampling.top_p), -jnp.inf, scaled)
    return scaled


def _order_key(x):
    """float32 -> uint32 in the same order (-inf first): negatives have all bits flipped, the rest the sign."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _from_order_key(key):
    bits = jnp.where(key >> 31 == 1, key & jnp.uint32(0x7FFFFFFF), ~key)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def top_p_cutoff(scaled, top_p: float):
    """[B, 1]: per row of logits [B, V] (fp32, -inf allowed) the least value v whose strictly larger entries
    hold less than `top_p` of the probability: the entries >= v are the nucleus (the fewest largest entries
    whose mass reaches top_p, ties kept), as sorting and a cumulative sum give it. Found by bisection over the
    float32 order, 32 masked sums of [B, V] and no sort: on CPU the sort cost ~4x a whole decode step of the
    tiny searcher at 50 rows, and 2 s a step at Qwen's vocabulary (bench/RESULTS.md, issue 17)."""
    probs = jax.nn.softmax(scaled, axis=-1)

    def mass_above(key):  # [B] probability of the entries > the value of key [B]
        return jnp.sum(jnp.where(scaled > _from_order_key(key)[:, None], probs, 0.0), axis=-1)

    lowest = _order_key(jnp.min(jnp.where(jnp.isfinite(scaled), scaled, jnp.inf), axis=-1))
    highest = _order_key(jnp.max(scaled, axis=-1))  # nothing above it: mass 0 < top_p

    def halve(_, bounds):  # mass_above(lo) >= top_p > mass_above(hi): the answer is in (lo, hi]
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        inside = mass_above(mid) < top_p
        return jnp.where(inside, lo, mid), jnp.where(inside, mid, hi)

    _, hi = jax.lax.fori_loop(0, 32, halve, (lowest, highest))
    keep_all = mass_above(lowest) < top_p
    return _from_order_key(jnp.where(keep_all, lowest, hi))[:, None]


def first_argmax(x):
    """`jnp.argmax(x, -1)` for x [B, V] (the first index of each row's maximum) as two plain reductions:
    XLA:CPU runs argmax's (value, index) reduction as a scalar loop, ~0.2 ms of a ~2.3 ms decode step at
    bench/rollout.py's S (16 x 8,192 logits). A row without a maximum (NaN) gets V - 1."""
    v = x.shape[-1]
    top = jnp.max(x, axis=-1)[:, None]  # from a [B] max, as `_logprob_and_entropy`'s
    first = jnp.min(jnp.where(x == top, jnp.arange(v, dtype=jnp.int32), v), axis=-1)
    return jnp.minimum(first, v - 1)


def sample_tokens(logits, keys, counters, sampling: SamplingParams, rows: RowSampling | None = None):
    """Sample one token per row. logits [B, V] fp32; keys [B] PRNG keys; counters [B] int (fold-in).

    Returns (tokens [B] int32, logprob [B], entropy [B]). logprob is under the sampling distribution
    (temperature, top-k, top-p); for greedy (temperature 0) it is the model's log-prob at temperature 1.
    entropy is of the full-vocabulary temperature-scaled distribution (temperature 1 for greedy).
    rows: per-row temperature and top_p (the per-row mode; `sampling`'s top_k still applies to all rows).
    """
    logits = logits.astype(jnp.float32)
    if rows is not None:
        return _sample_per_row(logits, keys, counters, sampling.top_k, rows)
    if sampling.temperature == 0.0:  # one distribution: the sampling one is the full one
        tokens = first_argmax(logits)
        return (tokens, *_logprob_and_entropy(logits, tokens))
    dist = _filter_logits(logits, sampling)
    row_keys = jax.vmap(jax.random.fold_in)(keys, counters)
    tokens = jax.vmap(jax.random.categorical)(row_keys, dist).astype(jnp.int32)
    logprob = _logprob_and_entropy(dist, tokens, entropy=False)[0]
    return tokens, logprob, _logprob_and_entropy(logits / sampling.temperature, tokens)[1]


def _logprob_and_entropy(x, tokens, entropy: bool = True):
    """log softmax(x)[b, tokens[b]] [B] and the entropy of softmax(x) [B] (None without `entropy`) for logits
    x [B, V] fp32 (-inf allowed, a finite entry per row), no [B, V] log-probs in memory: log-prob x[t] - max -
    log s (`jax.nn.log_softmax`'s bits), entropy log s - sum(e z) / s, z = x - max, e = exp(z), s = sum(e),
    e z = 0 at -inf. A [B] max, x[t] not z[t]: else XLA:CPU wrote max and z as [B, V] arrays (issue 41)."""
    top = jnp.max(x, axis=-1)
    z = x - top[:, None]
    e = jnp.exp(z)
    s = jnp.sum(e, axis=-1)
    log_s = jnp.log(s)
    logprob = (jnp.take_along_axis(x, tokens[:, None], axis=-1)[:, 0] - top) - log_s
    if not entropy:
        return logprob, None
    return logprob, log_s - jnp.sum(jnp.where(e > 0, e * z, 0.0), axis=-1) / s


def _sample_per_row(logits, keys, counters, top_k: int, rows: RowSampling):
    """`sample_tokens` with row b at temperature rows.temperature[b] and top_p rows.top_p[b], each row by the
    conventions of `sample_tokens` for its own settings (greedy rows: first argmax, temperature-1 logprob and
    entropy)."""
    greedy = rows.temperature == 0.0
    scaled = logits / jnp.where(greedy, 1.0, rows.temperature)[:, None]
    dist = scaled
    if top_k > 0:
        kth = jax.lax.top_k(dist, top_k)[0][:, -1:]
        dist = jnp.where(dist < kth, -jnp.inf, dist)
    cutoff = jnp.where(rows.top_p[:, None] < 1.0, top_p_cutoff(dist, rows.top_p), -jnp.inf)
    dist = jnp.where(dist < cutoff, -jnp.inf, dist)
    dist = jnp.where(greedy[:, None], logits, dist)
    row_keys = jax.vmap(jax.random.fold_in)(keys, counters)
    sampled = jax.vmap(jax.random.categorical)(row_keys, dist).astype(jnp.int32)
    tokens = jnp.where(greedy, first_argmax(logits), sampled)
    logprob = _logprob_and_entropy(dist, tokens, entropy=False)[0]
    return tokens, logprob, _logprob_and_entropy(scaled, tokens)[1]
