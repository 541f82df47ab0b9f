"""Rule-based stand-ins for models on the synthetic world: they know only its facts and sentence templates.

- `solution_trace(question, world)`: the ideal trajectory (one search per hop, then the answer) as `Step`s,
  the SFT warm start's teacher.
- `read_facts` / `read_answer`: a reader of the world's statement templates; answers a question from
  evidence text alone (R-Search's frozen evidence answerer).
(`scoring.world_chat.WorldChatModel`, the chat model behind SOAR's judges and R-Search's evidence reward on the
world, answers with them.)
"""

from __future__ import annotations

import dataclasses
import re

from jaxsearch.data.qa import QAExample
from jaxsearch.data.world.generator import World
from jaxsearch.data.world.tables import ORDER_COMPARISONS, RELATIONS, SAME_COMPARISONS, year_of


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of an ideal trajectory.

    action "search": `text` is the query, which should retrieve `passage_id`; that passage's `fact` sentence
    says that `relation` of `subject` is `found`. action "answer": `text` is the final answer.
    """

    action: str
    text: str
    passage_id: str | None = None
    subject: str | None = None
    relation: str | None = None
    found: str | None = None
    fact: str | None = None


def solution_trace(question: QAExample, world: World) -> list[Step]:
    """The ideal trajectory for a question of this world: one search per hop, then the answer.

    Each query is the hop's subject name plus its relation's words, e.g. "Velmar Rising film directed
    director".
    """
    meta = question.metadata
    steps = []
    for name, relation, passage_id in zip(meta["hop_entities"], meta["relations"], question.supporting_ids):
        entity = world.entity_named(name)
        if entity is None or not world.has(entity.id, relation):
            raise ValueError(f"question {question.id}: no {relation!r} fact about {name!r} in this world")
        fact, passage, sentence = world.statement(entity.id, relation)
        if passage.id != passage_id:
            raise ValueError(
                f"question {question.id}: passage {passage_id} is not where this world states it"
            )
        steps.append(
            Step(
                "search",
                f"{name} {RELATIONS[relation].query}",
                passage_id=passage_id,
                subject=name,
                relation=relation,
                found=world.object_text(fact),
                fact=sentence,
            )
        )
    steps.append(Step("answer", question.golden_answers[0]))
    return steps


# ------------------------------------------------------------------------------------------- a rule-based reader


def _pattern(template: str) -> re.Pattern:
    """A template ("{s} was born in {o}.") as an anchored regex with one lazy group per field."""
    parts = re.split(r"(\{[a-z]\})", template)
    body = "".join(f"(?P<{p[1]}>.+?)" if re.fullmatch(r"\{[a-z]\}", p) else re.escape(p) for p in parts)
    return re.compile(f"^{body}$")


def _by_length(pairs: list[tuple[str, str]]) -> list[tuple[str, re.Pattern]]:
    """(key, pattern) with the templates of most literal text first: "{s} is married to {o}." before
    "{s} married {o}.", so a longer template wins where a shorter one also matches."""
    literal = lambda t: len(re.sub(r"\{[a-z]\}", "", t))  # noqa: E731
    return [(key, _pattern(t)) for key, t in sorted(pairs, key=lambda kt: -literal(kt[1]))]


_STATEMENTS = _by_length([(r, t) for r, rel in RELATIONS.items() for t in rel.statements])
_QUESTIONS = _by_length([(r, t) for r, rel in RELATIONS.items() for t in rel.questions])
_ORDER = _by_length(
    [((r, first), t) for r, both in ORDER_COMPARISONS.items() for first in (0, 1) for t in both[first]]
)
_SAME = _by_length([(r, t) for r, templates in SAME_COMPARISONS.items() for t in templates])


def read_facts(text: str) -> list[tuple[str, str, str]]:
    """(subject, relation, object) of each sentence of `text` that one of the world's statement templates
    words, in text order; other sentences are skipped."""
    facts = []
    for sentence in re.split(r"(?<=\.)\s+", text.strip()):
        for relation, pattern in _STATEMENTS:
            match = pattern.match(sentence.strip())
            if match:
                facts.append((match["s"], relation, match["o"]))
                break
    return facts


def read_answer(question: str, evidence: str) -> str:
    """The answer a reader that knows only the world's templates gives from `evidence` alone ("" if none).

    A chain question asks for its outermost relation: the object of the last evidence fact of that relation.
    A comparison needs both subjects' facts of its relation: the earlier / later one, or yes / no.
    This stands in for R-Search's frozen evidence answerer on the synthetic world.
    """
    facts = read_facts(evidence)
    value = {(s, r): o for s, r, o in facts}
    question = question.strip()
    for (relation, first), pattern in _ORDER:
        if match := pattern.match(question):
            a, b = match["a"], match["b"]
            if (a, relation) not in value or (b, relation) not in value:
                return ""
            ya, yb = year_of(value[a, relation]), year_of(value[b, relation])
            if ya is None or yb is None or ya == yb:
                return ""
            return a if (ya < yb) == (first == 0) else b
    for relation, pattern in _SAME:
        if match := pattern.match(question):
            a, b = match["a"], match["b"]
            if (a, relation) not in value or (b, relation) not in value:
                return ""
            return "yes" if value[a, relation] == value[b, relation] else "no"
    for relation, pattern in _QUESTIONS:
        if pattern.match(question):
            found = [o for _, r, o in facts if r == relation]
            return found[-1] if found else ""
    return ""


# Where a response holds what the retriever returned: Search-R1's (and SOAR's, R-Search's) observations, and
# Graph-R1's (its `<knowledge>` turns; EKA's P0 `<knowledge>` is in the prompt, which the judge is not shown).
