"""Training-free EKA as the EKA authors run it (seed 000 §5.4, Table 5: P0 in the prompt of a model not
trained for it), for evaluation: `launch/eval.py --protocol eka_infer`. The loop is the one of their inference
script, yxzwang/EarlyKnowledgeAlignment `agent/vllm_infer/EKA_infer.py` (`run_single_example`):

    content = build_prompt(question, P0 texts)  # their ChatML typed into the text, assistant turn left open
    up to max_turns chat calls:
        content goes as ONE user message through vLLM's OpenAI chat API: the model reads Qwen's chat template
        around it (its default system turn first) and writes up to max_tokens tokens, to EOS
        a reply with <query>...</query>: cut after its first </query>, search the JSON's "query" (an invalid
        call gets their invalid-call text), content += reply + "<|im_end|>" + KNOWLEDGE_TURN; next call
        any other reply: the answer, by their rule (`extract_answer`); the episode ends

    agent = build_eka_infer(agent_config, model_config, mesh, initial_k=5)
    traj = agent.rollout(params, questions, key)     # -> Trajectories, as AgentEngine.rollout's

Every call re-templates the whole text and prefills it again: no KV cache carries over, and the text the
policy wrote is decoded and encoded again. That breaks jaxsearch's rule (tokens are the truth, no
re-tokenisation) and is acceptable only because this is evaluation: training never runs this loop, and it is
the loop the authors' training-free numbers come from. Shapes stay static: each call's prompts are padded to
the sampler's buckets and decoded into one cache of `cache_len` slots, so the calls reuse a few compiled
programs.

Where this loop departs from their script, on purpose:
- The answer: their `extract_answer_from_text` reads the whole text, prompt included, whose instruction holds
  "<answer>\\n...\\n</answer>", so their script predicts "..." for every question. We apply their rule to the
  last reply, without the "<|im_end|>" they append to it.
- Decoding stops at a `</query>` that closes a `<query>` (they decode to EOS and cut there: the same text).
- A last call that still queries ends the episode unsearched (theirs searches, then stops: the knowledge is
  never shown); the prediction is None (theirs ""; both score 0).
- vLLM refuses a call whose prompt + max_tokens exceeds the model's length; we decode what the cache holds
  (the row is marked truncated), and a prompt the cache cannot hold ends the row, truncated, without answer.

The record of a row (`Trajectories`) is its first call's prompt, then per call the tokens sampled (loss mask
1, with their log-probs and entropy) and the text appended after them (mask 0): `responses` is the text their
script accumulates after the prompt. Later calls prefilled the re-templated text, not this token row.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxsearch.agent.build import build_retriever, load_tokenizer
from jaxsearch.agent.engine import as_key, row_keys
from jaxsearch.agent.protocols import GRAPH_R1_INVALID_CALL, GraphR1Protocol, initial_docs
from jaxsearch.agent.sampler import Sampler, SamplingParams, StopTable
from jaxsearch.agent.trajectories import HINT, OBSERVATION, POLICY, Row, Trajectories, assemble
from jaxsearch.config import AgentConfig
from jaxsearch.retrieval.base import graph_r1_result_string

# EKA_infer.py `build_system_prompt`: the instruction, byte for byte (the model reads it)
INSTRUCTION = (
    "Answer the given question.\n"
    "You must always first do your reasoning inside <think>...</think>.\n"
    "If you need external information, after finishing a <think> block you may call the search tool by "
    'outputting a <query>...</query> block that contains a JSON object with a single field "query".\n'
    "The environment will execute the search and return the top results wrapped in "
    "<knowledge>...</knowledge>. You can repeat this process and call the tool multiple times.\n"
    "When you have enough information to answer, stop calling the tool and output your final reasoning in "
    "<think>...</think> followed by the final answer in <answer>...</answer>.\n\n"
    'Output format for tool call:\n<think>\n...\n</think>\n<query>\n{\n  "query": "..."\n}\n</query>\n\n'
    "Output format for answer:\n<think>\n...\n</think>\n<answer>\n...\n</answer>\n"
)
# ... and the sentence before P0
P0_INTRO = (
    "\nThe following initial knowledge may be useful. It is given to you before any tool calls and is "
    "wrapped in <knowledge> tags.\n"
)
END_OF_TURN = "<|im_end|>"  # EKA_infer.py `process_tool_call`: appended to every reply
# EKA_infer.py `execute_tool_calls_batch`: tool_custom_response_template
KNOWLEDGE_TURN = (
    "<|im_start|>user\n<knowledge>\n{knowledge}\n</knowledge><|im_end|>\n<|im_start|>assistant\n<think>"
)
QUERY_CLOSE = "</query>"
# process_tool_call's and tool_env.py extract_tool_call's pattern
QUERY_BLOCK = re.compile(r"<query>(.*?)</query>", re.DOTALL)

# The chat calls' end of sequence: Qwen2.5-*-Instruct generation_config.json eos_token_id [151645, 151643],
# which vLLM stops at. Its replies drop the added tokens marked "special" in Qwen2.5's tokenizer_config.json
# (ids 151643-151656; skip_special_tokens=True, vLLM's default); <tool_call> ... <|file_sep|> are not special.
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
SKIPPED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------- the text


def build_prompt(question: str, initial_knowledge: Sequence[str]) -> str:
    """EKA_infer.py `build_system_prompt`: the user message of the first call (their ChatML in the text). P0's
    texts one per line inside <knowledge>, left out when they join to "" (no P0: their no-EKA prompt)."""
    knowledge = "\n".join(initial_knowledge)
    text = "<|im_start|>system\n" + INSTRUCTION + f"\nQuestion: {question}\n"
    if knowledge:
        text += P0_INTRO + f"<knowledge>\n{knowledge}\n</knowledge>\n"
    return text + "<|im_end|>\n<|im_start|>assistant\n"


def cut_reply(reply: str) -> tuple[str, bool]:
    """EKA_infer.py `process_tool_call` (without the "<|im_end|>" it appends): (the reply cut after its first
    `</query>`, True) when it holds a `<query>...</query>` block, else (the reply, False)."""
    if QUERY_BLOCK.search(reply) is None:
        return reply, False
    return reply.split(QUERY_CLOSE)[0] + QUERY_CLOSE, True


def parse_query(reply: str) -> str | None:
    """tool_env.py `ToolEnv.extract_tool_call`: the first `<query>` block's JSON object's "query", as str();
    None (an invalid call) when there is no block, no JSON, or not an object with "query"."""
    block = QUERY_BLOCK.search(reply)
    if block is None:
        return None
    try:
        call = json.loads(block.group(1).strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(call, dict) or "query" not in call:
        return None
    return str(call["query"])


def extract_answer(text: str) -> str:
    """EKA_infer.py `extract_answer_from_text`: the first `<answer>` block's text, else the text after the
    first `<think>...</think>`, else the whole text; stripped."""
    answer = re.search(r"<answer>\s*(.*?)\s*</answer>", text, re.DOTALL)
    if answer is not None:
        return answer.group(1).strip()
    after_think = re.search(r"<think>.*?</think>\s*(.*)", text, re.DOTALL)
    if after_think is not None:
        return after_think.group(1).strip()
    return text.strip()


def knowledge_turn(knowledge: str) -> str:
    """The text appended after a reply that made a call: their "<|im_end|>", then the knowledge turn."""
    return END_OF_TURN + KNOWLEDGE_TURN.format(knowledge=knowledge)


def chat_text(tokenizer, content: str) -> str:
    """One call's prompt: `content` as the one user message under the tokenizer's chat template (Qwen2.5's:
    its default system turn first) with the assistant turn opened, as vLLM's chat API renders it."""
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


