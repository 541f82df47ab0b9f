"""Faults injected into the network side (issue 42, cases 3, 4, 5 and 7b), against the real servers and client
on loopback: a retriever that never answers or refuses, requests over each limit, a large request beside a
small one, bodies nested 100k deep or not UTF-8, and a client that disconnects mid-body.

The agent server runs here with a stub engine (a whitespace tokenizer and a rollout that records its
questions): what is tested is the HTTP server, its limits and its batcher, not the model."""
import asyncio
import json
import os
import re
import socket
import threading
import time
import types

import httpx
import numpy as np
import pytest

from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.client import RemoteRetriever, RetrieverUnavailable
from jaxsearch.retrieval.server import Limits
from net import free_port
from hang import HANG_S

CORPUS = os.path.join(os.path.dirname(__file__), "data", "corpus", "corpus.jsonl")
SLACK_S = 1.0  # past a deadline: the last attempt's teardown and the error, on a loaded machine


# ------------------------------------------------------------------------------------------- case 3: client


def check_gives_up(url: str, deadline_s: float, attempt_timeout_s: float):
    client = RemoteRetriever(url, deadline_s=deadline_s, attempt_timeout_s=attempt_timeout_s)
    start = time.monotonic()
    with pytest.raises(RetrieverUnavailable) as error:
        client.search(["Lisul River"], 3)
    elapsed = time.monotonic() - start
    client.close()
    assert elapsed < deadline_s + SLACK_S
    message = str(error.value)
    attempts = int(message.split(" is down: ")[1].split(" attempts")[0])
    assert attempts >= 2  # it retried within the deadline
    assert f"{url}/retrieve" in message
    spent = float(re.search(r"attempts over (\d+\.\d)s failed", message).group(1))  # the time it spent
    assert abs(spent - elapsed) < 0.2
    assert "config.retriever.deadline_s" in message and "attempt_timeout_s" in message
    assert "--search-url" not in message  # no such flag
    return elapsed, attempts


def test_client_gives_up_on_a_server_that_accepts_and_never_answers():
    with socket.socket() as silent:  # the kernel completes each handshake; nothing ever reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        elapsed, attempts = check_gives_up(url, deadline_s=2.0, attempt_timeout_s=0.6)
    assert elapsed >= 1.2  # it waited out at least two attempts: not a refusal
    assert attempts <= 4  # each attempt lasted its attempt_timeout_s (2 s / 0.6 s), not less


def test_client_gives_up_on_a_refusing_port():
    elapsed, attempts = check_gives_up(f"http://127.0.0.1:{free_port()}", deadline_s=1.5, attempt_timeout_s=1.0)
    assert attempts >= 3  # refusals are retried with back-off until the deadline


def test_deadline_comes_from_the_config():
    from configs.base import get_config
    from jaxsearch.agent.build import build_retriever
    from jaxsearch.config import RunConfig

    cfg = RunConfig.from_dict(get_config())
    assert 0 < cfg.retriever.attempt_timeout_s <= cfg.retriever.deadline_s < 60  # well under a minute
    rcfg = cfg.retriever.__class__(**{**cfg.retriever.__dict__, "deadline_s": 4.5, "attempt_timeout_s": 1.5})
    remote = build_retriever(rcfg)
    assert (remote.deadline_s, remote.attempt_timeout_s) == (4.5, 1.5)
    remote.close()


def test_trainer_stops_naming_the_newest_checkpoint(tmp_path, monkeypatch):
    """Past the deadline the run stops (it does not hang or skip data); the error names the checkpoint kept."""
    from jaxsearch.rl import trainer

    def retriever_down(cfg, workdir, progress):
        raise RetrieverUnavailable("retrieval server http://127.0.0.1:9/retrieve is down: 5 attempts")

    monkeypatch.setattr(trainer, "_train", retriever_down)
    for name in ("2", "4", "6.orbax-checkpoint-tmp-1"):  # 6: a save that never completed
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    with pytest.raises(RetrieverUnavailable, match=r"is down: 5 attempts\ntraining stopped; the newest checkpoint "
                       r"kept: step 4 \(.*checkpoints/4\); rerun the same command to resume"):
        trainer.train({}, str(tmp_path))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4", "6.orbax-checkpoint-tmp-1"]


