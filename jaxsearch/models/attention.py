"""Grouped-query attention over a key/value context: the dense form (prefill, training, accelerators), its
fused alternatives through `jax.nn.dot_product_attention` (`IMPLS`), and the CPU decode form (one query per
row over the KV cache as laid out).

Shapes: q [B, T, H, D]; keys k [B, K, D, S] and values v [B, K, S, D] (the KV cache's layout: per row and kv
head, scores = q [G, D] @ k [D, S] and out = weights [G, S] @ v [S, D], two plain matmuls with no transpose)
with H a multiple of K (query head j reads kv head j // (H / K)); mask [B, T, S] bool (True = the query sees
that key). Scores and softmax in fp32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxsearch.models.spans import SPAN_BLOCK, SPANS_FROM, cache_spans, first_span

NEG = -1e30  # finite "minus infinity" for masked logits: a fully masked (padding) row stays finite

# How a chunk of T > 1 queries (prefill, appends, training) attends (`Qwen2Config.attention_impl`):
#   reference  `_attend_dense` below, the [B, H, T, S] scores in memory (chunked by `chunk`)
#   xla        jax.nn.dot_product_attention(implementation=None): XLA's choice (jax 0.10: its own einsum and
#              softmax, scores in memory, chunked like reference)
#   cudnn      cuDNN's flash attention (GPU; bf16 / fp16; head_dim a multiple of 8, <= 128): no scores in
#              memory, so `chunk` does not apply; the mask goes in as an additive [B, 1, T, S] bias
#   auto       cudnn where it applies (`resolve_impl`), else reference: its softmax normalised after the
#              weighted sum lands closer to float64 (below), and on CPU xla was no steadier a win (0.7-1.1x)
IMPLS = ("reference", "xla", "cudnn", "auto")


def attend(q, k, v, mask, chunk: int = 0, impl: str = "reference"):
    """Grouped-query attention. q [B, T, H, D]; k [B, K, D, S]; v [B, K, S, D]; mask [B, T, S] bool
    -> [B, T, H, D].

    Scores and softmax in fp32; a query whose keys are all masked gets a uniform (finite) average.
    With 0 < chunk < T, queries go `chunk` at a time (T padded up to a multiple) through a `lax.map` whose
    body is rematerialised, so only one chunk's [B, H, chunk, S] scores are live, forward or backward.
    impl: one of IMPLS, for T > 1. A decode step (T = 1) takes the reference forms whatever impl and chunk
    (a chunk of one query is the whole query): compiled for CPU, `attend_decode_cpu`.
    """
    if q.shape[1] == 1:
        return jax.lax.platform_dependent(
            q, k, v, mask, cpu=attend_decode_cpu, default=functools.partial(_attend_dense, chunk=0)
        )
    impl = "reference" if q.shape[1] == 1 else resolve_impl(impl, q.dtype, q.shape[-1])
    if impl == "cudnn":
        return _attend_cudnn(q, k, v, mask)
    if impl == "xla":
        return _chunked(_attend_xla, q, k, v, mask, chunk)
    return _attend_dense(q, k, v, mask, chunk)


def resolve_impl(impl: str, dtype, head_dim: int) -> str:
    """The implementation `attend` runs for `impl` (IMPLS) on the default backend, for inputs of `dtype` and
    `head_dim`: "auto" is cudnn on a GPU for bf16 / fp16 and a head_dim cuDNN's flash attention takes (a
    multiple of 8, <= 128: jax's `check_is_flash_attention` before Hopper), else reference."""
    if impl not in IMPLS:
        raise ValueError(f"attention impl {impl!r}: expected one of {', '.join(IMPLS)}")
    if impl != "auto":
        return impl
    fits = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128
    return "cudnn" if fits and jax.default_backend() == "gpu" else "reference"


def _attend_xla(q, k, v, mask):
    """One chunk through jax.nn.dot_product_attention, implementation None (XLA picks). q, k, v cast to
    q's dtype (the call wants one dtype); it masks with -0.7 x the dtype's max, so a fully masked query
    also gets a uniform average."""
    dt = q.dtype
    k, v = k.transpose(0, 3, 1, 2).astype(dt), v.swapaxes(1, 2).astype(dt)  # the call's [B, S, K, D]
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None])


