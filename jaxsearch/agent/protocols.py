"""One protocol per method: prompt, stop strings, action parsing, observation format, initial context.

    protocol = get_protocol("eka", tags="graph_r1")
    contexts = protocol.initial_context(questions, retriever, k=5)     # EKA's P0; None elsewhere
    messages = protocol.build_messages(question, contexts[i])          # -> tokenizer.apply_chat_template
    action = protocol.parse_action(segment_text)                       # search | answer | invalid
    text = protocol.format_observation(docs) or protocol.invalid_hint()

Observations are appended with loss mask 0, but for the part the authors train (`masked_span`: Graph-R1's
`<|im_end|>` and `\n<think>\n` around its knowledge turn). `observation_allow_special` is True when an
observation holds chat special tokens (Graph-R1 closes the assistant turn around its `<knowledge>`): encode it
with `allow_special=True`. SOAR's observation also needs the internal-knowledge stream
(`needs_internal_knowledge`): one more policy generation per search, `internal_knowledge_messages(query, k)`.

Sources (reference text only; every string below is typed out from them):

- search_r1: PeterGriffinJin/Search-R1, `scripts/data_process/nq_search.py` (`make_prefix`, and the question
  made to end in "?") and `search_r1/llm_agent/generation.py` (`_postprocess_responses` and
  `postprocess_predictions` for actions, `execute_predictions` for the observation and the invalid-action
  text, `_passages2string` for the passages). Search-R1 has no note for the last turn: it decodes once more,
  and a search there gets no observation (`do_search=False`).
- graph_r1: Graph-R1 as forked by EKA (yxzwang/EarlyKnowledgeAlignment): `script_process.py`
  (`instruction_following`), `agent/tool/tool_env.py` (JSON `<query>`, invalid-call text), and the
  `tool_custom_response_template` of `verl/trainer/config/ppo_trainer.yaml`. The knowledge is the search
  server's reply as Graph-R1's agent shows it: the JSON string `{"results": [{"<knowledge>": ...,
  "<coherence>": ...}]}` (`retrieval.base.graph_r1_result_string`; hyperedges from the hypergraph retriever,
  passages' contents from any other).
- eka: seed 000 (P0 = top-k for the raw question, in `<knowledge>` before the first think). graph_r1 tags:
  `instruction_following_Retrievalinitial` and the P0 block of the same `script_process.py` (the knowledge
  texts one per line: `get_knowledge.py` keeps the `<knowledge>` strings of the server's reply). search_r1
  tags: no published text; Search-R1's prompt with EKA's sentence about the initial knowledge (ours).
- soar: seed 001, Table 13 (system prompt) and Table 14 (internal knowledge), verbatim but for the spaces the
  PDF extraction put around tags ("( <think> )", "</search> ."). The labels of the two streams inside
  `<information>` and the user turn are ours (the seed gives none); actions as in Search-R1.
- rsearch: QingFei1/R-Search, `scripts/pre_train_data.sh` (system prompt; the question is the user turn) and
  `src/train/generation.py` (observation, passages without "Doc i"). R-Search's tags `<observation>` and
  `<original_evidence>` are renamed `<information>` and `<evidence>`, this project's names for them
  (the rewards read those); rsearch_no_evidence: the same without the evidence sentences (seed 002 §5.2,
  no published prompt). rsearch_eval (agent/rsearch_eval.py): R-Search's evaluation loop,
  `src/eval/main.py` and `src/eval/config.yaml`, with the authors' tag names (for their checkpoints).
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Literal

from jaxsearch.data.qa_example import QAExample
from jaxsearch.data.search_r1_prompt import SEARCH_R1_PROMPT, nonempty_question, search_r1_question
from jaxsearch.retrieval.base import Doc, Retriever, format_passages, graph_r1_result_string
from jaxsearch.agent import parsing
from jaxsearch.registry import Registry


@dataclasses.dataclass(frozen=True)
class Action:
    """What a decoded segment asks for: a search (content = query), an answer, or nothing valid."""

    kind: Literal["search", "answer", "invalid"]
    content: str


# ---------------------------------------------------------------------------------------------- prompts

SEARCH_R1_INVALID_HINT = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
# Ours: Search-R1's prompt plus the sentence EKA adds to Graph-R1's (see the module docstring).
EKA_SEARCH_R1_PROMPT = SEARCH_R1_PROMPT.replace(
    "Answer the given question. ",
    "Answer the given question. The initial knowledge you need for the first think is between <knowledge> "
    "and </knowledge>. ",
)

_GRAPH_R1_OUTPUT_FORMAT = (
    "\n"
    "Output format for tool call:\n"
    "<think>\n...\n</think>\n<query>\n...\n</query>\n"
    "\n"
    "Output format for answer:\n"
    "<think>\n...\n</think>\n<answer>\n...\n</answer>\n"
)
GRAPH_R1_PROMPT = (
    "Answer the given question. You can query from knowledge base provided to you to answer the question. "
    "You can query knowledge as many times as you want.\n"
    "You must first conduct reasoning inside <think>...</think>. If you need to query knowledge, you can set "
    "a query statement between <query>...</query> to query from knowledge base after <think>...</think>.\n"
    "When you have the final answer, you can output the answer inside <answer>...</answer>.\n"
    + _GRAPH_R1_OUTPUT_FORMAT
    + "Question: {question}"
)
EKA_GRAPH_R1_PROMPT = (
    "Answer the given question. You can query from knowledge base provided to you to answer the question. "
    "You can query knowledge as many times as you want. "
    "The initial knowledge you need for the first think is between <knowledge>...</knowledge>.\n"
    "You must first conduct reasoning inside <think>...</think> relied on the initial knowledge. If you need "
    "to query knowledge, you can set a query statement between <query>...</query> to query from knowledge "
    "base after <think>...</think>.\n"
    "When you have the final answer, you can output the answer inside <answer>...</answer>.\n"
    + _GRAPH_R1_OUTPUT_FORMAT
    + "Question: {question}"
)
# Graph-R1 appends <|im_end|> to a response that made a query, then this turn change around the knowledge.
GRAPH_R1_OBSERVATION = (
    "<|im_end|><|im_start|>user\n<knowledge>\n{knowledge}\n</knowledge><|im_end|>\n"
    "<|im_start|>assistant\n<think>\n"
)
GRAPH_R1_INVALID_CALL = 'Invalid tool call format. Please use <query>{"query": "statement"}</query> format.'

SOAR_SYSTEM_PROMPT = (
    "You are an expert assistant capable of solving knowledge-intensive tasks efficiently. You will be given "
    "a question to answer as accurately as possible by carefully balancing INTERNAL information and EXTERNAL "
    "information.\n\n"
    "If you find you lack some knowledge, you can call an information engine by <search> query </search>. It "
    "will return the top internal and external information.\n\n"
    "To arrive at the answer, you will proceed step-by-step in a structured cycle of <think>, <search>, "
    "<information>, and <information_source> sequences. At end, you should use <answer> to provide answer. "
    "You can only generate content within these special tags.\n\n"
    "Thinking Phase (<think>): For question, it may be decomposed into sub-questions for you to think about. "
    "Some sub-questions may be answered by searching, while others may not. You can also use the <think> tag "
    "to express your uncertainty about the sub-question, weigh the accuracy and usefulness of both types of "
    "information, and decide whether further search is needed.\n\n"
    "Searching Phase (<search>): Formulate a search query only if required to fill a knowledge gap or verify "
    "uncertainty.\n\n"
    "Information Phase (<information>): Use internal and external results as context for further steps.\n\n"
    "Information Source (<information_source>): Before providing your final answer, indicate clearly whether "
    "you are using your own internal knowledge or external information. Only output either "
    "\u201cinternal\u201d or \u201cexternal\u201d inside this tag, nothing else."
)
# Ours (the seed gives no labels): how the two streams are told apart inside one <information> block.
SOAR_INTERNAL_LABEL = "Internal information:\n"
SOAR_EXTERNAL_LABEL = "External information:\n"
SOAR_INTERNAL_KNOWLEDGE_PROMPT = (
    "You are a helpful assistant.\n\n"
    "Your task is to list knowledge relevant to the question using ONLY your internal knowledge. Do NOT "
    "invent, guess, speculate, or hallucinate any facts. If your internal knowledge is limited, state only "
    "what is confidently known.\n\n"
    "You must STRICTLY follow all rules below:\n\n"
    "1) Your output MUST contain exactly {k} items.\n\n"
    "2) Each item MUST be a single declarative sentence.\n\n"
    "3) Each item MUST be formatted as a numbered bullet.\n\n"
    "4) Output ONLY the {k} numbered bullets and nothing else."
)

RSEARCH_EVIDENCE_INSTRUCTION = (  # the template's three sentences about the evidence step
    "When you know the final answer, use <evidence> and </evidence> to provide all potentially relevant "
    "original information from the observations. Ensure the information is complete and preserves the "
    "original wording without modification. If no searches were conducted or observations were made, omit "
    "the evidence section. "
)
RSEARCH_SYSTEM_PROMPT = (
    "You are a helpful assistant that can solve the given question step by step. For each step, start by "
    "explaining your thought process. If additional information is needed, provide a specific query enclosed "
    "in <search> and </search>. The system will return the top search results within <information> and "
    "</information>. You can perform multiple searches as needed.\n"
    + RSEARCH_EVIDENCE_INSTRUCTION
    + "Finally, provide the final answer within <answer> and </answer> tags."
)
# The evidence-free ablation (seed 002 §5.2): R-Search's repository (ecba08d) has no prompt or flag for it, so
# ours is the template without its evidence sentences, every other byte kept.
RSEARCH_NO_EVIDENCE_SYSTEM_PROMPT = RSEARCH_SYSTEM_PROMPT.replace(RSEARCH_EVIDENCE_INSTRUCTION, "")

# ---------------------------------------------------------------------------------------------- registry

PROTOCOLS: Registry[Callable[..., AgentProtocol]] = Registry("protocol")


def register_protocol(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register a protocol class (or factory taking the protocol's options) under `name`."""
    return PROTOCOLS.register(name)


