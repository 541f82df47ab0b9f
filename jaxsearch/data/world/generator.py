"""A seeded fictional world: invented entities, typed facts, a passage corpus and 1-4-hop questions.

No model can know the answers (names are built from random syllables): the only way to answer is to search.

- Entities: people, cities, countries, organisations, films and novels; dates and years are fact values.
- Facts: the typed relations in `tables.RELATIONS`; every relation is functional, so every question has one
  answer.
- Passages: each entity is a short document of passages titled with its name; a passage states 1-3 of its
  facts, each in one of 2-3 sentence templates. Distractor entities have names that look like real ones (a
  shared given or family name, a shared root) and facts of their own; no question is about or leads to them.
- Questions: single-fact (1 hop, NQ/PopQA-like), bridge (2 hops: "Where was the director of X born?"),
  comparison (2 hops: "Who was born first, A or B?", yes/no "Are A and B located in the same country?") and
  compositional chains (3-4 hops, MuSiQue-like). Each has its golden answers (with aliases), the ids of its
  supporting passages in hop order, and its hop count. No question (nor a rewording of it: the key is its
  facts) is in two splits.

`World.write(dir)` writes FlashRAG files: `corpus.jsonl` rows `{"id", "contents": '"Title"\\ntext'}` and
`{train,dev,test}.jsonl` QA rows with `metadata: {"supporting_ids", "hops", "type", "relations",
"hop_entities"}`. `generate_world(world_config(size, seed))`: the same config always gives the same world.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
from collections.abc import Iterator

from jaxsearch.data.qa import QAExample, write_jsonl
from jaxsearch.data.world.tables import (
    BOOK_WORDS,
    CODAS,
    COUNTRY_FORMS,
    FILM_WORDS,
    MONTHS,
    ONSETS,
    ORDER_COMPARISONS,
    ORG_SUFFIXES,
    RELATIONS,
    SAME_COMPARISONS,
    SPLITS,
    VOWELS,
    year_of,
)


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """Sizes and mixes of a world. `hop_mix`: share of 1-, 2-, 3- and 4-hop questions in each split;
    `comparison_share`: share of the 2-hop questions that are comparisons (the rest are bridges)."""

    seed: int = 0
    n_people: int = 60
    n_cities: int = 16
    n_countries: int = 5
    n_orgs: int = 15
    n_films: int = 12
    n_books: int = 12
    n_distractors: int = 16
    hop_mix: tuple[float, float, float, float] = (0.3, 0.35, 0.2, 0.15)
    comparison_share: float = 0.3
    split_sizes: tuple[int, int, int] = (400, 50, 50)  # train, dev, test


SIZES = {
    "tiny": WorldConfig(),
    "small": WorldConfig(
        n_people=600,
        n_cities=80,
        n_countries=12,
        n_orgs=120,
        n_films=100,
        n_books=100,
        n_distractors=150,
        split_sizes=(4000, 500, 500),
    ),
}


def world_config(size: str = "tiny", seed: int = 0) -> WorldConfig:
    """The preset `size` ("tiny" or "small") with `seed`."""
    if size not in SIZES:
        raise ValueError(f"unknown world size {size!r}; expected one of {sorted(SIZES)}")
    return dataclasses.replace(SIZES[size], seed=seed)


@dataclasses.dataclass(frozen=True)
class Entity:
    id: str  # "person_3"
    kind: str  # person | city | country | org | film | book
    name: str
    aliases: tuple[str, ...] = ()
    distractor: bool = False


@dataclasses.dataclass(frozen=True)
class Fact:
    """`object`: an entity id, or for a relation without object kind the value ("12 March 1843", "1871")."""

    subject: str
    relation: str
    object: str


@dataclasses.dataclass(frozen=True)
class Passage:
    """One corpus passage; `sentences[i]` states `facts[i]`, all about the title entity."""

    id: str
    title: str
    facts: tuple[Fact, ...]
    sentences: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join(self.sentences)

    @property
    def contents(self) -> str:
        """The wiki-18 / FlashRAG `contents` string: quoted title, newline, text."""
        return f'"{self.title}"\n{self.text}'


@dataclasses.dataclass
class World:
    config: WorldConfig
    entities: dict[str, Entity]  # by id, in creation order
    passages: list[Passage]  # passage i has id str(i)
    questions: dict[str, list[QAExample]]  # by split

    def __post_init__(self):
        self._by_name = {e.name: e for e in self.entities.values()}
        self._where = {
            (f.subject, f.relation): (f, p, s) for p in self.passages for f, s in zip(p.facts, p.sentences)
        }

    def entity_named(self, name: str) -> Entity | None:
        """The entity with this name (names are unique), or None."""
        return self._by_name.get(name)

    def has(self, subject_id: str, relation: str) -> bool:
        return (subject_id, relation) in self._where

    def statement(self, subject_id: str, relation: str) -> tuple[Fact, Passage, str]:
        """(fact, passage, sentence) stating `relation` of a subject; KeyError if the subject has none."""
        return self._where[(subject_id, relation)]

    def object_text(self, fact: Fact) -> str:
        """How passages write the fact's object: the entity's name, or the value."""
        return fact.object if RELATIONS[fact.relation].object is None else self.entities[fact.object].name

    def answers(self, fact: Fact) -> list[str]:
        """Golden answers for the fact's object: its name and aliases, or the value (dates in two formats)."""
        if RELATIONS[fact.relation].object is not None:
            entity = self.entities[fact.object]
            return [entity.name, *entity.aliases]
        if fact.relation == "birth_date":
            day, month, year = fact.object.split()
            return [fact.object, f"{month} {day}, {year}"]
        return [fact.object]

    def texts(self) -> Iterator[str]:
        """Every text an agent sees or writes in this world (to build a vocabulary)."""
        for passage in self.passages:
            yield passage.contents
        for examples in self.questions.values():
            for example in examples:
                yield example.question
                yield from example.golden_answers
        for relation in RELATIONS.values():
            yield relation.query

    def write(self, out_dir: str | os.PathLike) -> None:
        """corpus.jsonl, {train,dev,test}.jsonl and world_config.json into `out_dir`."""
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "corpus.jsonl"), "w", encoding="utf-8") as f:
            for passage in self.passages:
                f.write(json.dumps({"id": passage.id, "contents": passage.contents}) + "\n")
        for split, examples in self.questions.items():
            write_jsonl(examples, os.path.join(out_dir, f"{split}.jsonl"))
        with open(os.path.join(out_dir, "world_config.json"), "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self.config), f, indent=1)


def generate_world(config: WorldConfig) -> World:
    """The world of `config`; the same config always gives the same world."""
    rng = random.Random(config.seed)
    entities, facts = _make_entities_and_facts(config, rng)
    passages = _make_passages(entities, facts, rng)
    world = World(config, entities, passages, {})
    world.questions = _make_questions(world, config, rng)
    return world


class _Names:
    """Unique invented words from random syllables, never an English word the templates use."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used = {w.lower() for w in re.findall(r"[A-Za-z]+", " ".join(_template_texts()))}

    def word(self, min_syllables: int = 2, max_syllables: int = 3) -> str:
        while True:
            n = self.rng.randint(min_syllables, max_syllables)
            word = "".join(self.rng.choice(ONSETS) + self.rng.choice(VOWELS) for _ in range(n))
            word = (word + self.rng.choice(CODAS)).capitalize()
            if word.lower() not in self.used:
                self.used.add(word.lower())
                return word


def _template_texts() -> Iterator[str]:
    for r in RELATIONS.values():
        yield from (*r.statements, *r.phrases, *r.questions, r.query)
    for first, last in ORDER_COMPARISONS.values():
        yield from (*first, *last)
    for templates in SAME_COMPARISONS.values():
        yield from templates
    yield from (*ORG_SUFFIXES, *FILM_WORDS, *BOOK_WORDS, *COUNTRY_FORMS, *MONTHS, "The of yes no")


class _EntityBuilder:
    """Entities and their facts, drawn from one rng in a fixed order: the world is a function of its seed."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.names = _Names(rng)
        self.entities: dict[str, Entity] = {}
        self.facts: list[Fact] = []
        self.counts: dict[str, int] = {}
        self.taken: set[str] = set()  # entity names
        self.root_of: dict[str, str] = {}  # entity id -> root word (orgs, films, books)
        self.titles = {  # kind -> how a name is built from a root word
            "org": lambda root: f"{root} {rng.choice(ORG_SUFFIXES)}",
            "film": lambda root: f"{root} {rng.choice(FILM_WORDS)}",
            "book": lambda root: f"The {rng.choice(BOOK_WORDS)} of {root}",
        }

    def add(self, kind: str, name: str, aliases: tuple[str, ...] = (), distractor: bool = False) -> str:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.taken.add(name)
        entity = Entity(f"{kind}_{self.counts[kind] - 1}", kind, name, aliases, distractor)
        self.entities[entity.id] = entity
        return entity.id

    def add_titled(self, kind: str, root: str, distractor: bool = False) -> str:
        entity_id = self.add(kind, self.titles[kind](root), distractor=distractor)
        self.root_of[entity_id] = root
        return entity_id

    def fact(self, subject: str, relation: str, obj: str) -> None:
        self.facts.append(Fact(subject, relation, obj))

    def date(self, year: int) -> str:
        return f"{self.rng.randint(1, 28)} {self.rng.choice(MONTHS)} {year}"

    def places(self, n_countries: int, n_cities: int) -> list[str]:
        """Countries (with official names) and cities, each city in a country, the first ones capitals."""
        countries = []
        for _ in range(n_countries):
            root = self.names.word(2, 2) + self.rng.choice(("ia", "land", "ora"))
            official = f"{self.rng.choice(COUNTRY_FORMS)} of {root}"
            countries.append(self.add("country", root, (official,)))
            self.fact(countries[-1], "official_name", official)
        cities = [self.add("city", self.names.word()) for _ in range(n_cities)]
        for i, city in enumerate(cities):
            country = countries[i] if i < len(countries) else self.rng.choice(countries)
            self.fact(city, "located_in", country)
            if i < len(countries):
                self.fact(country, "capital", city)
        return cities

    def person_name(self, given: list[str], family: list[str]) -> str:
        while (name := f"{self.rng.choice(given)} {self.rng.choice(family)}") in self.taken:
            pass
        return name

    def life_facts(self, people: list[str], cities: list[str], orgs: list[str]) -> dict[str, int]:
        """Births, employers and marriages; returns each person's birth year."""
        rng = self.rng
        birth_year = {p: rng.randint(1820, 1960) for p in people}
        for p in people:
            self.fact(p, "born_in", rng.choice(cities))
            self.fact(p, "birth_date", self.date(birth_year[p]))
            if rng.random() < 0.85:
                self.fact(p, "works_for", rng.choice(orgs))
        shuffled = rng.sample(people, len(people))
        for a, b in zip(shuffled[0 : int(0.6 * len(people)) : 2], shuffled[1 : int(0.6 * len(people)) : 2]):
            self.fact(a, "spouse_of", b)
            self.fact(b, "spouse_of", a)
        return birth_year

    def work_facts(self, orgs, films, books, people, cities, birth_year: dict[str, int]) -> None:
        """Founders and headquarters of orgs; directors and writers of films and books, with their years."""
        rng = self.rng
        for org in orgs:
            founder = rng.choice(people)
            self.fact(org, "founded_by", founder)
            self.fact(org, "founded_year", str(birth_year[founder] + rng.randint(25, 60)))
            self.fact(org, "headquartered_in", rng.choice(cities))
        for kind, year_relation, items in (
            ("directed_by", "released_in", films),
            ("written_by", "published_in", books),
        ):
            for item in items:
                creator = rng.choice(people)
                self.fact(item, kind, creator)
                self.fact(item, year_relation, str(birth_year[creator] + rng.randint(22, 60)))

    def distractor(self, i: int, real: dict[str, list[str]], given, family, cities) -> None:
        """Distractor i: a look-alike name (a shared given or family name, or root) with facts of its own; no
        real entity's fact points at it, so no question is about it."""
        rng = self.rng
        kind = ("person", "org", "person", "film", "person", "org", "person", "book")[i % 8]
        while True:
            like = rng.choice(real[kind])
            if kind == "person":
                first, last = self.entities[like].name.split(" ")
                name = f"{rng.choice(given)} {last}" if rng.random() < 0.5 else f"{first} {rng.choice(family)}"
            else:
                name = self.titles[kind](self.root_of[like])
            if name not in self.taken:
                break
        entity = self.add(kind, name, distractor=True)
        year = rng.randint(1820, 1990)
        if kind == "person":
            self.fact(entity, "born_in", rng.choice(cities))
            self.fact(entity, "birth_date", self.date(year))
            self.fact(entity, "works_for", rng.choice(real["org"]))
        elif kind == "org":
            self.fact(entity, "founded_by", rng.choice(real["person"]))
            self.fact(entity, "founded_year", str(year))
            self.fact(entity, "headquartered_in", rng.choice(cities))
        else:
            self.fact(entity, "directed_by" if kind == "film" else "written_by", rng.choice(real["person"]))
            self.fact(entity, "released_in" if kind == "film" else "published_in", str(year))


def _make_entities_and_facts(config: WorldConfig, rng: random.Random) -> tuple[dict[str, Entity], list[Fact]]:
    world = _EntityBuilder(rng)
    cities = world.places(config.n_countries, config.n_cities)
    given = [world.names.word() for _ in range(max(8, config.n_people // 3))]
    family = [world.names.word(2, 2) for _ in range(max(8, config.n_people // 3))]
    people = [world.add("person", world.person_name(given, family)) for _ in range(config.n_people)]
    orgs = [world.add_titled("org", world.names.word()) for _ in range(config.n_orgs)]
    films = [world.add_titled("film", world.names.word()) for _ in range(config.n_films)]
    books = [world.add_titled("book", world.names.word()) for _ in range(config.n_books)]
    birth_year = world.life_facts(people, cities, orgs)
    world.work_facts(orgs, films, books, people, cities, birth_year)
    real = {"person": people, "org": orgs, "film": films, "book": books}
    for i in range(config.n_distractors):
        world.distractor(i, real, given, family, cities)
    return world.entities, world.facts


def _make_passages(entities: dict[str, Entity], facts: list[Fact], rng: random.Random) -> list[Passage]:
    """Each entity's facts, shuffled and cut into passages of 1-3 facts titled with the entity's name."""
    by_subject: dict[str, list[Fact]] = {}
    for f in facts:
        by_subject.setdefault(f.subject, []).append(f)
    passages: list[Passage] = []
    for entity in entities.values():
        own = rng.sample(by_subject.get(entity.id, []), len(by_subject.get(entity.id, [])))
        while own:
            size = rng.choice((1, 2, 2, 3))
            chunk, own = own[:size], own[size:]
            sentences = tuple(_render(f, entities, rng) for f in chunk)
            passages.append(Passage(str(len(passages)), entity.name, tuple(chunk), sentences))
    return passages


def _render(f: Fact, entities: dict[str, Entity], rng: random.Random) -> str:
    relation = RELATIONS[f.relation]
    obj = f.object if relation.object is None else entities[f.object].name
    return rng.choice(relation.statements).format(s=entities[f.subject].name, o=obj)


def _make_questions(world: World, config: WorldConfig, rng: random.Random) -> dict[str, list[QAExample]]:
    """Per split: hop counts by `hop_mix` (largest remainder); no question is drawn twice, in any split."""
    chains = _chain_pools(world, rng)
    used: set[tuple] = set()
    questions: dict[str, list[QAExample]] = {}
    for split, size in zip(SPLITS, config.split_sizes):
        counts = _allocate(size, config.hop_mix)
        n_comparisons = round(counts[1] * config.comparison_share)
        drawn = [
            _draw_chain(world, chains[h], h, rng)
            for h in (1, 2, 3, 4)
            for _ in range(counts[h - 1] - (n_comparisons if h == 2 else 0))
        ]
        drawn += [_draw_comparison(world, used, rng) for _ in range(n_comparisons)]
        rng.shuffle(drawn)
        questions[split] = [dataclasses.replace(q, id=f"{split}_{i}") for i, q in enumerate(drawn)]
    return questions


def _allocate(total: int, mix: tuple[float, ...]) -> list[int]:
    shares = [total * m / sum(mix) for m in mix]
    counts = [int(s) for s in shares]
    for i in sorted(range(len(mix)), key=lambda i: counts[i] - shares[i])[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _chain_pools(world: World, rng: random.Random) -> dict[int, dict[tuple[str, ...], list[tuple[str, ...]]]]:
    """Every askable chain, by hop count, then by relation pattern: (start id, relations...), shuffled.

    A chain follows one fact per hop from a non-distractor entity, never revisits an entity, and its answer is
    not an entity named in the question.
    """
    pools: dict[int, dict[tuple[str, ...], list[tuple[str, ...]]]] = {h: {} for h in (1, 2, 3, 4)}

    def walk(start: str, path: tuple[str, ...], visited: tuple[str, ...]) -> None:
        for name, relation in RELATIONS.items():
            if relation.subject != world.entities[visited[-1]].kind or not relation.questions:
                continue
            if not world.has(visited[-1], name):
                continue
            fact = world.statement(visited[-1], name)[0]
            if relation.object is not None and fact.object in visited:
                continue
            chain = path + (name,)
            pools[len(chain)].setdefault(chain, []).append((start, *chain))
            if relation.object is not None and len(chain) < 4:
                walk(start, chain, visited + (fact.object,))

    for entity in world.entities.values():
        if not entity.distractor:
            walk(entity.id, (), (entity.id,))
    for by_pattern in pools.values():
        for candidates in by_pattern.values():
            rng.shuffle(candidates)
    return pools


def _draw_chain(
    world: World, pool: dict[tuple[str, ...], list[tuple[str, ...]]], hops: int, rng: random.Random
) -> QAExample:
    """Pops a chain of a uniformly chosen relation pattern and words it as a question."""
    patterns = sorted(p for p, candidates in pool.items() if candidates)
    if not patterns:
        raise ValueError(
            f"the world has too few {hops}-hop chains for the requested questions; "
            "enlarge it (more entities) or lower split_sizes"
        )
    start, *relations = pool[rng.choice(patterns)].pop()
    subject, phrase, hop_names, supporting = start, world.entities[start].name, [], []
    for i, relation in enumerate(relations):
        fact, passage, _ = world.statement(subject, relation)
        hop_names.append(world.entities[subject].name)
        supporting.append(passage.id)
        templates = RELATIONS[relation].questions if i == len(relations) - 1 else RELATIONS[relation].phrases
        if i > 0:  # around a nested phrase, only templates that end with it read well
            templates = [t for t in templates if t.rstrip("?").endswith("{x}")]
        phrase = rng.choice(templates).format(x=phrase)
        subject = fact.object
    kind = "single" if hops == 1 else "bridge" if hops == 2 else "compositional"
    return QAExample(
        "",
        phrase,
        world.answers(fact),
        supporting,
        {"hops": hops, "type": kind, "relations": list(relations), "hop_entities": hop_names},
    )


def _draw_comparison(world: World, used: set[tuple], rng: random.Random) -> QAExample:
    """A new two-subject comparison: which comes first/last by year, or yes/no same object (half yes)."""
    subjects_of = {
        relation: [e.id for e in world.entities.values() if not e.distractor and world.has(e.id, relation)]
        for relation in sorted((*ORDER_COMPARISONS, *SAME_COMPARISONS))
    }
    relations = [relation for relation, subjects in subjects_of.items() if len(subjects) >= 2]
    for _ in range(10_000 if relations else 0):
        relation = rng.choice(relations)
        subjects = subjects_of[relation]
        a, b = rng.sample(subjects, 2)
        fa, fb = world.statement(a, relation)[0], world.statement(b, relation)[0]
        if relation in SAME_COMPARISONS:
            want_yes = rng.random() < 0.5
            if want_yes:
                same = [s for s in subjects if s != a and world.statement(s, relation)[0].object == fa.object]
                if not same:
                    continue
                b = rng.choice(same)
                fb = world.statement(b, relation)[0]
            elif fa.object == fb.object:
                continue
        elif year_of(fa.object) == year_of(fb.object):
            continue
        key = (relation, *sorted((a, b)))
        if key in used:
            continue
        used.add(key)
        name_a, name_b = world.entities[a].name, world.entities[b].name
        if relation in SAME_COMPARISONS:
            question = rng.choice(SAME_COMPARISONS[relation]).format(a=name_a, b=name_b)
            answer = "yes" if fa.object == fb.object else "no"
        else:
            ask_first = rng.random() < 0.5
            templates = ORDER_COMPARISONS[relation][0 if ask_first else 1]
            question = rng.choice(templates).format(a=name_a, b=name_b)
            a_first = year_of(fa.object) < year_of(fb.object)
            answer = name_a if a_first == ask_first else name_b
        supporting = [world.statement(a, relation)[1].id, world.statement(b, relation)[1].id]
        return QAExample(
            "",
            question,
            [answer],
            supporting,
            {
                "hops": 2,
                "type": "comparison",
                "relations": [relation, relation],
                "hop_entities": [name_a, name_b],
            },
        )
    raise ValueError("the world has too few distinct comparisons for the requested questions; enlarge it")
