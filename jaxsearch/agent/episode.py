"""The multi-turn episode driver: decode on the device, parse and retrieve on the host, append, repeat.

For a batch of questions (already repeated `group_size` times by the data iterator):

    prompt (chat template; EKA's P0 inside it)  -> Sampler.start            (device)
    repeat up to max_turns:
        Sampler.decode one segment per active row until a stop string / EOS / budget   (device)
        protocol.parse_action on each row's segment text                              (host)
        one retriever.search call for all the turn's queries                          (host)
        observation (or Search-R1's invalid-action hint) -> Sampler.append, loss mask 0
        rows that answered stop
    a last turn without search for rows still going (Search-R1's final rollout)

The trajectory holds exactly the token ids that were sampled (no decode -> re-encode of generated
text); observations are encoded once, on their own, as the policy then sees them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import jax
import numpy as np

from jaxsearch.retrieval.base import format_passages
from jaxsearch.agent import segments
from jaxsearch.agent.protocols import AgentProtocol
from jaxsearch.agent.sampler import STOP_BUDGET, Sampler

# one chunk of a row's response: what produced it and its token ids
POLICY, OBSERVATION, HINT = "policy", "observation", "hint"


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """Limits of one rollout. Token counts are per row."""

    max_turns: int = 4  # turns that may search; a last turn without search follows
    retrieval_k: int = 3
    max_segment_tokens: int = 256  # one decode segment
    max_obs_tokens: int = 512  # an observation is cut to this many tokens (Search-R1's max_obs_length)
    initial_k: int = 3  # EKA's P0 passages
    internal_k: int = 3  # SOAR: facts listed by the internal-knowledge generation


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Trajectories:
    """A batch of finished episodes. Arrays are [B, L], right-padded, prompt then response.

    loss_mask is 1 only on tokens the policy sampled (not prompt, P0, observations, hints, padding).
    logprobs / entropy are the sampler's at those tokens (0 elsewhere): logprobs[b, t] is the log-prob
    of tokens[b, t]. Host metadata (per row lists) rides along as static fields.
    """

    tokens: np.ndarray
    attention_mask: np.ndarray
    loss_mask: np.ndarray
    segment_ids: np.ndarray
    logprobs: np.ndarray
    entropy: np.ndarray
    prompt_lengths: np.ndarray  # [B]
    turns: np.ndarray  # [B] decode segments
    searches: np.ndarray  # [B] searches executed
    answers: list = dataclasses.field(metadata=dict(static=True))  # final answer text or None
    responses: list = dataclasses.field(metadata=dict(static=True))  # policy + observation text (no hints)
    doc_ids: list = dataclasses.field(metadata=dict(static=True))  # per row, per search: retrieved ids
    observations: list = dataclasses.field(metadata=dict(static=True))  # per row: observation strings
    # per row, per search: the retrieved passages' text (the external stream, E_ext) and SOAR's listed facts
    # (the internal stream, E_int), kept apart: a SOAR observation shows both
    retrieved: list = dataclasses.field(metadata=dict(static=True))
    internal_knowledge: list = dataclasses.field(metadata=dict(static=True))
    # responses with each observation as `protocol.external_view` reads it (SOAR's judge sees E_ext only)
    external_responses: list = dataclasses.field(metadata=dict(static=True))
    evidence: list = dataclasses.field(metadata=dict(static=True))  # R-Search: last <evidence> or None
    sources: list = dataclasses.field(metadata=dict(static=True))  # SOAR: declared source or None
    timings: dict = dataclasses.field(metadata=dict(static=True))  # seconds: device (prefill, decode,
    # append), retrieval (incl. SOAR's internal stream), host (parsing, encoding, assembly)
    truncated: np.ndarray  # [B] bool: the row ran out of cache room before it answered


class _Row:
    """Host-side record of one row's response, chunk by chunk."""

    def __init__(self):
        self.chunks: list[tuple[str, list[int], np.ndarray, np.ndarray]] = []
        self.texts: list[tuple[str, str]] = []
        self.answer: str | None = None
        self.doc_ids: list[list[str]] = []
        self.observations: list[str] = []
        self.retrieved: list[str] = []
        self.internal: list[str] = []
        self.turns = 0
        self.searches = 0
        self.done = False
        self.truncated = False

    def add(self, kind, ids, text, logprobs=None, entropy=None):
        n = len(ids)
        self.chunks.append((kind, list(ids), _or_zeros(logprobs, n), _or_zeros(entropy, n)))
        self.texts.append((kind, text))

    @property
    def length(self) -> int:
        return sum(len(c[1]) for c in self.chunks)


