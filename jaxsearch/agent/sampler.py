"""Jitted batched sampling over the Qwen2 KV cache: prefill, decode-until-stop, and append.

The device loop (`decode_segment`) is one `lax.while_loop` that samples a token per active row,
appends it to the cache, and stops a row when it writes a stop string, an end-of-sequence id, or
reaches its token budget. Stop strings are matched on bytes, not token ids: each row keeps a rolling
window of the bytes it generated in this segment, so `</search>` is found however the BPE split it
(`"</"`, `"search"`, `">\\n\\n"`, or `"ing</"` ...). The row stops at the token that completes the
string; tokens are never re-encoded.

Host-facing API:

    sampler = Sampler(config, stop_table=StopTable.build(tokenizer, ["</search>", "</answer>"],
                      eos_ids=[tokenizer.eos_id]), cache_len=1024, max_segment=256)
    state = sampler.start(params, prompts, seed)           # prompts: list of token-id lists
    seg, state = sampler.decode(params, state, budget)     # seg: numpy arrays per row
    state = sampler.append(params, state, chunks)          # observations, per row (empty: nothing)
    ids = sampler.complete(params, prompts, seed, budget)  # start + decode, new token ids per prompt

Shapes are static: prompts and appended chunks are padded to length buckets (`complete`'s batches to row
buckets), so after warm-up a multi-turn rollout compiles nothing new.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsearch import multihost, parallel
from jaxsearch.models import qwen2
from jaxsearch.agent.sampling import RowSampling, SamplingParams, sample_tokens
from jaxsearch.models.spans import default_buckets

MAX_TOKEN_BYTES = 64  # bytes kept per token for stop matching (longer tokens keep their last 64)
STOP_BUDGET = -1  # SegmentResult.stop code: budget or cache end reached (no stop)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StopTable:
    """Device-side tables for stop detection.

    token_bytes [V, MAX_TOKEN_BYTES] uint8 (left-aligned), token_len [V]; stops [S, M] uint8 with
    stop_mask [S, M]; eos_ids [E]. Stop code s < S means stop string s; S + e means eos_ids[e].
    """

    token_bytes: jax.Array
    token_len: jax.Array
    stops: jax.Array
    stop_mask: jax.Array
    eos_ids: jax.Array

    @classmethod
    def build(
        cls,
        tokenizer,
        stop_strings: Sequence[str],
        eos_ids: Sequence[int] = (),
        vocab_size: int | None = None,
    ) -> "StopTable":
        """Tables for `tokenizer` (needs `token_bytes(id)`); vocab_size: the model's (>= tokenizer's)."""
        vocab = max(vocab_size or 0, tokenizer.vocab_size)
        table = np.zeros((vocab, MAX_TOKEN_BYTES), np.uint8)
        lengths = np.zeros((vocab,), np.int32)
        for i in range(tokenizer.vocab_size):
            b = tokenizer.token_bytes(i)[-MAX_TOKEN_BYTES:]
            table[i, : len(b)] = np.frombuffer(b, np.uint8)
            lengths[i] = len(b)
        return cls.from_arrays(table, lengths, stop_strings, eos_ids)

    @classmethod
    def eos_only(cls, vocab_size: int, eos_ids: Sequence[int] = ()) -> "StopTable":
        """A table with no stop strings (no token bytes needed): rows stop at `eos_ids` or their budget."""
        table = np.zeros((vocab_size, MAX_TOKEN_BYTES), np.uint8)
        return cls.from_arrays(table, np.zeros(vocab_size, np.int32), [], eos_ids)

    @classmethod
    def from_arrays(cls, table, lengths, stop_strings, eos_ids) -> "StopTable":
        encoded = [s.encode("utf-8") for s in stop_strings]
        if any(not s for s in encoded):
            raise ValueError("stop strings must be non-empty")
        width = max([len(s) for s in encoded] + [1])
        stops = np.zeros((len(encoded), width), np.uint8)
        mask = np.zeros((len(encoded), width), bool)
        for i, s in enumerate(encoded):
            stops[i, : len(s)] = np.frombuffer(s, np.uint8)
            mask[i, : len(s)] = True
        return cls(
            jnp.asarray(table),
            jnp.asarray(lengths),
            jnp.asarray(stops),
            jnp.asarray(mask),
            jnp.asarray(np.asarray(eos_ids, np.int32).reshape(-1)),
        )

    @property
    def num_stop_strings(self) -> int:
        return self.stops.shape[0]

    def request_stop_code(self, r: int = 0) -> int:
        """The stop code of a row's request stop string r (`RowSampling`): after the strings and eos ids."""
        return self.num_stop_strings + self.eos_ids.shape[0] + r


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """What persists between segments: the cache, each row's next-token logits [B, V] and PRNG key."""

    cache: qwen2.KVCache
    logits: jax.Array
    keys: jax.Array  # [B] typed PRNG keys


