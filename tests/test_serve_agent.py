"""launch/serve_agent.py and jaxsearch.serving: the tiny searcher behind the OpenAI chat API, over real HTTP,
checked against direct greedy rollouts of the same engine (answers, queries, docs), streaming, 16
concurrent clients, malformed requests, and the command line."""

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import jax
import pytest

from jaxsearch import parallel
from tiny_models import save_tiny_searcher
from hang import HANG_S

# pytest-xdist: the module's tests share its costly fixtures, so one worker runs them all
pytestmark = pytest.mark.xdist_group("serve_agent")

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "launch" / "serve_agent.py"
MAX_BATCH = 8
MODEL = "tiny-searcher"


def load_launch_module():
    """The command's module (launch/serve_agent.py is its wrapper)."""
    return importlib.import_module("jaxsearch.cli.serve_agent")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny searcher (tests/test_evaluate.py's) saved as a params checkpoint, its tokenizer JSON and corpus."""
    d = tmp_path_factory.mktemp("serve")
    config, params, tokenizer, world, retriever = save_tiny_searcher(d)
    questions = [ex.question for ex in world.questions["test"][:16]]
    return dict(dir=d, corpus=retriever.corpus.path, questions=questions)


def cli_args(tiny):
    d = tiny["dir"]
    return [
        "--checkpoint", d / "ckpt", "--tokenizer", d / "tokenizer.json", "--dtype", "float32",
        "--retriever", "bm25", "--corpus", tiny["corpus"], "--topk", 1, "--max-turns", 2,
        "--max-segment-tokens", 48, "--max-obs-tokens", 150, "--cache-len", 768,
        "--max-batch", MAX_BATCH, "--batch-wait-ms", 200, "--model-name", MODEL,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def served(tiny):
    """The launcher's engine on one CPU device, served in this process on an ephemeral port, and the direct
    greedy rollouts of the 16 questions (two batches of MAX_BATCH: the server's one shape)."""
    from jaxsearch.serving.server import make_server, serve_in_thread

    launch = load_launch_module()
    args = launch.parse_args(list(map(str, cli_args(tiny))))
    launch.check_inputs(args)
    mesh = parallel.make_mesh({"fsdp": 1}, jax.devices()[:1])
    engine, params = launch.build(args, mesh)
    qs = tiny["questions"]
    direct = {}
    for start in range(0, len(qs), MAX_BATCH):
        traj = engine.rollout(params, qs[start : start + MAX_BATCH], 0)
        for i, q in enumerate(qs[start : start + MAX_BATCH]):
            direct[q] = dict(
                answer=traj.answers[i],
                response=traj.responses[i],
                turns=int(traj.turns[i]),
                doc_ids=[[d.id for d in docs] for docs in traj.docs[i]],
                truncated=bool(traj.truncated[i]),
                prompt_tokens=int(traj.prompt_lengths[i]),
                sampled=int(traj.loss_mask[i].sum()),
                context=int(traj.attention_mask[i].sum()),
            )
    server = make_server(engine, params, MODEL, "127.0.0.1", 0, MAX_BATCH, 200.0)
    serve_in_thread(server)
    try:
        yield dict(url=server.url, server=server, engine=engine, direct=direct, questions=qs)
    finally:
        server.close()


def chat(url, question, **body):
    payload = {"model": MODEL, "messages": [{"role": "user", "content": question}], **body}
    return httpx.post(url + "/v1/chat/completions", json=payload, timeout=HANG_S)


def check_against_direct(body, question, served):
    """A chat.completion for `question` equals the direct greedy rollout's answer, queries and docs."""
    ref = served["direct"][question]
    assert (
        body["object"] == "chat.completion" and body["model"] == MODEL and body["id"].startswith("chatcmpl-")
    )
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": ref["answer"] or ""}
    assert choice["finish_reason"] == ("length" if ref["answer"] is None else "stop")
    agent = choice["search_agent"]
    assert agent["response"] == ref["response"] and agent["turns"] == ref["turns"]
    assert agent["truncated"] == ref["truncated"] and agent["initial_docs"] == []
    assert [[d["id"] for d in s["docs"]] for s in agent["searches"]] == ref["doc_ids"]
    retriever = served["engine"].retriever
    for s in agent["searches"]:  # the query, searched again, gives the served docs; the policy wrote it
        assert f"<search> {s['query']} </search>" in ref["response"]
        again = retriever.search([s["query"]], 1)[0]
        assert [d.id for d in again] == [d["id"] for d in s["docs"]]
        assert [(d.title, d.text) for d in again] == [(d["title"], d["text"]) for d in s["docs"]]
    usage = body["usage"]
    assert usage["prompt_tokens"] == ref["prompt_tokens"] and usage["completion_tokens"] == ref["sampled"]
    assert usage["total_tokens"] == ref["prompt_tokens"] + ref["sampled"]
    # the rest of the direct rollout's context: observation tokens, counted apart
    assert usage["retrieved_tokens"] == ref["context"] - ref["prompt_tokens"] - ref["sampled"]


# ------------------------------------------------------------------------------------------- routes


def test_models(served):
    r = httpx.get(served["url"] + "/v1/models")
    assert r.status_code == 200
    (model,) = r.json()["data"]
    assert r.json()["object"] == "list" and isinstance(model.pop("created"), int)
    assert model == {"id": MODEL, "object": "model", "owned_by": "jaxsearch"}


def test_answer_equals_the_direct_greedy_rollout(served):
    q = served["questions"][0]
    # the server's own sampling restated, a cap it does not reach, and fields accepted at their "off" value
    r = chat(served["url"], q, temperature=0, n=1, max_tokens=10**6, seed=3, top_p=1.0, user="u", metadata={"a": "b"},
             store=False, presence_penalty=0, frequency_penalty=0.0, logprobs=False, logit_bias={}, tools=[])
    assert r.status_code == 200, r.text
    body = r.json()
    check_against_direct(body, q, served)
    # the tiny searcher searches and answers: the checks are not vacuous
    direct = [served["direct"][q] for q in served["questions"]]
    assert any(d["doc_ids"] for d in direct) and any(d["answer"] for d in direct)
    # earlier messages and a system prompt are not shown to the agent: the same episode
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "an earlier question"},
        {"role": "assistant", "content": "an earlier answer"},
        {"role": "user", "content": [{"type": "text", "text": q}]},
    ]
    r = httpx.post(
        served["url"] + "/v1/chat/completions", json={"model": MODEL, "messages": messages}, timeout=HANG_S
    )
    check_against_direct(r.json(), q, served)


