"""Finished episodes as arrays the trainer reads, plus what the host saw on the way (text, documents).

    traj = engine.rollout(params, questions, key)     # agent/engine.py
    traj.tokens[b], traj.loss_mask[b], traj.docs[b]   # row b: [L] ids, [L] 0/1, per search the Docs retrieved
    traj.queries[b]                                   # row b: per search, the query it searched

`Row` is the host-side record of one row while its episode runs; `assemble` turns the rows into
`Trajectories`; `concat` joins the trajectories of several micro-batches.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxsearch.agent import segments
from jaxsearch.retrieval.base import Doc

# what produced one chunk of a row's response
POLICY, OBSERVATION, HINT = "policy", "observation", "hint"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Trajectories:
    """A batch of finished episodes. Arrays are [B, L], right-padded, prompt then response.

    loss_mask is 1 on the tokens trained: those the policy sampled, and the parts of observations and hints
    that the method's authors train (`protocol.masked_span`: Graph-R1's `<|im_end|>` and `\n<think>\n`
    around each knowledge turn); 0 on prompt, P0, the rest of observations and hints, padding. logprobs /
    entropy are the sampler's at the sampled tokens (0 elsewhere, also at trained observation tokens, which
    were not sampled): logprobs[b, t] is the log-prob of tokens[b, t]. The RL update never reads them: it
    recomputes the old log-probs of every token (`rl.algorithms.GRPO.prepare`), so the ratio of a trained
    observation token is exp(new - old) like any other. Host metadata (per row lists) rides along as static
    fields.
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
    truncated: np.ndarray  # [B] bool: the row ran out of cache room before it answered
    answers: list = dataclasses.field(metadata=dict(static=True))  # final answer text or None
    responses: list = dataclasses.field(metadata=dict(static=True))  # policy, observation and hint text
    # per row: EKA's P0 (the Docs in the prompt; [] without P0), and per search the Docs retrieved
    initial_docs: list = dataclasses.field(metadata=dict(static=True))
    docs: list = dataclasses.field(metadata=dict(static=True))
    queries: list = dataclasses.field(metadata=dict(static=True))  # per row, per search: the query searched
    observations: list = dataclasses.field(metadata=dict(static=True))  # per row: observation strings
    # per row, per observation the policy saw: the retrieved text (the external stream, E_ext) and SOAR's
    # listed facts (the internal stream, E_int), kept apart (a SOAR observation shows both), each as far as
    # the policy saw it (observations are cut to max_obs_tokens)
    retrieved: list = dataclasses.field(metadata=dict(static=True))
    internal_knowledge: list = dataclasses.field(metadata=dict(static=True))
    # responses with each observation as `protocol.external_view` reads it (SOAR's judge sees E_ext only)
    external_responses: list = dataclasses.field(metadata=dict(static=True))
    evidence: list = dataclasses.field(metadata=dict(static=True))  # R-Search: last <evidence> or None
    sources: list = dataclasses.field(metadata=dict(static=True))  # SOAR: declared source or None
    timings: dict = dataclasses.field(metadata=dict(static=True))  # seconds: device (prefill, decode,
    # append), retrieval (incl. SOAR's internal stream), host (parsing, encoding, assembly); with decode slots
    # the host works while the device decodes: device is the time it was provably busy, host the rest
    # per row: why it ended ("stop" | "length" | "cancelled", `Row.finish_reason`) and the tokens the policy
    # sampled (the loss mask also marks Graph-R1's trained observation spans)
    finish_reasons: list = dataclasses.field(metadata=dict(static=True))
    policy_tokens: list = dataclasses.field(metadata=dict(static=True))

    @property
    def doc_ids(self) -> list[list[list[str]]]:
        """Per row, per search: the retrieved ids."""
        return [[[d.id for d in docs] for docs in row] for row in self.docs]


