"""The retrieval server as a real subprocess (Search-R1 schema, 4xx, concurrency) and its client."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.client import RemoteRetriever, RetrieverUnavailable, parse_response
from jaxsearch.retrieval.server import create_app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "data", "corpus", "corpus.jsonl")
CONTENTS = {row["id"]: row["contents"] for row in map(json.loads, open(CORPUS))}
QUESTIONS = [json.loads(line)["question"] for line in open(os.path.join(ROOT, "tests", "data", "corpus", "queries.jsonl"))]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port, *extra):
    cmd = [sys.executable, os.path.join(ROOT, "launch", "serve_retriever.py"), "--corpus", CORPUS,
           "--retriever", "bm25", "--port", str(port), "--max-queries", "64", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_healthy(url, proc, timeout=60):
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
        proc.wait(timeout=10)
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


@pytest.mark.parametrize("raw, message", [
    (b'{"queries": ["a"', "invalid json"),
    (b'["a", "b"]', "body: input should be a valid dictionary"),
    (b'{"topk": 3}', "queries: field required"),
    (b'{"queries": "a string"}', "queries: input should be a valid list"),
    (b'{"queries": ["ok", 7]}', "queries[1]: input should be a valid string"),
    (b'{"queries": []}', "queries: must hold 1 to 64 queries, got 0"),
    (json.dumps({"queries": ["q"] * 65}).encode(), "queries: must hold 1 to 64 queries, got 65"),
    (b'{"queries": ["a"], "topk": 0}', "topk: must be between 1 and 100"),
    (b'{"queries": ["a"], "topk": 101}', "topk: must be between 1 and 100"),
    (b'{"queries": ["a"], "topk": "3"}', "topk: input should be a valid integer"),
    (b'{"queries": ["a"], "return_scores": "yes"}', "return_scores: input should be a valid boolean"),
    (json.dumps({"queries": ["x" * 5000]}).encode(), "queries[0]: longer than 4096 characters"),
])
def test_bad_requests_get_4xx_with_a_message(server, raw, message):
    response = httpx.post(server + "/retrieve", content=raw, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500
    assert message in response.json()["detail"].lower()
    assert httpx.get(server + "/health").status_code == 200


def test_64_concurrent_clients(server):
    expected = httpx.post(server + "/retrieve", json={"queries": QUESTIONS[:64], "topk": 5}).json()["result"]
    before = httpx.get(server + "/health").json()

    def client(i):
        with httpx.Client(timeout=30) as http:
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
    client = RemoteRetriever(url, retries=10, backoff=0.2, max_backoff=1.0)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(docs=client.search(["Lisul River"], 2)))
    thread.start()
    time.sleep(0.5)  # the client is already retrying against a closed port
    proc = start_server(port)
    try:
        thread.join(timeout=60)
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
        RemoteRetriever(server, retries=5, backoff=5.0).search(["q"], 1000)


def test_parse_search_r1_responses_with_and_without_scores():
    doc = {"id": "12", "contents": '"Aaron"\nAaron is a prophet.'}
    assert parse_response({"result": [[{"document": doc, "score": 0.5}]]}, 1, "u") == [
        [Doc("12", "Aaron", "Aaron is a prophet.", 0.5)]]
    assert parse_response({"result": [[doc], []]}, 2, "u") == [[Doc("12", "Aaron", "Aaron is a prophet.")], []]
    with pytest.raises(ValueError, match="expected 'result' with 2 lists"):
        parse_response({"result": [[doc]]}, 2, "u")
    with pytest.raises(ValueError, match=r"result\[0\]\[0\]: missing field 'contents'"):
        parse_response({"result": [[{"document": {"id": "1"}, "score": 1.0}]]}, 1, "u")


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


@pytest.fixture
def in_process_server():
    """Run `create_app(retriever)` with uvicorn in a thread; yields a function retriever -> url."""
    servers = []

    def serve(retriever):
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(retriever, "fake"), port=port, log_level="warning"))
        thread = threading.Thread(target=server.run)
        thread.start()
        servers.append((server, thread))
        while not server.started:
            time.sleep(0.01)
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, thread in servers:
        server.should_exit = True
        thread.join()


def test_concurrent_requests_are_batched_into_one_search(in_process_server):
    retriever = FlakyRetriever(delay=0.5)
    url = in_process_server(retriever)

    def ask(i):
        return httpx.post(url + "/retrieve", json={"queries": [f"q{i}a", f"q{i}b"], "topk": 1 + i % 3}, timeout=30).json()

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
