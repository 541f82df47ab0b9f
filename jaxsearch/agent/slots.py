"""Decode slots: a fixed set of KV-cache rows that decode independently, a few tokens per call.

The lockstep rollout decodes a whole segment for every row, then does the host work (parse, retrieve,
append) for every row: each turn waits for its slowest row. Slots let rows proceed on their own:

    slots = Slots(sampler, steps_per_call=16)                     # cheap: compiles are shared
    state = slots.empty(n)                                        # n slots, nothing in them
    state = slots.insert(params, state, slot, prompt_ids, budget, key=key_data)  # a new row (resets the slot)
    state = slots.copy_prompt(state, slot, other, budget, key_data2)  # another new row, the same prompt
    state = slots.insert(params, state, slot, observation_ids, budget)           # the same row, next segment
    state = slots.move(state, slot, lower_slot)  # a row moved down, once rows finish and none waits
    out, state = slots.decode(params, state)     # dispatched, not waited for: the host works meanwhile
    result = slots.fetch(out)                    # host arrays of that call

One `decode` call runs up to `steps_per_call` decode steps of `sampler.decode_loop` for the active slots
(fixed shapes, stop strings / EOS / budgets detected on the device) over the first slots that hold every
active one (8, 16, 32, ... or all: a switch on the device, one compile). `insert` prefills a chunk into one
slot chosen by a traced index, so every slot shares one compile per chunk bucket. A row samples with its own
key and its own cache length as the counter, as in the lockstep rollout, so its tokens do not depend on the
slot it runs in, the other rows, or how its segment is split into calls.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsearch import multihost, parallel
from jaxsearch.agent import sampler as sampler_lib
from jaxsearch.agent.sampler import DecodeState, Sampler, decode_loop
from jaxsearch.models import qwen2
from jaxsearch.models.spans import default_buckets, first_span


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SlotState:
    """n slots on the device: their cache rows, next-token logits and keys (`DecodeState`), and per slot
    whether it decodes (active [n] bool), its tokens left in the segment (budget [n] int32) and the last
    bytes it generated in the segment (window [n, W] uint8, for stop strings)."""

    decode: DecodeState
    active: jax.Array
    budget: jax.Array
    window: jax.Array


@dataclasses.dataclass(frozen=True)
class StepsResult:
    """One decode call, on the host. tokens / logprobs / entropy [n, N] valid up to length [n] (tokens
    decoded in this call); active [n]: the slot still decodes after the call; stop [n]: the stop code of
    a slot that stopped in this call (`SegmentResult.stop`), STOP_BUDGET otherwise."""

    tokens: np.ndarray
    logprobs: np.ndarray
    entropy: np.ndarray
    length: np.ndarray
    stop: np.ndarray
    active: np.ndarray

    def piece(self, slot: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The slot's (tokens, logprobs, entropy) in this call: a piece of its segment (`Segment.join`)."""
        k = int(self.length[slot])
        return self.tokens[slot, :k], self.logprobs[slot, :k], self.entropy[slot, :k]


def decode_steps(
    config, params, slots: SlotState, table, sampling, steps: int, widths: tuple[int, ...] = (), rows=None
):
    """Up to `steps` tokens for each active slot. Returns ((tokens, logprobs, entropy, length, stop,
    active), new SlotState). rows: per-slot settings [n] (`sampler.RowSampling`, the per-row mode; the slots'
    windows must hold their stop strings: `Slots.empty(n, per_row=True)`); None: `sampling` for all.

    widths (ascending, the last = n slots; () = (n,)): the call decodes the first `width` slots, the
    smallest width that holds every active slot (picked on the device): on CPU a step costs about its
    rows, so the last rows of a rollout, moved into the lowest slots, decode as a batch of their own size."""
    n = slots.active.shape[0]
    widths = widths or (n,)
    if widths[-1] != n:
        raise ValueError(f"widths {widths} must end at the {n} slots")

    def over(w):
        def run(slots: SlotState):
            st = slots.decode
            head = DecodeState(cache=st.cache, logits=st.logits[:w], keys=st.keys[:w])  # the whole cache
            active, budget, window = slots.active[:w], slots.budget[:w], slots.window[:w]
            head_rows = None if rows is None else rows.take(slice(0, w))
            out = decode_loop(config, params, head, active, budget, window, table, sampling, steps, head_rows)

            def put(whole, part):
                return jax.lax.dynamic_update_slice_in_dim(whole, part, 0, axis=0)

            def pad(x, value):  # [w, ...] -> [n, ...]
                return jnp.pad(x, [(0, n - w)] + [(0, 0)] * (x.ndim - 1), constant_values=value)

            logits = put(st.logits, out.state.logits)
            new = SlotState(
                decode=DecodeState(cache=out.state.cache, logits=logits, keys=st.keys),
                active=put(slots.active, out.active),
                budget=put(slots.budget, out.budget),
                window=put(slots.window, out.window),
            )
            results = (out.tokens, out.logprobs, out.entropy, out.length)
            stop = pad(out.stop, sampler_lib.STOP_BUDGET)
            return (*(pad(x, 0) for x in results), stop, new.active), new

        return run

    if len(widths) == 1:
        return over(n)(slots)
    highest = jnp.max(jnp.where(slots.active, jnp.arange(1, n + 1), 0))  # slots up to the last active one
    return jax.lax.switch(first_span(widths, highest), [over(w) for w in widths], slots)