def _attend_cudnn(q, k, v, mask):
    """cuDNN's flash attention over the whole T (nothing chunked). Its backward with a mask (as a bias) takes
    only even T and S (jax's `check_is_flash_attention`), so an odd T or S is padded by one (a masked key, a
    dropped query)."""
    t, s, dt = q.shape[1], v.shape[2], q.dtype
    pt, ps = t % 2, s % 2
    q = jnp.pad(q, ((0, 0), (0, pt), (0, 0), (0, 0)))
    k, v = k.transpose(0, 3, 1, 2), v.swapaxes(1, 2)  # the call's [B, S, K, D]
    k, v = (jnp.pad(x.astype(dt), ((0, 0), (0, ps), (0, 0), (0, 0))) for x in (k, v))
    mask = jnp.pad(mask, ((0, 0), (0, pt), (0, ps)))
    out = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="cudnn")
    return out[:, :t]


def attend_decode_cpu(q, k, v, mask):
    """`attend` for one query per row on CPU, over the cache as laid out: per row and kv head, the G query
    heads [G, D] @ that head's keys [D, S], a softmax over the last axis, then the weights [G, S] @ its values
    [S, D] (plain matmuls: in a [B, S, K, D] layout XLA:CPU transposed both caches at every step or computed
    K times the products; keys as [S, D] took a transposed matmul, ~1.7x slower; issue 41).

    A cache of SPANS_FROM slots or more is read over the shortest span that holds every row's keys (its first
    128, 256, 512, ... slots, or all; a `lax.switch` on the mask): at 1,024 slots a step is bound by reading
    the whole cache, so this makes a decode step of 50 rows with ~200 keys each ~2.2x faster
    (bench/RESULTS.md, issue 17). Its softmax reduces in an order fixed by the span (`_fixed_order`), so a
    row's bits depend neither on the span nor on the other rows of its batch: a row decodes the same tokens in
    a slot as in a lockstep batch. Smaller caches take the plain softmax, whose sums XLA:CPU may run with
    different kernels by size, so there a row's bits can follow the batch when B x S is small.
    """
    s = v.shape[2]
    if s < SPANS_FROM:
        return _attend_one_query(q, k, v, mask, exact=False)
    spans = cache_spans(s)
    keys = jnp.max(jnp.where(mask[:, 0], jnp.arange(1, s + 1), 0))  # the keys the furthest row reads
    branches = [functools.partial(_attend_one_query, span=n, exact=True) for n in spans]
    return jax.lax.switch(first_span(spans, keys), branches, q, k, v, mask)


