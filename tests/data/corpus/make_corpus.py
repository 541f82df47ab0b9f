"""Regenerate the shipped test corpus: a fictional world (no real-world facts) with known answers.

    python tests/data/corpus/make_corpus.py

Writes, next to this file: corpus.jsonl ({"id", "contents"}, Search-R1 / FlashRAG style),
corpus_title_text.jsonl (the same passages as {"id", "title", "text"}) and queries.jsonl
({"id", "question", "golden_answers"}). Deterministic (seeded).
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
SYLLABLES = ["vel", "mor", "ka", "strel", "or", "in", "mad", "dox", "thal", "ren", "bri", "sa", "lun", "dar",
             "ost", "ve", "quil", "an", "tor", "is", "myr", "eth", "gal", "fen", "ro", "wick", "ul", "zan",
             "pel", "cor", "dun", "har", "lis", "mon", "nes", "tav"]
CRAFTS = ["glass", "copper", "silk", "clock", "paper", "rope", "lantern", "violin", "ink", "tile"]
PROFESSIONS = ["cartographer", "composer", "astronomer", "shipwright", "botanist", "painter", "engineer",
               "physician", "architect", "poet"]
GENRES = ["mystery", "adventure", "historical", "satirical", "romance", "epic"]
THEMES = ["a lighthouse keeper", "two rival bakers", "a lost expedition", "a travelling circus",
          "an exiled prince", "a flooded library", "a clockmaker's apprentice", "a mapmaker's daughter"]


def names(rng, n, parts, suffix=""):
    seen, out = set(), []
    while len(out) < n:
        name = "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize() + suffix
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def main():
    rng = random.Random(1234)
    provinces = names(rng, 12, 3)
    seas = [f"{n} Sea" for n in names(rng, 8, 2)]
    mountains = [f"{n} Mountains" for n in names(rng, 10, 2)]
    rivers = [f"{n} River" for n in names(rng, 40, 2)]
    cities = names(rng, 60, 3)
    first, last = names(rng, 90, 2), names(rng, 90, 3)
    people = [f"{f} {l}" for f, l in zip(first, last)]
    books = [f"The {n}" for n in names(rng, 70, 3)]
    bands = [f"The {n}s" for n in names(rng, 40, 2)]
    passages, queries = [], []

    def add(title, text):
        passages.append((title, text))

    def ask(question, answer):
        queries.append((question, [answer]))

    river_sea = {}
    for r in rivers:
        sea, mts, km = rng.choice(seas), rng.choice(mountains), rng.randint(40, 900)
        river_sea[r] = sea
        add(r, f"The {r} rises in the {mts} and flows {km} kilometres before it empties into the {sea}. "
               f"Its lower valley is farmed for barley and its delta is a nesting ground for herons.")
        ask(f"Into which sea does the {r} flow?", sea)
    founders = rng.sample(people, len(cities))
    city_river = {}
    for c, founder in zip(cities, founders):
        prov, river, year, craft = rng.choice(provinces), rng.choice(rivers), rng.randint(900, 1700), rng.choice(CRAFTS)
        city_river[c] = river
        add(c, f"{c} is a town in the province of {prov}, on the banks of the {river}. It was founded in {year} "
               f"by {founder}. {c} is known for its {craft} workshops and its autumn market.")
        ask(f"Who founded the town of {c}?", founder)
        ask(f"In which province is the town of {c}?", prov)
    birthplace = {}
    for p in people:
        city, prof, year = rng.choice(cities), rng.choice(PROFESSIONS), rng.randint(1500, 1950)
        birthplace[p] = city
        add(p, f"{p} was a {prof} born in {city} in {year}. {p.split()[0]} trained in the workshops of the "
               f"provincial capital and later taught a generation of students.")
        ask(f"Where was {p} born?", city)
    for b in books:
        author, genre, year, theme = rng.choice(people), rng.choice(GENRES), rng.randint(1600, 1990), rng.choice(THEMES)
        add(b, f"{b} is a {genre} novel by {author}, first published in {year}. The story follows {theme} "
               f"and was translated into several languages.")
        ask(f"Who wrote the novel {b}?", author)
    for band in bands:
        city, year = rng.choice(cities), rng.randint(1960, 2015)
        add(band, f"{band} are a folk band formed in {city} in {year}. Their songs borrow from the work "
                  f"songs of river boatmen and they tour every summer.")
        ask(f"In which town were {band} formed?", city)
    # A few two-hop questions: the answer sits in a second passage.
    for p in people[:10]:
        ask(f"On which river is the birthplace of {p}?", city_river[birthplace[p]])

    order = list(range(len(passages)))
    rng.shuffle(order)
    with open(os.path.join(HERE, "corpus.jsonl"), "w") as f_contents, \
            open(os.path.join(HERE, "corpus_title_text.jsonl"), "w") as f_title_text:
        for row, i in enumerate(order):
            title, text = passages[i]
            f_contents.write(json.dumps({"id": str(row), "contents": f'"{title}"\n{text}'}) + "\n")
            f_title_text.write(json.dumps({"id": str(row), "title": title, "text": text}) + "\n")
    sample = rng.sample(range(len(queries)), 120)
    with open(os.path.join(HERE, "queries.jsonl"), "w") as f:
        for qid, i in enumerate(sorted(sample)):
            question, answers = queries[i]
            f.write(json.dumps({"id": f"q{qid}", "question": question, "golden_answers": answers}) + "\n")


if __name__ == "__main__":
    main()