def _or_zeros(x, n):
    return np.zeros(n, np.float32) if x is None else np.asarray(x, np.float32)


def run_episodes(
    sampler: Sampler,
    params,
    tokenizer,
    protocol: AgentProtocol,
    retriever,
    questions: Sequence[str],
    config: EpisodeConfig = EpisodeConfig(),
    seed: int = 0,
    initial_retriever=None,
    internal_generate: Callable[[list[list[dict]]], list[str]] | None = None,
    messages: Sequence[list[dict] | None] | None = None,
) -> Trajectories:
    """Roll out one episode per question. See the module docstring.

    initial_retriever: EKA's P0 source (default: `retriever`; another corpus for the noisy-P0 ablation).
    internal_generate: SOAR's internal-knowledge stream, messages per query -> generated text per query
      (e.g. `text_generator(...)` over the policy or a frozen copy).
    messages: per row, chat messages that replace `protocol.build_messages` (a dataset's own prompt); None
      rows (or None) keep the protocol's.
    """
    t_start = time.perf_counter()
    b = len(questions)
    contexts = protocol.initial_context(list(questions), initial_retriever or retriever, config.initial_k)
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                protocol.build_messages(q, c) if messages is None or messages[i] is None else messages[i],
                add_generation_prompt=True,
            ),
            allow_special=True,
        )
        for i, (q, c) in enumerate(zip(questions, contexts))
    ]
    room = sampler.cache_len - max(map(len, prompts))
    if room < config.max_segment_tokens:
        raise ValueError(
            f"cache_len {sampler.cache_len} leaves {room} tokens after the longest prompt; "
            f"need at least max_segment_tokens={config.max_segment_tokens}"
        )
    if protocol.needs_internal_knowledge and internal_generate is None:
        raise ValueError(
            f"protocol {protocol.name!r} needs internal_generate (the internal-knowledge stream)"
        )
    rows = [_Row() for _ in range(b)]
    clock = {"device": 0.0, "retrieval": 0.0, "host": 0.0}
    t = time.perf_counter()
    state = sampler.start(params, prompts, seed)
    clock["device"] += time.perf_counter() - t

    for turn in range(config.max_turns + 1):
        final = turn == config.max_turns
        active = [i for i, r in enumerate(rows) if not r.done]
        if not active:
            break
        budget = np.zeros(b, np.int32)
        for i in active:  # leave room for the segment; a row without room ends truncated
            free = sampler.cache_len - len(prompts[i]) - rows[i].length
            budget[i] = min(config.max_segment_tokens, free)
        t = time.perf_counter()
        seg, state = sampler.decode(params, state, budget)  # returns host arrays: the device work is done
        clock["device"] += time.perf_counter() - t
        searches: list[tuple[int, str]] = []
        observations: dict[int, tuple[str, str]] = {}
        for i in active:
            row = rows[i]
            n = int(seg.length[i])
            ids = seg.tokens[i, :n].tolist()
            text = tokenizer.decode(ids)
            row.add(POLICY, ids, text, seg.logprobs[i, :n], seg.entropy[i, :n])
            row.turns += 1
            action = protocol.parse_action(text)
            if action.kind == "answer":
                row.answer, row.done = action.content, True
            elif final:
                row.done = True
            elif action.kind == "search":
                searches.append((i, action.content))
            elif seg.stop[i] == STOP_BUDGET and budget[i] < config.max_segment_tokens:
                row.done = row.truncated = True  # out of cache room
            else:
                observations[i] = (HINT, protocol.invalid_hint())
        if searches:
            queries = [q for _, q in searches]
            t = time.perf_counter()
            docs = retriever.search(queries, config.retrieval_k)
            internal = _internal_streams(protocol, internal_generate, queries, config.internal_k)
            clock["retrieval"] += time.perf_counter() - t
            for j, (i, _) in enumerate(searches):
                if internal is None:
                    obs = protocol.format_observation(docs[j])
                else:
                    obs = protocol.format_observation(docs[j], internal[j])
                    rows[i].internal.append(internal[j])
                rows[i].searches += 1
                rows[i].doc_ids.append([d.id for d in docs[j]])
                rows[i].retrieved.append(format_passages(docs[j]).strip())
                rows[i].observations.append(obs)
                observations[i] = (OBSERVATION, obs)
        chunks = [[] for _ in range(b)]
        for i, (kind, text) in observations.items():
            allow = protocol.observation_allow_special and kind == OBSERVATION
            ids = tokenizer.encode(text, allow_special=allow)[: config.max_obs_tokens]
            free = sampler.cache_len - len(prompts[i]) - rows[i].length
            if free - len(ids) < config.max_segment_tokens // 4:  # no room left to act on it
                rows[i].done = rows[i].truncated = True
                continue
            rows[i].add(kind, ids, tokenizer.decode(ids))
            chunks[i] = ids
        t = time.perf_counter()
        state = sampler.append(params, state, chunks)
        jax.block_until_ready(state.logits)
        clock["device"] += time.perf_counter() - t

    traj = _assemble(prompts, rows, tokenizer, protocol, clock)
    clock["host"] = time.perf_counter() - t_start - clock["device"] - clock["retrieval"]
    return traj


