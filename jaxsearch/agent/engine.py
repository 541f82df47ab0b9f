"""The agent engine: one search agent (tokenizer, protocol, retrievers, sampler, limits) and its rollout.

    engine = AgentEngine(tokenizer, protocol, retriever, sampler, EpisodeConfig(max_turns=4))
    traj = engine.rollout(params, questions, key)      # -> Trajectories (agent/trajectories.py)

RL (`rl/trainer.py`), evaluation (`eval/`) and serving all roll out through `rollout`. One rollout, for a
batch of questions (already repeated `group_size` times by the data iterator):

    EKA's P0: one retriever call for the raw questions; the prompt shows it    (host)
    prompt (chat template) -> Sampler.start                                    (device)
    repeat up to max_turns:
        Sampler.decode one segment per active row until a stop string / EOS / budget   (device)
        protocol.parse_action on each row's segment text                              (host)
        one retriever.search call for all the turn's queries (SOAR: + its internal stream)   (host)
        observation (or Search-R1's invalid-action hint) -> Sampler.append, loss mask 0
        rows that answered stop
    a last turn without search for rows still going (Search-R1's final rollout)

The trajectory holds exactly the token ids that were sampled (no decode -> re-encode of generated text);
observations are encoded once, on their own, as the policy then sees them. Row i of a rollout samples with
`fold_in(key, i)`: its randomness depends on the key and its index only, not on batch or micro-batch sizes.
A served row (`requests`, agent/requests.py) may bring its own sampling settings, token cap, stop strings and
seed; `events` streams what happens to each row as it happens, and `cancelled` ends rows early.
So does SOAR's internal stream: its generation for row i's s-th search samples with fold_in(fold_in(k, i), s),
k split from the key (`internal_keys`), whatever the scheduler, the micro-batch or the other rows' searches.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsearch.agent import trajectories as traj_lib
from jaxsearch.agent import protocols as protocols_lib
from jaxsearch.agent import requests as requests_lib
from jaxsearch.agent.protocols import AgentProtocol, initial_docs
from jaxsearch.agent.requests import EventStream, RowRequest, ServedRows
from jaxsearch.agent.sampler import STOP_BUDGET, RowSampling, Sampler, Segment
from jaxsearch.agent.slots import Slots, SlotState
from jaxsearch.agent.trajectories import HINT, OBSERVATION, POLICY, Row, Trajectories
from jaxsearch.config import EpisodeConfig


def as_key(key: int | jax.Array) -> jax.Array:
    """A typed PRNG key from an int seed or a key (typed, or raw uint32[2])."""
    if isinstance(key, int):
        return jax.random.key(key)
    return key if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else jax.random.wrap_key_data(key)


def row_keys(key: jax.Array, start: int, n: int) -> jax.Array:
    """[n] keys of rows start .. start + n - 1: fold_in(key, row)."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(start, start + n, dtype=jnp.uint32))


def internal_keys(key: jax.Array, rows: Sequence[int], searches: Sequence[int]) -> jax.Array:
    """[n] keys of SOAR's internal-stream generations: fold_in(fold_in(key, rows[j]), searches[j]), the
    searches[j]-th search (from 0) of rollout row rows[j]."""
    rows, searches = np.asarray(rows, np.uint32), np.asarray(searches, np.uint32)
    return jax.vmap(lambda r, s: jax.random.fold_in(jax.random.fold_in(key, r), s))(rows, searches)


