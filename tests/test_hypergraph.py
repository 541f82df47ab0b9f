"""Graph-R1's knowledge hypergraph: record grammar, extractors (fake OpenAI server, the synthetic world),
merging, atomic / resumable builds, retrieval against a hand-computed fusion, and Graph-R1's `/search` as
its agent and EKA's client read it."""
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from jaxsearch.data.world.generator import generate_world, world_config
from jaxsearch.retrieval import make_retriever
from jaxsearch.retrieval.base import split_contents
from jaxsearch.retrieval.client import RemoteRetriever
from jaxsearch.retrieval.corpus import CorpusError
from jaxsearch.retrieval.encoders import EncoderSpec
from jaxsearch.retrieval.hypergraph import HypergraphRetriever, Incidence, fuse
from jaxsearch.retrieval.hypergraph_build import TokenChunker, build_hypergraph
from jaxsearch.retrieval.hypergraph_extract import (
    CONTINUE_PROMPT,
    IF_LOOP_PROMPT,
    EntityMention,
    ExtractorUnavailable,
    HyperRelation,
    OpenAIExtractor,
    parse_records,
)
from jaxsearch.data.world.extractor import WorldExtractor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from jaxsearch.cli import build_hypergraph as build_cli
from jaxsearch.models.tokenizer import QwenTokenizer
from net import free_port
from hang import HANG_S

E = EntityMention


def write_corpus(path, texts):
    path.write_text("".join(json.dumps({"id": f"d{i}", "contents": t}) + "\n" for i, t in enumerate(texts)))
    return str(path)


# -------------------------------------------------------------------------------------------- record grammar


def test_parse_records_well_formed():
    output = (
        '("hyper-relation"<|>"Tomas Quell directed Velmar Rising in 1921."<|>9)##\n'
        '("entity"<|>"Tomas Quell"<|>"person"<|>"A film director."<|>85)##\n'
        '("entity"<|>"Velmar Rising"<|>"film"<|>"A film of 1921."<|>"95.5")##\n'
        '("hyper-relation"<|>"Velmar Rising premiered in Deben."<|>7)##\n'
        '("entity"<|>"Deben"<|>"geo"<|>"A city."<|>60)\n<|COMPLETE|>'
    )
    facts, skipped = parse_records(output)
    assert facts == [
        HyperRelation("Tomas Quell directed Velmar Rising in 1921.", 9.0,
                      (E("TOMAS QUELL", "PERSON", "A film director.", 85.0),
                       E("VELMAR RISING", "FILM", "A film of 1921.", 95.5))),
        HyperRelation("Velmar Rising premiered in Deben.", 7.0, (E("DEBEN", "GEO", "A city.", 60.0),)),
    ]
    assert skipped == []


def test_parse_records_malformed():
    output = "\n##".join([
        '("entity"<|>"Orphan"<|>"person"<|>"before any segment"<|>90)',  # no hyper-relation yet: skipped
        'Here are the records:',  # no parentheses: skipped
        '("hyper-relation"<|>"A &amp; B met\x07 in Ko."<|>high)',  # html entity, control char, score not a number
        '("entity"<|>alex<|>person<|>"Alex met B."<|>very)',  # unquoted fields; key score not a number
        '("entity"<|>"B"<|>"person"<|>90)',  # 4 fields: skipped
        '("entity"<|>""<|>"person"<|>"no name"<|>90)',  # empty name: skipped
        '("relationship"<|>"A"<|>"B"<|>"met"<|>3)',  # another kind: skipped
        '("hyper-relation"<|>""<|>4)',  # empty segment: skipped, and its entities with it
        '("entity"<|>"Lost"<|>"person"<|>"of the empty segment"<|>70)',
        '("hyper-relation"<|>"Ko is a city\nby the sea."<|>8)',  # a record over two lines
        '("entity"<|>"Ko"<|>"geo"<|>"A city."<|>80)<|COMPLETE|>trailing words',
    ])
    facts, skipped = parse_records(output)
    assert facts == [
        HyperRelation("A & B met in Ko.", 1.0, (E("ALEX", "PERSON", "Alex met B.", 50.0),)),
        HyperRelation("Ko is a cityby the sea.", 8.0, (E("KO", "GEO", "A city.", 80.0),)),
    ]
    assert len(skipped) == 8  # the 7 records marked above, and "trailing words"


