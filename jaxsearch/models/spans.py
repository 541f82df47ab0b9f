"""Lengths in powers of two: the sampler's padding buckets and the spans of a KV cache that a step reads.

A row's keys fill a cache from its first slot, so a step that only needs the first n slots of every row can
read (and write) a span of n slots instead of the whole cache. Spans are 128, 256, 512, ... slots, and the
whole cache; the branch is picked on the device (`lax.switch`), so one compile serves every length.
"""

from __future__ import annotations

import jax.numpy as jnp

SPAN_BLOCK = 128  # the smallest span, in slots; also the block of the CPU decode attention's fixed-order sums
SPANS_FROM = 512  # caches of this many slots or more are read over spans (a smaller one is read whole)


def default_buckets(limit: int, smallest: int = 16) -> tuple[int, ...]:
    """Powers of two from `smallest` up to and including `limit`."""
    out, b = [], smallest
    while b < limit:
        out.append(b)
        b *= 2
    return tuple(out) + (limit,)


def cache_spans(slots: int, at_least: int = 1) -> tuple[int, ...]:
    """The spans (slot counts) a cache of `slots` slots is read over, each of at least `at_least` slots:
    (slots,) for a cache below SPANS_FROM."""
    if slots < SPANS_FROM:
        return (slots,)
    return tuple(n for n in default_buckets(slots, SPAN_BLOCK) if n >= min(at_least, slots))


def first_span(spans: tuple[int, ...], slots_needed):
    """Index ([] int32, traced) of the first of `spans` holding `slots_needed` ([] int) slots: a count of the
    spans below it (jnp.searchsorted lowers to a while loop)."""
    return jnp.sum(jnp.asarray(spans) < slots_needed, dtype=jnp.int32)
