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
    """`attend` for one query per row as multiply-reduce over the cache in its own [B, S, K, D] layout. The
    batched-matmul form makes XLA:CPU transpose both caches of every layer at every decode step (the matmuls
    want [B, K, S, D]); this one reads them as they are: 4 fused ops per layer fewer, ~10% more tokens/s at
    bench/rollout.py's S. Accelerators keep the matmul form."""
    b, _, h, d = q.shape
    kvh = k.shape[2]
    q = q.reshape(b, 1, kvh, h // kvh, d).astype(jnp.float32)  # [B, 1, K, G, D]
    scores = jnp.sum(q * k[:, :, :, None, :].astype(jnp.float32), axis=-1) * (d**-0.5)  # [B, S, K, G]
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