@dataclasses.dataclass(frozen=True)
class SegmentResult:
    """One decoded segment, on the host. tokens/logprobs/entropy [B, N]; valid up to length [B].

    stop [B]: index of the stop string that ended the row, num_stop_strings + e for eos_ids[e], or
    STOP_BUDGET (-1) when the budget / cache ran out or the row was inactive; in the per-row mode
    `StopTable.request_stop_code(r)` for the row's request stop string r.
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    entropy: np.ndarray
    length: np.ndarray
    stop: np.ndarray

    def row(self, i: int, budget: int) -> Segment:
        """Row i's segment, decoded under `budget` tokens."""
        n = int(self.length[i])
        return Segment(self.tokens[i, :n], self.logprobs[i, :n], self.entropy[i, :n], self.stop[i], budget)


@dataclasses.dataclass(frozen=True)
class Segment:
    """One row's decoded segment, on the host, as the agent engine records and acts on it: the sampled
    tokens [n] with their logprobs and entropy [n], its stop code (`SegmentResult.stop`) and the budget of
    tokens it was decoded under."""

    tokens: np.ndarray
    logprobs: np.ndarray
    entropy: np.ndarray
    stop: int
    budget: int

    @classmethod
    def join(cls, pieces: Sequence[tuple], stop: int, budget: int) -> Segment:
        """A segment decoded in several calls (decode slots): pieces = (tokens, logprobs, entropy) per call."""
        tokens, logprobs, entropy = (np.concatenate(x) for x in zip(*pieces))
        return cls(tokens, logprobs, entropy, stop, budget)


def roll_window(window, tok, table: StopTable):
    """Append each row's token bytes to its byte window [B, W], keeping the last W bytes."""
    n = table.token_len[tok]
    full = jnp.concatenate([window, table.token_bytes[tok]], axis=1)  # (window ++ bytes)[n : n + W]
    return jnp.take_along_axis(full, n[:, None] + jnp.arange(window.shape[1])[None], axis=1)


def window_size(table: StopTable, row_stop_bytes: int = 0) -> int:
    """Bytes of generated text to keep: a stop string can start up to M - 1 bytes before the last token
    (M: the longest of the table's strings and, in the per-row mode, `row_stop_bytes`)."""
    return MAX_TOKEN_BYTES + max(table.stops.shape[1], row_stop_bytes) - 1


def match_stops(window, table: StopTable):
    """window [B, W] uint8 -> stop index [B] of the first stop string found anywhere in it, or -1."""
    if table.num_stop_strings == 0:
        return jnp.full((window.shape[0],), -1, jnp.int32)
    return _first(_found(window, table.stops, table.stop_mask))


def match_row_stops(window, rows: RowSampling):
    """window [B, W] uint8 -> index [B] of the first of each row's own stop strings found in it, or -1."""
    found = _found(window, rows.stops, rows.stop_mask) & jnp.any(rows.stop_mask, -1)  # an empty entry: none
    return _first(found)