def get_protocol(name: str, **options) -> AgentProtocol:
    """A new protocol registered as `name`, built with `options`; a clear error lists the known names."""
    return PROTOCOLS.get(name)(**options)


# ---------------------------------------------------------------------------------------------- protocols


class AgentProtocol:
    """The base class: what the episode driver asks a method. Subclasses fill in the prompt and formats."""

    name: str
    stop_strings: tuple[str, ...] = ("</search>", "</answer>")
    segment_tags: dict[str, str] = {}  # opening tag -> segment name in segments.SEGMENT_IDS
    system_prompt: str | None = None
    observation_allow_special = False
    uses_initial_knowledge = False  # EKA: P0 passages for the raw question in the prompt
    needs_internal_knowledge = False
    observation_tag = "information"  # the tag an observation's retrieved text sits in
    # The part of an observation (or hint) the authors' loss mask leaves out, from the start of the first string
    # through the end of the second; the tokens around it are trained (Graph-R1's turn change). None: the whole
    # observation has loss mask 0 (Search-R1's info mask). `trajectories.context_loss_mask` applies it.
    masked_span: tuple[str, str] | None = None
    # evaluation F1 with FlashRAG's yes/no/noanswer rule (`scoring.metrics.f1_score`), or the plain SQuAD F1 of
    # the method's own evaluation script
    f1_special_answers = True

    def user_prompt(self, question: str, initial_context: str | None = None) -> str:
        """The user turn: the method's instruction text with the question (and the initial context)."""
        raise NotImplementedError

    def build_messages(self, question: str, initial_context: str | None = None) -> list[dict]:
        """Chat messages for `tokenizer.apply_chat_template(messages, add_generation_prompt=True)`."""
        system = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
        return system + [{"role": "user", "content": self.user_prompt(question, initial_context)}]

    def initial_block(self, docs: list[Doc]) -> str:
        """The prompt's block of initial passages (EKA's P0); only methods with `uses_initial_knowledge`."""
        raise NotImplementedError(f"protocol {self.name!r} has no initial knowledge")

    def initial_context(self, questions: Sequence[str], retriever: Retriever, k: int) -> list[str | None]:
        """Context for the prompt before the first turn, one per question; None when the method has none."""
        if not self.uses_initial_knowledge:
            return [None] * len(questions)
        return [self.initial_block(docs) for docs in initial_docs(questions, retriever, k)]

    def parse_action(self, segment_text: str) -> Action:
        """The action of one decoded segment (the text the policy wrote since the last observation)."""
        raise NotImplementedError

    def format_observation(self, docs: list[Doc]) -> str:
        """The text appended after a search: the retrieved docs in the method's format."""
        raise NotImplementedError

    def invalid_hint(self) -> str:
        """The text appended after an invalid action."""
        raise NotImplementedError

    def external_view(self, observation: str) -> str:
        """An observation as it reads with only what the retriever returned (SOAR drops its internal stream)."""
        return observation

    def observation_streams(self, observation: str) -> tuple[str, str]:
        """(internal, external) streams of an observation's text as the policy saw it (maybe cut short):
        SOAR's listed facts (E_int; "" for every other method) and the retrieved text inside the observation
        tag (E_ext)."""
        return "", tag_content(observation, self.observation_tag)

    def close_cut_observation(self, seen: str, full: str) -> str:
        """The text the rewards read for an observation cut to max_obs_tokens: what the policy saw (`seen`, a
        prefix of `full`) up to `full`'s closing tag, then `full`'s tail from that tag on, so that a parser
        reading tag pairs (or Graph-R1's chat turns) never runs past the cut into the policy's later text. The policy's tokens are not changed
        (Search-R1 cuts `next_obs_ids` the same way and appends no tag: generation.py `_process_next_obs`)."""
        at = full.rfind(f"</{self.observation_tag}>")
        if at < 0:
            return seen
        return seen[:at] + full[at:] if len(seen) > at else seen + full[at:]

    def _reject_context(self, initial_context: str | None) -> None:
        if initial_context is not None:
            raise ValueError(f"protocol {self.name!r} takes no initial context, got {initial_context[:80]!r}")