# ------------------------------------------------------------------------------------------- cases 4, 5: retrieval server


class EchoRetriever:
    """Each query's doc id is the query; searching costs `per_query_s` a query; records every call."""

    def __init__(self, per_query_s=0.0):
        self.per_query_s, self.calls = per_query_s, []

    def search(self, queries, k):
        self.calls.append(list(queries))
        time.sleep(self.per_query_s * len(queries))
        return [[Doc(q, "t", "x", 0.0)] * k for q in queries]


def raw_request(url: str, head: str, body: bytes = b"") -> tuple[int, str]:
    """Send `head` (request line and headers) and `body` as they are; (status, response body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=HANG_S) as s:
        s.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < content_length(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1].decode()


def content_length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 60


def test_retrieval_limits_answer_4xx_naming_the_limit(in_process_server):
    retriever = EchoRetriever()
    url = in_process_server(retriever, search_topk=2, limits=Limits(max_body_bytes=4096, max_queries=3,
                                                                    max_query_chars=50))
    post = lambda body: httpx.post(url + "/retrieve", content=body, timeout=HANG_S)
    # over the body limit by Content-Length: refused before a byte of the body is sent
    status, body = raw_request(url, f"POST /retrieve HTTP/1.1\nHost: x\nContent-Type: application/json\n"
                                    f"Content-Length: {10**9}\n")
    assert status == 413 and "1,000,000,000 bytes" in body and "--max-body-bytes" in body and "4,096" in body
    # no Content-Length (chunked): counted while reading
    chunks = (b'{"queries": ["' + b"a" * 1000 for _ in range(10))
    r = httpx.post(url + "/retrieve", content=chunks, timeout=HANG_S)
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["detail"]
    r = post(json.dumps({"queries": ["a", "b", "c", "d"]}))
    assert r.status_code == 400 and "4 queries is over the limit of 3" in r.json()["detail"]
    assert "--max-queries" in r.json()["detail"]
    r = post(json.dumps({"queries": ["a", "b" * 51]}))
    assert r.status_code == 400 and "queries[1]: 51 characters is over the limit of 50" in r.json()["detail"]
    assert "--max-query-chars" in r.json()["detail"]
    # case 5: nesting far past any body's (json.loads would recurse out of stack) and bytes that are not UTF-8
    deep = b'{"queries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    big = Limits(max_body_bytes=1 << 20)
    url = in_process_server(retriever, search_topk=2, limits=big)
    for path in ("/retrieve", "/search"):
        r = httpx.post(url + path, content=deep, timeout=HANG_S)
        assert r.status_code == 400 and "100,001 levels deep; the limit is 32" in r.json()["detail"]
        r = httpx.post(url + path, content=b'{"queries": ["caf\xe9"]}', timeout=HANG_S)
        assert r.status_code == 400 and "not UTF-8: byte 0xe9 at offset 17" in r.json()["detail"]
    # within the limits all is as before: brackets and escapes inside strings are not nesting
    odd = ['[[[[{{{{"', "\\", '\\"]]]]', "caf\u00e9"] + ["[" * 40]
    r = httpx.post(url + "/retrieve", json={"queries": odd, "topk": 1}, timeout=HANG_S)
    assert r.status_code == 200 and [d[0]["id"] for d in r.json()["result"]] == odd
    assert not any(len(c) > 5 for c in retriever.calls)


def test_a_small_query_does_not_wait_for_a_large_request(in_process_server):
    """A request of 300 queries (0.6 s of search) is searched in parts; a one-query request sent once its
    search began is answered in the next call, before the large one is done (before: after all of it)."""
    retriever = EchoRetriever(per_query_s=0.002)
    url = in_process_server(retriever, max_batch_chars=200)  # 20 queries of 10 characters per call
    large = [f"large {i:04d}"[:10] for i in range(300)]
    finished = {}

    def send_large():
        r = httpx.post(url + "/retrieve", json={"queries": large, "topk": 1}, timeout=HANG_S)
        finished["large"] = time.monotonic()
        finished["large_ids"] = [d[0]["id"] for d in r.json()["result"]]

    thread = threading.Thread(target=send_large)
    thread.start()
    deadline = time.monotonic() + HANG_S
    while not retriever.calls and time.monotonic() < deadline:
        time.sleep(0.005)
    r = httpx.post(url + "/retrieve", json={"queries": ["small"], "topk": 1}, timeout=HANG_S)
    small_done = time.monotonic()
    thread.join(timeout=HANG_S)
    assert r.json()["result"][0][0]["id"] == "small" and finished["large_ids"] == large
    assert small_done < finished["large"]
    calls = retriever.calls
    small_call = next(i for i, c in enumerate(calls) if "small" in c)
    last_large = max(i for i, c in enumerate(calls) if any(q.startswith("large") for q in c))
    assert small_call < last_large  # searched while the large one still had parts left
    assert max(sum(map(len, c)) for c in calls) <= 200 and sum(len(c) for c in calls) == 301


class PiecewiseBM25:
    """BM25 over the shipped corpus, scoring as the server asks (`split_query`, `scores` piece by piece,
    `top_docs`); records every piece scored, each taking `per_piece_s`."""

    def __init__(self, per_piece_s):
        from jaxsearch.retrieval.bm25 import BM25Retriever
        from jaxsearch.retrieval.corpus import Corpus

        self.bm25 = BM25Retriever.build(Corpus(CORPUS, progress=False), progress=False)
        self.per_piece_s, self.pieces = per_piece_s, []

    def split_query(self, query, max_chars):
        return self.bm25.split_query(query, max_chars)

    def scores(self, piece, into=None):
        self.pieces.append(piece)
        time.sleep(self.per_piece_s)
        return self.bm25.scores(piece, into)

    def top_docs(self, scores, k):
        return self.bm25.top_docs(scores, k)


def test_a_small_query_does_not_wait_for_a_long_query(in_process_server):
    """Four queries of 16,384 characters (the default --max-query-chars) are scored in pieces of at most 256
    characters (--max-batch-chars); a one-word query sent meanwhile is scored between two pieces of one
    long query, and every answer is that of the whole query (before: each long query was one search call)."""
    retriever = PiecewiseBM25(per_piece_s=0.001)
    url = in_process_server(retriever)
    words = open(CORPUS).read().split()
    long_queries = [" ".join(words[i::4])[:Limits.max_query_chars] for i in range(4)]
    finished = {}

    def send_large():
        r = httpx.post(url + "/retrieve", json={"queries": long_queries, "topk": 3, "return_scores": True},
                       timeout=HANG_S)
        finished["large"], finished["body"] = time.monotonic(), r.json()

    thread = threading.Thread(target=send_large)
    thread.start()
    deadline = time.monotonic() + HANG_S
    while not retriever.pieces and time.monotonic() < deadline:
        time.sleep(0.005)
    r = httpx.post(url + "/retrieve", json={"queries": ["River"], "topk": 3, "return_scores": True},
                   timeout=HANG_S)
    small_done = time.monotonic()
    thread.join(timeout=HANG_S)
    assert small_done < finished["large"]
    small = retriever.pieces.index("River")
    assert 0 < small < len(retriever.pieces) - 1  # between two pieces of the large request
    large_pieces = [p for p in retriever.pieces if p != "River"]
    assert "".join(large_pieces) == "".join(long_queries) and max(map(len, large_pieces)) <= 256
    expected = [[{"document": {"id": d.id, "contents": d.contents}, "score": d.score} for d in docs]
                for docs in retriever.bm25.search(long_queries + ["River"], 3)]  # whole queries, one by one
    assert finished["body"]["result"] == expected[:4] and r.json()["result"] == expected[4:]
    assert all(len(docs) == 3 for docs in expected)


def test_the_search_thread_waits_while_the_event_loop_works_on_a_request(monkeypatch):
    """The search thread starts no call while the event loop is working on a request (it would take the GIL
    from it every switch interval): a query queued meanwhile is searched once that work ends, or after
    LOOP_FIRST_S at the latest."""
    from jaxsearch.retrieval import server

    monkeypatch.setattr(server, "LOOP_FIRST_S", 0.5)

    async def scenario(batcher, searched, busy_s):
        batcher.loop_working(+1)  # request A in hand (parsing, say)
        batcher.loop_working(+1)  # request B, whose query is queued
        t0 = time.monotonic()
        search = asyncio.ensure_future(batcher.search(["b"], 1))
        await asyncio.sleep(busy_s)  # A's work on the loop (asleep here: the GIL stays free for the thread)
        batcher.loop_working(-1)
        assert [[d.id for d in docs] for docs in await search] == [["b"]]
        batcher.loop_working(-1)  # B answered
        return searched[-1] - t0

    def waited(busy_s):
        """A fresh batcher each time: one still in the wait that followed an earlier answer would search at
        that wait's end, before LOOP_FIRST_S from now (a clean-clone run saw 0.499 s)."""
        retriever = EchoRetriever()
        batcher = server.Batcher(retriever, max_batch=8)
        searched = []
        retriever.search = lambda queries, k: searched.append(time.monotonic()) or EchoRetriever.search(retriever, queries, k)
        batcher.start()
        try:
            return asyncio.run(scenario(batcher, searched, busy_s))
        finally:
            batcher.close()

    assert 0.05 <= waited(0.05) < 0.5  # until A's work ended, not the whole LOOP_FIRST_S
    assert 0.5 <= waited(1.0) < 0.95  # A's work went on: searched after LOOP_FIRST_S anyway