def _found(window, stops, mask):
    """window [B, W]; stops, mask [S, M] (every row's) or [B, S, M] (each row's own) -> [B, S]: stop string
    s occurs in the row's window."""
    w, m = window.shape[1], stops.shape[-1]
    padded = jnp.pad(window, ((0, 0), (0, m - 1)))
    idx = jnp.arange(w)[:, None] + jnp.arange(m)[None, :]  # [W, M]
    unfolded = padded[:, idx]  # [B, W, M]
    if stops.ndim == 2:  # [B, S, W, M]
        eq = (unfolded[:, None] == stops[None, :, None]) | ~mask[None, :, None]
    else:
        eq = (unfolded[:, None] == stops[:, :, None]) | ~mask[:, :, None]
    return jnp.any(jnp.all(eq, axis=-1), axis=-1)


def _first(found):
    """found [B, S] -> the first s found per row, or -1."""
    return jnp.where(jnp.any(found, axis=-1), jnp.argmax(found, axis=-1), -1)


def _match_eos(tok, table: StopTable):
    """tok [B] -> num_stop_strings + e where tok == eos_ids[e], else STOP_BUDGET."""
    if table.eos_ids.shape[0] == 0:
        return jnp.full(tok.shape, STOP_BUDGET, jnp.int32)
    is_eos = tok[:, None] == table.eos_ids[None]
    return jnp.where(jnp.any(is_eos, -1), table.num_stop_strings + jnp.argmax(is_eos, -1), STOP_BUDGET)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SegmentState:
    """The carry of `decode_loop`'s while loop (B rows, N = tokens per call, W = window_size(table))."""

    step: jax.Array  # [] int32: tokens decoded so far in this call (the loop stops at N)
    state: DecodeState  # the cache, next-token logits [B, V] and keys [B], advanced per decoded token
    active: jax.Array  # [B] bool: the row still decodes (no stop, no eos, budget left)
    budget: jax.Array  # [B] int32: tokens the row may still decode
    window: jax.Array  # [B, W] uint8: the last W bytes the row generated, for stop-string matching
    tokens: jax.Array  # [B, N] int32: sampled tokens, valid up to length
    logprobs: jax.Array  # [B, N] float32: their log-probs under the sampling distribution
    entropy: jax.Array  # [B, N] float32: the sampling distribution's entropy at each token
    length: jax.Array  # [B] int32: tokens the row decoded in this call
    stop: jax.Array  # [B] int32: stop code (see SegmentResult.stop); STOP_BUDGET while none


def decode_loop(
    config: qwen2.Qwen2Config,
    params,
    state: DecodeState,
    active,
    budget,
    window,
    table: StopTable,
    sampling: SamplingParams,
    max_new: int,
    rows: RowSampling | None = None,
) -> SegmentState:
    """Decode up to `max_new` tokens for each active row until it stops (stop string, EOS, no budget left).

    active [B] bool; budget [B] int32 tokens left (clipped to the cache's free slots); window [B, W] uint8:
    the row's last generated bytes (zeros at a segment's start). state's logits and keys are [B, ...]; its
    cache may hold more rows, of which the first B decode (the others are kept). The one loop under
    `decode_segment` (a whole segment per call) and the decode slots' `agent/slots.decode_steps` (a few tokens
    per call). rows: the per-row mode's settings [B] (W must hold their stop strings: `window_size`); a
    row's own stop string wins over the table's codes at the same token.
    """
    b = budget.shape[0]
    budget = jnp.minimum(budget, state.cache.max_len - state.cache.lengths[:b])  # never past the cache end
    config, params = qwen2.for_decoding(config, params)

    def cond(seg: SegmentState):
        return (seg.step < max_new) & jnp.any(seg.active)

    def write(out, value, active, step):  # a row active at `step` has decoded `step` tokens in this call
        column = jnp.where(active, value, jnp.zeros_like(value))[:, None]
        return jax.lax.dynamic_update_slice_in_dim(out, column, step, axis=1)

    def body(seg: SegmentState) -> SegmentState:
        st, active, length = seg.state, seg.active, seg.length
        tok, logp, ent = sample_tokens(st.logits, st.keys, st.cache.lengths[:b], sampling, rows)
        logits, cache = qwen2.decode_step(config, params, st.cache, tok, active)
        code = _match_eos(tok, table)
        window = seg.window
        if table.num_stop_strings or rows is not None:  # the byte scan only where there are stop strings
            window = jnp.where(active[:, None], roll_window(seg.window, tok, table), seg.window)
            hit = match_stops(window, table)
            code = jnp.where(hit >= 0, hit, code)
        if rows is not None:
            hit = match_row_stops(window, rows)
            code = jnp.where(hit >= 0, table.request_stop_code() + hit, code)
        budget = seg.budget - active
        return SegmentState(
            step=seg.step + 1,
            # rows that appended a token get the logits after it (also when they just stopped)
            state=DecodeState(
                cache=cache, logits=jnp.where(active[:, None], logits, st.logits), keys=st.keys
            ),
            active=active & (code == STOP_BUDGET) & (budget > 0),
            budget=budget,
            window=window,
            tokens=write(seg.tokens, tok, active, seg.step),
            logprobs=write(seg.logprobs, logp, active, seg.step),
            entropy=write(seg.entropy, ent, active, seg.step),
            length=length + active,
            stop=jnp.where(active, code, seg.stop),
        )

    init = SegmentState(
        step=jnp.int32(0),
        state=state,
        active=active & (budget > 0),
        budget=budget,
        window=window,
        tokens=jnp.zeros((b, max_new), jnp.int32),
        logprobs=jnp.zeros((b, max_new), jnp.float32),
        entropy=jnp.zeros((b, max_new), jnp.float32),
        length=jnp.zeros((b,), jnp.int32),
        stop=jnp.full((b,), STOP_BUDGET, jnp.int32),
    )
    return jax.lax.while_loop(cond, body, init)