@register_protocol("search_r1")
class SearchR1Protocol(AgentProtocol):
    """Search-R1: `<think>` / `<search>` / `<information>` / `<answer>`, prompt in the user turn."""

    name = "search_r1"
    segment_tags = {
        "<think>": "think",
        "<search>": "search",
        "<information>": "information",
        "<answer>": "answer",
    }

    def user_prompt(self, question: str, initial_context: str | None = None) -> str:
        self._reject_context(initial_context)
        return SEARCH_R1_PROMPT.format(question=search_r1_question(question))

    def parse_action(self, segment_text: str) -> Action:
        return search_r1_action(segment_text)

    def format_observation(self, docs: list[Doc]) -> str:
        return f"\n\n<information>{passages(docs)}</information>\n\n"

    def invalid_hint(self) -> str:
        return SEARCH_R1_INVALID_HINT


@register_protocol("graph_r1")
class GraphR1Protocol(AgentProtocol):
    """Graph-R1: `<query>{"query": ...}</query>` searches; knowledge comes back in a user turn.

    A segment without a `<query>` ends the episode (Graph-R1 stops such a row): it is an answer, with the
    first `<answer>` block's text, or "" when there is none.
    """

    name = "graph_r1"
    # No stop at </answer>: the rollout decodes to EOS (ppo_trainer.yaml rollout.custom_stop_words: []), and
    # generation.py `_process_tool_call` cuts a response at its first </query> (the tokens after it are dropped).
    stop_strings = ("</query>",)
    segment_tags = {"<think>": "think", "<query>": "search", "<knowledge>": "knowledge", "<answer>": "answer"}
    observation_allow_special = True
    observation_tag = "knowledge"
    # ray_trainer.py `_create_loss_mask`: loss mask 0 from "<|im_start|>user\n<knowledge>" through the end of
    # "</knowledge><|im_end|>\n<|im_start|>assistant"; the <|im_end|> before it (the EOS generation.py appends
    # to a query) and the "\n<think>\n" after it are trained
    masked_span = ("<|im_start|>user\n<knowledge>", "</knowledge><|im_end|>\n<|im_start|>assistant")
    f1_special_answers = False  # evaluation/eval.py `cal_f1` (also the validation's): plain token F1

    def user_prompt(self, question: str, initial_context: str | None = None) -> str:
        self._reject_context(initial_context)
        return GRAPH_R1_PROMPT.format(question=nonempty_question(question))

    def parse_action(self, segment_text: str) -> Action:
        query = re.search(r"<query>(.*?)</query>", segment_text, re.DOTALL)
        if query is None:
            answer = re.search(r"<answer>(.*?)</answer>", segment_text, re.DOTALL)
            return Action("answer", "" if answer is None else answer.group(1).strip())
        try:
            call = json.loads(query.group(1).strip())
        except json.JSONDecodeError:
            return Action("invalid", "")
        if not isinstance(call, dict) or "query" not in call:
            return Action("invalid", "")
        return Action("search", str(call["query"]))

    def format_observation(self, docs: list[Doc]) -> str:
        return GRAPH_R1_OBSERVATION.format(knowledge=graph_r1_result_string(docs))

    def invalid_hint(self) -> str:
        return GRAPH_R1_OBSERVATION.format(knowledge=GRAPH_R1_INVALID_CALL)