def test_close_while_the_search_thread_waits_for_the_event_loop(monkeypatch):
    """close() ends the search thread while it waits for the event loop's work (a clean-clone run hung here:
    the wait ended by close() was followed by a wait for work that never came)."""
    from jaxsearch.retrieval import server

    monkeypatch.setattr(server, "LOOP_FIRST_S", 60.0)
    batcher = server.Batcher(EchoRetriever(), max_batch=8)
    batcher.start()

    async def answered_while_the_loop_holds_another_request():
        batcher.loop_working(+1)  # request A in hand
        batcher.loop_working(+1)  # request B, whose query is queued
        search = asyncio.ensure_future(batcher.search(["b"], 1))
        await asyncio.sleep(0.1)
        batcher.loop_working(-1)  # A done: B is searched; B's answer is then the loop's work
        await search

    asyncio.run(answered_while_the_loop_holds_another_request())
    time.sleep(0.2)  # the thread waits (up to LOOP_FIRST_S) for the loop to write B's answer
    closer = threading.Thread(target=batcher.close, daemon=True)
    closer.start()
    closer.join(timeout=5.0)
    assert not closer.is_alive(), "Batcher.close() did not return"


# ------------------------------------------------------------------------------------------- cases 4, 5, 7b: agent server


class StubTokenizer:
    def encode(self, text, allow_special=False):
        return text.split()

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return " ".join(m["content"] for m in messages)


