"""The retrieval server as a real subprocess (Search-R1 schema and coercions, 4xx, concurrency) and its
client, spoken to as Search-R1's client and servers do."""
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.client import RemoteRetriever, RetrieverUnavailable, parse_response
from net import free_port
from hang import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "data", "corpus", "corpus.jsonl")
CONTENTS = {row["id"]: row["contents"] for row in map(json.loads, open(CORPUS))}
QUESTIONS = [json.loads(line)["question"] for line in open(os.path.join(ROOT, "tests", "data", "corpus", "queries.jsonl"))]


def start_server(port, *extra):
    cmd = [sys.executable, os.path.join(ROOT, "launch", "serve_retriever.py"), "--corpus", CORPUS,
           "--retriever", "bm25", "--port", str(port), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_healthy(url, proc, timeout=HANG_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise TimeoutError(f"server at {url} not healthy after {timeout}s")


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stderr.close()


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = start_server(port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        stop(proc)


def test_search_r1_schema(server):
    body = httpx.post(server + "/retrieve", json={"queries": ["Lisul River", "Who founded the town of Myrmongal?"],
                                                  "topk": 3, "return_scores": True}).json()
    assert set(body) == {"result"} and len(body["result"]) == 2
    for items in body["result"]:
        assert len(items) == 3
        for item in items:
            assert set(item) == {"document", "score"} and isinstance(item["score"], float)
            assert set(item["document"]) == {"id", "contents"}
            assert item["document"]["contents"] == CONTENTS[item["document"]["id"]]
        assert [i["score"] for i in items] == sorted((i["score"] for i in items), reverse=True)
    assert body["result"][0][0]["document"]["contents"].startswith('"Lisul River"\n')
    assert body["result"][1][0]["document"]["contents"].startswith('"Myrmongal"\n')

    plain = httpx.post(server + "/retrieve", json={"queries": ["Lisul River"]}).json()  # topk default 3
    assert plain["result"] == [[i["document"] for i in body["result"][0]]]
    health = httpx.get(server + "/health").json()
    assert health["status"] == "ok" and health["num_docs"] == 300


# Request bodies that Search-R1's QueryRequest (search_r1/search/retrieval_server.py) refuses, found by
# running that pydantic model on them; each gets a 4xx naming the field. topk -1 passes its model but
# fails its search; here it is refused up front.
@pytest.mark.parametrize("raw, message", [
    (b'{"queries": ["a"', "invalid json"),
    (b'["a", "b"]', "body: input should be a valid dictionary"),
    (b'{"topk": 3}', "queries: field required"),
    (b'{"queries": "a string"}', "queries: input should be a valid list"),
    (b'{"queries": null}', "queries: input should be a valid list"),
    (b'{"queries": ["ok", 7]}', "queries[1]: input should be a valid string"),
    (b'{"queries": [null]}', "queries[0]: input should be a valid string"),
    (b'{"queries": ["a"], "topk": -1}', "topk: must be at least 0, got -1"),
    (b'{"queries": ["a"], "topk": "abc"}', "topk: input should be a valid integer"),
    (b'{"queries": ["a"], "topk": 3.5}', "topk: input should be a valid integer"),
    (b'{"queries": ["a"], "return_scores": "maybe"}', "return_scores: input should be a valid boolean"),
    (b'{"queries": ["a"], "return_scores": 2}', "return_scores: input should be a valid boolean"),
    (b'{"queries": ["a"], "return_scores": null}', "return_scores: input should be a valid boolean"),
])
def test_bad_requests_get_4xx_with_a_message(server, raw, message):
    response = httpx.post(server + "/retrieve", content=raw, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500
    assert message in response.json()["detail"].lower()
    assert httpx.get(server + "/health").status_code == 200


# Bodies that Search-R1's QueryRequest accepts, with what its pydantic model made of them (found by running
# it): (body, the body as coerced).
SEARCH_R1_COERCIONS = [
    ({"topk": "3"}, {"topk": 3}),
    ({"topk": " 3 "}, {"topk": 3}),
    ({"topk": "3.0"}, {"topk": 3}),
    ({"topk": 3.0}, {"topk": 3}),
    ({"topk": True}, {"topk": 1}),
    ({"topk": None}, {}),
    ({"return_scores": 1}, {"return_scores": True}),
    ({"return_scores": 1.0}, {"return_scores": True}),
    ({"return_scores": "true"}, {"return_scores": True}),
    ({"return_scores": "yes"}, {"return_scores": True}),
    ({"return_scores": "on"}, {"return_scores": True}),
    ({"return_scores": "1"}, {"return_scores": True}),
    ({"return_scores": 0}, {"return_scores": False}),
    ({"return_scores": "off"}, {"return_scores": False}),
    ({"extra": 5, "topk": 2}, {"topk": 2}),
]


@pytest.mark.parametrize("fields, coerced", SEARCH_R1_COERCIONS)
def test_search_r1_coercions(server, fields, coerced):
    queries = {"queries": ["Lisul River", "Myrmongal"]}
    got = httpx.post(server + "/retrieve", json={**queries, **fields})
    assert got.status_code == 200, got.text
    assert got.json() == httpx.post(server + "/retrieve", json={**queries, **coerced}).json()


def test_requests_search_r1_accepts(server):
    post = lambda body: httpx.post(server + "/retrieve", json=body, timeout=HANG_S)
    # Search-R1's client on a turn where no row searches
    assert post({"queries": [], "topk": 3, "return_scores": True}).json() == {"result": []}
    assert post({"queries": ["a", "b"], "topk": 0}).json() == {"result": [[], []]}
    # its default batch: 512 prompts x 5 samples, one request per turn
    queries = [QUESTIONS[i % len(QUESTIONS)] for i in range(2560)]
    body = post({"queries": queries, "topk": 3, "return_scores": True}).json()
    assert len(body["result"]) == 2560
    first = post({"queries": QUESTIONS, "topk": 3, "return_scores": True}).json()["result"]
    assert body["result"][: len(QUESTIONS)] == first and body["result"][-1] == first[2559 % len(QUESTIONS)]
    # as Search-R1's client reads it: result[i][j]["document"]["contents"]
    assert [[d["document"]["contents"] for d in r] for r in first] == [
        [CONTENTS[d["document"]["id"]] for d in r] for r in first
    ]
    long_query = " ".join(["Lisul River"] * 1000)  # 11,999 characters
    assert post({"queries": [long_query], "topk": 1}).json()["result"][0][0]["id"] == "0"
    # a topk beyond the corpus returns every match
    assert 3 < len(post({"queries": ["River"], "topk": 10_000}).json()["result"][0]) <= 300


def test_64_concurrent_clients(server):
    expected = httpx.post(server + "/retrieve", json={"queries": QUESTIONS[:64], "topk": 5}).json()["result"]
    before = httpx.get(server + "/health").json()

    def client(i):
        with httpx.Client(timeout=HANG_S) as http:
            got = []
            for j in range(3):
                qs = [QUESTIONS[(i + j + n) % 64] for n in range(2)]
                response = http.post(server + "/retrieve", json={"queries": qs, "topk": 5})
                response.raise_for_status()
                got.append((qs, response.json()["result"]))
            return got

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(client, range(64)))
    index = {q: i for i, q in enumerate(QUESTIONS[:64])}
    for got in results:
        for qs, result in got:
            assert result == [expected[index[q]] for q in qs]
    after = httpx.get(server + "/health").json()
    assert after["queries"] - before["queries"] == 64 * 3 * 2
    assert after["batches"] - before["batches"] <= 64 * 3


def test_client_retries_until_a_late_server_is_up():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = RemoteRetriever(url, deadline_s=HANG_S, attempt_timeout_s=HANG_S, backoff=0.2, max_backoff=1.0)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(docs=client.search(["Lisul River"], 2)))
    thread.start()
    time.sleep(0.5)  # the client is already retrying against a closed port
    proc = start_server(port)
    try:
        thread.join(timeout=HANG_S)
        assert not thread.is_alive()
        docs = outcome["docs"]
        assert len(docs) == 1 and len(docs[0]) == 2 and docs[0][0].title == "Lisul River"
        assert docs[0][0].contents == CONTENTS[docs[0][0].id]
    finally:
        stop(proc)
        client.close()


def test_client_error_when_server_stays_down():
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(RetrieverUnavailable, match=f"{url}/retrieve is down: 3 attempts"):
        RemoteRetriever(url, retries=2, backoff=0.05).search(["q"], 1)
    assert time.monotonic() - start < 5


def test_client_does_not_retry_4xx(server):
    with pytest.raises(ValueError, match="HTTP 422"):
        RemoteRetriever(server, retries=5, backoff=5.0).search(["q"], -1)


def test_parse_search_r1_responses_with_and_without_scores():
    doc = {"id": "12", "contents": '"Aaron"\nAaron is a prophet.'}
    aaron = Doc("12", "Aaron", "Aaron is a prophet.", 0.5, doc["contents"])
    assert parse_response({"result": [[{"document": doc, "score": 0.5}]]}, 1, "u") == [[aaron]]
    assert parse_response({"result": [[doc], []]}, 2, "u") == [[aaron.with_score(0.0)], []]
    with pytest.raises(ValueError, match="expected 'result' with 2 lists"):
        parse_response({"result": [[doc]]}, 2, "u")
    with pytest.raises(ValueError, match=r"result\[0\]\[0\]: missing field 'contents'"):
        parse_response({"result": [[{"document": {"id": "1"}, "score": 1.0}]]}, 1, "u")
    with pytest.raises(ValueError, match=r"result\[0\]\[0\]: field 'id' must be a string or integer"):
        parse_response({"result": [[{"document": {"id": [1], "contents": "x"}}]]}, 1, "u")
    with pytest.raises(ValueError, match=r"result\[0\]\[0\]: field 'score' must be a number"):
        parse_response({"result": [[{"document": doc, "score": "high"}]]}, 1, "u")


def test_parse_id_less_documents_as_search_r1s_servers_send_them():
    # Search-R1's BM25 server on a --storeRaw index (BM25Retriever._search): title, text and contents, no id
    stored = '"Aaron"\nAaron is a prophet.'
    raw = {"title": "Aaron", "text": "Aaron is a prophet.", "contents": stored}
    # its online search servers (serp_search_server.py): only contents, and no score
    online = {"document": {"contents": '"Moses"\nA leader.'}}
    # a document with only title and text: contents built as Search-R1's servers build them
    titled = {"title": "Miriam", "text": "A prophetess."}
    (docs,) = parse_response({"result": [[{"document": raw, "score": 7.5}, online, titled]]}, 1, "u")
    assert [d.contents for d in docs] == [stored, '"Moses"\nA leader.', '"Miriam"\nA prophetess.']
    assert [d.score for d in docs] == [7.5, 0.0, 0.0]
    assert docs[0].id == "sha1:" + hashlib.sha1(stored.encode()).hexdigest()[:16]
    assert len({d.id for d in docs}) == 3  # distinct passages, distinct ids
    assert parse_response({"result": [[raw]]}, 1, "u")[0][0].id == docs[0].id  # same passage, same id


class FlakyRetriever:
    """Echoes each query as a doc id; fails its first `failures` calls; records every call."""

    def __init__(self, failures=0, delay=0.0):
        self.failures, self.delay, self.calls = failures, delay, []

    def search(self, queries, k):
        self.calls.append(list(queries))
        time.sleep(self.delay)
        if len(self.calls) <= self.failures:
            raise RuntimeError("index shard unavailable")
        return [[Doc(q, "t", f"rank {r}", float(-r)) for r in range(k)] for q in queries]


def test_concurrent_requests_are_batched_into_one_search(in_process_server):
    retriever = FlakyRetriever(delay=0.5)
    url = in_process_server(retriever)

    def ask(i):
        return httpx.post(url + "/retrieve", json={"queries": [f"q{i}a", f"q{i}b"], "topk": 1 + i % 3}, timeout=HANG_S).json()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(ask, range(16)))
    for i, body in enumerate(results):  # every request gets its own queries' results at its own topk
        assert [[d["id"] for d in docs] for docs in body["result"]] == [[f"q{i}a"] * (1 + i % 3), [f"q{i}b"] * (1 + i % 3)]
    assert sum(len(c) for c in retriever.calls) == 32
    assert len(retriever.calls) <= 3  # the first request alone, then the queued ones together


def test_client_retries_5xx_and_server_survives_retriever_errors(in_process_server):
    retriever = FlakyRetriever(failures=2)
    url = in_process_server(retriever)
    assert httpx.post(url + "/retrieve", json={"queries": ["x"]}).status_code == 500
    docs = RemoteRetriever(url, retries=3, backoff=0.05).search(["hello"], 2)
    assert [d.id for d in docs[0]] == ["hello", "hello"] and len(retriever.calls) == 3


def test_large_request_is_searched_in_parts(in_process_server):
    retriever = FlakyRetriever()
    url = in_process_server(retriever, max_batch=100, max_batch_chars=10**6)  # the query count binds
    queries = [f"q{i}" for i in range(2560)]
    body = httpx.post(url + "/retrieve", json={"queries": queries, "topk": 1}, timeout=HANG_S).json()
    assert [docs[0]["id"] for docs in body["result"]] == queries
    assert max(len(c) for c in retriever.calls) == 100 and sum(len(c) for c in retriever.calls) == 2560


# contents as a corpus may hold them: unquoted title, trailing spaces, title only, several lines, unicode
ODD_CONTENTS = ['"Lisul River"\nThe Lisul River rises.', "Unquoted Title\nSome text.", '"Trailing"  \ntext  ',
                '"Title only"', "Line one\nline two\nline three", '"\u00dcn\u00efc\u00f6d\u00e9"\n\u00e7\u00e0\tva']


def test_contents_pass_through_byte_for_byte(tmp_path, in_process_server):
    from jaxsearch.retrieval.base import format_passages
    from jaxsearch.retrieval.bm25 import BM25Retriever
    from jaxsearch.retrieval.corpus import Corpus

    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(ODD_CONTENTS)))
    url = in_process_server(BM25Retriever.build(Corpus(str(path), progress=False), progress=False))
    words = ["Lisul", "Unquoted", "Trailing", "only", "three", "\u00e7\u00e0"]
    body = httpx.post(url + "/retrieve", json={"queries": words, "topk": 1, "return_scores": True}).json()
    assert [r[0]["document"]["contents"] for r in body["result"]] == ODD_CONTENTS
    docs = RemoteRetriever(url).search(words, 1)
    assert [d[0].contents for d in docs] == ODD_CONTENTS
    # the observation Search-R1's client makes of them: _passages2string in search_r1/llm_agent/generation.py,
    # run on these contents
    assert format_passages([d[0] for d in docs]) == (
        'Doc 1(Title: "Lisul River") The Lisul River rises.\nDoc 2(Title: Unquoted Title) Some text.\n'
        'Doc 3(Title: "Trailing"  ) text  \nDoc 4(Title: "Title only") \nDoc 5(Title: Line one) line two\n'
        'line three\nDoc 6(Title: "\u00dcn\u00efc\u00f6d\u00e9") \u00e7\u00e0\tva\n'
    )