class EkaSearchR1Protocol(SearchR1Protocol):
    """EKA on Search-R1: P0 in `<knowledge>` at the end of the user turn, before the first think."""

    name = "eka"
    tags = "search_r1"
    segment_tags = {**SearchR1Protocol.segment_tags, "<knowledge>": "knowledge"}

    def user_prompt(self, question: str, initial_context: str | None = None) -> str:
        block = _require_context(initial_context)
        return EKA_SEARCH_R1_PROMPT.format(question=search_r1_question(question)) + block + "\n"

    uses_initial_knowledge = True

    def initial_block(self, docs: list[Doc]) -> str:
        return knowledge_block(docs)


class EkaGraphR1Protocol(GraphR1Protocol):
    """EKA on Graph-R1 (the paper's main setting, seed 000 Table 1)."""

    name = "eka"
    tags = "graph_r1"

    def user_prompt(self, question: str, initial_context: str | None = None) -> str:
        block = _require_context(initial_context)
        return EKA_GRAPH_R1_PROMPT.format(question=nonempty_question(question)) + "\n" + block + "\n"

    uses_initial_knowledge = True

    def initial_block(self, docs: list[Doc]) -> str:
        return "<knowledge>\n" + knowledge_lines(docs) + "\n</knowledge>"


@register_protocol("eka")
def eka_protocol(tags: str = "search_r1") -> AgentProtocol:
    """EKA over the Search-R1 or the Graph-R1 loop (`tags`). Nothing here depends on training."""
    variants = {"search_r1": EkaSearchR1Protocol, "graph_r1": EkaGraphR1Protocol}
    if tags not in variants:
        raise ValueError(f"eka: unknown tags {tags!r}; known: {sorted(variants)}")
    return variants[tags]()