def slot_widths(n: int, smallest: int) -> tuple[int, ...]:
    """The widths `decode_steps` picks from for n slots: powers of two from `smallest` below n, and n."""
    return default_buckets(n, smallest) if n > smallest else (n,)


def _row(x, slot):
    """Row `slot` ([] int32, traced) of x, kept as a [1, ...] slice."""
    return jax.lax.dynamic_slice_in_dim(x, slot, 1, axis=0)


def _put(x, slot, value):
    """x with row `slot` replaced by value [1, ...]."""
    return jax.lax.dynamic_update_slice_in_dim(x, value.astype(x.dtype), slot, axis=0)


def _start_segment(slots: SlotState, slot, cache, logits, key_data, budget) -> SlotState:
    """`slots` with the new cache, logits [n, V] and raw keys [n, 2] (`slot`'s row already written in them) and
    a segment of `budget` tokens begun in `slot`: active if budget > 0, its stop-string window emptied."""
    return SlotState(
        decode=DecodeState(cache=cache, logits=logits, keys=jax.random.wrap_key_data(key_data)),
        active=_put(slots.active, slot, (budget > 0)[None]),
        budget=_put(slots.budget, slot, budget[None]),
        window=_put(slots.window, slot, jnp.zeros_like(_row(slots.window, slot))),
    )


def insert(config, params, slots: SlotState, slot, ids, mask, key_data, budget, reset):
    """Append ids [1, T] (mask [1, T]) to the cache row of `slot` ([] int32, traced) and start a segment of
    `budget` tokens there. reset ([] bool): a new row: the slot's cache row is emptied first and its key
    becomes key_data ([2] uint32 raw key data); otherwise the row continues with its key."""
    cache, st = slots.decode.cache, slots.decode

    def row(x):
        return _row(x, slot)

    def put(x, value):
        return _put(x, slot, value)

    row_cache = jax.tree.map(row, cache)
    row_cache = row_cache.replace(lengths=jnp.where(reset, 0, row_cache.lengths))
    logits, row_cache = qwen2.extend_over_span(config, params, row_cache, ids, mask)
    keys = jax.random.key_data(st.keys)
    keys = put(keys, jnp.where(reset, key_data, row(keys)[0])[None])
    new_cache = jax.tree.map(put, cache, row_cache)
    return _start_segment(slots, slot, new_cache, put(st.logits, logits), keys, budget)


def _copy_slot(slots: SlotState, src, dst) -> SlotState:
    """`slots` with everything of slot `dst` ([] int32, traced) replaced by slot `src`'s."""
    return jax.tree.map(lambda x: _put(x, dst, _row(x, src)), slots)


def copy_prompt(slots: SlotState, src, dst, key_data, budget):
    """Start a new row in slot `dst` ([] int32, traced) from the prompt prefilled in slot `src`: its cache
    row and next-token logits copied, its own key (key_data [2] uint32) and a segment of `budget` tokens.
    The GRPO group's other samples of a question so skip their prefill."""
    st = _copy_slot(slots, src, dst).decode
    keys = _put(jax.random.key_data(st.keys), dst, key_data[None])
    return _start_segment(slots, dst, st.cache, st.logits, keys, budget)


def move(slots: SlotState, src, dst) -> SlotState:
    """The row in slot `src` ([] int32, traced) moved to slot `dst`, all of it (cache row, logits, key,
    segment); `src` left inactive."""
    moved = _copy_slot(slots, src, dst)
    return dataclasses.replace(moved, active=_put(moved.active, src, jnp.zeros((1,), bool)))


