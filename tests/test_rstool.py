"""RSTool (seed 002 §1, §6; issue 39 item 8(d)): `POST /v1/rstool` on the agent server takes a question,
runs R-Search's reasoning-search episode through the server's batcher and engine, and returns the evidence the
policy wrote. The policy is scripted (`ScriptedSampler` over the Qwen2.5 BPE, no model), so the expected
evidence is the scripted text itself; the rest of the episode is checked against a direct rollout of the same
engine.
"""

import threading
import time

import httpx
import numpy as np
import pytest

from hang import HANG_S
from jaxsearch.agent.engine import AgentEngine
from jaxsearch.agent.protocols import get_protocol
from jaxsearch.agent.sampler import SamplingParams, StopTable
from jaxsearch.config import EpisodeConfig
from jaxsearch.retrieval.base import Doc
from jaxsearch.serving.server import Limits, make_server, serve_in_thread
from test_graphr1_setting import TOK, ScriptedSampler

MODEL = "rsearch-tool"
HAMLET = "Who wrote Hamlet?"
FRANCE = "What is the capital of France?"
EVIDENCE = "Hamlet is a tragedy written by William Shakespeare."
SCRIPTS = {  # what the policy writes, decode call by decode call, for each question
    HAMLET: [
        "I need the author of Hamlet. <search> Hamlet author </search>",
        f"The passage names him.\n<evidence> {EVIDENCE} </evidence>\n<answer> William Shakespeare </answer>",
    ],
    FRANCE: ["I know this one. <answer> Paris </answer>"],  # no search, so no evidence (R-Search's prompt)
}
# scripts/evidence.yaml PROMPT (R-Search's frozen reader), typed out; qa_f1.py evidence_eval formats it with
# the evidence and the stripped question, then strips it
READER_PROMPT = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nThe following are given passages:\n{evidence}\n\nQuestion: {query}\nAnswer:"
)


class QuestionSampler(ScriptedSampler):
    """Each row writes the script of the question in its prompt (from each rollout's start), whatever it is
    batched with; with the settings the engine reads of a sampler serving per-row requests."""

    sampling = SamplingParams(temperature=0.0)

    def __init__(self, stop_strings):
        super().__init__(TOK, stop_strings, [], cache_len=1024, max_segment=128)
        self.table = StopTable.from_arrays(
            np.zeros((1, 1), np.uint8), np.zeros(1, np.int32), stop_strings, [TOK.eos_id]
        )

    def start(self, params, prompts, keys):
        texts = [TOK.decode(list(p)) for p in prompts]
        self.scripts = [list(next(s for q, s in SCRIPTS.items() if q in t)) for t in texts]
        self.appended = [[] for _ in prompts]
        return super().start(params, prompts, keys)


class HamletRetriever:
    def search(self, queries, k):
        return [[Doc("hamlet", "Hamlet", EVIDENCE)] for _ in queries]


def engine_for(protocol_name):
    protocol = get_protocol(protocol_name)
    limits = EpisodeConfig(max_turns=3, retrieval_k=1, max_segment_tokens=128, scheduler="lockstep")
    return AgentEngine(TOK, protocol, HamletRetriever(), QuestionSampler(protocol.stop_strings), limits)


@pytest.fixture(scope="module")
def served():
    engine = engine_for("rsearch")
    direct = engine.rollout(None, [HAMLET, FRANCE], 0)
    server = make_server(engine, None, MODEL, port=0, max_batch=2, batch_wait_ms=50.0,
                         limits=Limits(max_message_tokens=32))  # fmt: skip
    serve_in_thread(server)
    try:
        yield server, direct
    finally:
        server.close()


def rstool(server, **body):
    return httpx.post(server.url + "/v1/rstool", json={"model": MODEL, **body}, timeout=HANG_S)


