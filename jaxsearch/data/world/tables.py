"""The synthetic world's tables: its typed relations and their sentence, phrase and question templates, the
comparison question templates, and the word lists that invented names are built from.

- `RELATIONS`: every fact type (born_in, birth_date, spouse_of, works_for, founded_by, ...), subject kind ->
  object kind (None: a value, a date or a year). Every relation is functional (one object per subject), so
  every question has one answer.
- `ORDER_COMPARISONS` / `SAME_COMPARISONS`: two-subject questions (which comes first / last; same object?).
- Name parts: `ORG_SUFFIXES`, `FILM_WORDS`, `BOOK_WORDS`, `COUNTRY_FORMS`; syllables `ONSETS`, `VOWELS`, `CODAS`.
"""

from __future__ import annotations

import dataclasses

SPLITS = ("train", "dev", "test")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


@dataclasses.dataclass(frozen=True)
class Relation:
    """A typed relation: subject kind -> object kind (None: a value, a date or a year).

    `statements`: passage sentences ({s} subject, {o} object). `phrases`: noun phrases for the object inside a
    longer question ("the director of {x}"; none for value relations). `questions`: questions asking for the
    object (none: never asked). Each relation that can follow another in a chain has a phrase and a question
    ending in "{x}", the only ones used around a nested phrase. `query`: words a search query adds to the
    subject's name.
    """

    subject: str
    object: str | None
    statements: tuple[str, ...]
    phrases: tuple[str, ...]
    questions: tuple[str, ...]
    query: str


RELATIONS: dict[str, Relation] = {
    "born_in": Relation(
        "person",
        "city",
        ("{s} was born in {o}.", "{s} is a native of the city of {o}.", "The birthplace of {s} is {o}."),
        ("the birthplace of {x}", "the city where {x} was born"),
        ("Where was {x} born?", "In which city was {x} born?", "What is the birthplace of {x}?"),
        "born birthplace native",
    ),
    "birth_date": Relation(
        "person",
        None,
        ("{s} was born on {o}.", "The date of birth of {s} is {o}.", "{s} came into the world on {o}."),
        (),
        ("When was {x} born?", "What is the date of birth of {x}?"),
        "born date birth",
    ),
    "spouse_of": Relation(
        "person",
        "person",
        ("{s} is married to {o}.", "{s} married {o}.", "The spouse of {s} is {o}."),
        ("the spouse of {x}",),
        ("Who is the spouse of {x}?", "Who is {x} married to?"),
        "married spouse",
    ),
    "works_for": Relation(
        "person",
        "org",
        ("{s} works for {o}.", "{s} is employed by {o}.", "{s} holds a position at {o}."),
        ("the employer of {x}", "the organisation that employs {x}"),
        ("Which organisation does {x} work for?", "Who employs {x}?"),
        "works employed employer position",
    ),
    "founded_by": Relation(
        "org",
        "person",
        ("{s} was founded by {o}.", "{o} founded {s}.", "The founder of {s} is {o}."),
        ("the founder of {x}",),
        ("Who founded {x}?", "Who is the founder of {x}?"),
        "founded founder",
    ),
    "founded_year": Relation(
        "org",
        None,
        ("{s} was established in {o}.", "{s} has existed since its establishment in {o}."),
        (),
        ("In what year was {x} established?", "What is the year of establishment of {x}?"),
        "established establishment year",
    ),
    "headquartered_in": Relation(
        "org",
        "city",
        (
            "{s} is headquartered in {o}.",
            "The headquarters of {s} are in {o}.",
            "{s} has its head office in {o}.",
        ),
        ("the city where {x} is headquartered", "the headquarters city of {x}"),
        ("Where is {x} headquartered?", "In which city are the headquarters of {x}?"),
        "headquartered headquarters head office",
    ),
    "located_in": Relation(
        "city",
        "country",
        ("{s} is a city in {o}.", "{s} lies in the country of {o}.", "{s} is located in {o}."),
        ("the country of {x}", "the country where {x} is located"),
        ("In which country is {x}?", "Which country is {x} located in?"),
        "city country located lies",
    ),
    "capital": Relation(
        "country",
        "city",
        ("The capital of {s} is {o}.", "{o} is the capital city of {s}."),
        ("the capital of {x}",),
        ("What is the capital of {x}?", "Which city is the capital of {x}?"),
        "capital",
    ),
    "official_name": Relation(
        "country",
        None,
        ("{s} is officially called the {o}.", "The official name of {s} is the {o}."),
        (),
        (),
        "official name",
    ),
    "directed_by": Relation(
        "film",
        "person",
        ("{s} is a film directed by {o}.", "{o} directed the film {s}.", "The director of {s} is {o}."),
        ("the director of {x}",),
        ("Who directed {x}?", "Who is the director of the film {x}?"),
        "film directed director",
    ),
    "written_by": Relation(
        "book",
        "person",
        ("{s} is a novel written by {o}.", "{o} wrote the novel {s}.", "The author of {s} is {o}."),
        ("the author of {x}",),
        ("Who wrote {x}?", "Who is the author of the novel {x}?"),
        "novel written wrote author",
    ),
    "released_in": Relation(
        "film",
        None,
        ("{s} was released in {o}.", "The film {s} premiered in {o}."),
        (),
        ("In what year was {x} released?", "When did the film {x} premiere?"),
        "film released premiered year",
    ),
    "published_in": Relation(
        "book",
        None,
        ("{s} was published in {o}.", "The novel {s} first appeared in print in {o}."),
        (),
        ("In what year was {x} published?", "When was the novel {x} first published?"),
        "novel published print year",
    ),
}