class Slots:
    """The jitted decode / insert functions for the decode slots of one `Sampler` (its config, cache
    length, stop table, sampling, buckets and mesh)."""

    def __init__(self, sampler: Sampler, steps_per_call: int = 16, smallest_width: int | None = None):
        """smallest_width: the fewest slots a decode call decodes (`decode_steps`' widths); None: 8 where the
        slots sit on one CPU device, else all of them (an accelerator's decode step reads every weight
        whatever its rows, and the first slots of a batch sharded over a mesh sit on its first devices)."""
        if steps_per_call < 1:
            raise ValueError(f"steps_per_call must be >= 1, got {steps_per_call}")
        if smallest_width is None:
            one_cpu = sampler.mesh is None or sampler.mesh.size == 1
            smallest_width = 8 if one_cpu and jax.default_backend() == "cpu" else 2**31 - 1
        if smallest_width < 1:
            raise ValueError(f"smallest_width must be >= 1, got {smallest_width}")
        self.sampler, self.steps_per_call, self.smallest_width = sampler, steps_per_call, smallest_width
        self._decode, self._insert, self._empty, self._copy, self._move = _jitted(sampler.mesh)
        self._no_key = np.zeros(jax.random.key_data(jax.random.key(0)).shape, np.uint32)

    def compiled_count(self) -> int:
        """Compiled variants of decode / insert / empty / copy / move (jax caches them per function)."""
        return sum(f._cache_size() for f in (self._decode, self._insert, self._empty, self._copy, self._move))

    def empty(self, n: int, row_stop_bytes: int = 0) -> SlotState:
        """n empty, inactive slots; row_stop_bytes: the longest request stop string of the per-row mode."""
        s = self.sampler
        return self._empty(s.config, n, s.cache_len, sampler_lib.window_size(s.table, row_stop_bytes))

    def insert(
        self, params, state: SlotState, slot: int, ids: Sequence[int], budget: int, key=None
    ) -> SlotState:
        """Prefill `ids` into `slot` and let it decode a segment of up to `budget` tokens. key: a new row's
        PRNG key as raw key data (`jax.random.key_data`, on the host: an eager op would wait for the device)
        and the slot is emptied first; None: the slot's row continues. The caller keeps the row
        within the cache (tokens past its end are dropped); this only dispatches, it waits for nothing."""
        s = self.sampler  # the caller keeps the row within the cache (reading the lengths would wait)
        buckets = s.prompt_buckets if key is not None else s.chunk_buckets
        width = sampler_lib._bucket(len(ids), buckets, "prompt" if key is not None else "appended chunk")
        padded, mask = sampler_lib._pad_rows([ids], width, left=False)
        key_data = self._no_key if key is None else np.asarray(key, np.uint32)
        return self._insert(
            s.config,
            params,
            state,
            np.int32(slot),
            padded,
            mask,
            key_data,
            np.int32(budget),
            np.bool_(key is not None),
        )

    def copy_prompt(self, state: SlotState, src: int, dst: int, budget: int, key) -> SlotState:
        """Start a new row (key: raw key data, as for `insert`) in `dst` from the prompt that `insert` prefilled
        in `src`, which must not have decoded since; dispatches only."""
        return self._copy(state, np.int32(src), np.int32(dst), np.asarray(key, np.uint32), np.int32(budget))

    def move(self, state: SlotState, src: int, dst: int) -> SlotState:
        """The row in slot `src` moved to slot `dst` (whose row is dropped), as it is; dispatches only."""
        return self._move(state, np.int32(src), np.int32(dst))

    def stop(self, state: SlotState, slot: int) -> SlotState:
        """`slot` decodes no more (a cancelled row): moved onto itself it is left inactive; dispatches only."""
        return self.move(state, slot, slot)

    def decode(self, params, state: SlotState, rows=None):
        """Dispatch one decode call. rows: per-slot settings [n] (`sampler.RowSampling`, the per-row mode).
        Returns (device outputs for `fetch`, new SlotState)."""
        s, widths = self.sampler, slot_widths(state.active.shape[0], self.smallest_width)
        args = (s.config, params, state, s.table, s.sampling, self.steps_per_call, widths)
        if rows is not None:  # rows=None is not passed: the default's call, as before the per-row mode
            args += (jax.tree.map(s._rows, rows),)
        return self._decode(*args)

    @staticmethod
    def fetch(out) -> StepsResult:
        """A decode call's outputs on the host (waits for the call)."""
        return StepsResult(*(multihost.to_host(x) for x in out))


def jit_decode_steps(mesh: jax.sharding.Mesh | None = None):
    """`decode_steps` jitted as `Slots.decode` runs it (under the mesh's activation sharding, the slot state
    donated; config, sampling and steps static): `launch/plan.py` lowers this same function."""
    return _jitted(mesh)[0]


@functools.lru_cache(maxsize=None)
def _jitted(mesh: jax.sharding.Mesh | None):
    """(decode_steps, insert, _empty, copy_prompt, move) jitted once per mesh (under its activation sharding),
    the slot state donated: every `Slots` of a process shares their compiles."""
    shard = (lambda f: parallel.with_activation_sharding(f, mesh)) if mesh is not None else (lambda f: f)
    return (
        jax.jit(shard(decode_steps), static_argnums=(0, 4, 5, 6), donate_argnums=(2,)),
        jax.jit(shard(insert), static_argnums=(0,), donate_argnums=(2,)),
        jax.jit(shard(_empty), static_argnums=(0, 1, 2, 3)),
        jax.jit(shard(copy_prompt), donate_argnums=(0,)),
        jax.jit(shard(move), donate_argnums=(0,)),
    )


def _empty(config, n: int, cache_len: int, window: int) -> SlotState:
    cache = qwen2.init_cache(config, n, cache_len)
    logits = jnp.zeros((n, config.vocab_size), jnp.float32)
    keys = jax.random.split(jax.random.key(0), n)  # placeholders: a row's insert sets its key
    return SlotState(
        decode=DecodeState(cache=cache, logits=logits, keys=keys),
        active=jnp.zeros((n,), bool),
        budget=jnp.zeros((n,), jnp.int32),
        window=jnp.zeros((n, window), jnp.uint8),
    )
