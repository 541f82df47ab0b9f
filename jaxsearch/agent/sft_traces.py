"""Supervised warm-start data: the synthetic world's solution traces as token-exact agent trajectories.

`sft_trajectory` writes one question's ideal trajectory in a protocol's format, assembled exactly as the
episode driver assembles a rollout, so a model fine-tuned on it produces trajectories the driver can run:

    prompt   encode(apply_chat_template(protocol.build_messages(question, context)), allow_special=True)
    policy   encode(segment text)                       loss mask 1, one segment per search and the answer
    obs      encode(protocol.format_observation(retriever.search([query], k)[0]),
                    allow_special=protocol.observation_allow_special)                     loss mask 0
    eos      tokenizer.eos_id after the final segment                                      loss mask 1

Each piece is encoded on its own (never across a boundary). The observations are what the retriever really
returns for the trace's query, so a trace whose query the retriever misses still shows what the model would
see. Policy text is templated per step (Search-R1 layout shown; each protocol's prompt fixes its own order):

    <think> I need the {relation words} of {subject}. </think>\\n<search> {query} </search>
    <think> The answer is {answer}. </think>\\n<answer> {answer} </answer>

R-Search reasons in plain text and writes `<evidence>` (the trace's fact sentences) before `<answer>`;
SOAR declares `<information_source> external </information_source>` before `<answer>`; Graph-R1 writes
`<think>\\n...\\n</think>\\n<query>\\n{"query": ...}\\n</query>`, its observation reopens `<think>\\n`, and
its answer is `<answer> {answer} </answer>` (see `policy_segments`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence

import numpy as np

from jaxsearch.data.qa import QAExample
from jaxsearch.data.world.generator import World
from jaxsearch.data.world.oracle import Step, solution_trace
from jaxsearch.models.word_tokenizer import WordTokenizer
from jaxsearch.models.tokenizer import Tokenizer
from jaxsearch.retrieval.base import Doc, Retriever
from jaxsearch.agent.trajectories import padded_width
from jaxsearch.agent.protocols import (
    SOAR_INTERNAL_KNOWLEDGE_PROMPT,
    AgentProtocol,
    GraphR1Protocol,
    RSearchProtocol,
    SoarProtocol,
    get_protocol,
)

# What the think text calls each relation's object ("I need the {words} of {subject}.").
RELATION_WORDS = {
    "born_in": "birthplace",
    "birth_date": "date of birth",
    "spouse_of": "spouse",
    "works_for": "employer",
    "founded_by": "founder",
    "founded_year": "year of establishment",
    "headquartered_in": "headquarters city",
    "located_in": "country",
    "capital": "capital",
    "official_name": "official name",
    "directed_by": "director",
    "written_by": "author",
    "released_in": "release year",
    "published_in": "publication year",
}
NEED = "I need the {words} of {subject}."
ANSWER = "The answer is {answer}."
PROTOCOL_NAMES = ("search_r1", "eka", "rsearch", "soar", "graph_r1")


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """One trajectory: `ids` and `loss_mask` (1 on policy tokens and the final EOS), [T] each; the first
    `prompt_len` ids are the prompt."""

    ids: list[int]
    loss_mask: list[int]
    prompt_len: int
    mistake: SFTExample | None = None  # a mistaken trajectory of the same question (`sft_dataset(mistake=)`)


def build_world_tokenizer(world: World, protocol_names: Sequence[str] = PROTOCOL_NAMES) -> WordTokenizer:
    """A word tokenizer over the world's text, the protocols' prompts, observations and hints, and the
    SFT templates: every word an SFT trajectory of this world holds is one token."""
    protocols = []
    for name in protocol_names:
        tag_sets = ("search_r1", "graph_r1") if name == "eka" else (None,)
        protocols += [
            get_protocol(name) if tags is None else get_protocol(name, tags=tags) for tags in tag_sets
        ]
    texts = list(world.texts())
    texts += [*RELATION_WORDS.values(), NEED, ANSWER, "external internal", SOAR_INTERNAL_KNOWLEDGE_PROMPT]
    for protocol in protocols:
        context = "<knowledge>\nknowledge\n</knowledge>" if protocol.name == "eka" else None
        texts += [m["content"] for m in protocol.build_messages("question", context)]
        texts += [_observation(protocol, [Doc("0", "Title", "text")]), protocol.invalid_hint()]
    texts.append(json.dumps({"query": "query"}))  # Graph-R1's search call
    return WordTokenizer.build(texts)


def policy_segments(
    protocol: AgentProtocol, trace: Sequence[Step], verbose_answer: bool = False
) -> list[str]:
    """The policy's text per turn: one segment per search step, then the answer segment. `verbose_answer`:
    the answer tag holds the sentence "The answer is X." instead of X (a base model's format error)."""
    *searches, answer = trace
    if answer.action != "answer" or any(step.action != "search" for step in searches):
        raise ValueError(f"a trace is searches then one answer, got {[s.action for s in trace]}")
    segments = []
    for turn, step in enumerate(searches):
        need = NEED.format(words=RELATION_WORDS[step.relation], subject=step.subject)
        if isinstance(protocol, GraphR1Protocol):
            think = "<think>\n" if turn == 0 else ""  # the observation reopens <think>
            query = json.dumps({"query": step.text})
            segments.append(f"{think}{need}\n</think>\n<query>\n{query}\n</query>")
        elif isinstance(protocol, RSearchProtocol):
            segments.append(f"{need}\n<search> {step.text} </search>")
        else:
            segments.append(f"<think> {need} </think>\n<search> {step.text} </search>")
    final = ANSWER.format(answer=answer.text)
    said = final if verbose_answer else answer.text
    if isinstance(protocol, GraphR1Protocol):
        # " {said} ", not the prompt's "\n{said}\n": Graph-R1's format check and parser take either, and the
        # world tokenizer has one token for " Drath" (as the knowledge reads it) and another for "Drath" (after a
        # newline), so the newline layout asks the tiny model to map each answer word to an unrelated token
        # (its SFT start then answered only in the sentence form, EM 0.00 on 40 held-out questions).
        think = "<think>\n" if not searches else ""
        segments.append(f"{think}{final}\n</think>\n<answer> {said} </answer>")
    elif isinstance(protocol, RSearchProtocol):
        evidence = " ".join(step.fact for step in searches)
        block = f"\n<evidence> {evidence} </evidence>" if protocol.writes_evidence else ""  # ablation: none
        segments.append(f"{final}{block}\n<answer> {said} </answer>")
    elif isinstance(protocol, SoarProtocol):
        source = "<information_source> external </information_source>"
        segments.append(f"<think> {final} </think>\n{source}\n<answer> {said} </answer>")
    else:
        segments.append(f"<think> {final} </think>\n<answer> {said} </answer>")
    return segments


def sft_trajectory(
    protocol: AgentProtocol,
    tokenizer: Tokenizer,
    example: QAExample,
    trace: Sequence[Step],
    retriever: Retriever,
    k: int,
    initial_context: str | None = None,
    internal_facts: str = "",
    verbose_answer: bool = False,
    results: Sequence[list[Doc]] | None = None,
) -> SFTExample:
    """The trajectory of `trace` for `example`, token for token as the episode driver builds it.

    `initial_context`: EKA's P0; None computes it with `protocol.initial_context` (None for other methods).
    `internal_facts`: SOAR's internal stream in every observation (the policy knows nothing of this world).
    `verbose_answer`: see `policy_segments`.
    `results`: the top-k docs of each of the trace's searches, found beforehand (None: searched here).
    """
    if initial_context is None:
        initial_context = protocol.initial_context([example.question], retriever, k)[0]
    messages = protocol.build_messages(example.question, initial_context)
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True), allow_special=True
    )
    segments = policy_segments(protocol, trace, verbose_answer)
    queries = [step.text for step in trace[:-1]]
    if results is None:
        results = retriever.search(queries, k) if queries else []
    ids, mask = list(prompt), [0] * len(prompt)
    for turn, segment in enumerate(segments):
        policy = tokenizer.encode(segment)
        ids += policy
        mask += [1] * len(policy)
        if turn < len(results):
            text = _observation(protocol, results[turn], internal_facts)
            observation = tokenizer.encode(text, allow_special=protocol.observation_allow_special)
            ids += observation
            mask += [0] * len(observation)
    ids.append(tokenizer.eos_id)
    mask.append(1)
    return SFTExample(ids, mask, len(prompt))