# ------------------------------------------------------------------ merging and retrieval, against hand values

# Three chunks' hyper-relations; every weight and rank below is worked out by hand from these.
SCRIPT = {
    "doc zero": [HyperRelation("H0", 6, (E("A", "PERSON", "a1", 90), E("B", "PERSON", "b1", 40))),
                 HyperRelation("H1", 5, (E("A", "GEO", "a2", 50), E("C", "ORG", "c1", 70)))],
    "doc one": [HyperRelation("H2", 9, (E("B", "PERSON", "b1", 60), E("C", "ORG", "c1", 30), E("D", "GEO", "d1", 20))),
                HyperRelation("H0", 3, (E("A", "GEO", "a1", 10),))],
    "doc two": [HyperRelation("H3", 2, (E("D", "GEO", "d1", 80),)),
                HyperRelation("H4", 7, (E("E", "EVENT", "e1", 40), E("A", "GEO", "a3", 30))),
                HyperRelation("H5", 9, (E("F", "EVENT", "f1", 10),))],
}


class ScriptedExtractor:
    """Returns SCRIPT's facts per chunk text; raises after `fail_after` chunks; counts the chunks it did."""

    spec = {"kind": "scripted"}

    def __init__(self, fail_after=None):
        self.fail_after, self.done = fail_after, []

    def extract_many(self, texts):
        for i, text in enumerate(texts):
            if self.fail_after is not None and len(self.done) == self.fail_after:
                raise RuntimeError("extractor died")
            self.done.append(text)
            yield i, SCRIPT[text]

    def close(self):
        pass


ENTITY_DIMS = {name: i for i, name in enumerate("ABCDEF")}
HYPEREDGE_DIMS = {f"H{i}": 6 + i for i in range(6)}
# The query's similarity to each entity / hyperedge: top-5 entities C, A, D, E, B; hyperedges H3, H5, H1, H0, H2.
QUERY_WEIGHTS = {"C": 5, "A": 4, "D": 3, "E": 2, "B": 1, "H3": 5, "H5": 4, "H1": 3, "H0": 2, "H2": 1}


class StubEncoder:
    """One dimension per entity (embedded as '"NAME"\\ndescription') and per hyperedge; the query "q" is the
    QUERY_WEIGHTS mix, so the top-5 lists are known."""

    spec = EncoderSpec("stub-encoder", normalize=False)
    dim = 12

    def encode_passages(self, texts, batch_size=256):
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            name = split_contents(text)[0] if text.startswith('"') else text
            out[row, ENTITY_DIMS.get(name, HYPEREDGE_DIMS.get(name))] = 1.0
        return out

    def encode_queries(self, queries, batch_size=256):
        vector = np.zeros(self.dim, np.float32)
        for name, weight in QUERY_WEIGHTS.items():
            vector[ENTITY_DIMS.get(name, HYPEREDGE_DIMS.get(name))] = weight
        return np.tile(vector / np.linalg.norm(vector), (len(queries), 1))


# Entity route (degree = entity degree + hyperedge degree; A:3, B:2, C:2, D:2, E:1; H0:2 H1:2 H2:3 H3:1 H4:2):
#   C-H1 (2+2=4, w70) C-H2 (5, 30) A-H0 (5, 90+10) A-H1 (5, 50) A-H4 (5, 30) D-H2 (5, 20) D-H3 (3, 80)
#   E-H4 (3, 40) B-H0 (4, 40) B-H2 (5, 60)
#   sorted: A-H0 B-H2 A-H1 C-H2 A-H4 D-H2 | C-H1 B-H0 | D-H3 E-H4 -> H0 H2 H1 H2 H4 H2 H1 H0 H3 H4
# Hyperedge route: H3 H5 H1 H0 H2 by weight (H3 2, H5 9, H1 5, H0 6+3, H2 9) -> H5 H0 H2 H1 H3
# Fusion: H0 1 + 1/8 + 1/2; H2 1/2 + 1/4 + 1/6 + 1/3; H5 1; H1 1/3 + 1/7 + 1/4; H3 1/9 + 1/5; H4 1/5 + 1/10
EXPECTED = [("H0", 1.625), ("H2", 1.25), ("H5", 1.0), ("H1", 1 / 3 + 1 / 7 + 1 / 4), ("H3", 1 / 9 + 1 / 5),
            ("H4", 0.3)]