class Row:
    """Host-side record of one row's episode, chunk by chunk after its prompt of `prompt_length` tokens."""

    def __init__(self, prompt: list[int], initial_docs: list[Doc]):
        self.prompt = prompt
        self.initial_docs = initial_docs
        self.chunks: list[tuple[str, list[int], np.ndarray, np.ndarray]] = []
        self.texts: list[tuple[str, str]] = []
        self.answer: str | None = None
        self.queries: list[str] = []
        self.docs: list[list[Doc]] = []
        self.observations: list[str] = []
        self.turns = 0
        self.searches = 0
        self.done = False
        self.truncated = False
        self.request = None  # a served row's `agent.requests.RowRequest` (None: the engine's settings)
        self.finish: str | None = None  # where a request stop string or a cancel ended the row

    def add(self, kind, ids, text, logprobs=None, entropy=None):
        n = len(ids)
        self.chunks.append((kind, list(ids), _or_zeros(logprobs, n), _or_zeros(entropy, n)))
        self.texts.append((kind, text))

    @property
    def finish_reason(self) -> str:
        """Why the row ended: "stop" (answered, or a request stop string), "length" (max_tokens, turns or
        cache room ran out) or "cancelled"."""
        return self.finish or ("stop" if self.answer is not None else "length")

    @property
    def policy_tokens(self) -> int:
        """Tokens the policy sampled so far."""
        return sum(len(c[1]) for c in self.chunks if c[0] == POLICY)

    @property
    def length(self) -> int:
        """Tokens so far, prompt included."""
        return len(self.prompt) + sum(len(c[1]) for c in self.chunks)


def _or_zeros(x, n):
    return np.zeros(n, np.float32) if x is None else np.asarray(x, np.float32)


def response_segments(chunks, tokenizer, tags) -> np.ndarray:
    """Segment ids [T] int32 of a row's response (its chunks after the prompt: prompts quote tags). Each
    observation is labelled on its own: a segment the policy left open (`<think> ... <search>q</search>`
    sampled without `</think>`) ends where the retriever's text begins, which is labelled by its own tags."""
    runs, policy = [], []  # policy: the policy's (and hints') tokens since the last observation
    for kind, ids, *_ in chunks:
        if kind == OBSERVATION:
            runs, policy = runs + [policy, ids], []
        else:
            policy = policy + list(ids)
    labels = [
        segments.label_token_segments([tokenizer.token_bytes(int(t)) for t in run], tags)
        for run in runs + [policy]
    ]
    return np.concatenate(labels).astype(np.int32)


def context_loss_mask(ids, tokenizer, protocol) -> np.ndarray:
    """[n] int32 loss mask of an observation's or hint's tokens: 0 throughout, or with `protocol.masked_span`
    (start, end) 1 but on each span from a `start` through the end of the next `end` (to the chunk's end when a
    cut removed it), as Graph-R1's ray_trainer.py `_create_loss_mask` masks the decoded response. Tokens are
    placed by their bytes (a token starting inside a span is masked), not by re-encoding text."""
    n = len(ids)
    if protocol.masked_span is None:
        return np.zeros(n, np.int32)
    start, end = (tag.encode() for tag in protocol.masked_span)
    pieces = [tokenizer.token_bytes(int(t)) for t in ids]
    offsets = np.cumsum([0] + [len(p) for p in pieces])[:-1]
    text = b"".join(pieces)
    mask = np.ones(n, np.int32)
    at = text.find(start)
    while at >= 0:
        close = text.find(end, at)
        stop = len(text) if close < 0 else close + len(end)
        mask[(offsets >= at) & (offsets < stop)] = 0
        at = text.find(start, stop)
    return mask