# Comparisons of two subjects' values: (first-asked templates, last-asked templates); answer is a subject.
ORDER_COMPARISONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "birth_date": (
        ("Who was born first, {a} or {b}?", "Who is older, {a} or {b}?"),
        ("Who was born later, {a} or {b}?", "Who is younger, {a} or {b}?"),
    ),
    "founded_year": (
        ("Which was established first, {a} or {b}?", "Which organisation is older, {a} or {b}?"),
        ("Which was established more recently, {a} or {b}?",),
    ),
    "released_in": (
        ("Which film was released first, {a} or {b}?",),
        ("Which film was released later, {a} or {b}?",),
    ),
    "published_in": (
        ("Which novel was published first, {a} or {b}?",),
        ("Which novel was published later, {a} or {b}?",),
    ),
}
# Yes/no comparisons: do two subjects have the same object?
SAME_COMPARISONS: dict[str, tuple[str, ...]] = {
    "located_in": ("Are {a} and {b} located in the same country?", "Do {a} and {b} lie in the same country?"),
    "born_in": ("Were {a} and {b} born in the same city?", "Do {a} and {b} share a birthplace?"),
    "works_for": (
        "Do {a} and {b} work for the same organisation?",
        "Are {a} and {b} employed by the same organisation?",
    ),
    "headquartered_in": ("Are {a} and {b} headquartered in the same city?",),
}

ORG_SUFFIXES = (
    "Industries",
    "Institute",
    "Company",
    "Society",
    "Works",
    "Foundation",
    "Guild",
    "Trading House",
)
FILM_WORDS = ("Rising", "Dawn", "Night", "Road", "Gate", "Tide", "Crown", "Harbour")
BOOK_WORDS = ("Song", "Book", "Hour", "Garden", "Winter", "Lantern", "Mirror", "House")
COUNTRY_FORMS = ("Republic", "Kingdom", "Federation", "Commonwealth")
ONSETS = tuple("b d f g k l m n p r s t v z br dr gr kr tr th sh st qu".split())
VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
CODAS = ("", "", "", "n", "r", "l", "s", "th", "m")


def year_of(value: str) -> int | None:
    """The year of a value: a year ("1871") or a date ("12 March 1843"); None for anything else, which
    only model-written evidence holds ("X was born on Fesougum.")."""
    words = value.split()
    return int(words[-1]) if words and words[-1].isdigit() else None