@pytest.fixture(scope="module")
def small_graph(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("small")
    corpus = write_corpus(tmp / "corpus.jsonl", list(SCRIPT))
    build_hypergraph(corpus, str(tmp / "graph"), ScriptedExtractor(), StubEncoder(), progress=False)
    return str(tmp / "graph"), corpus


def rows(path):
    return [json.loads(line) for line in open(path)]


def test_merge_weights_types_and_sources(small_graph):
    path, _ = small_graph
    hyperedges = rows(os.path.join(path, "hyperedges.jsonl"))
    assert [(h["contents"], h["weight"], h["sources"]) for h in hyperedges] == [
        ("H0", 9.0, ["d0#0", "d1#0"]), ("H1", 5.0, ["d0#0"]), ("H2", 9.0, ["d1#0"]), ("H3", 2.0, ["d2#0"]),
        ("H4", 7.0, ["d2#0"]), ("H5", 9.0, ["d2#0"])]
    entities = rows(os.path.join(path, "entities.jsonl"))
    # A: types PERSON once, GEO three times; descriptions a1 (twice), a2, a3
    assert entities[0] == {"id": "0", "contents": '"A"\na1<SEP>a2<SEP>a3', "name": "A", "type": "GEO",
                           "description": "a1<SEP>a2<SEP>a3"}
    assert [e["name"] for e in entities] == list("ABCDEF")
    incidence = Incidence.load(os.path.join(path, "incidence.npz"))
    by_entity = {name: dict(zip(incidence.hyperedges[s:t].tolist(), incidence.weights[s:t].tolist()))
                 for name, s, t in zip("ABCDEF", incidence.entity_offsets[:-1], incidence.entity_offsets[1:])}
    assert by_entity == {"A": {0: 100.0, 1: 50.0, 4: 30.0}, "B": {0: 40.0, 2: 60.0}, "C": {1: 70.0, 2: 30.0},
                         "D": {2: 20.0, 3: 80.0}, "E": {4: 40.0}, "F": {5: 10.0}}
    assert incidence.hyperedge_degree.tolist() == [2, 2, 3, 1, 2, 1]
    assert json.load(open(os.path.join(path, "meta.json")))["num_incidences"] == 11
    from jaxsearch.files import MARKER  # the build marks its directory as written by jaxsearch

    assert sorted(os.listdir(path)) == sorted([MARKER, "entities.faiss", "entities.jsonl", "hyperedges.faiss",
                                               "hyperedges.jsonl", "incidence.npz", "meta.json"])


def test_retrieval_matches_hand_computed_fusion(small_graph):
    retriever = HypergraphRetriever.load(small_graph[0], encoder=StubEncoder(), progress=False)
    docs = retriever.search(["q"], 10)[0]
    assert [d.contents for d in docs] == [name for name, _ in EXPECTED]
    np.testing.assert_allclose([d.score for d in docs], [score for _, score in EXPECTED], rtol=1e-12)
    assert [d.id for d in docs] == ["0", "2", "5", "1", "3", "4"]
    # each hyperedge stands for the passages it was extracted from (its chunks' documents, once each)
    assert [d.passage_ids for d in docs] == [("d0", "d1"), ("d1",), ("d2",), ("d0",), ("d2",), ("d2",)]
    assert [d.contents for d in retriever.search(["q", "q"], 3)[1]] == ["H0", "H2", "H5"]
    assert retriever.search([], 10) == [] and retriever.search(["q"], 0) == [[]]


def test_fuse_counts_every_occurrence_and_keeps_first_seen_on_ties():
    assert fuse([7, 8], [8, 7], 10) == [(7, 1.5), (8, 1.5)]  # 1 + 1/2 each: the first seen first
    assert fuse([4, 4, 4], [], 10) == [(4, 1 + 1 / 2 + 1 / 3)]
    assert fuse([1], [2], 1) == [(1, 1.0)]


# ------------------------------------------------------------------- Graph-R1's /search as its clients read it


def graph_r1_agent_search(url, queries):
    """What Graph-R1's SearchTool.batch_execute does: POST {"queries": [...]} to /search, `.json()` the reply;
    each item is the tool's result string, shown to the model verbatim and checked with `"results" in result`."""
    results = httpx.post(url + "/search", json={"queries": queries}, timeout=HANG_S).json()
    assert isinstance(results, list) and len(results) == len(queries)
    assert all(isinstance(r, str) and "results" in r for r in results)
    return results


def eka_top_knowledge(result_string, top_n):
    """EKA's get_knowledge.py: json.loads the string, keep items with both keys, sort by float coherence."""
    items = [{"knowledge": i["<knowledge>"], "coherence": float(i["<coherence>"])}
             for i in json.loads(result_string).get("results", []) if "<knowledge>" in i and "<coherence>" in i]
    return [i["knowledge"] for i in sorted(items, key=lambda i: i["coherence"], reverse=True)[:top_n]]


def test_graph_r1_search_endpoint(small_graph, in_process_server):
    retriever = HypergraphRetriever.load(small_graph[0], encoder=StubEncoder(), progress=False)
    url = in_process_server(retriever, search_topk=10)
    results = graph_r1_agent_search(url, ["q", "q"])
    want = [{"<knowledge>": name, "<coherence>": round(score, 3)} for name, score in EXPECTED]
    assert json.loads(results[0]) == {"results": want}
    assert results[0].startswith('{"results": [{"<knowledge>": "H0", "<coherence>": 1.625}, ')  # json.dumps' spacing
    assert [i["<coherence>"] for i in json.loads(results[1])["results"]] == [1.625, 1.25, 1.0, 0.726, 0.311, 0.3]
    assert eka_top_knowledge(results[0], 3) == ["H0", "H2", "H5"]
    assert graph_r1_agent_search(url, []) == []
    assert httpx.post(url + "/search", json={"queries": "q"}).status_code == 422
    # our /retrieve and the remote retriever see the same hyperedges
    body = httpx.post(url + "/retrieve", json={"queries": ["q"], "topk": 2, "return_scores": True}).json()
    assert [(r["document"]["contents"], r["score"]) for r in body["result"][0]] == [("H0", 1.625), ("H2", 1.25)]
    remote = RemoteRetriever(url).search(["q"], 10)[0]
    assert [(d.contents, d.score) for d in remote] == [(d.contents, d.score) for d in retriever.search(["q"], 10)[0]]


# ----------------------------------------------------------------------------- the OpenAI-compatible extractor


class FakeChat:
    """An OpenAI-compatible /v1/chat/completions: scripted replies per chunk and pass; 503 for the first
    `fail_first` requests and for every prompt holding `broken`; records each request."""

    def __init__(self, replies, more=None, fail_first=0, broken=None):
        self.replies, self.more, self.fail_first, self.broken = replies, more or {}, fail_first, broken
        self.requests = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((self.path, self.headers.get("Authorization"), body))
                status, reply = fake.answer(body)
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, body):
        if len(self.requests) <= self.fail_first:
            return 503, "overloaded"
        messages = body["messages"]
        chunk = next(c for c in self.replies if c in messages[0]["content"])
        if self.broken and self.broken in messages[0]["content"]:
            return 503, "down"
        if messages[-1]["content"] == IF_LOOP_PROMPT:
            return 200, self.more.get(chunk, "NO")
        return 200, self.replies[chunk][len(messages) // 2]  # 1 message: pass 0; 3: pass 1; 5: pass 2

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def record(text, score, *entities):
    return f'("hyper-relation"<|>"{text}"<|>{score})##' + "".join(
        f'("entity"<|>"{n}"<|>"person"<|>"{n} is here."<|>{k})##' for n, k in entities)


REPLIES = {
    "Alpha met Beta.": [record("Alpha met Beta.", 9, ("Alpha", 90)), record("Beta was met.", 5, ("Beta", 70)),
                        record("They met once.", 4, ("Alpha", 20), ("Beta", 10))],
    "Gamma left.": [record("Gamma left.", 8, ("Gamma", 80)), record("Gamma is gone.", 3, ("Gamma", 40)), ""],
}


@pytest.fixture
def fake_chat():
    fakes = []

    def start(*args, **kwargs):
        fakes.append(FakeChat(*args, **kwargs))
        return fakes[-1]

    yield start
    for fake in fakes:
        fake.close()


def test_openai_extractor_request_shape_and_gleaning(tmp_path, fake_chat):
    fake = fake_chat(REPLIES, more={"Alpha met Beta.": "Yes"})  # Alpha: a second gleaning; Gamma: stop after one
    extractor = OpenAIExtractor(fake.url, "gpt-4o-mini", str(tmp_path / "cache.jsonl"), api_key="sk-test",
                                backoff=(0, 0))
    assert [f.text for f in extractor.extract("Alpha met Beta.")] == ["Alpha met Beta.", "Beta was met.", "They met once."]
    assert [f.text for f in extractor.extract("Gamma left.")] == ["Gamma left.", "Gamma is gone."]
    # Alpha: extract, glean, "more?" (yes), glean; Gamma: extract, glean, "more?" (no)
    assert len(fake.requests) == 7
    path, auth, body = fake.requests[3]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test" and body["model"] == "gpt-4o-mini"
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert body["messages"][1]["content"] == REPLIES["Alpha met Beta."][0]
    assert body["messages"][2]["content"] == CONTINUE_PROMPT and "Alpha met Beta." in body["messages"][0]["content"]
    assert "temperature" not in body  # as Graph-R1: the endpoint's default


def test_openai_extractor_retries_then_gives_up(tmp_path, fake_chat):
    fake = fake_chat(REPLIES, fail_first=2)
    extractor = OpenAIExtractor(fake.url, "m", str(tmp_path / "c.jsonl"), max_gleaning=0, backoff=(0, 0))
    assert [f.text for f in extractor.extract("Gamma left.")] == ["Gamma left."]
    assert len(fake.requests) == 3 and extractor.counts["retries"] == 2
    extractor = OpenAIExtractor(fake.url, "m", str(tmp_path / "c.jsonl"), max_gleaning=0, attempts=2, backoff=(0, 0))
    fake.broken = "Alpha"
    with pytest.raises(ExtractorUnavailable, match="2 attempts"):
        extractor.extract("Alpha met Beta.")


def test_llm_build_resumes_from_its_cache_and_a_rebuild_asks_nothing(tmp_path, fake_chat):
    fake = fake_chat(REPLIES, more={"Alpha met Beta.": "yes"}, broken="Gamma")
    corpus = write_corpus(tmp_path / "corpus.jsonl", ["Alpha met Beta.", "Gamma left."])
    out, cache = str(tmp_path / "graph"), str(tmp_path / "graph.cache.jsonl")
    extractors = []

    def extractor():
        extractors.append(OpenAIExtractor(fake.url, "m", cache, concurrency=1, attempts=2, backoff=(0, 0)))
        return extractors[-1]

    with pytest.raises(ExtractorUnavailable):
        build_hypergraph(corpus, out, extractor(), StubEncoder(), progress=False)
    assert not os.path.exists(out) and len(rows(out + ".partial/extractions.jsonl")) == 1  # Alpha's
    asked = len(fake.requests)  # Alpha: 4 (extract, glean, "more?", glean); Gamma's first call: 2 attempts
    assert asked == 4 + 2
    fake.broken = None
    build_hypergraph(corpus, out, extractor(), StubEncoder(), progress=False)
    assert len(fake.requests) == asked + 3  # Gamma only: extract, glean, "more?" (no)
    assert [h["contents"] for h in rows(os.path.join(out, "hyperedges.jsonl"))] == [
        "Alpha met Beta.", "Beta was met.", "They met once.", "Gamma left.", "Gamma is gone."]
    entities = {e["name"]: e for e in rows(os.path.join(out, "entities.jsonl"))}
    assert list(entities) == ["ALPHA", "BETA", "GAMMA"]
    before = len(fake.requests)
    build_hypergraph(corpus, out, extractor(), StubEncoder(), progress=False)  # the same graph again
    build_hypergraph(corpus, str(tmp_path / "graph2"), extractor(), StubEncoder(), progress=False)
    assert len(fake.requests) == before
    for e in extractors:
        e.close()


# ------------------------------------------------------------------------------------------ atomic builds


def test_interrupted_build_keeps_the_previous_graph_and_resumes(tmp_path, small_graph):
    out = str(tmp_path / "graph")
    corpus = write_corpus(tmp_path / "corpus.jsonl", list(SCRIPT))
    build_hypergraph(corpus, out, ScriptedExtractor(), StubEncoder(), progress=False)
    before = os.listdir(out), open(os.path.join(out, "hyperedges.jsonl")).read()
    dying = ScriptedExtractor(fail_after=2)
    with pytest.raises(RuntimeError, match="extractor died"):
        build_hypergraph(corpus, out, dying, StubEncoder(), progress=False)
    assert (os.listdir(out), open(os.path.join(out, "hyperedges.jsonl")).read()) == before
    with open(out + ".partial/extractions.jsonl", "a") as f:
        f.write('{"chunk": "d2#0", "fa')  # a line cut by a kill
    resumed = ScriptedExtractor()
    build_hypergraph(corpus, out, resumed, StubEncoder(), progress=False)
    assert resumed.done == ["doc two"] and not os.path.exists(out + ".partial")
    for name in ("entities.jsonl", "hyperedges.jsonl"):  # the same graph as the build without interruption
        assert open(os.path.join(out, name)).read() == open(os.path.join(small_graph[0], name)).read()
    got, want = Incidence.load(os.path.join(out, "incidence.npz")), Incidence.load(small_graph[0] + "/incidence.npz")
    assert np.array_equal(got.hyperedges, want.hyperedges) and np.array_equal(got.weights, want.weights)


def test_bad_input_is_named_and_nothing_is_written(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "d0", "contents": "doc zero"}\n{"id": "d1", "content": "doc one"}\n')
    out = str(tmp_path / "graph")
    with pytest.raises(CorpusError, match=r"corpus.jsonl:2: missing field 'contents'"):
        build_hypergraph(str(corpus), out, ScriptedExtractor(), StubEncoder(), progress=False)
    assert not os.path.exists(out) and not os.path.exists(out + ".partial")
    world = tmp_path / "world"
    world.mkdir()
    write_corpus(world / "corpus.jsonl", ["doc zero"])
    (world / "world_config.json").write_text('{"seed": 0, "n_peple": 5}')
    assert build_cli.main(["--world", str(world), "--out", out, "--no-progress"]) == 2
    assert "world_config.json: unknown field 'n_peple'" in capsys.readouterr().err
    assert build_cli.main(["--corpus", str(tmp_path / "none.jsonl"), "--llm-url", "http://127.0.0.1:9/v1",
                           "--out", out]) == 2
    assert "none.jsonl: no such corpus file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_cli.parse_args(["--out", out])  # neither --world nor --llm-url
    with pytest.raises(ValueError, match="overlap"):
        TokenChunker(size=100, overlap=100)


def test_token_chunks_overlap():
    # Qwen's tokenizer splits digits one by one: 25 digits are 25 tokens
    chunker = TokenChunker("qwen", size=10, overlap=3, encoder=QwenTokenizer())
    assert chunker.split(" 0123456789012345678901234 ") == ["0123456789", "7890123456", "4567890123", "1234"]
    assert chunker.split("  short text ") == ["short text"]  # at most `size` bytes: one window
    assert chunker.split("   ") == []


# ----------------------------------------------------------------------------------- the synthetic world


@pytest.fixture(scope="module")
def world():
    return generate_world(world_config("tiny", 0))


def test_world_extractor_reads_the_worlds_facts(world):
    extractor = WorldExtractor(world)
    assert extractor.extract(world.passages[0].contents) == [  # '"Zapousland"\nThe capital of ... (seed 0)
        HyperRelation("The capital of Zapousland is Thousol.", 10.0,
                      (E("ZAPOUSLAND", "COUNTRY", "Zapousland is a country.", 100.0),
                       E("THOUSOL", "CITY", "Thousol is a city.", 80.0))),
        HyperRelation("The official name of Zapousland is the Commonwealth of Zapousland.", 10.0,
                      (E("ZAPOUSLAND", "COUNTRY", "Zapousland is a country.", 100.0),
                       E("COMMONWEALTH OF ZAPOUSLAND", "NAME", "Commonwealth of Zapousland is an official name.", 80.0)))]
    for passage in world.passages:  # every fact of every passage: its sentence, subject and object
        facts = extractor.extract(passage.contents)
        assert [f.text for f in facts] == list(passage.sentences)
        for fact, world_fact in zip(facts, passage.facts):
            obj = world.entities.get(world_fact.object)
            assert [e.name for e in fact.entities] == [world.entities[world_fact.subject].name.upper(),
                                                       (obj.name if obj else world_fact.object).upper()]
    with pytest.raises(ValueError, match="no sentence of this world"):
        extractor.extract('"Elsewhere"\nNothing here is of the world.')


def test_world_build_cli_and_serve_retriever(tmp_path, world):
    world_dir = tmp_path / "world"
    world.write(world_dir)
    subset = world.passages[:40]
    corpus = write_corpus(tmp_path / "corpus.jsonl", [p.contents for p in subset])
    out = str(tmp_path / "graph")
    assert build_cli.main(["--world", str(world_dir), "--corpus", corpus, "--encoder", "minilm", "--out", out,
                           "--no-progress"]) == 0
    meta = json.load(open(os.path.join(out, "meta.json")))
    names = {world.entities[f.subject].name.upper() for p in subset for f in p.facts} | {
        (world.entities[f.object].name if f.object in world.entities else f.object).upper()
        for p in subset for f in p.facts}
    assert (meta["num_hyperedges"], meta["num_entities"]) == (sum(len(p.facts) for p in subset), len(names))

    retriever = make_retriever("hypergraph", index=out, progress=False)
    sentences = {s for p in subset for s in p.sentences}
    questions = [q for q in world.questions["train"] if q.metadata["hops"] == 1
                 and world.statement(world.entity_named(q.metadata["hop_entities"][0]).id,
                                     q.metadata["relations"][0])[2] in sentences][:8]
    assert len(questions) >= 4
    for q, docs in zip(questions, retriever.search([q.question for q in questions], 10)):
        entity = world.entity_named(q.metadata["hop_entities"][0])
        assert world.statement(entity.id, q.metadata["relations"][0])[2] in [d.contents for d in docs], q.question

    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "launch", "serve_retriever.py"), "--retriever",
                             "hypergraph", "--index", out, "--port", str(port)], stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + HANG_S
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        asked = [q.question for q in questions[:3]]
        local = retriever.search(asked, 10)
        served = [json.loads(r)["results"] for r in graph_r1_agent_search(url, asked)]
        assert served == [[{"<knowledge>": d.contents, "<coherence>": round(d.score, 3)} for d in docs] for docs in local]
        body = httpx.post(url + "/retrieve", json={"queries": asked, "topk": 10}).json()
        assert [[d["contents"] for d in docs] for docs in body["result"]] == [[d.contents for d in docs] for docs in local]
    finally:
        proc.terminate()
        proc.wait(timeout=HANG_S)
        proc.stderr.close()
    with pytest.raises(ValueError, match="needs index"):
        make_retriever("hypergraph")