def decode_segment(
    config: qwen2.Qwen2Config,
    params,
    state: DecodeState,
    budget,
    table: StopTable,
    sampling: SamplingParams,
    max_new: int,
    rows: RowSampling | None = None,
):
    """Decode one segment: up to `max_new` tokens per row until each row stops.

    budget [B] int32: per-row token limit for this segment (0 = row inactive); rows: the per-row mode's
    settings [B] (`decode_loop`). Returns (tokens [B, N], logprobs [B, N], entropy [B, N], length [B],
    stop [B], new DecodeState).
    """
    b = budget.shape[0]
    row_stop_bytes = 0 if rows is None else rows.stops.shape[-1]
    window = jnp.zeros((b, window_size(table, row_stop_bytes)), jnp.uint8)
    out = decode_loop(config, params, state, budget > 0, budget, window, table, sampling, max_new, rows)
    return out.tokens, out.logprobs, out.entropy, out.length, out.stop, out.state


def _bucket(n: int, buckets: Sequence[int], what: str) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{what} of {n} tokens exceeds the largest bucket {buckets[-1]}")


def _pad_rows(rows: Sequence[Sequence[int]], width: int, left: bool):
    ids = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        if len(r):
            sl = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, sl], mask[i, sl] = r, 1
    return ids, mask


def jit_decode(mesh: jax.sharding.Mesh | None = None):
    """`decode_segment` jitted as `Sampler.decode` runs it (under the mesh's activation sharding, the
    DecodeState donated; config, sampling and max_new static): `launch/plan.py` lowers this same function."""
    fn = decode_segment if mesh is None else parallel.with_activation_sharding(decode_segment, mesh)
    return jax.jit(fn, static_argnums=(0, 5, 6), donate_argnums=(2,))


def per_device_batch(mesh: jax.sharding.Mesh | None, params, rows: int):
    """The mesh axes to split `rows` rows over when the sampler runs one program per device: where `params`
    are whole on every device of `mesh` (a replicated decode layout) and its batch axes hold every device
    and divide the rows (their PartitionSpec entry); else None, and the sampler runs the mesh's jit. Per
    device the decode loop stops when that device's rows stop, with no collective per step: on the 2-core
    CPU bench/rollout.py's S workload decodes 1.3-1.5x faster over 2 host devices than on one, under the
    mesh's jit 0.7x (bench/RESULTS.md, issue 41)."""
    if mesh is None or not parallel.replicated_on(mesh, params):
        return None
    batch = parallel.logical_to_spec(("batch",), (rows,), mesh)[0]
    axes = (batch,) if isinstance(batch, str) else tuple(batch or ())
    every_device = mesh.size > 1 and math.prod(mesh.shape[a] for a in axes) == mesh.size
    return batch if every_device else None