@register_protocol("soar")
class SoarProtocol(AgentProtocol):
    """SOAR: each search returns an internal stream (facts the policy lists) and the external passages."""

    name = "soar"
    segment_tags = {
        "<think>": "think",
        "<search>": "search",
        "<information>": "information",
        "<information_source>": "information_source",
        "<answer>": "answer",
    }
    system_prompt = SOAR_SYSTEM_PROMPT
    needs_internal_knowledge = True

    def user_prompt(self, question: str, initial_context: str | None = None) -> str:
        self._reject_context(initial_context)
        return nonempty_question(question)

    def parse_action(self, segment_text: str) -> Action:
        return search_r1_action(segment_text)

    def format_observation(self, docs: list[Doc], internal_facts: str) -> str:
        """Both labelled streams in one `<information>` block: internal facts first, then the passages."""
        return (
            f"\n\n<information>{SOAR_INTERNAL_LABEL}{internal_facts.strip()}\n"
            f"{SOAR_EXTERNAL_LABEL}{passages(docs)}</information>\n\n"
        )

    def invalid_hint(self) -> str:
        return SEARCH_R1_INVALID_HINT

    def internal_knowledge_messages(self, query: str, k: int) -> list[dict]:
        """Messages for the policy's internal-knowledge generation for one search query (Table 14)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return [
            {"role": "system", "content": SOAR_INTERNAL_KNOWLEDGE_PROMPT.format(k=k)},
            {"role": "user", "content": query},
        ]

    @staticmethod
    def parse_internal_facts(text: str, k: int) -> list[str]:
        """The first `k` numbered bullets ("1. ..." or "1) ...") of an internal-knowledge generation."""
        facts = [m.group(1).strip() for m in re.finditer(r"^[ \t]*\d+[.)][ \t]+(\S.*)$", text, re.MULTILINE)]
        return facts[:k]

    @staticmethod
    def format_internal_facts(facts: Sequence[str]) -> str:
        """Facts as the numbered list that goes into the observation."""
        return "\n".join(f"{i}. {fact}" for i, fact in enumerate(facts, start=1))

    @staticmethod
    def parse_source(response: str) -> str | None:
        """The last `<information_source>` the policy wrote, "internal" or "external"; else None."""
        return parsing.information_source(response)

    @staticmethod
    def external_view(observation: str) -> str:
        """An observation as seen with the external stream only (what the fabrication judge is shown, E_ext):
        the internal stream's label and facts removed. `observation` may be cut short (max_obs_tokens)."""
        start = observation.find(SOAR_INTERNAL_LABEL)
        if start < 0:
            return observation
        end = observation.find(SOAR_EXTERNAL_LABEL, start)
        return observation[:start] + ("" if end < 0 else observation[end + len(SOAR_EXTERNAL_LABEL) :])

    def observation_streams(self, observation: str) -> tuple[str, str]:
        """(E_int, E_ext) as the policy saw them: the facts after the internal label, the passages after the
        external label (either cut short, or empty, when the observation was cut before it)."""
        body = tag_content(observation, self.observation_tag)
        internal, found, external = body.partition(SOAR_EXTERNAL_LABEL)
        if not found:
            internal = _drop_partial_suffix(internal, "\n" + SOAR_EXTERNAL_LABEL)
        internal = internal[len(SOAR_INTERNAL_LABEL) :] if internal.startswith(SOAR_INTERNAL_LABEL) else ""
        return internal.strip(), external.strip()