def _attend_one_query(q, k, v, mask, exact: bool, span: int | None = None):
    """One query per row over the cache's first `span` slots (None: all). q [B, 1, H, D]; k [B, K, D, S];
    v [B, K, S, D].
    exact: the softmax's max and sum, and the weighted sum of values, in `_fixed_order`-style blocks of
    SPAN_BLOCK slots, so the slots past a row's keys add exact zeros (its bits follow neither its batch nor
    the span) and no sum runs over more than SPAN_BLOCK terms (one matmul over 1,152 slots strays ~1e-6 from
    a float64 sum)."""
    if span is not None:
        k, v, mask = k[..., :span], v[:, :, :span], mask[:, :, :span]
    b, _, h, d = q.shape
    kvh, s = v.shape[1], v.shape[2]
    g = h // kvh
    q = q.reshape(b, kvh, g, d).astype(jnp.float32)
    scores = jnp.einsum("bkgd,bkds->bkgs", q, k.astype(jnp.float32)) * (d**-0.5)  # [B, K, G, S]
    scores = jnp.where(mask[:, :, None, :], scores, NEG)
    v = v.astype(jnp.float32)
    # the softmax normalised after the weighted sum, as `_attend_reference` does (closer to float64)
    if not exact:
        unnormalised = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
        out = jnp.einsum("bkgs,bksd->bkgd", unnormalised, v) / jnp.sum(unnormalised, axis=-1)[..., None]
        return out.reshape(b, 1, h, d).astype(k.dtype)
    unnormalised = jnp.exp(scores - _fixed_order(scores, jnp.maximum, NEG)[..., None])
    pad = -s % SPAN_BLOCK  # zero weights on zero values past the span's end
    weights = jnp.pad(unnormalised, ((0, 0), (0, 0), (0, 0), (0, pad))).reshape(b, kvh, g, -1, SPAN_BLOCK)
    v = jnp.pad(v, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(b, kvh, -1, SPAN_BLOCK, d)
    parts = jnp.einsum("bkgnm,bknmd->nbkgd", weights, v)  # one matmul per block, then the blocks in order
    total = parts[0]
    for i in range(1, parts.shape[0]):
        total = total + parts[i]
    out = total / _fixed_order(unnormalised, jnp.add, 0.0)[..., None]
    return out.reshape(b, 1, h, d).astype(k.dtype)


def _fixed_order(x, op, pad):
    """x [..., S] reduced over S by `op` in an order fixed by S alone, in elementwise ops: blocks of
    SPAN_BLOCK keys (the last padded with `pad`) each folded by halving, then block after block. Past a row's
    keys x is `pad` (0 for the sum, NEG for the max), which leaves the result's bits as they are, so every
    span that holds the row's keys gives the same bits. (A reduction op would not do: XLA:CPU picks YNNPACK's
    kernel or its own by size, and fuses the exp after the max into YNNPACK's; the two round differently.)"""
    s = x.shape[-1]
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, -s % SPAN_BLOCK)], constant_values=pad)
    x = x.reshape(*x.shape[:-1], -1, SPAN_BLOCK)
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = op(x[..., :half], x[..., half:])
    total = x[..., 0, 0]
    for i in range(1, x.shape[-2]):
        total = op(total, x[..., i, 0])
    return total


def _chunked(kernel, q, k, v, mask, chunk: int):
    """kernel(q, k, v, mask) over queries `chunk` at a time (0 or >= T: at once), as `attend` describes."""
    b, t, h, d = q.shape
    if not 0 < chunk < t:
        return kernel(q, k, v, mask)
    n = -(-t // chunk)
    pad = n * chunk - t
    q_chunks = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    q_chunks = q_chunks.reshape(b, n, chunk, h, d).swapaxes(0, 1)  # [n, B, chunk, H, D]
    m_chunks = jnp.pad(mask, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, -1).swapaxes(0, 1)
    one = jax.checkpoint(lambda qm: kernel(qm[0], k, v, qm[1]))
    out = jax.lax.map(one, (q_chunks, m_chunks)).swapaxes(0, 1).reshape(b, n * chunk, h, d)
    return out[:, :t]


def _attend_dense(q, k, v, mask, chunk: int):
    """The reference attention (`attend`'s impl "reference"), chunked by `chunk`."""
    return _chunked(_attend_reference, q, k, v, mask, chunk)


def _attend_reference(q, k, v, mask):
    b, t, h, d = q.shape
    kvh = k.shape[1]
    # q as [B, K, G, T, D]: each dot in the batched matmul's own layouts (XLA:CPU 0.10 has no bf16 x bf16 = f32
    # dot for other orders of these operands)
    q = jnp.moveaxis(q.reshape(b, t, kvh, h // kvh, d), 1, 3)
    scores = jnp.einsum("bkgtd,bkds->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (d**-0.5)
    scores = jnp.where(mask[:, None, None], scores, NEG)
    # softmax normalised after the weighted sum (as flash attention does): one rounding of the sum instead of
    # one per probability. fp32 log-probs of a full forward land ~25% closer to a float64 forward (max error
    # 9.7e-6 -> 7.3e-6 on the tiny searcher), and so closer to the sampler's (bench/RESULTS.md, issue 17)
    unnormalised = jnp.exp(scores - jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True)))
    out = jnp.einsum("bkgts,bksd->bkgtd", unnormalised.astype(v.dtype), v, preferred_element_type=jnp.float32)
    out = out / jnp.sum(unnormalised, axis=-1)[..., None]
    return jnp.moveaxis(out.astype(v.dtype), 3, 1).reshape(b, t, h, d)
