"""Grouped-query attention over a key/value context: the dense form (prefill, training, accelerators) and
the CPU decode form (one query per row over the KV cache as laid out).

Shapes: q [B, T, H, D]; k, v [B, S, K, D] with H a multiple of K (query head j reads kv head j // (H / K));
mask [B, T, S] bool (True = the query sees that key). Scores and softmax in fp32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

NEG = -1e30  # finite "minus infinity" for masked logits: a fully masked (padding) row stays finite


def attend(q, k, v, mask, chunk: int = 0):
    """Grouped-query attention. q [B, T, H, D]; k, v [B, S, K, D]; mask [B, T, S] bool -> [B, T, H, D].

    Scores and softmax in fp32; a query whose keys are all masked gets a uniform (finite) average.
    With 0 < chunk < T, queries go `chunk` at a time (T padded up to a multiple) through a `lax.map` whose
    body is rematerialised, so only one chunk's [B, H, chunk, S] scores are live, forward or backward.
    A decode step (T = 1) compiled for CPU takes `attend_decode_cpu`.
    """
    if q.shape[1] == 1 and chunk == 0:
        return jax.lax.platform_dependent(
            q, k, v, mask, cpu=attend_decode_cpu, default=functools.partial(_attend_dense, chunk=0)
        )
    return _attend_dense(q, k, v, mask, chunk)


def attend_decode_cpu(q, k, v, mask):
    """`attend` for one query per row, reading the cache in its own [B, S, K, D] layout (the batched-matmul
    form makes XLA:CPU transpose both caches of every layer at every decode step: they want [B, K, S, D]).

    Scores: one matmul per row of all H query heads against the S*K cached keys ([B, S*K, D] as laid out),
    of which the K diagonal [query group, kv head] blocks are kept. It computes K times the scores it needs
    and is still the fast form on CPU: at bench/rollout.py's S (K = 2) the multiply-reduce over D it replaces
    took ~0.19 ms of a ~2.3 ms decode step per layer, this ~0.05 ms (bench/RESULTS.md, issue 17). The
    weighted sum of values stays a multiply-reduce over S (XLA fuses it with the output projection).
    Accelerators keep the matmul form."""
    b, _, h, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    g = h // kvh
    every = jnp.einsum(
        "bhd,bmd->bmh", q.reshape(b, h, d).astype(jnp.float32), k.reshape(b, s * kvh, d).astype(jnp.float32)
    ).reshape(b, s, kvh, kvh, g)  # [B, S, K (key's head), K (query's group), G]
    scores = jnp.stack([every[:, :, j, j] for j in range(kvh)], axis=2) * (d**-0.5)  # [B, S, K, G]
    scores = jnp.where(mask[:, 0, :, None, None], scores, NEG)
    probs = jax.nn.softmax(scores, axis=1)
    out = jnp.sum(probs[..., None] * v[:, :, :, None, :].astype(jnp.float32), axis=1)  # [B, K, G, D]
    return out.reshape(b, 1, h, d).astype(v.dtype)


def _attend_dense(q, k, v, mask, chunk: int):
    b, t, h, d = q.shape
    if 0 < chunk < t:
        n = -(-t // chunk)
        pad = n * chunk - t
        q_chunks = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
        q_chunks = q_chunks.reshape(b, n, chunk, h, d).swapaxes(0, 1)  # [n, B, chunk, H, D]
        m_chunks = jnp.pad(mask, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, -1).swapaxes(0, 1)
        one = jax.checkpoint(lambda qm: _attend_dense(qm[0], k, v, qm[1], 0))
        out = jax.lax.map(one, (q_chunks, m_chunks)).swapaxes(0, 1).reshape(b, n * chunk, h, d)
        return out[:, :t]
    kvh = k.shape[2]
    q = q.reshape(b, t, kvh, h // kvh, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (d**-0.5)
    scores = jnp.where(mask[:, None, None], scores, NEG)
    # softmax normalised after the weighted sum (as flash attention does): one rounding of the sum instead of
    # one per probability. fp32 log-probs of a full forward land ~25% closer to a float64 forward (max error
    # 9.7e-6 -> 7.3e-6 on the tiny searcher), and so closer to the sampler's (bench/RESULTS.md, issue 17)
    unnormalised = jnp.exp(scores - jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True)))
    out = jnp.einsum("bkgts,bskd->btkgd", unnormalised.astype(v.dtype), v, preferred_element_type=jnp.float32)
    out = out / jnp.moveaxis(jnp.sum(unnormalised, axis=-1), -1, 1)[..., None]
    return out.astype(v.dtype).reshape(b, t, h, d)