def test_stream_deltas_equal_the_completion(served):
    q = served["questions"][1]
    plain = chat(served["url"], q).json()
    events = []
    body = {"model": MODEL, "messages": [{"role": "user", "content": q}], "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", served["url"] + "/v1/chat/completions", json=body, timeout=HANG_S) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: ")
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    # the usage chunk last, with no choices (OpenAI's include_usage)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]
    choices = [c["choices"][0] for c in chunks[:-1]]
    content = "".join(c["delta"].get("content", "") for c in choices)
    assert content == plain["choices"][0]["message"]["content"]
    assert [c["finish_reason"] for c in choices[:-1]] == [None] * (len(choices) - 1)
    last = choices[-1]
    assert last["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert last["search_agent"] == plain["choices"][0]["search_agent"]
    # the episode streamed: the policy's text, searches and observations concatenate to the response
    agent = [c["delta"]["search_agent"] for c in choices if "search_agent" in c["delta"]]
    assert "".join(a.get("text", "") for a in agent) == plain["choices"][0]["search_agent"]["response"]
    searches = [{"query": a["query"], "docs": a["docs"]} for a in agent if a["type"] == "search"]
    assert searches == plain["choices"][0]["search_agent"]["searches"]


def test_concurrent_clients_get_their_own_answers(served):
    """16 clients at once: batched (MAX_BATCH rows, padded), each answer is its own question's."""
    qs = served["questions"]
    results, batches = [None] * len(qs), served["server"].batcher.batches
    barrier = threading.Barrier(len(qs))

    def client(i):
        barrier.wait()
        results[i] = chat(served["url"], qs[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(qs))]
    batcher = served["server"].batcher
    submitted = batcher.submitted
    with batcher.held():  # all 16 queue up first: batching is then deterministic, whatever the load
        for t in threads:
            t.start()
        deadline = time.monotonic() + HANG_S
        while batcher.submitted - submitted < len(qs) and time.monotonic() < deadline:
            time.sleep(0.01)
    for t in threads:
        t.join()
    for q, r in zip(qs, results):
        assert r.status_code == 200, r.text
        check_against_direct(r.json(), q, served)
    assert len({r.json()["choices"][0]["message"]["content"] for r in results}) > 1
    # batched: 16 queued requests make two full rollouts of MAX_BATCH rows
    assert batcher.batches - batches == len(qs) // MAX_BATCH


# ------------------------------------------------------------------------------------------- errors


def error_of(r, status):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"]["message"], str)
    return body["error"]


BAD = [
    ({"messages": [{"role": "user", "content": "q"}]}, "model"),
    ({"model": 3, "messages": [{"role": "user", "content": "q"}]}, "model"),
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": "who?"}, "messages"),
    ({"model": MODEL, "messages": [5]}, "messages[0]"),
    ({"model": MODEL, "messages": [{"content": "q"}]}, "messages[0].role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    ({"model": MODEL, "messages": [{"role": "system", "content": "s"}]}, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": " "}]},
     "messages[1].content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "q"}], "n": MAX_BATCH + 1}, "n"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "q"}], "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "q"}], "temperature": 2.5}, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "q"}], "temperature": -1}, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "q"}], "stream": "yes"}, "stream"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "q"}], "seed": 1.5}, "seed"),
]  # fmt: skip