def assemble(rows: list[Row], tokenizer, protocol, timings: dict) -> Trajectories:
    """The rows' prompts and chunks as right-padded [B, L] arrays, with their host records."""
    b = len(rows)
    width = max(r.length for r in rows)
    tokens, attn, loss, seg_ids = (np.zeros((b, width), np.int32) for _ in range(4))
    logp, ent = np.zeros((b, width), np.float32), np.zeros((b, width), np.float32)
    for i, row in enumerate(rows):
        pos = start = len(row.prompt)
        tokens[i, :pos] = row.prompt
        for kind, ids, lp, en in row.chunks:
            n = len(ids)
            tokens[i, pos : pos + n] = ids
            loss[i, pos : pos + n] = 1 if kind == POLICY else context_loss_mask(ids, tokenizer, protocol)
            logp[i, pos : pos + n] = lp
            ent[i, pos : pos + n] = en
            pos += n
        attn[i, :pos] = 1
        seg_ids[i, start:pos] = response_segments(row.chunks, tokenizer, protocol.segment_tags)
    # the decoded response as the authors' rewards read it, hints included: Search-R1's and R-Search's
    # `execute_predictions` (generation.py) append the invalid-action text to the response, Graph-R1's tool
    # env (agent/tool/tool_env.py) a knowledge turn; dropping it merges the turns around it
    responses = ["".join(t for _, t in r.texts) for r in rows]
    external = ["".join(protocol.external_view(t) if k == OBSERVATION else t for k, t in r.texts) for r in rows]
    streams = [[protocol.observation_streams(t) for kind, t in r.texts if kind == OBSERVATION] for r in rows]
    parse_evidence = getattr(protocol, "parse_evidence", lambda _: None)
    parse_source = getattr(protocol, "parse_source", lambda _: None)
    return Trajectories(
        tokens=tokens,
        attention_mask=attn,
        loss_mask=loss,
        segment_ids=seg_ids,
        logprobs=logp,
        entropy=ent,
        prompt_lengths=np.asarray([len(r.prompt) for r in rows], np.int32),
        turns=np.asarray([r.turns for r in rows], np.int32),
        searches=np.asarray([r.searches for r in rows], np.int32),
        truncated=np.asarray([r.truncated for r in rows]),
        answers=[r.answer for r in rows],
        responses=responses,
        initial_docs=[r.initial_docs for r in rows],
        docs=[r.docs for r in rows],
        queries=[r.queries for r in rows],
        observations=[r.observations for r in rows],
        retrieved=[[external for _, external in row] for row in streams],
        internal_knowledge=[
            [internal for internal, _ in row] if protocol.needs_internal_knowledge else [] for row in streams
        ],
        external_responses=external,
        evidence=[parse_evidence(r) for r in responses],
        sources=[parse_source(r) for r in responses],
        timings=timings,
        finish_reasons=[r.finish_reason for r in rows],
        policy_tokens=[r.policy_tokens for r in rows],
    )


def concat(parts: list[Trajectories]) -> Trajectories:
    """One batch from several (micro-batches): rows in order, arrays zero-padded to the widest, timings summed."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.tokens.shape[1] for p in parts)
    out = {}
    for f in dataclasses.fields(Trajectories):
        values = [getattr(p, f.name) for p in parts]
        if isinstance(values[0], list):
            out[f.name] = sum(values, [])
        elif isinstance(values[0], dict):  # timings
            out[f.name] = {k: sum(v[k] for v in values) for k in values[0]}
        elif values[0].ndim == 2:
            out[f.name] = np.concatenate([pad_to(v, width) for v in values])
        else:
            out[f.name] = np.concatenate(values)
    return Trajectories(**out)


def pad_to(x: np.ndarray, width: int) -> np.ndarray:
    """[B, width]: `x` [B, T] cut or zero-padded on the right."""
    x = x[:, :width]
    return np.pad(x, ((0, 0), (0, width - x.shape[1])))


def padded_width(length: int, cap: int, multiple: int) -> int:
    """Columns for a batch whose longest row has `length` tokens: `cap`, or with `multiple` > 0 `length`
    rounded up to a multiple of it, at most `cap` (fewer padded columns; a compile per width seen)."""
    return min(cap, -(-length // multiple) * multiple) if multiple else cap