def test_returns_the_evidence_of_the_episode(served):
    server, direct = served
    r = rstool(server, question=HAMLET, temperature=0, seed=7)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "rstool.evidence" and body["id"].startswith("rstool-") and body["model"] == MODEL
    assert body["question"] == HAMLET
    assert body["evidence"] == EVIDENCE  # the policy's <evidence> block, stripped
    assert body["reader_prompt"] == READER_PROMPT.format(evidence=EVIDENCE, query=HAMLET).strip()
    assert (body["answer"], body["finish_reason"]) == ("William Shakespeare", "stop")
    agent = body["search_agent"]
    assert agent["response"] == direct.responses[0]  # the episode a direct rollout runs
    assert SCRIPTS[HAMLET][1] in agent["response"] and "<information>" in agent["response"]
    searches = [(s["query"], [d["id"] for d in s["docs"]]) for s in agent["searches"]]
    assert searches == [("Hamlet author", ["hamlet"])]
    assert body["usage"]["completion_tokens"] == int(direct.loss_mask[0].sum())


def test_no_search_no_evidence(served):
    server, _ = served
    body = rstool(server, question=FRANCE).json()
    assert (body["evidence"], body["reader_prompt"], body["answer"]) == (None, None, "Paris")


def test_batched_with_a_chat_request(served):
    """An RSTool request and a chat request queued together run as one rollout of two rows."""
    server, _ = served
    replies, batches, submitted = {}, server.batcher.batches, server.batcher.submitted

    def chat():
        payload = {"model": MODEL, "messages": [{"role": "user", "content": FRANCE}]}
        replies["chat"] = httpx.post(server.url + "/v1/chat/completions", json=payload, timeout=HANG_S)

    def tool():
        replies["tool"] = rstool(server, question=HAMLET)

    threads = [threading.Thread(target=f) for f in (chat, tool)]
    with server.batcher.held():  # both queue up before the worker takes a batch
        for t in threads:
            t.start()
        deadline = time.monotonic() + HANG_S
        while server.batcher.submitted < submitted + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    for t in threads:
        t.join(HANG_S)
    assert server.batcher.batches == batches + 1
    assert replies["chat"].json()["choices"][0]["message"]["content"] == "Paris"
    assert replies["tool"].json()["evidence"] == EVIDENCE


@pytest.mark.parametrize(
    "body, status, param, says",
    [
        ({}, 400, "question", "expected a string, got nothing"),
        ({"question": 3}, 400, "question", "expected a string, got int"),
        ({"question": "  "}, 400, "question", "empty"),
        ({"question": HAMLET, "messages": []}, 400, "messages", "unknown field"),
        ({"question": HAMLET, "stream": True}, 400, "stream", "unknown field"),
        ({"question": HAMLET, "temperature": 5}, 400, "temperature", "[0, 2]"),
        ({"question": HAMLET, "seed": -1}, 400, "seed", "integer"),
        ({"question": "word " * 40}, 400, "question", "over the limit of 32"),
        ({"question": HAMLET, "model": "other"}, 404, "model", "does not exist"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(served, body, status, param, says):
    server, _ = served
    r = httpx.post(server.url + "/v1/rstool", json={"model": MODEL, **body}, timeout=HANG_S)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"]


def test_wrong_method_and_malformed_body(served):
    server, _ = served
    r = httpx.get(server.url + "/v1/rstool", timeout=HANG_S)
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    r = httpx.post(server.url + "/v1/rstool", content=b"{not json", timeout=HANG_S)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/rstool", json=[HAMLET], timeout=HANG_S)
    assert r.status_code == 400 and "expected a JSON object, got list" in r.json()["error"]["message"]


def test_a_policy_without_evidence_has_no_rstool():
    server = make_server(engine_for("rsearch_no_evidence"), None, MODEL, port=0, max_batch=1)
    serve_in_thread(server)
    try:
        r = rstool(server, question=HAMLET)
        assert r.status_code == 404
        error = r.json()["error"]
        assert error["code"] == "rstool_unavailable"
        assert "'rsearch_no_evidence' writes none" in error["message"]
        assert server.batcher.submitted == 0  # refused before any rollout
    finally:
        server.close()
