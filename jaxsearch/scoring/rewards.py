"""Rewards over decoded trajectories (host side): named reward functions and weighted sums.

A reward function takes a batch of `RewardInput` and returns float64 [N], so a reward backed by a
model (R-Search's evidence answerer, SOAR's judges) makes one batched call per batch.

    REWARDS / get_reward(name)        text-only rewards by name: em, f1, sub_em (Search-R1's answer rule),
                                      em_strict, f1_strict (one answer, at most 256 characters), em_gated,
                                      f1_gated, format, search_r1, rsearch_f1, rsearch_format,
                                      rsearch_format_no_evidence, graph_r1, source_consistency
    combine([("em", 1.0), ("format", 0.2), (evidence_reward(answerer), 1.0)])   weighted sum; its
                                      `score(samples)` also gives each term's values by name
    overlong_penalty(lengths, L_max, L_cache)   DAPO's length shaping, from token counts (not text)

`response` is everything after the prompt, decoded without special tokens: what the policy wrote
plus the `<information>...</information>` observations the retriever inserted. Tags inside an
observation are never read as the policy's (`parsing.policy_view`).

Sources: Search-R1 `verl/utils/reward_score/qa_em.py` and `qa_em_format.py` (answer extraction,
`is_valid_sequence`, the combined EM/format score, its constants in
`scripts/nq_hotpotqa/v0.3/train_grpo_format.sh`); Graph-R1 as forked by EKA (format score and F1);
R-Search (seed 002 and QingFei1/R-Search: answer F1 + evidence F1 from a frozen answerer + format);
SOAR (seed 001: source-consistent reward, Table 7's two checks; evidence-fabrication judge, Table 2).
tests/data/reward_cases/ holds values obtained by running the authors' functions on the same inputs.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Protocol, Sequence

import numpy as np

from jaxsearch.scoring.metrics import answer_in_text, exact_match, f1_score, sub_exact_match, words_in_text
from jaxsearch.agent import parsing
from jaxsearch.agent.protocols import SEARCH_R1_INVALID_HINT, stream_lines
from jaxsearch.registry import Registry

MAX_ANSWER_CHARS = 256


@dataclasses.dataclass(frozen=True)
class RewardInput:
    """One trajectory as the rewards see it.

    response:           decoded text after the prompt (policy text and <information> observations; an
                        observation cut to max_obs_tokens is closed: `AgentProtocol.close_cut_observation`).
    golden_answers:     the dataset's accepted answers.
    question:           the raw question (R-Search's evidence answerer and SOAR's judges read it).
    internal_knowledge: SOAR: the internal stream E_int, the facts the policy listed (all searches).
    external_knowledge: the external stream E_ext, the passages the retriever returned (all searches);
                        never the internal facts, though a SOAR observation shows both. Both streams as far
                        as the policy saw them (observations are cut to max_obs_tokens).
    external_response:  the response with each observation reduced to its external stream: what SOAR's
                        fabrication judge is shown. None: the response itself (no internal stream).
    """

    response: str
    golden_answers: Sequence[str]
    question: str = ""
    internal_knowledge: str = ""
    external_knowledge: str = ""
    external_response: str | None = None


RewardFn = Callable[[Sequence[RewardInput]], np.ndarray]


def reward_inputs(traj, examples) -> list[RewardInput]:
    """The rewards' view of each row of `agent.trajectories.Trajectories` for its `QAExample`: SOAR's internal
    facts and the retrieved passages as separate streams, the judge's view of the response beside it."""
    return [
        RewardInput(
            traj.responses[i],
            ex.golden_answers,
            ex.question,
            internal_knowledge="\n".join(traj.internal_knowledge[i]),
            external_knowledge="\n".join(traj.retrieved[i]),
            external_response=traj.external_responses[i],
        )
        for i, ex in enumerate(examples)
    ]


# ---------------------------------------------------------------------------------------- parsing
# One parser for the protocols, the rewards and evaluation: jaxsearch/agent/parsing.py.

policy_view, observations, blocks = parsing.policy_view, parsing.observations, parsing.blocks
extract_answer, extract_evidence = parsing.extract_answer, parsing.extract_evidence
extract_information_source = parsing.information_source