def p0_trace(trace: Sequence[Step], p0_ids: set[str]) -> list[Step]:
    """EKA's mechanism in a trace: the leading searches whose passage is already in P0 (`p0_ids`) are left out,
    so the trace reads them from the prompt and searches only for what P0 lacks (a question P0 answers
    outright is answered without a search)."""
    skip = 0
    while skip < len(trace) - 1 and trace[skip].passage_id in p0_ids:
        skip += 1
    return list(trace[skip:])


def early_stop_trace(trace: Sequence[Step]) -> list[Step]:
    """The mistake of an agent that stops searching too early: the first search of `trace`, then an answer with
    what that search found (the first hop's entity, not the question's answer)."""
    first = trace[0]
    if first.action != "search":
        raise ValueError(f"an early stop needs a trace that starts with a search, got {first.action!r}")
    return [first, Step("answer", first.found)]


def no_search_trace(guess: str) -> list[Step]:
    """The mistake of an agent that answers from its own (here: no) knowledge without searching: `guess`."""
    return [Step("answer", guess)]


MISTAKES = ("early_stop", "no_search", "verbose_answer")


def sft_dataset(
    world: World,
    split: str,
    protocol: AgentProtocol,
    tokenizer: Tokenizer,
    retriever: Retriever,
    k: int,
    max_len: int,
    truncate: bool = False,
    mistake: str = "",
    questions: int = 0,
    use_p0: bool = False,
) -> list[SFTExample]:
    """The SFT trajectories of a split's questions under `protocol`, in split order: the protocol the RL stage
    runs (`agent.build.build_protocol`; EKA's tags decide its prompt and format). One longer than `max_len`
    is left out, or with `truncate` cut to its first `max_len` tokens (a prefix of the trajectory, no EOS).

    `mistake`: the examples carry a mistaken trajectory of their question as `mistake`, which
    `sft_batches(mistake_share=)` draws in place of the ideal one, so the start sometimes errs as base models
    do, for RL to correct. "early_stop": each chain question (bridge / compositional, 2-4 hops) stops after its
    first search (`early_stop_trace`); "no_search": every question is answered without a search, with the
    first golden answer of another question of the split (`no_search_trace`; question i takes question
    `(i + 1 + default_rng([i]).integers(n - 1)) % n`'s); "verbose_answer": every question's ideal trace with
    a sentence in the answer tag ("The answer is X.", which exact match scores 0; `policy_segments`).
    `questions`: only the split's first N questions (0: all).
    `use_p0` (EKA): the ideal trace reads what P0 already holds instead of searching for it (`p0_trace`).
    """
    if mistake not in ("", *MISTAKES):
        raise ValueError(f"unknown SFT mistake {mistake!r}; known: {MISTAKES}")
    examples = world.questions[split][: questions or None]
    contexts = protocol.initial_context([e.question for e in examples], retriever, k)
    if use_p0 and protocol.name != "eka":
        raise ValueError(f"use_p0 is EKA's (P0), not {protocol.name!r}'s")
    p0 = retriever.search([e.question for e in examples], k) if use_p0 else [[]] * len(examples)
    traces = [p0_trace(solution_trace(e, world), {d.id for d in docs}) for e, docs in zip(examples, p0)]
    found = _search_traces(retriever, traces, k)
    out = []
    for i, (example, context, trace) in enumerate(zip(examples, contexts, traces)):
        sft = _fit(
            sft_trajectory(protocol, tokenizer, example, trace, retriever, k, context, results=found[i]),
            max_len,
            truncate,
        )
        if sft is None:
            continue
        wrong, verbose = None, mistake == "verbose_answer"
        if mistake == "early_stop" and example.metadata["type"] in ("bridge", "compositional"):
            wrong = early_stop_trace(trace)
        elif mistake == "no_search":
            other = (i + 1 + int(np.random.default_rng([i]).integers(len(examples) - 1))) % len(examples)
            wrong = no_search_trace(examples[other].golden_answers[0])
        elif verbose:
            wrong = trace
        if wrong is not None:
            known = found[i][: len(wrong) - 1]  # every mistake searches a prefix of the ideal searches
            wrong_sft = sft_trajectory(
                protocol,
                tokenizer,
                example,
                wrong,
                retriever,
                k,
                context,
                verbose_answer=verbose,
                results=known,
            )
            sft = dataclasses.replace(sft, mistake=_fit(wrong_sft, max_len, truncate))
        out.append(sft)
    return out


