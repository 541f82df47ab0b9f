"""The synthetic world's facts as hyper-relations for the Graph-R1 hypergraph (`retrieval.hypergraph_build`),
read from the world's structured facts instead of asked of a language model (`retrieval.hypergraph_extract`'s
OpenAIExtractor does that for real corpora)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Sequence

from jaxsearch.data.world.generator import WorldConfig, generate_world
from jaxsearch.data.world.tables import RELATIONS
from jaxsearch.retrieval.hypergraph_extract import EntityMention, HyperRelation

_KIND_TYPES = {"person": "PERSON", "city": "CITY", "country": "COUNTRY", "org": "ORGANIZATION", "film": "FILM",
               "book": "BOOK"}
_KIND_WORDS = {"person": "a person", "city": "a city", "country": "a country", "org": "an organisation",
               "film": "a film", "book": "a novel"}
_VALUE_TYPES = {"birth_date": "DATE", "official_name": "NAME"}  # the other value relations hold years
SUBJECT_KEY_SCORE, OBJECT_KEY_SCORE, WORLD_COMPLETENESS = 100.0, 80.0, 10.0  # ours: a world sentence is whole


class WorldExtractor:
    """The synthetic world's facts as hyper-relations, read from its structured facts, not from a model.

    Each statement sentence of a chunk is one hyper-relation (completeness 10) joining its subject
    (key score 100) and its object entity or value (80, typed DATE, YEAR or NAME). Descriptions say what kind
    of thing an entity is. A chunk without any sentence of the world is an error (wrong `--world`).
    """

    def __init__(self, world):
        self.world = world
        self._facts = {s: f for p in world.passages for f, s in zip(p.facts, p.sentences)}

    @classmethod
    def from_dir(cls, world_dir: str) -> WorldExtractor:
        """The world that `launch/make_world.py` wrote into `world_dir`, regenerated from its world_config.json."""
        path = os.path.join(world_dir, "world_config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no world config (write a world with `python launch/make_world.py`)")
        try:
            with open(path, encoding="utf-8") as f:
                fields = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(fields, dict):
            raise ValueError(f"{path}: expected a JSON object of WorldConfig fields")
        known = {f.name: f for f in dataclasses.fields(WorldConfig)}
        for name, value in fields.items():
            if name not in known:
                raise ValueError(f"{path}: unknown field {name!r}; expected {sorted(known)}")
            if isinstance(value, list):
                fields[name] = tuple(value)
        try:
            return cls(generate_world(WorldConfig(**fields)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: not a usable world config ({e})") from None

    @property
    def spec(self) -> dict:
        return {"kind": "world", "config": dataclasses.asdict(self.world.config)}

    def extract(self, text: str) -> list[HyperRelation]:
        facts = []
        for line in text.splitlines():
            for sentence in re.split(r"(?<=\.)\s+", line.strip()):
                if (fact := self._facts.get(sentence)) is not None:
                    facts.append(self._hyper_relation(fact, sentence))
        if not facts:
            raise ValueError(f"chunk {text[:80]!r} holds no sentence of this world: is the corpus the world's "
                             "corpus.jsonl?")
        return facts

    def extract_many(self, texts: Sequence[str]) -> Iterator[tuple[int, list[HyperRelation]]]:
        for i, text in enumerate(texts):
            yield i, self.extract(text)

    def _hyper_relation(self, fact, sentence: str) -> HyperRelation:
        subject = self.world.entities[fact.subject]
        entities = [self._mention(subject, SUBJECT_KEY_SCORE)]
        if RELATIONS[fact.relation].object is None:  # a value: a date, a year or an official name
            value_type = _VALUE_TYPES.get(fact.relation, "YEAR")
            kind = "an official name" if value_type == "NAME" else "a " + value_type.lower()
            description = f"{fact.object} is {kind}."
            entities.append(EntityMention(fact.object.upper(), value_type, description, OBJECT_KEY_SCORE))
        else:
            entities.append(self._mention(self.world.entities[fact.object], OBJECT_KEY_SCORE))
        return HyperRelation(sentence, WORLD_COMPLETENESS, tuple(entities))

    @staticmethod
    def _mention(entity, key_score: float) -> EntityMention:
        return EntityMention(entity.name.upper(), _KIND_TYPES[entity.kind],
                             f"{entity.name} is {_KIND_WORDS[entity.kind]}.", key_score)

    def close(self) -> None:
        pass