@dataclasses.dataclass(frozen=True)
class AgentEngine:
    """What a rollout needs, built once. `replace(...)` gives a variant (e.g. the evaluation sampler)."""

    tokenizer: Any
    protocol: AgentProtocol
    retriever: Any  # `retrieval.base.Retriever`: search(queries, k) -> docs per query
    sampler: Sampler
    limits: EpisodeConfig = EpisodeConfig()  # turns, top-k, token limits, scheduler, micro-batch
    initial_retriever: Any = None  # EKA's P0 source (None: `retriever`; another corpus: noisy-P0 ablation)
    internal_sampler: Sampler | None = None  # SOAR's internal-knowledge stream (None: `sampler`)

    def replace(self, **changes) -> AgentEngine:
        return dataclasses.replace(self, **changes)

    def rollout(
        self,
        params,
        questions: Sequence[str],
        key: int | jax.Array,
        messages: Sequence[list[dict] | None] | None = None,
        requests: Sequence[RowRequest | None] | None = None,
        events: Callable[[requests_lib.Event], None] | None = None,
        cancelled: Callable[[int], bool] | None = None,
    ) -> Trajectories:
        """One episode per question, in sampler calls of `limits.micro_batch` rows (lockstep) or in that
        many decode slots (`limits.scheduler` "slots").

        key: a PRNG key or int seed; row i samples with fold_in(key, i). messages: per row, chat messages that
        replace the protocol's prompt (a dataset's own prompt, `protocols.prompt_messages`); None keeps it.
        requests: per row a `RowRequest` (its temperature, top_p, max_tokens, stop strings, seed) or None (the
        engine's settings); given, the sampler runs in its per-row mode (one compile whatever the settings).
        events: called with each `requests.Event` of a row as the episode runs (on this thread). cancelled:
        cancelled(i) -> True ends row i at the next host turn ("cancelled").
        """
        key = as_key(key)
        sample_key, internal_key = jax.random.split(key)
        keys = row_keys(sample_key, 0, len(questions))
        served = ServedRows.build(self, len(questions), requests, events, cancelled)
        if requests is not None:
            keys = requests_lib.seeded_keys(keys, requests)
        scheduler = self.limits.scheduler
        if scheduler == "slots":
            internal = self._internal_stream(params, internal_key)
            return self._episodes_in_slots(params, questions, keys, internal, messages, served)
        if scheduler != "lockstep":
            raise ValueError(f"scheduler {scheduler!r}: expected 'lockstep' or 'slots'")
        n = self.limits.micro_batch or len(questions)
        parts = [
            self._episodes(
                params,
                questions[i : i + n],
                keys[i : i + n],
                self._internal_stream(params, internal_key, first=i),
                None if messages is None else messages[i : i + n],
                served.part(i, len(questions[i : i + n])),
            )
            for i in range(0, len(questions), n)
        ]
        return traj_lib.concat(parts)

    def rollout_examples(self, params, examples: Sequence, key: int | jax.Array, data_prompt: bool = True):
        """`rollout` of QA examples (`data.qa_example.QAExample`): their questions, and under search_r1 a
        dataset's own prompt where it has one (`protocols.prompt_messages`; data_prompt=False: ours)."""
        messages = protocols_lib.prompt_messages(examples, self.protocol.name, data_prompt)
        return self.rollout(params, [e.question for e in examples], key, messages)

    # ------------------------------------------------------------------------------- one sampler call

    def _episodes(self, params, questions, keys, internal, messages, served: ServedRows) -> Trajectories:
        t_start = time.perf_counter()
        clock = {"device": 0.0, "retrieval": 0.0, "host": 0.0}
        rows = self._start_rows(questions, messages, clock)
        stream = served.attach(rows, self.tokenizer)
        t = time.perf_counter()
        state = self.sampler.start(params, [r.prompt for r in rows], keys)
        clock["device"] += time.perf_counter() - t
        for turn in range(self.limits.max_turns + 1):
            for i, row in enumerate(rows):
                if not row.done and served.is_cancelled(i):
                    requests_lib.cancel_row(row, [], self.tokenizer, stream, i)
            active = [i for i, r in enumerate(rows) if not r.done]
            if not active:
                break
            budget = self._budgets(rows, active)
            t = time.perf_counter()
            seg, state = self.sampler.decode(params, state, budget, rows=served.settings)  # host arrays: done
            clock["device"] += time.perf_counter() - t
            searches, hints = self._act(rows, active, seg, budget, final=turn == self.limits.max_turns)
            observations = self._search(rows, searches, internal, clock)
            chunks = self._encode(rows, {**hints, **observations})
            if stream is not None:
                for i in active:
                    stream.report(i)
            t = time.perf_counter()
            state = self.sampler.append(params, state, chunks)
            jax.block_until_ready(state.logits)
            clock["device"] += time.perf_counter() - t
        traj = traj_lib.assemble(rows, self.tokenizer, self.protocol, clock)
        clock["host"] = time.perf_counter() - t_start - clock["device"] - clock["retrieval"]
        return traj

    # ------------------------------------------------------------------------------- decode slots

    def _episodes_in_slots(
        self, params, questions, keys, internal, messages, served: ServedRows
    ) -> Trajectories:
        """The same episodes as `_episodes`, in `limits.micro_batch` decode slots where rows never wait.

        Each loop: the host acts on the slots whose segment ended in the last call (parse, one retrieval for
        all of them, encode) and inserts their observation, or a waiting row's prompt where a row finished;
        it dispatches a decode call for the slots that decode, then reads the call's tokens. When a retrieval
        took at least half as long as a decode call (a remote retriever), it acts while the next call runs
        instead: the device keeps busy, and the rows that ended join the call after (bench/RESULTS.md,
        issue 17: in-process BM25 1.1x faster acting first, a 20 ms retriever 1.3x faster overlapping).
        A new row whose prompt a slot prefilled since the last call (a GRPO group's next sample of the same
        question) copies that slot's cache row instead of prefilling it again. Once no row waits, rows move
        from the highest slots into those that finished rows left, so that the last calls decode few slots
        (`slots.decode_steps`' widths).
        """
        t_start = time.perf_counter()
        clock = {"device": 0.0, "retrieval": 0.0, "host": 0.0}
        rows = self._start_rows(questions, messages, clock)
        schedule = _SlotSchedule.start(self, params, rows, keys, internal, clock, served)
        act_first = True  # act before the next call while a retrieval takes less than half a decode call
        while schedule.busy:
            if served.cancelled is not None:
                schedule.cancel()
                if not schedule.busy:
                    break
            if schedule.ended and act_first:
                schedule.act_on_ended()
            if not schedule.waiting:  # only then can slots be free
                schedule.compact()
            call = schedule.dispatch()  # the host may act on `ended` while it runs
            if schedule.ended:
                schedule.act_on_ended()
            if call is not None:
                act_first = schedule.collect(*call)
        traj = traj_lib.assemble(rows, self.tokenizer, self.protocol, clock)
        # device and host overlap here: host is the wall time left when neither device nor retrieval ran
        clock["host"] = max(0.0, time.perf_counter() - t_start - clock["device"] - clock["retrieval"])
        return traj

    def _internal_stream(self, params, key, first: int = 0):
        """SOAR's internal-knowledge generator (`text_generator` on `internal_sampler`), None for the others:
        (messages, [(row, search)]) -> texts, row i of this call being row first + i of the rollout."""
        if not self.protocol.needs_internal_knowledge:
            return None
        generate = text_generator(self.internal_sampler or self.sampler, params, self.tokenizer)

        def stream(messages, ids):
            rows, searches = zip(*ids)
            return generate(messages, internal_keys(key, [first + r for r in rows], searches))

        return stream

    def _start_rows(self, questions, messages, clock) -> list[Row]:
        """A row per question: its P0 (EKA) and its prompt's token ids; checks the cache has room to act."""
        p0 = [[] for _ in questions]
        if self.protocol.uses_initial_knowledge:
            t = time.perf_counter()
            p0 = initial_docs(questions, self.initial_retriever or self.retriever, self.limits.initial_k)
            clock["retrieval"] += time.perf_counter() - t
        rows = []
        for i, (question, docs) in enumerate(zip(questions, p0)):
            if messages is not None and messages[i] is not None:
                chat = messages[i]
            else:
                chat = self.protocol.build_messages(
                    question, self.protocol.initial_block(docs) if docs else None
                )
            text = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
            rows.append(Row(self.tokenizer.encode(text, allow_special=True), docs))
        room = self.sampler.cache_len - max(r.length for r in rows)
        if room < self.limits.max_segment_tokens:
            raise ValueError(
                f"cache_len {self.sampler.cache_len} leaves {room} tokens after the longest prompt; "
                f"need at least max_segment_tokens={self.limits.max_segment_tokens}"
            )
        return rows

    def _budgets(self, rows: list[Row], active: list[int]) -> np.ndarray:
        """[B] tokens each row may decode this turn (0: inactive): a segment, or what is left of the cache
        or of a request's max_tokens."""
        budget = np.zeros(len(rows), np.int32)
        for i in active:  # a row without room for a whole segment ends truncated (see `_act`)
            budget[i] = min(self.limits.max_segment_tokens, self.sampler.cache_len - rows[i].length)
            request = rows[i].request
            if request is not None and request.max_tokens is not None:
                budget[i] = min(budget[i], request.max_tokens - rows[i].policy_tokens)
        return budget

    def _act(self, rows, active, seg, budget, final: bool) -> tuple[list[tuple[int, str]], dict]:
        """Record each active row's segment and parse its action -> (searches (row, query), hints by row)."""
        searches, hints = [], {}
        for i in active:
            self._act_row(rows, i, seg.row(i, budget[i]), final, searches, hints)
        return searches, hints

    def _act_row(self, rows, i, segment: Segment, final: bool, searches: list, hints: dict) -> None:
        """Record row i's segment and act on it: an answer, a request's stop string or max_tokens, or the last
        turn ends the row, a search goes to `searches`, anything else gets the hint."""
        row, ids = rows[i], [int(t) for t in segment.tokens]
        text = self.tokenizer.decode(ids)
        request = row.request
        if request is not None and 0 <= (r := self._request_stop(segment)) < len(request.stop):
            # the text is cut before the stop string
            text = requests_lib.cut_at_stop(text, request.stop)
            row.add(POLICY, ids, text, segment.logprobs, segment.entropy)
            row.turns += 1
            row.answer, row.done = requests_lib.stop_answer(self.protocol, text), True
            row.finish = requests_lib.STOP
            return
        row.add(POLICY, ids, text, segment.logprobs, segment.entropy)
        row.turns += 1
        action = self.protocol.parse_action(text)
        if action.kind == "answer":
            row.answer, row.done = action.content, True
        elif request is not None and row.policy_tokens >= (request.max_tokens or np.inf):
            row.done = True  # finish_reason "length"
        elif final:
            row.done = True
        elif action.kind == "search":
            searches.append((i, action.content))
        elif segment.stop == STOP_BUDGET and segment.budget < self.limits.max_segment_tokens:
            row.done = row.truncated = True  # out of cache room
        else:
            hints[i] = (HINT, self.protocol.invalid_hint())

    def _request_stop(self, segment: Segment) -> int:
        """The index of the request stop string that ended a served row's segment; outside
        0 .. len(request.stop) - 1 when none did (a protocol stop string, EOS or the budget)."""
        return int(segment.stop) - self.sampler.table.request_stop_code()

    def _search(self, rows, searches, internal, clock) -> dict[int, tuple[str, str]]:
        """One retriever call for the turn's queries (+ SOAR's internal stream) -> observation by row."""
        if not searches:
            return {}
        queries = [q for _, q in searches]
        t = time.perf_counter()
        docs = self.retriever.search(queries, self.limits.retrieval_k)
        facts = None
        if internal is not None:
            k = self.limits.internal_k
            messages = [self.protocol.internal_knowledge_messages(q, k) for q in queries]
            generated = internal(messages, [(i, rows[i].searches) for i, _ in searches])
            facts = [
                self.protocol.format_internal_facts(self.protocol.parse_internal_facts(g, k))
                for g in generated
            ]
        clock["retrieval"] += time.perf_counter() - t
        observations = {}
        for j, (i, query) in enumerate(searches):
            row = rows[i]
            if facts is None:
                obs = self.protocol.format_observation(docs[j])
            else:
                obs = self.protocol.format_observation(docs[j], facts[j])
            row.searches += 1
            row.queries.append(query)
            row.docs.append(list(docs[j]))
            row.observations.append(obs)
            observations[i] = (OBSERVATION, obs)
        return observations

    def _encode(self, rows, texts: dict[int, tuple[str, str]]) -> list[list[int]]:
        """Token ids to append per row (cut to max_obs_tokens); a row left without room to act ends truncated."""
        chunks = [[] for _ in rows]
        for i, (kind, text) in texts.items():
            ids, seen = encode_context(self.tokenizer, self.protocol, kind, text, self.limits.max_obs_tokens)
            free = self.sampler.cache_len - rows[i].length
            if free - len(ids) < self.limits.max_segment_tokens // 4:  # no room left to act on it
                rows[i].done = rows[i].truncated = True
                continue
            rows[i].add(kind, ids, seen)
            chunks[i] = ids
        return chunks