@pytest.mark.parametrize("body,param", BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_malformed_requests_name_the_field(served, body, param):
    error = error_of(httpx.post(served["url"] + "/v1/chat/completions", json=body), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert param in error["message"]


def test_bad_json_unknown_model_routes_and_methods(served):
    url = served["url"]
    for raw in (b"{not json", b"[1, 2]", b"\xff"):
        error = error_of(httpx.post(url + "/v1/chat/completions", content=raw), 400)
        assert error["type"] == "invalid_request_error" and error["param"] is None
    body = {"model": "gpt-4", "messages": [{"role": "user", "content": "q"}]}
    error = error_of(httpx.post(url + "/v1/chat/completions", json=body), 404)
    assert error["param"] == "model" and error["code"] == "model_not_found"
    for method, path in (("GET", "/v1/nothing"), ("POST", "/v2/chat/completions"), ("GET", "/")):
        assert error_of(httpx.request(method, url + path), 404)["type"] == "invalid_request_error"
    for method, path, allow in (
        ("GET", "/v1/chat/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", "/v1/models", "GET"),
        ("PUT", "/v1/chat/completions", "POST"),
    ):
        r = httpx.request(method, url + path, json={})
        error_of(r, 405)
        assert r.headers["allow"] == allow
    # the server still answers after all that
    assert httpx.get(url + "/v1/models").status_code == 200


def test_a_question_too_long_for_the_cache_fails_alone(served):
    """A prompt without cache room is a 400 for its request only; the one batched with it is answered. The
    server's own --max-message-tokens check would refuse it before any batch (tests/test_faults_servers.py):
    lifted here, so the rollout's check is the one tested."""
    q = served["questions"][2]
    long = " ".join(["who"] * 2000) + "?"
    server = served["server"]
    limits = server.limits
    server.limits = dataclasses.replace(limits, max_message_tokens=10**6)
    try:
        _check_too_long_fails_alone(served, q, long)
    finally:
        server.limits = limits


def _check_too_long_fails_alone(served, q, long):
    results = [None, None]
    barrier = threading.Barrier(2)

    def client(i, question):
        barrier.wait()
        results[i] = chat(served["url"], question)

    threads = [threading.Thread(target=client, args=(i, x)) for i, x in enumerate((q, long))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_against_direct(results[0].json(), q, served)
    assert error_of(results[1], 400)["param"] == "messages"
    # streamed: the error comes as an event after the role chunk (the headers went out first), then [DONE]
    payload = {"model": MODEL, "messages": [{"role": "user", "content": long}], "stream": True}
    with httpx.stream("POST", served["url"] + "/v1/chat/completions", json=payload, timeout=HANG_S) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant"}
    assert json.loads(events[1])["error"]["param"] == "messages" and events[2:] == ["[DONE]"]


# ------------------------------------------------------------------------------------------- CLI


def cli(*args, timeout=HANG_S):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    return subprocess.run(
        [sys.executable, str(SERVE), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_help_and_bad_input(tiny, tmp_path):
    proc = cli("--help")
    assert proc.returncode == 0
    for flag in ("--checkpoint", "--protocol", "--eka-tags", "--retriever", "--url", "--max-batch",
                 "--batch-wait-ms", "--host", "--model-name", "--temperature", "--cache-len", "--run"):  # fmt: skip
        assert flag in proc.stdout
    args = list(map(str, cli_args(tiny)))
    cases = [
        ("--checkpoint", str(tmp_path / "missing"), "missing"),
        ("--corpus", str(tmp_path / "nope.jsonl"), "nope.jsonl"),
        ("--tokenizer", str(tmp_path / "tok.json"), "tok.json"),
        ("--max-batch", "0", "--max-batch"),
    ]
    for flag, value, named in cases:
        bad = list(args)
        bad[bad.index(flag) + 1] = value
        proc = cli(*bad)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and named in lines[0]
    proc = cli(*[a for a in args if a not in ("--corpus", str(tiny["corpus"]))])
    assert proc.returncode == 2 and "--corpus" in proc.stderr


def test_command_line_server(tiny, served):
    """launch/serve_agent.py as a process on a free port (--port 0): the address it prints answers."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    cmd = [sys.executable, str(SERVE), *map(str, cli_args(tiny)), "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving"), proc.stderr.read() if proc.poll() is not None else line
        url = line.split(" on ")[1].split()[0].removesuffix("/v1")
        assert url.startswith("http://127.0.0.1:")
        q = served["questions"][3]
        r = chat(url, q)
        assert r.status_code == 200, r.text
        check_against_direct(r.json(), q, served)
    finally:
        proc.terminate()
        proc.wait(timeout=HANG_S)
        proc.stdout.close()
        proc.stderr.close()