def jit_decode_per_device(mesh: jax.sharding.Mesh, batch):
    """`decode_segment` as `Sampler.decode` runs it per device (`per_device_batch`): the rows and the
    DecodeState split over the mesh axes `batch`, the params and stop table whole on each device, the state
    donated."""
    return parallel.jit_per_device(
        decode_segment, mesh, batch, static_argnums=(0, 5, 6), replicated_argnums=(1, 4), donate_argnums=(2,)
    )


class Sampler:
    """Holds the jitted prefill / decode / append functions for one config, cache size and stop table."""

    def __init__(
        self,
        config: qwen2.Qwen2Config,
        stop_table: StopTable,
        cache_len: int,
        max_segment: int,
        sampling: SamplingParams = SamplingParams(),
        prompt_buckets: Sequence[int] | None = None,
        chunk_buckets: Sequence[int] | None = None,
        mesh: jax.sharding.Mesh | None = None,
    ):
        """mesh: shard the batch (prompts, KV cache, activations) over its data axes by the logical-axis
        rules, as the train step does; rows must divide by the data-parallel size, else they are
        replicated. None: wherever the params are, batch replicated."""
        self.config, self.table, self.cache_len = config, stop_table, cache_len
        self.max_segment, self.sampling, self.mesh = max_segment, sampling, mesh
        self.prompt_buckets = tuple(prompt_buckets or default_buckets(cache_len))
        self.chunk_buckets = tuple(chunk_buckets or default_buckets(cache_len))
        shard = (lambda f: parallel.with_activation_sharding(f, mesh)) if mesh is not None else (lambda f: f)
        self._prefill = jax.jit(shard(qwen2.prefill), static_argnums=(0, 4))
        self._extend = jax.jit(shard(qwen2.extend_over_span), static_argnums=(0,), donate_argnums=(2,))
        self._decode = jit_decode(mesh)
        self._per_device_jits: dict = {}  # batch mesh axes -> (prefill, decode), see `_per_device`

    def _rows(self, x: np.ndarray):
        """Host rows [B, ...] as a global array split over the mesh's data axes (as is without a mesh)."""
        if self.mesh is None:
            return x
        spec = parallel.logical_to_spec(("batch",) + (None,) * (x.ndim - 1), x.shape, self.mesh)
        return multihost.to_global(x, jax.sharding.NamedSharding(self.mesh, spec))

    def compiled_count(self) -> int:
        """Compiled variants of prefill / extend / decode (jax caches them per function, so the count
        includes other Samplers' compiles). A multi-turn rollout must stop growing it after warm-up."""
        fns = (self._prefill, self._extend, self._decode, *sum(self._per_device_jits.values(), ()))
        return sum(f._cache_size() for f in fns)

    def _per_device(self, params, rows: int):
        """(prefill, decode) run as one program per device when the mesh splits `rows` rows over its batch
        axes and `params` are whole on every device (`per_device_batch`); else None: the mesh's jit."""
        batch = per_device_batch(self.mesh, params, rows)
        if batch is None:
            return None
        if batch not in self._per_device_jits:
            prefill = parallel.jit_per_device(
                qwen2.prefill, self.mesh, batch, static_argnums=(0, 4), replicated_argnums=(1,)
            )
            self._per_device_jits[batch] = (prefill, jit_decode_per_device(self.mesh, batch))
        return self._per_device_jits[batch]

    def start(self, params, prompts: Sequence[Sequence[int]], seed: int | jax.Array) -> DecodeState:
        """Prefill left-padded prompts into a fresh cache. seed: an int or a [B] array of PRNG keys."""
        width = _bucket(max(len(p) for p in prompts), self.prompt_buckets, "prompt")
        ids, mask = _pad_rows(prompts, width, left=True)
        per_device = self._per_device(params, len(prompts))
        prefill = per_device[0] if per_device else self._prefill
        logits, cache = prefill(self.config, params, self._rows(ids), self._rows(mask), self.cache_len)
        if isinstance(seed, int):
            keys = jax.random.split(jax.random.key(seed), len(prompts))
        else:  # a private copy: the state is donated to the decode loop
            keys = jax.random.wrap_key_data(jnp.array(jax.random.key_data(seed), copy=True))
        return DecodeState(cache=cache, logits=logits, keys=keys)

    def decode(
        self, params, state: DecodeState, budget, rows: RowSampling | None = None
    ) -> tuple[SegmentResult, DecodeState]:
        """Decode one segment. budget: int or [B] ints (0 = row inactive this segment); rows: per-row
        settings [B] (the per-row mode; None: `sampling` for every row)."""
        b = state.logits.shape[0]
        budget = np.minimum(np.broadcast_to(np.asarray(budget, np.int32), (b,)), self.max_segment)
        args = (self.config, params, state, budget, self.table, self.sampling, self.max_segment)
        if rows is not None:  # rows=None is not passed: the default's call, as before the per-row mode
            args += (jax.tree.map(self._rows, rows),)
        per_device = self._per_device(params, b)
        decode = per_device[1] if per_device else self._decode
        tokens, logprobs, entropy, length, stop, state = decode(*args)
        # every process reads the whole batch back: the host side (parsing, retrieval) runs on all of them
        result = SegmentResult(*(multihost.to_host(x) for x in (tokens, logprobs, entropy, length, stop)))
        return result, state

    def complete(self, params, prompts: Sequence[Sequence[int]], seed, budget: int, rows: int = 0):
        """New token ids per prompt: a prefill and one segment of up to `budget` tokens. The batch is padded
        to `rows` rows (default: the next power of two) with copies of the first prompt that decode nothing,
        so calls of any size share one program per row count. seed: an int or [len(prompts)] PRNG keys."""
        n = len(prompts)
        pad = (rows or 1 << (n - 1).bit_length()) - n
        if not isinstance(seed, int):  # the padding rows' keys: copies of the first row's
            seed = jnp.concatenate([seed, jnp.repeat(seed[:1], pad, axis=0)])
        state = self.start(params, [*prompts, *[prompts[0]] * pad], seed)
        seg, _ = self.decode(params, state, [budget] * n + [0] * pad)
        return [seg.tokens[i, : seg.length[i]].tolist() for i in range(n)]

    def append(self, params, state: DecodeState, chunks: Sequence[Sequence[int]]) -> DecodeState:
        """Append chunks[b] (host-provided tokens, e.g. an observation) to row b; empty = nothing.

        The logits of rows that append nothing are kept, so such a row continues where it was.
        """
        longest = max(len(c) for c in chunks)
        if longest == 0:
            return state
        free = self.cache_len - multihost.to_host(state.cache.lengths)
        too_long = [i for i, c in enumerate(chunks) if len(c) > free[i]]
        if too_long:
            raise ValueError(f"rows {too_long} would overflow the cache of {self.cache_len} tokens")
        width = _bucket(longest, self.chunk_buckets, "appended chunk")
        ids, mask = _pad_rows(chunks, width, left=False)
        logits, cache = self._extend(self.config, params, state.cache, self._rows(ids), self._rows(mask))
        moved = jnp.asarray(mask.any(axis=1))[:, None]
        return DecodeState(cache=cache, logits=jnp.where(moved, logits, state.logits), keys=state.keys)


def generate(
    config: qwen2.Qwen2Config,
    params,
    prompt_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    stop: Sequence[int] | None = None,
    seed: int = 0,
) -> list[list[int]]:
    """New token ids per prompt (a stop id produced ends the row, included); rollouts use `Sampler`."""
    table = StopTable.eos_only(config.vocab_size, list(stop or []))
    w = max(len(p) for p in prompt_ids)
    sampler = Sampler(config, table, w + max_new_tokens, max_new_tokens, SamplingParams(temperature), [w])
    return sampler.complete(params, prompt_ids, seed, max_new_tokens, rows=len(prompt_ids))