def encode_context(
    tokenizer, protocol: AgentProtocol, kind: str, text: str, max_tokens: int
) -> tuple[list[int], str]:
    """An observation or hint as the policy gets it: its ids cut to `max_tokens`, and the text the rewards
    read for them (the decoded ids; a cut observation closed by `protocol.close_cut_observation`)."""
    # Graph-R1's invalid-call hint is a knowledge turn like its observations (tool_env.py): special tokens too
    full = tokenizer.encode(text, allow_special=protocol.observation_allow_special)
    ids = full[:max_tokens]
    seen = tokenizer.decode(ids)
    if kind == OBSERVATION and len(ids) < len(full):
        seen = protocol.close_cut_observation(seen, text)
    return ids, seen


@dataclasses.dataclass
class _SlotSchedule:
    """One rollout's decode slots as the host sees them (`AgentEngine._episodes_in_slots`), and their device
    state. Slot s holds row occupant[s] (None: free), decodes in the next call if decoding[s], and has so far
    decoded parts[s] of its current segment, of budgets[s] tokens."""

    engine: AgentEngine
    params: Any
    rows: list[Row]
    internal: Callable | None  # SOAR's internal stream (`AgentEngine._internal_stream`)
    clock: dict
    slots: Slots
    state: SlotState
    key_data: np.ndarray  # [rows, 2]: each row's PRNG key data, on the host
    waiting: list[int]  # rows not started yet, popped from the end: row 0 first
    occupant: list[int | None]
    decoding: np.ndarray  # [n] bool
    parts: list[list]  # per slot: (tokens, logprobs, entropy) of each call of the current segment
    budgets: np.ndarray  # [n] int32
    # (slot, stop code) of the segments that ended in the last call
    ended: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    # prompt -> the slot that prefilled it since the last call
    fresh: dict = dataclasses.field(default_factory=dict)
    search_s: float = 0.0  # seconds of the last retrieval
    served: ServedRows | None = None  # the rows' requests, events and cancels
    stream: EventStream | None = None
    slot_settings: RowSampling | None = None  # per-row mode: host arrays [n, ...], each slot's row's settings

    @classmethod
    def start(
        cls, engine: AgentEngine, params, rows: list[Row], keys, internal, clock, served: ServedRows
    ) -> _SlotSchedule:
        """`limits.micro_batch` slots (at most one per row), the first rows started in them."""
        slots = Slots(engine.sampler, engine.limits.steps_per_call)
        n = min(engine.limits.micro_batch or len(rows), len(rows))
        settings = served.settings
        schedule = cls(
            engine,
            params,
            rows,
            internal,
            clock,
            slots,
            slots.empty(n) if settings is None else slots.empty(n, settings.stops.shape[-1]),
            key_data=np.asarray(jax.random.key_data(keys)),  # read before any call
            waiting=list(range(len(rows)))[::-1],
            occupant=[None] * n,
            decoding=np.zeros(n, bool),
            parts=[[] for _ in range(n)],
            budgets=np.zeros(n, np.int32),
            served=served,
            stream=served.attach(rows, engine.tokenizer),
            slot_settings=None if settings is None else settings.take(np.zeros(n, np.int64)),
        )
        for slot in range(n):
            schedule.refill(slot)
        return schedule

    @property
    def busy(self) -> bool:
        return any(o is not None for o in self.occupant)

    def begin(self, slot: int, i: int, ids, reset: bool) -> None:
        """Row i decodes its next segment in `slot` after `ids` (reset: a new row, `ids` its prompt)."""
        self.budgets[slot] = self.engine._budgets(self.rows, [i])[i]
        budget = min(self.budgets[slot], self.engine.sampler.max_segment)
        prompt = tuple(ids) if reset else None
        key = self.key_data[i]
        if prompt in self.fresh:  # a GRPO group's next sample of a question: copy, don't prefill again
            self.state = self.slots.copy_prompt(self.state, self.fresh[prompt], slot, budget, key)
        else:
            self.state = self.slots.insert(self.params, self.state, slot, ids, budget, key if reset else None)
            if reset:
                self.fresh[prompt] = slot
        self.occupant[slot], self.decoding[slot], self.parts[slot] = i, True, []
        if self.slot_settings is not None:
            for x, row_x in zip(_fields(self.slot_settings), _fields(self.served.settings)):
                x[slot] = row_x[i]

    def refill(self, slot: int) -> None:
        """`slot` is free: the next waiting row, if any, starts in it."""
        self.occupant[slot] = None
        if self.waiting:
            i = self.waiting.pop()
            self.begin(slot, i, self.rows[i].prompt, reset=True)

    def act_on_ended(self) -> None:
        """The host's turn for the segments that ended: each recorded and parsed, one retrieval for all their
        searches, then each row's observation (or hint) inserted in its slot, or the slot refilled."""
        engine, rows, searches, hints = self.engine, self.rows, [], {}
        for slot, stop in self.ended:
            i = self.occupant[slot]
            segment = Segment.join(self.parts[slot], stop, self.budgets[slot])
            engine._act_row(rows, i, segment, rows[i].turns == engine.limits.max_turns, searches, hints)
        before = self.clock["retrieval"]
        observations = engine._search(rows, searches, self.internal, self.clock)
        self.search_s = self.clock["retrieval"] - before if searches else self.search_s
        chunks = engine._encode(rows, {**hints, **observations})
        for slot, _ in self.ended:
            i = self.occupant[slot]
            if self.stream is not None:
                self.stream.report(i)
            if rows[i].done:
                self.refill(slot)
            else:
                self.begin(slot, i, chunks[i], reset=False)
        self.ended = []

    def cancel(self) -> None:
        """The rows cancelled since the last host turn end (`requests.cancel_row`): a waiting one at once, a
        started one with what it decoded, its slot stopped and refilled."""
        for i in [i for i in self.waiting if self.served.is_cancelled(i)]:
            self.waiting.remove(i)
            requests_lib.cancel_row(self.rows[i], [], self.engine.tokenizer, self.stream, i)
        for slot, i in enumerate(self.occupant):
            if i is None or not self.served.is_cancelled(i):
                continue
            requests_lib.cancel_row(self.rows[i], self.parts[slot], self.engine.tokenizer, self.stream, i)
            if self.decoding[slot]:
                self.state = self.slots.stop(self.state, slot)
            self.decoding[slot], self.parts[slot] = False, []
            self.ended = [(s, stop) for s, stop in self.ended if s != slot]
            self.fresh = {prompt: s for prompt, s in self.fresh.items() if s != slot}  # its cache row goes
            self.refill(slot)

    def compact(self) -> None:
        """Rows moved from the highest slots into the free ones: the calls decode fewer slots."""
        n = len(self.occupant)
        for dst in [slot for slot in range(n) if self.occupant[slot] is None]:
            src = max((slot for slot in range(n) if self.occupant[slot] is not None), default=-1)
            if src < dst:
                break
            self.state = self.slots.move(self.state, src, dst)
            settings = () if self.slot_settings is None else _fields(self.slot_settings)
            for x in (self.occupant, self.decoding, self.parts, self.budgets, *settings):
                x[dst] = x[src]
            self.occupant[src], self.decoding[src], self.parts[src] = None, False, []
            self.ended = [(dst if slot == src else slot, stop) for slot, stop in self.ended]

    def dispatch(self) -> tuple | None:
        """A decode call for the slots that decode, dispatched, not waited for: (its outputs, the slots in it,
        when it was dispatched), or None when no slot decodes."""
        in_call = self.decoding.copy()
        if not in_call.any():
            return None
        dispatched = time.perf_counter()
        # a copy: the host changes its settings while the call runs
        rows = None if self.slot_settings is None else jax.tree.map(np.copy, self.slot_settings)
        out, self.state = self.slots.decode(self.params, self.state, rows)
        self.fresh.clear()  # their slots decode now
        return out, in_call, dispatched

    def collect(self, out, in_call: np.ndarray, dispatched: float) -> bool:
        """A dispatched call's tokens (waited for) added to its slots' segments; a slot whose segment stopped
        goes to `ended`. Returns whether to act before the next call: a retrieval took under half a call."""
        t = time.perf_counter()
        result = self.slots.fetch(out)
        # the device was busy from the dispatch if the host had to wait for it; else the host's work outlasted
        # the call, whose own length is unknown: count none of it (a lower bound)
        waited = time.perf_counter() - t
        call_s = time.perf_counter() - dispatched
        self.clock["device"] += call_s if waited > 1e-3 else waited
        for slot in np.flatnonzero(in_call):
            self.parts[slot].append(result.piece(slot))
            if self.stream is not None and result.length[slot]:
                self.stream.partial(self.occupant[slot], np.concatenate([p[0] for p in self.parts[slot]]))
            if not result.active[slot]:
                self.decoding[slot] = False
                self.ended.append((int(slot), int(result.stop[slot])))
        return self.search_s < call_s / 2


def _fields(settings: RowSampling) -> tuple[np.ndarray, ...]:
    """The host arrays of `settings`, in field order."""
    return tuple(getattr(settings, f.name) for f in dataclasses.fields(settings))


def text_generator(sampler: Sampler, params, tokenizer) -> Callable[[list[list[dict]], jax.Array], list[str]]:
    """(messages per prompt, keys [n]) -> generated text per prompt, one segment each (SOAR's internal
    stream), prompt i sampled with keys[i]. It decodes until `sampler`'s stop strings, EOS or its
    `max_segment`."""

    def generate(batch_messages: list[list[dict]], keys: jax.Array) -> list[str]:
        prompts = [
            tokenizer.encode(tokenizer.apply_chat_template(m, add_generation_prompt=True), allow_special=True)
            for m in batch_messages
        ]
        new = sampler.complete(params, prompts, keys, sampler.max_segment)  # batches padded: no recompiles
        return [tokenizer.decode(ids, skip_special=True) for ids in new]

    return generate