def _search_traces(retriever: Retriever, traces: Sequence[Sequence[Step]], k: int) -> list[list[list[Doc]]]:
    """The top-k docs of every search of every trace, in one retriever call (a dense encoder's query batch,
    not one call per search): per trace, per search."""
    queries = [step.text for trace in traces for step in trace[:-1]]
    docs = iter(retriever.search(queries, k) if queries else [])
    return [[next(docs) for _ in trace[:-1]] for trace in traces]


def _fit(sft: SFTExample, max_len: int, truncate: bool) -> SFTExample | None:
    """The example if it fits `max_len`, else its first `max_len` tokens (`truncate`) or None."""
    if len(sft.ids) <= max_len:
        return sft
    if truncate:
        return SFTExample(sft.ids[:max_len], sft.loss_mask[:max_len], min(sft.prompt_len, max_len))
    return None


def pad_sft_batch(
    examples: Sequence[SFTExample], max_len: int, pad_id: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded (ids, attention_mask, loss_mask), int32 [B, max_len]; a longer example is a ValueError."""
    ids = np.full((len(examples), max_len), pad_id, np.int32)
    attention = np.zeros((len(examples), max_len), np.int32)
    loss = np.zeros((len(examples), max_len), np.int32)
    for row, example in enumerate(examples):
        n = len(example.ids)
        if n > max_len:
            raise ValueError(f"example {row} has {n} tokens, more than max_len={max_len}")
        ids[row, :n] = example.ids
        attention[row, :n] = 1
        loss[row, :n] = example.loss_mask
    return ids, attention, loss


def sft_batches(
    examples: Sequence[SFTExample],
    batch_size: int,
    max_len: int,
    seed: int,
    pad_id: int = 0,
    mistake_share: float = 0.0,
    pad_multiple: int = 0,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Endless padded batches (see `pad_sft_batch`) of `max_len` columns, or with `pad_multiple` > 0 of the
    batch's longest example rounded up to a multiple of it (at most `max_len`; a compile per width). Epoch e
    visits the examples in the order `np.random.default_rng([seed, e]).permutation`, and batches run across
    epoch ends.

    `mistake_share`: an example with a `mistake` is replaced by it when its draw from
    `np.random.default_rng([seed, e, 1]).random(len(examples))` (indexed by the example) is below the share,
    so each epoch redraws which questions show the mistake."""
    if not examples:
        raise ValueError("sft_batches needs at least one example")
    epoch, order = 0, []
    while True:
        batch = []
        while len(batch) < batch_size:
            if not order:
                order = list(np.random.default_rng([seed, epoch]).permutation(len(examples)))
                draws = np.random.default_rng([seed, epoch, 1]).random(len(examples))
                epoch += 1
            i = order.pop(0)
            example = examples[i]
            if example.mistake is not None and draws[i] < mistake_share:
                example = example.mistake
            batch.append(example)
        width = padded_width(max(len(e.ids) for e in batch), max_len, pad_multiple)
        yield pad_sft_batch(batch, width, pad_id)


def _observation(protocol: AgentProtocol, docs: list[Doc], internal_facts: str = "") -> str:
    if isinstance(protocol, SoarProtocol):
        return protocol.format_observation(docs, internal_facts)
    return protocol.format_observation(docs)