@register_protocol("rsearch")
class RSearchProtocol(AgentProtocol):
    """R-Search: reasoning in plain text, `<search>`, retrieved text, then `<evidence>` before `<answer>`."""

    name = "rsearch"
    segment_tags = {
        "<search>": "search",
        "<information>": "information",
        "<evidence>": "evidence",
        "<answer>": "answer",
    }
    system_prompt = RSEARCH_SYSTEM_PROMPT
    writes_evidence = True  # its prompt asks for <evidence>

    def user_prompt(self, question: str, initial_context: str | None = None) -> str:
        self._reject_context(initial_context)
        return nonempty_question(question)

    def parse_action(self, segment_text: str) -> Action:
        return search_r1_action(segment_text)

    def format_observation(self, docs: list[Doc]) -> str:
        body = "".join(f'(Title: "{d.title}") {d.text}\n' for d in docs).strip()
        return f"\n\n<information>{body}</information>\n\n"

    def invalid_hint(self) -> str:
        return SEARCH_R1_INVALID_HINT

    f1_special_answers = False  # src/eval/utils.py `qa_f1_score`: plain token F1

    @staticmethod
    def parse_evidence(response: str) -> str | None:
        """The last `<evidence>` block the policy wrote (outside observations), stripped; else None."""
        return parsing.extract_evidence(response)


@register_protocol("rsearch_no_evidence")
class RSearchNoEvidenceProtocol(RSearchProtocol):
    """R-Search's evidence-free ablation (seed 002 §5.2, Table 3: "removes evidence from rollout"): its loop, a
    prompt that asks for no `<evidence>`; the configs drop the evidence reward and its format credit."""

    name = "rsearch_no_evidence"
    system_prompt = RSEARCH_NO_EVIDENCE_SYSTEM_PROMPT
    writes_evidence = False


# ---------------------------------------------------------------------------------------------- helpers