def graded_answer(response: str, max_answer_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """The answer the strict rewards (`em_strict`, `f1_strict`) score: None when absent, flooded (more than
    one `<answer>` the policy wrote: outside observations and invalid-action hints) or longer than
    `max_answer_chars`."""
    policy_text = policy_view(response).replace(SEARCH_R1_INVALID_HINT, "")
    if policy_text.count("<answer>") > 1:
        return None
    answer = parsing.last_block(policy_text, "answer")
    return answer if answer is not None and len(answer) <= max_answer_chars else None


# --------------------------------------------------------------------------- Search-R1 format

_FORMAT_TAG = re.compile(r"(</?(?:think|search|information|answer)>)")
_TRANSITIONS = {
    ("start", "<think>"): "in_think",
    ("after_information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "after_information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
_TEXT_STATES = ("in_think", "in_search", "in_information", "in_answer")


def is_valid_sequence(response: str) -> bool:
    """Search-R1's `is_valid_sequence`: (<think> <search> <information>)* <think> <answer>, nothing else.

    A state machine over the four tags: text is allowed only inside a tag, whitespace anywhere, and
    the sequence must end right after `</answer>`; so tags are balanced and there is one answer.
    """
    state = "start"
    for part in _FORMAT_TAG.split(policy_view(response)):
        if not part.strip():
            continue
        if _FORMAT_TAG.fullmatch(part):
            state = _TRANSITIONS.get((state, part))
            if state is None:
                return False
        elif state not in _TEXT_STATES:
            return False
    return state == "end"


def retrieval_hit(response: str, golden_answers: Sequence[str]) -> bool:
    """True if any observation block contains a golden answer (Search-R1's `is_retrieval_correct`)."""
    return any(answer_in_text(block, golden_answers) for block in observations(response))


# Search-R1's published format constants (scripts/nq_hotpotqa/v0.3/train_grpo_format.sh: reward_model.
# structure_format_score=0.2, final_format_score=0.1, retrieval_score=0)
STRUCTURE_FORMAT_SCORE, FINAL_FORMAT_SCORE, RETRIEVAL_SCORE = 0.2, 0.1, 0.0


def search_r1_score(
    response: str,
    golden_answers: Sequence[str],
    structure_format_score: float = STRUCTURE_FORMAT_SCORE,
    final_format_score: float = FINAL_FORMAT_SCORE,
    retrieval_score: float = RETRIEVAL_SCORE,
    score: float = 1.0,
) -> float:
    """Search-R1's `qa_em_format.compute_score_em` on one trajectory.

    correct answer:    score if the format is valid, else score - structure_format_score.
    otherwise, valid:  structure_format_score (+ retrieval_score if an observation holds a golden answer).
    otherwise:         final_format_score, the floor of every invalid trajectory.

    Search-R1 scores the decoded prompt + response, and its prompt holds two complete answer blocks
    ("<answer> and </answer>", "<answer> Beijing </answer>"), so a response without an answer is scored as
    if it answered "Beijing": wrong (final_format_score) unless a golden answer is "Beijing". Here a response
    without an answer is never correct: it gets the floor, which is Search-R1's value for every other gold.
    """
    answer = extract_answer(response)
    valid = is_valid_sequence(response)
    if answer is not None and exact_match(answer, golden_answers):
        return score if valid else score - structure_format_score
    if valid:
        return structure_format_score + (retrieval_score if retrieval_hit(response, golden_answers) else 0.0)
    return final_format_score


# ------------------------------------------------------------------------------ R-Search
# QingFei1/R-Search `src/verl/utils/reward_score/qa_f1.py` (compute_score_f1, extract_solution, F1_check).
# Its prompt holds one complete block of each tag (content "and"), and it counts blocks over prompt + response;
# below the counts are the response's own.


def rsearch_f1(prediction: str, golden_answers: Sequence[str]) -> float:
    """R-Search's `F1_check`: SQuAD token F1, max over golden answers, rounded to 2 decimals (no yes/no rule)."""
    return round(f1_score(prediction, golden_answers, special_answers=False), 2)


def rsearch_evidence(response: str) -> str | None:
    """The evidence R-Search scores: the last `<evidence>` block, only when the response has an observation."""
    view = policy_view(response)
    return extract_evidence(response) if blocks(view, "information") else None


def rsearch_format_score(response: str, weight: float = 0.2, evidence: bool = True) -> float:
    """R-Search's format reward (`extract_solution`'s two flags):

    answer:   `weight` when the response has exactly one answer block, non-empty and not "and".
    evidence: `weight` when it has exactly one non-empty evidence block and at least one observation, or
              when it has neither an evidence block nor an observation (no search, nothing to distill).
              The order of evidence and observations is not checked. `evidence=False`: no evidence part
              (the evidence-free ablation, seed 002 §5.2: the answer flag alone).
    """
    view = policy_view(response)
    answers, evidences = blocks(view, "answer"), blocks(view, "evidence")
    answer_ok = len(answers) == 1 and answers[0].strip() not in ("", "and")
    if not evidence:
        return weight * answer_ok
    searched = bool(blocks(view, "information"))
    if not evidences:
        evidence_ok = not searched
    else:
        evidence_ok = searched and len(evidences) == 1 and bool(evidences[0].strip())
    return weight * answer_ok + weight * evidence_ok


# ------------------------------------------------------------------------------ Graph-R1
# Graph-R1's `verl/utils/reward_score/qa_em_and_format.py` (compute_score_format, compute_score_format_answer)
# with `cal_f1` of its eval.py, as forked by EKA. It reads the assistant turns of the decoded (special tokens
# kept) prompt + response; knowledge comes back in user turns, so tags inside it are never read.

_ASSISTANT_START, _TURN_END = "<|im_start|>assistant\n", "<|im_end|>"
_ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", re.DOTALL)
_QUERY_TURN = re.compile(r"^<think>(.*?)</think>\n<query>(.*?)</query>$", re.DOTALL)
_ANSWER_TURN = re.compile(r"^<think>(.*?)</think>\n<answer>(.*?)</answer>$", re.DOTALL)
_QUERY_TURN_TAGS = ("<think>", "</think>", "<query>", "</query>")


def graph_r1_turns(response: str) -> list[str]:
    """The policy's assistant turns as Graph-R1 sees them: the response (which starts right after the prompt's
    `<|im_start|>assistant\n`) cut at the chat turn markers. Graph-R1 closes every turn the policy wrote with
    `<|im_end|>`; so is the last one here, unless the response ends on an observation's pre-filled `<think>\n`
    (the row ran out of turns: Graph-R1 has no turn there)."""
    text = _ASSISTANT_START + response
    if not text.endswith(_TURN_END) and not text.endswith(_ASSISTANT_START + "<think>\n"):
        text += _TURN_END
    return _ASSISTANT_TURN.findall(text)


def graph_r1_format_score(response: str) -> float:
    """Graph-R1's format score, uncapped: 0.5 per well-formed non-final turn (`<think>...</think>\n<query>...
    </query>`, each of the four tags once) + 0.5 for a well-formed final turn (`<think>...</think>\n<answer>...
    </answer>`; its tags are not counted)."""
    turns = graph_r1_turns(response)
    if not turns:
        return 0.0
    score = 0.0
    for turn in turns[:-1]:
        if all(turn.count(tag) == 1 for tag in _QUERY_TURN_TAGS) and _QUERY_TURN.match(turn):
            score += 0.5
    return score + (0.5 if _ANSWER_TURN.match(turns[-1]) else 0.0)


def graph_r1_score(response: str, golden_answers: Sequence[str]) -> float:
    """Graph-R1's reward: answer F1 (SQuAD, no yes/no rule) of the first `<answer>` of the last turn when the
    format score reaches 1, else -1 + format score. A direct answer without a search is at most -0.5."""
    form = min(graph_r1_format_score(response), 1.0)
    if form < 1.0:
        return -1.0 + form
    turns = graph_r1_turns(response)
    answer = re.search(r"<answer>(.*?)</answer>", turns[-1], re.DOTALL)
    return 0.0 if answer is None else f1_score(answer.group(1).strip(), golden_answers, special_answers=False)


# ------------------------------------------------------------------------------ SOAR consistency


def declared_stream(sample: RewardInput) -> tuple[str, str, str] | None:
    """(answer, declared source, that source's stream text), or None without an answer or a declaration.

    "internal" points at `internal_knowledge` (E_int) and "external" at `external_knowledge` (E_ext) only:
    an answer found in the other stream does not count.
    """
    answer, source = extract_answer(sample.response), extract_information_source(sample.response)
    if not answer or source is None:
        return None
    return answer, source, sample.internal_knowledge if source == "internal" else sample.external_knowledge


def stream_supports(stream: str, answer: str) -> bool:
    """SOAR's exact-match check of an answer against a stream (Table 7, "w/ EM check"; the seed does not spell
    out the match): the SQuAD-normalized answer occurs as a run of whole words in one fact or passage of the
    stream, read without the numbering our workflow puts before each ("1. ", "Doc 1(Title: "). So "no" is not
    in "nothing", nor "1" in a numbered list's "1. ..."."""
    return any(words_in_text(line, answer) for line in stream_lines(stream))


def source_consistent(sample: RewardInput) -> bool:
    """SOAR's source-consistency check by exact match (Table 7, "w/ EM check"): the declared stream, as far
    as the policy saw it, supports the answer (`stream_supports`). No answer or no declaration: False."""
    declared = declared_stream(sample)
    return declared is not None and stream_supports(declared[2], declared[0])


# ---------------------------------------------------------------------- reward function builders


def per_sample(fn: Callable[[RewardInput], float]) -> RewardFn:
    """Lift a one-trajectory scorer to a batched reward function."""

    def reward(samples: Sequence[RewardInput]) -> np.ndarray:
        return np.array([float(fn(s)) for s in samples], dtype=np.float64)

    return reward


def answer_reward(metric: Callable[[str, Sequence[str]], float], strict: bool = False) -> RewardFn:
    """metric(answer, golden answers); 0 without an answer.

    The answer is Search-R1's (`qa_em.compute_score_em`): the last complete `<answer>` block, any number of
    blocks, any length; none scores 0 (Search-R1 would read its prompt's example answer, "Beijing").
    strict: `graded_answer`, so more than one answer block or one over 256 characters scores 0 (a guard
    against answer flooding that the papers do not have).
    """

    def score(s: RewardInput) -> float:
        answer = graded_answer(s.response) if strict else extract_answer(s.response)
        return 0.0 if answer is None else metric(answer, s.golden_answers)

    return per_sample(score)


def format_gated(reward_fn: RewardFn, is_valid: Callable[[str], bool] = is_valid_sequence) -> RewardFn:
    """Graph-R1's gate: the wrapped reward counts only on trajectories whose format is valid."""

    def reward(samples: Sequence[RewardInput]) -> np.ndarray:
        return reward_fn(samples) * np.array([is_valid(s.response) for s in samples], dtype=np.float64)

    return reward


def search_r1_reward(**params: float) -> RewardFn:
    """`search_r1_score` with its parameters (structure_format_score, ...) fixed."""
    return per_sample(lambda s: search_r1_score(s.response, s.golden_answers, **params))


class EvidenceAnswerer(Protocol):
    """A frozen model that answers each question from the evidence alone (R-Search)."""

    def answer(self, questions: list[str], evidences: list[str]) -> list[str]: ...


def evidence_reward(answerer: EvidenceAnswerer) -> RewardFn:
    """R-Search's evidence reward (`compute_score_f1`): `rsearch_f1` of the frozen answerer's reply to the
    stripped question and the trajectory's evidence (`rsearch_evidence`: only after an observation).

    One `answerer.answer` call per batch, for the trajectories with non-empty evidence; the others get 0.
    """

    def evidence(samples: Sequence[RewardInput]) -> np.ndarray:
        out = np.zeros(len(samples), dtype=np.float64)
        evidences = [rsearch_evidence(s.response) for s in samples]
        rows = [i for i, e in enumerate(evidences) if e]
        if not rows:
            return out
        answers = answerer.answer([samples[i].question.strip() for i in rows], [evidences[i] for i in rows])
        if len(answers) != len(rows):
            raise ValueError(f"evidence answerer returned {len(answers)} answers for {len(rows)} evidences")
        for i, answer in zip(rows, answers):
            out[i] = rsearch_f1(answer, samples[i].golden_answers)
        return out

    return evidence


def rsearch_reward(answerer: EvidenceAnswerer) -> RewardFn:
    """R-Search's total reward: answer F1 + evidence F1 + format (0.2 answer + 0.2 evidence)."""
    return combine([("rsearch_f1", 1.0), (evidence_reward(answerer), 1.0), ("rsearch_format", 1.0)])


# --------------------------------------------------------------------------- SOAR fabrication judge

FABRICATION_JUDGE_PROMPT = """Task Instruction:

Determine whether a model’s reasoning is grounded in the provided information. Only judge whether the reasoning steps or the final answer actually depend on facts stated in the <information> block. Do NOT evaluate whether the final answer is correct.

Output Format:

{
"reason": "...",
"grounded": true/false
}"""


class Judge(Protocol):
    """An LLM judge: one completion per conversation of `{"role", "content"}` messages."""

    def judge(self, conversations: list[list[dict]]) -> list[str]: ...


def fabrication_judge_messages(sample: RewardInput) -> list[dict]:
    """SOAR's judge conversation: Table 2's text as the system message; the question and the trajectory as
    the user message (its layout is ours: the seed shows only the system prompt). The trajectory is the
    external view (E_ext only): facts the policy listed itself are not evidence it was given."""
    response = sample.response if sample.external_response is None else sample.external_response
    return [
        {"role": "system", "content": FABRICATION_JUDGE_PROMPT},
        {"role": "user", "content": f"Question: {sample.question}\n\nModel reasoning:\n{response}"},
    ]


_GROUNDED = re.compile(r"grounded[\"']?\s*[:=]\s*[\"']?(true|false)\b(?!\s*/)", re.IGNORECASE)


def parse_fabrication_verdict(text: str) -> float | None:
    """Judge output -> fabrication score: 1.0 not grounded, 0.0 grounded, None if no verdict found.

    Reads the last `"grounded": true|false` in the text (JSON or loose), so an echoed
    `"grounded": true/false` from the instruction is skipped.
    """
    verdicts = _GROUNDED.findall(text)
    if not verdicts:
        return None
    return 0.0 if verdicts[-1].lower() == "true" else 1.0


def judge_fabrication(judge: Judge, samples: Sequence[RewardInput]) -> np.ndarray:
    """Fabrication score per trajectory [N]: 1.0 fabricated, 0.0 grounded, NaN if unparseable."""
    conversations = [fabrication_judge_messages(s) for s in samples]
    verdicts = _judged(judge, conversations)
    scores = [parse_fabrication_verdict(v) for v in verdicts]
    return np.array([np.nan if s is None else s for s in scores], dtype=np.float64)


def _judged(judge: Judge, conversations: list[list[dict]]) -> list[str]:
    verdicts = judge.judge(conversations) if conversations else []
    if len(verdicts) != len(conversations):
        raise ValueError(f"judge returned {len(verdicts)} verdicts for {len(conversations)} conversations")
    return verdicts


def fabrication_reward(judge: Judge) -> RewardFn:
    """1.0 when the judge finds the trajectory grounded, else 0.0 (an unparseable verdict gets 0)."""

    def grounded(samples: Sequence[RewardInput]) -> np.ndarray:
        return (judge_fabrication(judge, samples) == 0.0).astype(np.float64)

    return grounded


def fabrication_rate(scores: np.ndarray) -> float:
    """Fraction of judged trajectories that fabricate, over parseable verdicts (NaN if none)."""
    scores = np.asarray(scores, dtype=np.float64)
    parsed = scores[~np.isnan(scores)]
    return float(parsed.mean()) if parsed.size else float("nan")


# --------------------------------------------------------------------- SOAR consistency by a judge

# Ours: the seed names an LLM-judged source-consistency check (Table 7, "w/ Claude Opus 4.8 judge") but does
# not print its prompt. Written in the style of Table 2.
SOURCE_CONSISTENCY_JUDGE_PROMPT = """Task Instruction:

Determine whether the final answer is supported by the information source the model declared. You are given the question, the final answer, the declared source ("internal": facts the model listed from its own knowledge; "external": passages returned by a search engine) and the text of that source. Only judge whether the source text states or directly implies the answer. Do NOT evaluate whether the final answer is correct.

Output Format:

{
"reason": "...",
"consistent": true/false
}"""

_CONSISTENT = re.compile(r"consistent[\"']?\s*[:=]\s*[\"']?(true|false)\b(?!\s*/)", re.IGNORECASE)


def source_consistency_judge_messages(answer: str, source: str, stream: str, question: str) -> list[dict]:
    """The consistency judge's conversation: the instruction as the system message, the case as the user's."""
    case = f"Question: {question}\n\nFinal answer: {answer}\n\nDeclared source: {source}\n\nSource text:\n{stream}"
    return [
        {"role": "system", "content": SOURCE_CONSISTENCY_JUDGE_PROMPT},
        {"role": "user", "content": case},
    ]


def source_consistency_judge_reward(judge: Judge) -> RewardFn:
    """SOAR's source-consistency check by an LLM judge (Table 7): 1.0 when the judge finds the declared
    stream supports the answer; 0.0 otherwise, unparseable verdicts included. Trajectories without an
    answer or a declaration get 0.0 without a judge call; one batched call for the rest."""

    def consistent(samples: Sequence[RewardInput]) -> np.ndarray:
        out = np.zeros(len(samples), dtype=np.float64)
        declared = [(i, declared_stream(s)) for i, s in enumerate(samples)]
        rows = [(i, d) for i, d in declared if d is not None]
        conversations = [source_consistency_judge_messages(*d, samples[i].question) for i, d in rows]
        for (i, _), verdict in zip(rows, _judged(judge, conversations)):
            found = _CONSISTENT.findall(verdict)
            out[i] = float(bool(found) and found[-1].lower() == "true")
        return out

    return consistent


# ------------------------------------------------------------------- DAPO's overlong shaping


def overlong_penalty(lengths: np.ndarray, max_tokens: int, buffer: int) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, Eq. 13), added to the reward.
    lengths [N]: tokens the policy wrote per trajectory (retrieved text excluded); max_tokens: L_max;
    buffer: L_cache (the paper: L_max 20480, L_cache 4096, §4.1). Returns float64 [N]:

        0                                   if |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
        -1                                  if |y| > L_max
    """
    if not 0 < buffer < max_tokens:
        raise ValueError(f"overlong shaping needs 0 < L_cache={buffer} < L_max={max_tokens}")
    lengths = np.asarray(lengths, dtype=np.float64)
    expected = max_tokens - buffer
    soft = np.minimum((expected - lengths) / buffer, 0.0)
    return np.where(lengths > max_tokens, -1.0, soft)


# ---------------------------------------------------------------------------------- registry

REWARDS: Registry[RewardFn] = Registry(
    "reward",
    {
        "em": answer_reward(exact_match),
        "f1": answer_reward(f1_score),
        "sub_em": answer_reward(sub_exact_match),
        "em_strict": answer_reward(exact_match, strict=True),
        "f1_strict": answer_reward(f1_score, strict=True),
        "em_gated": format_gated(answer_reward(exact_match)),
        "f1_gated": format_gated(answer_reward(f1_score)),
        "format": per_sample(lambda s: float(is_valid_sequence(s.response))),
        "search_r1": search_r1_reward(),
        "rsearch_f1": answer_reward(rsearch_f1),
        "rsearch_format": per_sample(lambda s: rsearch_format_score(s.response)),
        "rsearch_format_no_evidence": per_sample(lambda s: rsearch_format_score(s.response, evidence=False)),
        "graph_r1": per_sample(lambda s: graph_r1_score(s.response, s.golden_answers)),
        "source_consistency": per_sample(lambda s: float(source_consistent(s))),
    },
)


def get_reward(name: str) -> RewardFn:
    """The reward registered as `name`; a clear error lists the known names."""
    return REWARDS.get(name)


@dataclasses.dataclass(frozen=True)
class WeightedSum:
    """A reward function: the weighted sum of named rewards. `score` also returns each term's own
    (unweighted) values, so a trainer can log them apart without calling a model-backed term twice."""

    terms: tuple[tuple[str, RewardFn, float], ...]  # (name, reward function, weight)

    def __post_init__(self):
        names = [name for name, _, _ in self.terms]
        if len(set(names)) != len(names):
            raise ValueError(f"reward terms {names}: each name may appear once (merge the weights)")

    def score(self, samples: Sequence[RewardInput]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(total [N], {name: values [N]}), both float64."""
        values = [np.asarray(fn(samples), dtype=np.float64) for _, fn, _ in self.terms]
        total = np.zeros(len(samples), dtype=np.float64)
        for (_, _, weight), v in zip(self.terms, values):
            total += weight * v
        return total, {name: v for (name, _, _), v in zip(self.terms, values)}

    def __call__(self, samples: Sequence[RewardInput]) -> np.ndarray:
        return self.score(samples)[0]


def combine(terms: Sequence[tuple[str | RewardFn, float]]) -> WeightedSum:
    """Weighted sum of rewards, each given by registry name or as a reward function (named after the
    function, or `term{i}` when that name is taken or missing)."""
    named = []
    for i, (t, weight) in enumerate(terms):
        name = t if isinstance(t, str) else getattr(t, "__name__", "")
        if not name or name in {n for n, _, _ in named}:
            name = f"term{i}"
        named.append((name, get_reward(t) if isinstance(t, str) else t, float(weight)))
    return WeightedSum(tuple(named))