class StubEngine:
    """What the agent server uses of an `AgentEngine`: its tokenizer, protocol, limits and `rollout`, which
    answers each question with itself and records the questions of every call."""

    def __init__(self):
        self.tokenizer = StubTokenizer()
        self.protocol = types.SimpleNamespace(build_messages=lambda q, ctx: [{"role": "user", "content": q}])
        self.sampler = types.SimpleNamespace(cache_len=64)
        self.limits = types.SimpleNamespace(max_segment_tokens=14)
        self.calls = []

    def rollout(self, params, questions, key, requests=None, events=None, cancelled=None):
        self.calls.append(list(questions))
        n = len(questions)
        return types.SimpleNamespace(  # the fields agent.requests.summarize reads
            answers=list(questions), prompt_lengths=np.ones(n, int), loss_mask=np.ones((n, 2)),
            policy_tokens=np.full(n, 2), attention_mask=np.ones((n, 3)), finish_reasons=["stop"] * n,
            queries=[[] for _ in questions], docs=[[] for _ in questions], turns=np.ones(n, int),
            initial_docs=[[] for _ in questions], responses=list(questions), truncated=np.zeros(n, bool))


@pytest.fixture
def agent():
    from jaxsearch.serving.server import make_server, serve_in_thread

    engine = StubEngine()
    server = make_server(engine, None, "stub", port=0, max_batch=8, batch_wait_ms=50.0)  # default limits
    serve_in_thread(server)
    try:
        yield server, engine
    finally:
        server.close()