def _internal_streams(protocol, internal_generate, queries, k):
    """SOAR's internal-knowledge text per query (numbered facts), or None for other protocols."""
    if not protocol.needs_internal_knowledge:
        return None
    generated = internal_generate([protocol.internal_knowledge_messages(q, k) for q in queries])
    return [protocol.format_internal_facts(protocol.parse_internal_facts(g, k)) for g in generated]


def _assemble(prompts, rows, tokenizer, protocol, timings) -> Trajectories:
    b = len(rows)
    width = max(len(p) + r.length for p, r in zip(prompts, rows))
    tokens = np.zeros((b, width), np.int32)
    attn = np.zeros((b, width), np.int32)
    loss = np.zeros((b, width), np.int32)
    logp = np.zeros((b, width), np.float32)
    ent = np.zeros((b, width), np.float32)
    seg_ids = np.zeros((b, width), np.int32)
    for i, (prompt, row) in enumerate(zip(prompts, rows)):
        pos = len(prompt)
        tokens[i, :pos] = prompt
        start = pos
        for kind, ids, lp, en in row.chunks:
            n = len(ids)
            tokens[i, pos : pos + n] = ids
            loss[i, pos : pos + n] = kind == POLICY
            logp[i, pos : pos + n] = lp
            ent[i, pos : pos + n] = en
            pos += n
        attn[i, :pos] = 1
        response = tokens[i, start:pos]
        # segments are labelled over the response only (prompts quote tags)
        seg_ids[i, start:pos] = segments.label_token_segments(
            [tokenizer.token_bytes(int(t)) for t in response], protocol.segment_tags
        )
    responses = ["".join(t for kind, t in r.texts if kind != HINT) for r in rows]
    external = [
        "".join(protocol.external_view(t) if kind == OBSERVATION else t for kind, t in r.texts if kind != HINT)
        for r in rows
    ]
    parse_evidence = getattr(protocol, "parse_evidence", lambda _: None)
    parse_source = getattr(protocol, "parse_source", lambda _: None)
    return Trajectories(
        tokens=tokens,
        attention_mask=attn,
        loss_mask=loss,
        segment_ids=seg_ids,
        logprobs=logp,
        entropy=ent,
        prompt_lengths=np.asarray([len(p) for p in prompts], np.int32),
        turns=np.asarray([r.turns for r in rows], np.int32),
        searches=np.asarray([r.searches for r in rows], np.int32),
        answers=[r.answer for r in rows],
        responses=responses,
        doc_ids=[r.doc_ids for r in rows],
        observations=[r.observations for r in rows],
        retrieved=[r.retrieved for r in rows],
        internal_knowledge=[r.internal for r in rows],
        external_responses=external,
        evidence=[parse_evidence(r) for r in responses],
        sources=[parse_source(r) for r in responses],
        timings=timings,
        truncated=np.asarray([r.truncated for r in rows]),
    )


def text_generator(
    sampler: Sampler, params, tokenizer, seed: int = 0
) -> Callable[[list[list[dict]]], list[str]]:
    """messages per prompt -> generated text per prompt, one segment each (e.g. SOAR's internal stream).

    `sampler` should stop on EOS only and have a cache long enough for the prompts plus its segment.
    """

    def generate(batch_messages: list[list[dict]]) -> list[str]:
        prompts = [
            tokenizer.encode(tokenizer.apply_chat_template(m, add_generation_prompt=True), allow_special=True)
            for m in batch_messages
        ]
        seg, _ = sampler.decode(params, sampler.start(params, prompts, seed), sampler.max_segment)
        return [
            tokenizer.decode(seg.tokens[i, : seg.length[i]].tolist(), skip_special=True)
            for i in range(len(prompts))
        ]

    return generate