class EkaInferProtocol(GraphR1Protocol):
    """What evaluation (`eval.evaluate`) reads of this loop: the Graph-R1 tags (`<knowledge>` holds the
    retrieved text), R-S over the text of each `<knowledge>` block (a Graph-R1 protocol), and the plain token
    F1 of their script (EKA_infer.py scores with eval.py `cal_f1`; `cal_em` is our EM). Not registered: no
    rollout engine runs it; `EkaInferAgent` does."""

    name = "eka_infer"
    stop_strings = (QUERY_CLOSE,)
    uses_initial_knowledge = True
    masked_span = None  # nothing here trains: the loss mask marks the sampled tokens only


# ---------------------------------------------------------------------------------------------- the loop


@dataclasses.dataclass(frozen=True)
class _Reply:
    """One row's chat call: the ids sampled [n], their logprobs / entropy [n], whether the cache ran out."""

    ids: list
    logprobs: np.ndarray
    entropy: np.ndarray
    cache_full: bool


@dataclasses.dataclass(frozen=True)
class EkaInferAgent:
    """The authors' inference loop over our model, sampler and retriever (`rollout`, `rollout_examples`: the
    interface `eval.evaluate` drives, as an `AgentEngine`'s). `sampler` decodes until `</query>` or an EOS
    token (`build_eka_infer`); temperature and top-p are its own."""

    tokenizer: Any
    retriever: Any  # `retrieval.base.Retriever`
    sampler: Sampler
    max_turns: int  # chat calls per question (their --max-turns; launch/eval.py's defaults are theirs)
    max_tokens: int  # new tokens per chat call (their --max-tokens)
    retrieval_k: int  # passages per search
    initial_k: int  # P0 passages; 0: no P0 (their prompt without knowledge)
    initial_retriever: Any = None  # P0 from another corpus (None: `retriever`)
    protocol: EkaInferProtocol = dataclasses.field(default_factory=EkaInferProtocol)

    def replace(self, **changes) -> EkaInferAgent:
        return dataclasses.replace(self, **changes)

    def rollout_examples(self, params, examples: Sequence, key, data_prompt: bool = True) -> Trajectories:
        """`rollout` of QA examples' questions (data_prompt: unused, their prompt is always built)."""
        return self.rollout(params, [e.question for e in examples], key)

    def rollout(self, params, questions: Sequence[str], key) -> Trajectories:
        """One episode per question; row i samples call t with fold_in(fold_in(key, i), t)."""
        clock = {"device": 0.0, "retrieval": 0.0, "host": 0.0}
        t_start = time.perf_counter()
        keys = row_keys(as_key(key), 0, len(questions))
        p0 = [[] for _ in questions]
        if self.initial_k > 0:
            t = time.perf_counter()
            p0 = initial_docs(questions, self.initial_retriever or self.retriever, self.initial_k)
            clock["retrieval"] += time.perf_counter() - t
        contents = [build_prompt(q, [d.contents for d in docs]) for q, docs in zip(questions, p0)]
        rows = [Row(self._prompt_ids(c), docs) for c, docs in zip(contents, p0)]
        for turn in range(self.max_turns):
            prompts = {}
            for i, row in enumerate(rows):
                if row.done:
                    continue
                ids = row.prompt if turn == 0 else self._prompt_ids(contents[i])
                if len(ids) >= self.sampler.cache_len:  # no room to decode (vLLM: over max_model_len)
                    row.done = row.truncated = True
                else:
                    prompts[i] = ids
            if not prompts:
                break
            t = time.perf_counter()
            turn_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, turn)
            replies = self._chat_calls(params, prompts, turn_keys)
            clock["device"] += time.perf_counter() - t
            calls = self._read_replies(rows, replies, last=turn == self.max_turns - 1)
            self._search(rows, contents, calls, clock)
        traj = assemble(rows, self.tokenizer, self.protocol, clock)
        clock["host"] = time.perf_counter() - t_start - clock["device"] - clock["retrieval"]
        return traj

    def _prompt_ids(self, content: str) -> list[int]:
        # special-token text in the content ("<|im_start|>system" ...) is read as those tokens, as vLLM's
        # tokenizer reads it
        return self.tokenizer.encode(chat_text(self.tokenizer, content), allow_special=True)

    def _chat_calls(self, params, prompts: dict[int, list[int]], keys) -> dict[int, _Reply]:
        """One chat call per row of `prompts` (row -> prompt ids, each shorter than the cache): prefill, then
        decode up to max_tokens until an EOS token or a `</query>` that closes a `<query>` (a `</query>`
        without one decodes on: their cut is at the first `</query>`, but only a reply with a whole block
        makes a call). The other rows of the batch prefill one token and decode nothing."""
        n = keys.shape[0]
        state = self.sampler.start(params, [prompts.get(i, [self.tokenizer.eos_id]) for i in range(n)], keys)
        left, room = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i, ids in prompts.items():
            left[i], room[i] = self.max_tokens, self.sampler.cache_len - len(ids)
        pieces = {i: [] for i in prompts}
        while True:
            budget = np.minimum(left, room).astype(np.int32)
            if not budget.any():
                break
            seg, state = self.sampler.decode(params, state, budget)
            for i in np.flatnonzero(budget):
                length = int(seg.length[i])
                pieces[i].append((seg.tokens[i, :length], seg.logprobs[i, :length], seg.entropy[i, :length]))
                left[i] -= length
                room[i] -= length
                ids = [int(t) for piece in pieces[i] for t in piece[0]]
                if length == 0 or ids[-1] in self._eos_ids or QUERY_BLOCK.search(self._reply_text(ids)):
                    left[i] = 0
        replies = {}
        for i, parts in pieces.items():
            tokens, logprobs, entropy = (np.concatenate(x) for x in zip(*parts))
            ended = len(tokens) > 0 and int(tokens[-1]) in self._eos_ids
            full = room[i] == 0 and left[i] > 0 and not ended  # stopped by the cache's end
            replies[i] = _Reply([int(t) for t in tokens], logprobs, entropy, bool(full))
        return replies

    def _read_replies(self, rows: list[Row], replies: dict[int, _Reply], last: bool) -> list[tuple[int, str]]:
        """Record each reply; a reply without a query block answers, one with a block is a call unless `last`
        (their loop ends after max_turns calls). Returns the calls: (row, the reply cut after `</query>`)."""
        calls = []
        for i, reply in replies.items():
            row = rows[i]
            kept, is_call = cut_reply(self._reply_text(reply.ids))
            row.turns += 1
            row.truncated = row.truncated or reply.cache_full
            if not is_call:
                row.add(POLICY, reply.ids, kept + END_OF_TURN, reply.logprobs, reply.entropy)
                row.answer, row.done = extract_answer(kept), True
                continue
            row.add(POLICY, reply.ids, kept, reply.logprobs, reply.entropy)
            if last:
                row.done = True
            else:
                calls.append((i, kept))
        return calls

    def _search(
        self, rows: list[Row], contents: list[str], calls: list[tuple[int, str]], clock: dict
    ) -> None:
        """One retriever call for the valid queries of `calls`; each call's knowledge turn (their invalid-call
        text where the query did not parse) appended to the row's record and to its content."""
        queries = {i: parse_query(kept) for i, kept in calls}
        valid = [i for i, _ in calls if queries[i] is not None]
        t = time.perf_counter()
        results = self.retriever.search([queries[i] for i in valid], self.retrieval_k) if valid else []
        clock["retrieval"] += time.perf_counter() - t
        docs = dict(zip(valid, results))
        for i, kept in calls:
            row = rows[i]
            if i in docs:
                text, kind = knowledge_turn(graph_r1_result_string(list(docs[i]))), OBSERVATION
                row.searches += 1
                row.queries.append(queries[i])
                row.docs.append(list(docs[i]))
                row.observations.append(text)
            else:
                text, kind = knowledge_turn(GRAPH_R1_INVALID_CALL), HINT  # tool_env.py's invalid-call text
            contents[i] += kept + text
            row.add(kind, self.tokenizer.encode(text, allow_special=True), text)

    @functools.cached_property
    def _eos_ids(self) -> frozenset[int]:
        return token_ids(self.tokenizer, EOS_TOKENS)

    @functools.cached_property
    def _skipped_ids(self) -> frozenset[int]:
        return token_ids(self.tokenizer, SKIPPED_TOKENS)

    def _reply_text(self, ids: Sequence[int]) -> str:
        """A reply's text as vLLM's chat API returns it: its special tokens (EOS included) dropped."""
        return self.tokenizer.decode([t for t in ids if t not in self._skipped_ids])