def chat(url, question, timeout=HANG_S):
    body = {"model": "stub", "messages": [{"role": "user", "content": question}]}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)


def test_an_oversized_question_is_refused_before_it_joins_a_batch(agent):
    """The issue's 3.9 MB message among 7 normal ones: refused at once (400 naming the limit), never rolled
    out; the 7 are answered by one rollout of their own."""
    server, engine = agent
    # the default limit: the stub's cache of 64 tokens less a 14-token segment (its prompt is the question)
    assert server.limits.max_message_tokens == 50
    normal = [f"question {i}" for i in range(7)]
    huge, long = "word " * 780_000, "word " * 51  # 3.9 MB: refused by its length; 51 tokens: tokenized
    results, threads = {}, []
    with server.batcher.held():  # the 7 queue up; the oversized ones must not wait for a batch
        for q in normal:
            threads.append(threading.Thread(target=lambda q=q: results.update({q: chat(server.url, q)})))
            threads[-1].start()
        for q, what in ((huge, "3,900,000 characters, over 800 (16 per token"), (long, "51 tokens, over the limit of 50")):
            r = chat(server.url, q)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == "messages" and error["code"] == "context_length_exceeded"
            assert what in error["message"] and "--max-message-tokens" in error["message"]
        deadline = time.monotonic() + HANG_S
        while server.batcher.submitted < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.calls == []
    for t in threads:
        t.join(timeout=HANG_S)
    assert server.batcher.submitted == 7
    assert [results[q].json()["choices"][0]["message"]["content"] for q in normal] == normal
    (rows,) = engine.calls  # one batch of the 7 (in arrival order), padded to 8 rows with the last
    assert sorted(rows[:7]) == normal and rows[7] == rows[6]


def test_agent_body_limits_depth_and_utf8_are_4xx(agent):
    server, engine = agent
    url = server.url
    status, body = raw_request(url, f"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: {10**9}\n")
    error = json.loads(body)["error"]
    assert status == 413 and "1,000,000,000 bytes" in error["message"] and "--max-body-bytes" in error["message"]
    deep = b'{"model": "stub", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(url + "/v1/chat/completions", content=deep, timeout=HANG_S)
    assert r.status_code == 400 and "100,001 levels deep; the limit is 32" in r.json()["error"]["message"]
    bad = json.dumps({"model": "stub", "messages": [{"role": "user", "content": "caf?"}]}).encode()
    r = httpx.post(url + "/v1/chat/completions", content=bad.replace(b"caf?", b"caf\xe9"), timeout=HANG_S)
    assert r.status_code == 400 and "not UTF-8: byte 0xe9" in r.json()["error"]["message"]
    assert chat(url, "still answering").json()["choices"][0]["message"]["content"] == "still answering"
    assert engine.calls == [["still answering"] * 8]


def test_a_client_gone_mid_body_is_one_log_line(agent, capfd):
    server, engine = agent
    host, port = server.server_address[:2]
    capfd.readouterr()
    for linger in (False, True):  # a plain close (FIN) after part of the body, and a reset (RST)
        s = socket.create_connection((host, port), timeout=HANG_S)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b'{"model": ')
        if linger:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    err, deadline = "", time.monotonic() + HANG_S
    while err.count("client disconnected") < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        err += capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2 and "Traceback" not in err
    assert all("client disconnected during POST /v1/chat/completions" in line for line in lines)
    assert "after 10 of 1,000 body bytes" in lines[0] or "after 10 of 1,000 body bytes" in lines[1]
    assert chat(server.url, "after").status_code == 200 and engine.calls == [["after"] * 8]
