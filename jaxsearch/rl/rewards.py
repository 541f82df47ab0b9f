"""Rewards over decoded trajectories (host side): parsers, named reward functions, weighted sums.

A reward function takes a batch of `RewardInput` and returns float64 [N], so a reward backed by a
model (R-Search's evidence answerer, SOAR's fabrication judge) makes one batched call per batch.

    REWARDS / get_reward(name)        text-only rewards by name: em, f1, sub_em, em_gated, f1_gated,
                                      format, search_r1, rsearch_format, source_consistency
    combine([("em", 1.0), ("format", 0.2), (evidence_reward(answerer), 1.0)])   weighted sum; its
                                      `score(samples)` also gives each term's values by name

`response` is everything after the prompt, decoded without special tokens: what the policy wrote
plus the `<information>...</information>` observations the retriever inserted. Tags inside an
observation are never read as the policy's: parsers first empty every complete information block.

Sources: Search-R1 `verl/utils/reward_score/qa_em.py` and `qa_em_format.py` (answer extraction,
`is_valid_sequence`, the combined EM/format score); Graph-R1 (answer counts only with a valid
format); R-Search (seed 002: answer F1 + evidence F1 from a frozen answerer + format); SOAR (seed 001:
source-consistent reward, evidence-fabrication judge of Table 2).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Protocol, Sequence

import numpy as np

from jaxsearch.eval.metrics import answer_in_text, exact_match, f1_score, sub_exact_match

MAX_ANSWER_CHARS = 256


@dataclasses.dataclass(frozen=True)
class RewardInput:
    """One trajectory as the rewards see it.

    response:           decoded text after the prompt (policy text and <information> observations).
    golden_answers:     the dataset's accepted answers.
    question:           the raw question (R-Search's evidence answerer and SOAR's judge read it).
    internal_knowledge: SOAR: text of the internal-knowledge stream (facts the policy listed).
    external_knowledge: SOAR: text of the external stream (passages the retriever returned).
    """

    response: str
    golden_answers: Sequence[str]
    question: str = ""
    internal_knowledge: str = ""
    external_knowledge: str = ""


RewardFn = Callable[[Sequence[RewardInput]], np.ndarray]


# ---------------------------------------------------------------------------------------- parsing

_OBSERVATION = re.compile(r"<information>.*?</information>", re.DOTALL)


def policy_view(response: str) -> str:
    """The response with every complete observation emptied to `<information></information>`."""
    return _OBSERVATION.sub("<information></information>", response)


def observations(response: str) -> list[str]:
    """Contents of the complete `<information>` blocks, in order."""
    return [m.group(0)[len("<information>") : -len("</information>")] for m in _OBSERVATION.finditer(response)]


def _last_block(text: str, tag: str) -> str | None:
    """Stripped content of the last innermost complete <tag>...</tag> in text, or None."""
    pattern = rf"<{tag}>((?:(?!</?{tag}>).)*)</{tag}>"
    matches = re.findall(pattern, text, re.DOTALL)
    return matches[-1].strip() if matches else None


def _single_block_start(text: str, tag: str) -> int | None:
    """Start of the only <tag>...</tag> in text, or None unless there is exactly one open and one close."""
    if text.count(f"<{tag}>") != 1 or text.count(f"</{tag}>") != 1:
        return None
    start = text.find(f"<{tag}>")
    return start if start < text.find(f"</{tag}>") else None


def extract_answer(response: str) -> str | None:
    """The last complete `<answer>...</answer>` the policy wrote (Search-R1's rule), stripped; else None.

    Nested tags resolve to the innermost block; an unclosed trailing `<answer>` is ignored. Search-R1
    skips the first match because its text includes the prompt's example; ours starts after the prompt.
    """
    return _last_block(policy_view(response), "answer")


def graded_answer(response: str, max_answer_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """The answer that answer rewards score: None when absent, flooded (more than one `<answer>`)
    or longer than `max_answer_chars`."""
    if policy_view(response).count("<answer>") > 1:
        return None
    answer = extract_answer(response)
    return answer if answer is not None and len(answer) <= max_answer_chars else None


def extract_evidence(response: str) -> str | None:
    """The last complete `<evidence>...</evidence>` the policy wrote (R-Search), stripped; else None."""
    return _last_block(policy_view(response), "evidence")


def extract_information_source(response: str) -> str | None:
    """SOAR's declared source: "internal" or "external" from the last `<information_source>`; else None."""
    source = _last_block(policy_view(response), "information_source")
    source = source.lower() if source is not None else None
    return source if source in ("internal", "external") else None


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


def search_r1_score(
    response: str,
    golden_answers: Sequence[str],
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    retrieval_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """Search-R1's `qa_em_format.compute_score_em` on one trajectory.

    correct answer:    score if the format is valid, else score - structure_format_score.
    otherwise, valid:  structure_format_score (+ retrieval_score if an observation holds a golden answer).
    otherwise:         final_format_score if there is an answer, else 0.
    """
    answer = graded_answer(response)
    valid = is_valid_sequence(response)
    if answer is not None and exact_match(answer, golden_answers):
        return score if valid else score - structure_format_score
    if valid:
        return structure_format_score + (retrieval_score if retrieval_hit(response, golden_answers) else 0.0)
    return final_format_score if answer is not None else 0.0


# ------------------------------------------------------------------------------ R-Search format

def rsearch_format_score(response: str, weight: float = 0.2) -> float:
    """R-Search format: `weight` for exactly one answer block + `weight` for exactly one evidence
    block that comes after at least one observation."""
    view = policy_view(response)
    answer_ok = _single_block_start(view, "answer") is not None
    evidence_start = _single_block_start(view, "evidence")
    evidence_ok = evidence_start is not None and "</information>" in view[:evidence_start]
    return weight * answer_ok + weight * evidence_ok


# ------------------------------------------------------------------------------ SOAR consistency

def source_consistent(sample: RewardInput) -> bool:
    """SOAR: the declared `<information_source>` supports the answer (EM check).

    The answer is supported by a stream when its normalized text occurs in the stream's normalized
    text (`answer_in_text`); declaring "internal" needs support in `internal_knowledge`, declaring
    "external" needs it in `external_knowledge`. No answer or no declaration is inconsistent.
    """
    answer, source = graded_answer(sample.response), extract_information_source(sample.response)
    if answer is None or source is None:
        return False
    stream = sample.internal_knowledge if source == "internal" else sample.external_knowledge
    return answer_in_text(stream, [answer])


# ---------------------------------------------------------------------- reward function builders

def per_sample(fn: Callable[[RewardInput], float]) -> RewardFn:
    """Lift a one-trajectory scorer to a batched reward function."""

    def reward(samples: Sequence[RewardInput]) -> np.ndarray:
        return np.array([float(fn(s)) for s in samples], dtype=np.float64)

    return reward


def answer_reward(metric: Callable[[str, Sequence[str]], float], max_answer_chars: int = MAX_ANSWER_CHARS) -> RewardFn:
    """metric(graded answer, golden answers); 0 without a gradable answer."""

    def score(s: RewardInput) -> float:
        answer = graded_answer(s.response, max_answer_chars)
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
    """R-Search evidence reward: F1 of the answerer's answer from the trajectory's `<evidence>`.

    One `answerer.answer` call per batch, for the trajectories that wrote evidence; the others get 0.
    """

    def evidence(samples: Sequence[RewardInput]) -> np.ndarray:
        out = np.zeros(len(samples), dtype=np.float64)
        evidences = [extract_evidence(s.response) for s in samples]
        rows = [i for i, e in enumerate(evidences) if e]
        if not rows:
            return out
        answers = answerer.answer([samples[i].question for i in rows], [evidences[i] for i in rows])
        if len(answers) != len(rows):
            raise ValueError(f"evidence answerer returned {len(answers)} answers for {len(rows)} evidences")
        for i, answer in zip(rows, answers):
            out[i] = f1_score(answer, samples[i].golden_answers)
        return out

    return evidence


def rsearch_reward(answerer: EvidenceAnswerer) -> RewardFn:
    """R-Search's total reward: answer F1 + evidence F1 + format (0.2 answer + 0.2 evidence)."""
    return combine([("f1", 1.0), (evidence_reward(answerer), 1.0), ("rsearch_format", 1.0)])


# --------------------------------------------------------------------------- SOAR fabrication judge

FABRICATION_JUDGE_PROMPT = """Task Instruction:

Determine whether a model’s reasoning is grounded in the provided information. Only judge whether the reasoning steps or the final answer actually depend on facts stated in the <information> block. Do NOT evaluate whether the final answer is correct.

Output Format:

{
"reason": "...",
"grounded": true/false
}"""


class Judge(Protocol):
    """An LLM judge: one completion per prompt."""

    def judge(self, prompts: list[str]) -> list[str]: ...


def fabrication_judge_prompt(question: str, response: str) -> str:
    """SOAR's Table 2 instruction followed by the question and the trajectory to judge."""
    return f"{FABRICATION_JUDGE_PROMPT}\n\nQuestion: {question}\n\nModel reasoning:\n{response}"


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
    prompts = [fabrication_judge_prompt(s.question, s.response) for s in samples]
    verdicts = judge.judge(prompts) if prompts else []
    if len(verdicts) != len(prompts):
        raise ValueError(f"judge returned {len(verdicts)} verdicts for {len(prompts)} prompts")
    scores = [parse_fabrication_verdict(v) for v in verdicts]
    return np.array([np.nan if s is None else s for s in scores], dtype=np.float64)


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


# ---------------------------------------------------------------------------------- registry

REWARDS: dict[str, RewardFn] = {
    "em": answer_reward(exact_match),
    "f1": answer_reward(f1_score),
    "sub_em": answer_reward(sub_exact_match),
    "em_gated": format_gated(answer_reward(exact_match)),
    "f1_gated": format_gated(answer_reward(f1_score)),
    "format": per_sample(lambda s: float(is_valid_sequence(s.response))),
    "search_r1": search_r1_reward(),
    "rsearch_format": per_sample(lambda s: rsearch_format_score(s.response)),
    "source_consistency": per_sample(lambda s: float(source_consistent(s))),
}


def get_reward(name: str) -> RewardFn:
    """The reward registered as `name`; a clear error lists the known names."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; known: {sorted(REWARDS)}")
    return REWARDS[name]


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
