"""Per-row requests of a rollout (a served request's sampling settings), the rows' streamed events and their
summaries as a server answers them.

    requests = [RowRequest(temperature=0.7, max_tokens=64, stop=("\\n\\n",), seed=3), None, ...]
    traj = engine.rollout(params, questions, key, requests=requests, events=print, cancelled=lambda i: False)
    summarize(traj, 0)                                        # RowSummary: answer, finish reason, usage, ...

With `requests` the sampler runs in its per-row mode (`sampler.RowSampling`): temperatures, top-p and stop
strings are per-row device arrays, so rows of different settings share one decode call and one compile.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import jax
import numpy as np

from jaxsearch.agent.sampler import STOP_BUDGET, RowSampling, SamplingParams, Segment
from jaxsearch.agent.trajectories import OBSERVATION, POLICY, Row, Trajectories

MAX_STOPS = 4  # stop strings per request (OpenAI's limit for `stop`)
MAX_STOP_BYTES = 32  # UTF-8 bytes per stop string: the device's byte window holds the longest
STOP, LENGTH, CANCELLED = "stop", "length", "cancelled"  # finish reasons


@dataclasses.dataclass(frozen=True)
class RowRequest:
    """One rollout row's own settings (a served request's); None = the engine's own value."""

    temperature: float | None = None  # 0: greedy
    top_p: float | None = None  # (0, 1]
    max_tokens: int | None = None  # cap on the policy's own sampled tokens over the whole episode
    # (observations / hints / retrieved tokens do not count)
    stop: tuple[str, ...] = ()  # at most MAX_STOPS strings, each 1..MAX_STOP_BYTES UTF-8 bytes, no NUL
    seed: int | None = None  # row key = fold_in(key(seed), choice); None: the rollout's fold_in(key, i)
    choice: int = 0  # index among one request's n rows

    def __post_init__(self):
        """ValueError naming the field of a bad value."""
        t, p = self.temperature, self.top_p
        if t is not None and not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if p is not None and not (isinstance(p, (int, float)) and 0 < p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        if self.max_tokens is not None and not (_is_int(self.max_tokens) and self.max_tokens >= 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if isinstance(self.stop, str) or not isinstance(self.stop, (tuple, list)):
            raise ValueError(f"stop must be a tuple of strings, got {self.stop!r}")
        if len(self.stop) > MAX_STOPS:
            raise ValueError(f"stop holds {len(self.stop)} strings; at most {MAX_STOPS}")
        for s in self.stop:
            size = len(s.encode("utf-8")) if isinstance(s, str) else 0
            # a NUL byte would match the zero bytes of the device's empty stop window
            if not 1 <= size <= MAX_STOP_BYTES or "\0" in s:
                raise ValueError(f"stop string {s!r} must be 1 to {MAX_STOP_BYTES} UTF-8 bytes without NUL")
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if not (_is_int(self.choice) and 0 <= self.choice < 2**32):
            raise ValueError(f"choice must be an integer in [0, 2**32), got {self.choice!r}")


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def row_sampling(requests: Sequence[RowRequest | None], default: SamplingParams) -> RowSampling:
    """The per-row sampler settings of `requests` as host arrays ([B], [B, MAX_STOPS, MAX_STOP_BYTES]); a
    request's None (or a None request) takes `default`'s temperature / top_p."""
    b = len(requests)
    temperature = np.full(b, default.temperature, np.float32)
    top_p = np.full(b, default.top_p, np.float32)
    stops = np.zeros((b, MAX_STOPS, MAX_STOP_BYTES), np.uint8)
    mask = np.zeros((b, MAX_STOPS, MAX_STOP_BYTES), bool)
    for i, r in enumerate(requests):
        if r is None:
            continue
        temperature[i] = default.temperature if r.temperature is None else r.temperature
        top_p[i] = default.top_p if r.top_p is None else r.top_p
        for j, s in enumerate(r.stop):
            encoded = np.frombuffer(s.encode("utf-8"), np.uint8)
            stops[i, j, : len(encoded)], mask[i, j, : len(encoded)] = encoded, True
    return RowSampling(temperature, top_p, stops, mask)


@dataclasses.dataclass(frozen=True)
class RowSummary:
    """A finished row as a server answers it."""

    answer: str | None  # None: no answer
    finish_reason: str  # "stop" (answered, or a request stop string), "length" (max_tokens, turns or cache
    # room ran out), "cancelled"
    prompt_tokens: int
    policy_tokens: int  # tokens the policy sampled (loss-mask 1)
    retrieved_tokens: int  # observation + hint tokens appended
    turns: int
    queries: list[str]
    docs: list[list]  # retrieval.base.Doc per search
    initial_docs: list  # EKA's P0
    response: str  # the whole response text (policy segments and observations), cut before a request stop
    # string when one ended the row
    truncated: bool  # ran out of cache room


@dataclasses.dataclass(frozen=True)
class Event:
    """Something that happened to row `row` during a rollout (streaming)."""

    row: int
    kind: str  # "policy": text the policy decoded since the last event of this row (per decode call); the
    # concatenation of a segment's "policy" texts equals the segment's decoded text
    # "search": query + docs of a search; "observation" / "hint": the text appended as seen
    # "done": summary is set (the row ended; no more events for it)
    text: str = ""
    query: str = ""
    docs: tuple = ()
    summary: RowSummary | None = None


def summarize(traj: Trajectories, i: int) -> RowSummary:
    """Row i of a rollout as a server answers it (equal to its "done" event's summary)."""
    prompt, policy = int(traj.prompt_lengths[i]), int(traj.policy_tokens[i])
    return RowSummary(
        answer=traj.answers[i],
        finish_reason=traj.finish_reasons[i],
        prompt_tokens=prompt,
        policy_tokens=policy,
        retrieved_tokens=int(traj.attention_mask[i].sum()) - prompt - policy,
        turns=int(traj.turns[i]),
        queries=list(traj.queries[i]),
        docs=[list(d) for d in traj.docs[i]],
        initial_docs=list(traj.initial_docs[i]),
        response=traj.responses[i],
        truncated=bool(traj.truncated[i]),
    )


def summarize_row(row: Row) -> RowSummary:
    """`summarize` of a finished host row, before the rollout assembles its trajectories."""
    prompt, policy = len(row.prompt), row.policy_tokens
    return RowSummary(
        answer=row.answer,
        finish_reason=row.finish_reason,
        prompt_tokens=prompt,
        policy_tokens=policy,
        retrieved_tokens=row.length - prompt - policy,
        turns=row.turns,
        queries=list(row.queries),
        docs=[list(d) for d in row.docs],
        initial_docs=list(row.initial_docs),
        response="".join(t for _, t in row.texts),
        truncated=row.truncated,
    )


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """`text` before the first occurrence of any of `stops` (all of it when it holds none)."""
    found = [at for at in (text.find(s) for s in stops) if at >= 0]
    return text[: min(found)] if found else text


def stop_answer(protocol, text: str) -> str | None:
    """The answer of a segment cut before a request stop string: the protocol's answer where the cut text
    holds a whole answer block, else the text after an opened (unclosed) answer tag, else None."""
    tag = next((t for t, kind in protocol.segment_tags.items() if kind == "answer"), "<answer>")
    close = "</" + tag[1:]
    action = protocol.parse_action(text)
    if action.kind == "answer" and close in text:
        return action.content
    at = text.rfind(tag)
    return text[at + len(tag) :].strip() if at >= 0 and close not in text[at:] else None


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of `text` not yet stable: a trailing U+FFFD run (an incomplete UTF-8 sequence
    that the next token may complete) and the longest suffix that begins a request stop string."""
    stable = text.rstrip("\ufffd")
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(stable)), hold, -1):
            if stable.endswith(s[:n]):
                hold = n
                break
    return len(text) - len(stable) + hold


class EventStream:
    """The host side of a rollout's events for `rows`, rows first, first + 1, ... of the rollout: per row, the
    "policy" text emitted in its current segment, and what of its record (searches, observations / hints)
    has been reported. i below is an index into `rows`."""

    def __init__(self, events: Callable[[Event], None], tokenizer, rows: list[Row], first: int = 0):
        self.events, self.tokenizer, self.rows, self.first = events, tokenizer, rows, first
        self.emitted = [0] * len(rows)  # characters of the current segment's text emitted
        self.texts = [0] * len(rows)  # row.texts reported
        self.queries = [0] * len(rows)  # row.queries reported

    def partial(self, i: int, ids: Sequence[int]) -> None:
        """Row i has decoded `ids` of its current segment so far: emit its newly stable text."""
        text = self.tokenizer.decode([int(t) for t in ids])
        stops = self.rows[i].request.stop if self.rows[i].request is not None else ()
        text = cut_at_stop(text, stops)  # the row stopped at a whole stop string: what the engine records
        stable = text[: len(text) - _held_back(text, stops)]
        if len(stable) > self.emitted[i]:
            self.events(Event(self.first + i, POLICY, text=stable[self.emitted[i] :]))
            self.emitted[i] = len(stable)

    def report(self, i: int) -> None:
        """Row i's record since the last report, in order: the rest of each policy segment's text, searches
        with the observation or hint after them, and "done" once the row ended."""
        row = self.rows[i]
        for kind, text in row.texts[self.texts[i] :]:
            if kind == POLICY:
                if len(text) > self.emitted[i]:
                    self.events(Event(self.first + i, POLICY, text=text[self.emitted[i] :]))
                self.emitted[i] = 0
                continue
            if kind == OBSERVATION:
                self._searches(i, self.queries[i] + 1)
            self.events(Event(self.first + i, kind, text=text))
        self.texts[i] = len(row.texts)
        self._searches(i, len(row.queries))  # searches whose observation found no room in the cache
        if row.done:
            self.events(Event(self.first + i, "done", summary=summarize_row(row)))

    def _searches(self, i: int, upto: int) -> None:
        row = self.rows[i]
        for j in range(self.queries[i], min(upto, len(row.queries))):
            self.events(Event(self.first + i, "search", query=row.queries[j], docs=tuple(row.docs[j])))
        self.queries[i] = max(self.queries[i], min(upto, len(row.queries)))


def seed_key(seed: int) -> jax.Array:
    """jax.random.key(seed) for a seed in [0, 2**64): above 2**32 as jax seeds it with 64-bit ints enabled
    (high word, low word; without them jax keeps the low word only)."""
    if seed < 2**32:
        return jax.random.key(seed)
    return jax.random.wrap_key_data(np.asarray([seed >> 32, seed & 0xFFFFFFFF], np.uint32))


def seeded_keys(keys: jax.Array, requests: Sequence[RowRequest | None]) -> jax.Array:
    """keys [n] with those of the rows whose request has a seed replaced by fold_in(key(seed), choice)."""
    seeded = [(i, r) for i, r in enumerate(requests) if r is not None and r.seed is not None]
    if not seeded:
        return keys
    data = np.array(jax.random.key_data(keys))
    for i, r in seeded:
        data[i] = np.asarray(jax.random.key_data(jax.random.fold_in(seed_key(r.seed), r.choice)))
    return jax.random.wrap_key_data(data)


def cancel_row(row: Row, pieces: list, tokenizer, stream: EventStream | None, i: int) -> None:
    """Row i (of `stream`'s rows) ends as "cancelled", its segment's pieces decoded so far (`Segment.join`'s)
    recorded."""
    if pieces:
        segment = Segment.join(pieces, STOP_BUDGET, 0)
        ids = [int(t) for t in segment.tokens]
        row.add(POLICY, ids, tokenizer.decode(ids), segment.logprobs, segment.entropy)
        row.turns += 1
    row.done, row.finish = True, CANCELLED
    if stream is not None:
        stream.report(i)


@dataclasses.dataclass(frozen=True)
class ServedRows:
    """The served side of a rollout's rows first, first + 1, ...: their requests and per-row settings (the
    per-row mode; None: the engine's settings, as in training), the events callback and the cancel test."""

    requests: Sequence[RowRequest | None] | None
    settings: RowSampling | None  # host arrays [rows, ...] (`row_sampling`)
    events: Callable | None
    cancelled: Callable | None
    first: int = 0

    @classmethod
    def build(cls, engine, n: int, requests, events, cancelled) -> ServedRows:
        """Checks the requests (one per row, each a RowRequest or None) and builds their settings (defaults:
        the engine's sampler's)."""
        settings = None
        if requests is not None:
            if len(requests) != n:
                raise ValueError(f"requests: {len(requests)} for {n} questions")
            bad = [i for i, r in enumerate(requests) if not (r is None or isinstance(r, RowRequest))]
            if bad:
                raise ValueError(f"requests[{bad[0]}] is {type(requests[bad[0]]).__name__}, not a RowRequest")
            requests = list(requests)
            settings = row_sampling(requests, engine.sampler.sampling)
        return cls(requests, settings, events, cancelled)

    def part(self, first: int, n: int) -> ServedRows:
        """The rows first .. first + n - 1 of these."""
        rows = slice(first, first + n)
        return dataclasses.replace(
            self,
            requests=None if self.requests is None else self.requests[rows],
            settings=None if self.settings is None else self.settings.take(rows),
            first=self.first + first,
        )

    def attach(self, rows: list[Row], tokenizer) -> EventStream | None:
        """Gives each row its request; the rows' event stream (None without an events callback)."""
        if self.requests is not None:
            for row, request in zip(rows, self.requests):
                row.request = request
        return None if self.events is None else EventStream(self.events, tokenizer, rows, self.first)

    def is_cancelled(self, i: int) -> bool:
        return self.cancelled is not None and bool(self.cancelled(self.first + i))