def token_ids(tokenizer, tokens: Sequence[str]) -> frozenset[int]:
    """The ids of those of `tokens` the tokenizer has."""
    out = set()
    for token in tokens:
        try:
            out.add(tokenizer.token_to_id(token))
        except KeyError:
            continue
    return frozenset(out)


# ---------------------------------------------------------------------------------------------- building


def build_eka_infer(cfg: AgentConfig, model_config, mesh, initial_k: int) -> EkaInferAgent:
    """The loop for `cfg` (launch/eval.py's command line): its tokenizer and retrievers; rollout.max_turns
    chat calls of up to rollout.max_segment_tokens new tokens (their max_tokens) at eval_temperature /
    eval_top_p, eval_retrieval_k passages per search, `initial_k` P0 passages (0: none), cache_len slots."""
    r = cfg.rollout
    tokenizer = load_tokenizer(cfg.tokenizer)
    eos = sorted(token_ids(tokenizer, EOS_TOKENS))
    table = StopTable.build(tokenizer, [QUERY_CLOSE], eos, model_config.vocab_size)
    sampling = SamplingParams(r.eval_temperature, r.eval_top_p if r.eval_temperature else 1.0, 0)
    sampler = Sampler(
        model_config, table, r.cache_len, min(r.max_segment_tokens, r.cache_len), sampling, mesh=mesh
    )
    return EkaInferAgent(
        tokenizer,
        build_retriever(cfg.retriever),
        sampler,
        max_turns=r.max_turns,
        max_tokens=r.max_segment_tokens,
        retrieval_k=r.eval_retrieval_k,
        initial_k=initial_k,
        initial_retriever=None if cfg.initial_retriever is None else build_retriever(cfg.initial_retriever),
    )