def search_r1_action(text: str) -> Action:
    """Search-R1's rule: cut after the first `</search>` (else the first `</answer>`), then the first complete
    `<search>` or `<answer>` block decides, its text stripped; no complete block is invalid."""
    for close in ("</search>", "</answer>"):
        if close in text:
            text = text.split(close)[0] + close
            break
    match = re.search(r"<(search|answer)>(.*?)</\1>", text, re.DOTALL)
    if match is None:
        return Action("invalid", "")
    return Action(match.group(1), match.group(2).strip())


def tag_content(text: str, tag: str) -> str:
    """The stripped text after the first `<tag>` of `text`, up to its `</tag>` (or the end of a text cut
    before it, less any part of the closing tag); "" without the opening tag."""
    start = text.find(f"<{tag}>")
    if start < 0:
        return ""
    start += len(tag) + 2
    end = text.find(f"</{tag}>", start)
    body = _drop_partial_suffix(text[start:], f"</{tag}>") if end < 0 else text[start:end]
    return body.strip()


def _drop_partial_suffix(text: str, marker: str) -> str:
    """`text` less a trailing proper prefix of `marker` (where a cut fell inside it)."""
    for n in range(len(marker) - 1, 0, -1):
        if text.endswith(marker[:n]):
            return text[:-n]
    return text


# the numbering our workflow puts before each line of a stream: SOAR's facts "1. " (format_internal_facts),
# Search-R1's passages "Doc 1(Title: " (retrieval.base.format_passages)
_STREAM_NUMBERING = re.compile(r"^[ \t]*(?:\d+\.[ \t]+|Doc \d+\(Title:[ \t]*)")


def stream_lines(stream: str) -> list[str]:
    """A stream's lines (one fact or passage each) without the numbering our workflow adds to them."""
    return [_STREAM_NUMBERING.sub("", line, count=1) for line in stream.splitlines()]


def passages(docs: Sequence[Doc]) -> str:
    """Search-R1's passages, `Doc i(Title: "t") text` one per line, stripped as Search-R1 strips them."""
    return format_passages(list(docs)).strip()


def initial_docs(questions: Sequence[str], retriever: Retriever, k: int) -> list[list[Doc]]:
    """EKA's P0: the top-k docs for each raw question, in one batched call."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    results = retriever.search(list(questions), k)
    if len(results) != len(questions):
        raise ValueError(f"retriever returned {len(results)} results for {len(questions)} questions")
    return [docs[:k] for docs in results]


def knowledge_lines(docs: Sequence[Doc]) -> str:
    """EKA's P0 in the Graph-R1 setting: the knowledge texts one per line (script_process.py)."""
    return "\n".join(d.contents for d in docs)


def knowledge_block(docs: list[Doc]) -> str:
    """P0 as the prompt shows it: Search-R1's passage strings inside `<knowledge>`."""
    return f"<knowledge>\n{passages(docs)}\n</knowledge>"


def _require_context(initial_context: str | None) -> str:
    if initial_context is None:
        raise ValueError("eka needs the P0 block from protocol.initial_context(), got None")
    return initial_context


def prompt_messages(
    examples: Sequence[QAExample], protocol: str, use_data_prompt: bool = True
) -> list[list[dict] | None] | None:
    """Per example, the chat messages to prompt with instead of the protocol's own: the dataset's `prompt`
    under the search_r1 protocol (None where an example has none); None when nothing replaces the protocol's
    prompt (another protocol, `use_data_prompt=False`, or no example with a prompt).

    Warns when a dataset prompt differs from the built-in Search-R1 template filled with its question.
    """
    if protocol != "search_r1" or not use_data_prompt or all(ex.prompt is None for ex in examples):
        return None
    builtin = [
        [{"role": "user", "content": SEARCH_R1_PROMPT.format(question=search_r1_question(ex.question))}]
        for ex in examples
    ]
    if any(ex.prompt is not None and ex.prompt != ours for ex, ours in zip(examples, builtin)):
        warnings.warn(
            "the dataset's own prompt differs from the built-in search_r1 template; prompting with the "
            "dataset's (config protocol.data_prompt=False or launch/eval.py --builtin-prompt: ours)",
            stacklevel=2,
        )
    return [ex.prompt for ex in examples]
