"""Chat-model backends and the judge / evidence-answerer adapters.

OpenAIChatModel against a fake OpenAI server (FastAPI under uvicorn in a thread, 127.0.0.1 only);
LocalChatModel against `sampler.generate` on a tiny random Qwen2; adapters on hand cases.
"""

import asyncio
import json
import threading
import time

import jax
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from jaxsearch.models import orbax_io
from jaxsearch.models.word_tokenizer import WordTokenizer
from jaxsearch.models import hf_io, qwen2
from jaxsearch.scoring import judge as J
from jaxsearch.scoring.rewards import RewardInput, evidence_reward, judge_fabrication
from jaxsearch.agent.sampler import generate

from tiny_models import tiny_qwen2_config
from net import free_port

MODEL = "judge-model"


# ------------------------------------------------------------------------------ fake OpenAI server


class FakeOpenAI:
    """`/v1/chat/completions` that records each request and replies with JSON echoing the last message:
    `{"reason": "echo: <content>", "grounded": <"</information>" in content>}`.

    `script` holds what the next requests get instead, in order: an HTTP status code, "hang" (sleep past
    the client's timeout, then answer) or "garbage" (200 without choices). max_tokens above 4096 is a 400, as vLLM's context check.
    """

    def __init__(self):
        self.app = FastAPI()
        self.reset()

        @self.app.post("/v1/chat/completions")
        async def complete(request: Request):
            body = await request.json()
            self.requests.append({"body": body, "auth": request.headers.get("authorization")})
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                step = self.script.pop(0) if self.script else None
                await asyncio.sleep(1.0 if step == "hang" else self.delay)
                if step == "garbage":
                    return {"object": "chat.completion", "choices": []}
                if isinstance(step, int):
                    return JSONResponse(
                        {"error": {"message": f"scripted {step}", "code": step}}, status_code=step
                    )
                if body["max_tokens"] > 4096:
                    message = f"max_tokens={body['max_tokens']} exceeds the context of 4096 tokens"
                    return JSONResponse({"error": {"message": message, "code": 400}}, status_code=400)
                content = body["messages"][-1]["content"]
                reply = json.dumps({"reason": f"echo: {content}", "grounded": "</information>" in content})
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                }
                return {"id": "x", "object": "chat.completion", "model": body["model"], "choices": [choice]}
            finally:
                self.in_flight -= 1

    def reset(self, script=(), delay=0.0):
        self.requests, self.script, self.delay = [], list(script), delay
        self.in_flight = self.max_in_flight = 0


def serve(app, port):
    """Run `app` on 127.0.0.1:port in a thread; returns the uvicorn server (set should_exit to stop)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    server.thread = thread
    return server


def stop(server):
    server.should_exit = True
    server.thread.join(timeout=10)


@pytest.fixture(scope="module")
def fake_server():
    fake, port = FakeOpenAI(), free_port()
    server = serve(fake.app, port)
    while not server.started:
        time.sleep(0.01)
    yield fake, f"http://127.0.0.1:{port}"
    stop(server)


@pytest.fixture
def fake(fake_server):
    fake, url = fake_server
    fake.reset()
    return fake, url


def user(text):
    return [{"role": "user", "content": text}]


def echoed(reply):
    return json.loads(reply)["reason"].removeprefix("echo: ")


# ------------------------------------------------------------------------------------ OpenAI tests


def test_chat_completions_url():
    assert J.chat_completions_url("http://h:8004") == "http://h:8004/v1/chat/completions"
    assert J.chat_completions_url("http://h:8004/v1/") == "http://h:8004/v1/chat/completions"
    assert J.chat_completions_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"


def test_request_schema_and_replies(fake):
    server, url = fake
    model = J.OpenAIChatModel(url + "/v1", MODEL, api_key="sk-test")
    batch = [
        [{"role": "system", "content": "Be strict."}, {"role": "user", "content": "first"}],
        user("second"),
    ]
    replies = model.chat(batch, max_tokens=64, temperature=0.3, top_p=0.9)
    assert [echoed(r) for r in replies] == ["first", "second"]
    bodies = sorted((r["body"] for r in server.requests), key=lambda b: len(b["messages"]))
    assert bodies == [
        {"model": MODEL, "messages": batch[1], "max_tokens": 64, "temperature": 0.3, "top_p": 0.9},
        {"model": MODEL, "messages": batch[0], "max_tokens": 64, "temperature": 0.3, "top_p": 0.9},
    ]
    assert [r["auth"] for r in server.requests] == ["Bearer sk-test"] * 2
    assert model.chat([], 8, 0.0) == []
    model.close()


def test_batch_of_32_runs_concurrently_in_order(fake):
    server, url = fake
    server.reset(delay=0.2)
    model = J.OpenAIChatModel(url, MODEL, max_concurrency=16)
    prompts = [f"prompt {i}" for i in range(32)]
    start = time.monotonic()
    replies = model.chat([user(p) for p in prompts], 16, 0.0)
    elapsed = time.monotonic() - start
    assert [echoed(r) for r in replies] == prompts
    assert len(server.requests) == 32
    assert 8 <= server.max_in_flight <= 16
    assert elapsed < 32 * 0.2 / 4  # serial would take 6.4 s; 16 at a time about 0.4 s


def test_retries_5xx_429_and_timeouts(fake):
    server, url = fake
    server.reset(script=[503, 429, 503, "hang"])
    model = J.OpenAIChatModel(url, MODEL, timeout=0.3, retries=5, backoff=0.05)
    assert echoed(model.chat([user("after failures")], 8, 0.0)[0]) == "after failures"
    assert len(server.requests) == 5


def test_retries_until_a_late_server_is_up():
    port = free_port()
    late = FakeOpenAI()
    holder = {}
    timer = threading.Timer(0.8, lambda: holder.update(server=serve(late.app, port)))
    start = time.monotonic()  # before the timer: the server is up no sooner than 0.8 s after this
    timer.start()
    model = J.OpenAIChatModel(f"http://127.0.0.1:{port}", MODEL, retries=8, backoff=0.1)
    try:
        assert echoed(model.chat([user("late")], 8, 0.0)[0]) == "late"
        assert time.monotonic() - start >= 0.8
    finally:
        timer.join()
        stop(holder["server"])


def test_clear_error_when_the_server_stays_down():
    url = f"http://127.0.0.1:{free_port()}"
    model = J.OpenAIChatModel(url, MODEL, retries=2, backoff=0.05)
    start = time.monotonic()
    with pytest.raises(J.ChatModelUnavailable, match=f"{url}/v1/chat/completions is down: 3 attempts") as e:
        model.chat([user("a"), user("b")], 8, 0.0)
    assert "ConnectError" in str(e.value)
    assert time.monotonic() - start < 5


def test_4xx_is_not_retried_and_shows_the_servers_message(fake):
    server, url = fake
    model = J.OpenAIChatModel(url, MODEL, retries=5, backoff=5.0)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"HTTP 400\).*max_tokens=9000 exceeds the context of 4096 tokens"):
        model.chat([user("too long")], 9000, 0.0)
    assert len(server.requests) == 1 and time.monotonic() - start < 2


def test_a_reply_without_choices_is_a_clear_error(fake):
    server, url = fake
    server.reset(script=["garbage"])
    with pytest.raises(ValueError, match=r"chat/completions: expected a chat completion with choices\[0\]"):
        J.OpenAIChatModel(url, MODEL).chat([user("x")], 8, 0.0)


def test_fabrication_judge_over_http(fake):
    _, url = fake
    judge = J.ChatJudge(J.make_chat_model("openai", base_url=url, model=MODEL))
    samples = [
        RewardInput(
            "<think>x</think><information>Paris is in France.</information><answer>Paris</answer>", ["Paris"]
        ),
        RewardInput("<think>I recall it.</think><answer>Paris</answer>", ["Paris"], question="Where?"),
    ]
    np.testing.assert_array_equal(judge_fabrication(judge, samples), [0.0, 1.0])


# ------------------------------------------------------------------------------------- local model

TEXTS = [
    "Which river flows through Velmar?",
    "The Lisul River flows through Velmar and Ostrad.",
    "Who founded the Orrin Guild?",
    "Answer the question based on the given passages.",
]
CONVERSATIONS = [user(t) for t in TEXTS] + [[{"role": "system", "content": "Judge."}, *user("Velmar?")]]
MAX_NEW = 12


def random_params(config, seed=0):
    """Random params of `qwen2.init_params`' shapes (std 0.2, unit norm scales), built in numpy: fast."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: qwen2.init_params(config, jax.random.PRNGKey(0)))

    def fill(path, s):
        if path[-1].key == "scale":
            return np.ones(s.shape, np.float32)
        return rng.normal(0.0, 0.2, s.shape).astype(np.float32)

    return jax.tree_util.tree_map_with_path(fill, shapes)


def _eos_test_params(config, tok, ids):
    """Random params (seeds 0, 1, ...) whose eos logit is 1.1x token t's, t chosen so that greedy rows differ, and
    some stop at eos (where they would write t) while others run to MAX_NEW: checked with `generate`."""
    for seed in range(8):
        base = random_params(config, seed)
        written = [set(n) for n in generate(config, base, ids, MAX_NEW)]
        # a token some rows write and others never do: those rows may stop early, the others cannot
        for t in sorted(set.union(*written) - set.intersection(*written) - {tok.eos_id}):
            params = jax.tree_util.tree_map(np.copy, base)
            params["lm_head"][:, tok.eos_id] = 1.1 * params["lm_head"][:, t]
            new = generate(config, params, ids, MAX_NEW, stop=[tok.eos_id])
            lengths = [len(n) for n in new]
            if min(lengths) < MAX_NEW and max(lengths) == MAX_NEW and len({tuple(n) for n in new}) == len(new):
                return params
    raise AssertionError("no random params give distinct rows that stop at eos beside rows that run to the budget")


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Qwen2 (`_eos_test_params`) whose greedy rows differ, some stopping at eos, some at the budget."""
    tok = WordTokenizer.build(TEXTS)
    config = tiny_qwen2_config(tok.vocab_size, num_hidden_layers=2)
    ids = [
        tok.encode(tok.apply_chat_template(c, add_generation_prompt=True), allow_special=True)
        for c in CONVERSATIONS
    ]
    params = _eos_test_params(config, tok, ids)
    model = J.LocalChatModel(config, params, tok, cache_len=96, max_new_tokens=MAX_NEW, batch_size=4)
    return tok, config, params, model


def test_local_greedy_matches_generate(tiny):
    tok, config, params, model = tiny
    replies = model.chat(CONVERSATIONS, MAX_NEW, 0.0)
    ids = [
        tok.encode(tok.apply_chat_template(c, add_generation_prompt=True), allow_special=True)
        for c in CONVERSATIONS
    ]
    new = generate(config, params, ids, MAX_NEW, stop=[tok.eos_id])
    assert replies == [tok.decode(n, skip_special=True) for n in new]
    lengths = [len(n) for n in new]
    assert min(lengths) < MAX_NEW and max(lengths) == MAX_NEW  # rows stop at eos and at the budget
    assert len(set(replies)) == len(replies)


def test_local_chunks_equal_one_by_one_without_recompiling(tiny):
    _, _, _, model = tiny
    batched = model.chat(CONVERSATIONS, MAX_NEW, 0.0)  # chunks of 4: the second is padded with 3 copies
    compiled = model.sampler(0.0).compiled_count()
    assert [model.chat([c], MAX_NEW, 0.0)[0] for c in CONVERSATIONS] == batched
    assert model.chat(CONVERSATIONS[::-1][:3], MAX_NEW, 0.0) == batched[::-1][:3]
    assert model.sampler(0.0).compiled_count() == compiled


def test_local_budget_cap_and_prompt_limit(tiny):
    _, _, _, model = tiny
    full = model.chat(CONVERSATIONS, MAX_NEW, 0.0)
    assert model.chat(CONVERSATIONS, 10 * MAX_NEW, 0.0) == full  # capped by max_new_tokens
    short = model.chat(CONVERSATIONS, 3, 0.0)
    assert all(f.startswith(s) for f, s in zip(full, short)) and short != full
    with pytest.raises(ValueError, match="conversation 1: .* exceed cache_len=96"):
        model.chat([user("hi"), user(" ".join(["Velmar"] * 90))], MAX_NEW, 0.0)


def test_local_sampling_follows_the_seed(tiny):
    tok, config, params, _ = tiny
    a = J.LocalChatModel(config, params, tok, 96, MAX_NEW, temperature=1.0, batch_size=4, seed=3)
    b = J.LocalChatModel(config, params, tok, 96, MAX_NEW, temperature=1.0, batch_size=4, seed=3)
    first = a.chat(CONVERSATIONS, MAX_NEW, 1.0)
    assert b.chat(CONVERSATIONS, MAX_NEW, 1.0) == first
    assert a.chat(CONVERSATIONS, MAX_NEW, 1.0) != first  # the next chunks use the next seeds


def test_make_local_chat_model_from_checkpoints(tiny, tmp_path):
    tok, config, params, model = tiny
    expected = model.chat(CONVERSATIONS, MAX_NEW, 0.0)
    tok.save(tmp_path / "tok.json")
    orbax_io.save_params(str(tmp_path / "orbax"), config, params)
    hf_io.save_hf(config, params, str(tmp_path / "hf"))
    for sub in ("orbax", "hf"):
        loaded = J.make_chat_model(
            "local",
            path=str(tmp_path / sub),
            tokenizer=str(tmp_path / "tok.json"),
            cache_len=96,
            max_new_tokens=MAX_NEW,
        )
        assert loaded.chat(CONVERSATIONS, MAX_NEW, 0.0) == expected, sub
    direct = J.make_chat_model(
        "local", config=config, params=params, tokenizer=tok, cache_len=96, max_new_tokens=4
    )
    assert isinstance(direct, J.LocalChatModel) and direct.max_new_tokens == 4
    with pytest.raises(ValueError, match="unknown chat model kind 'vllm'"):
        J.make_chat_model("vllm")


# ---------------------------------------------------------------------------------------- adapters


class ScriptedChat:
    """A fake chat model: reply(messages) -> text; records every call."""

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    def chat(self, batch, max_tokens, temperature, top_p=1.0):
        self.calls.append((batch, max_tokens, temperature, top_p))
        return [self.reply(m) for m in batch]


def test_chat_judge_messages_and_verdicts():
    chat = ScriptedChat(
        lambda m: '{"reason": "ok", "grounded": %s}' % ("true" if "doc" in m[-1]["content"] else "false")
    )
    judge = J.ChatJudge(chat, max_tokens=300)
    system = {"role": "system", "content": "You are a strict judge."}
    conversations = [
        [system, {"role": "user", "content": "with doc"}],
        [system, {"role": "user", "content": "without"}],
    ]
    assert judge.judge(conversations) == [
        '{"reason": "ok", "grounded": true}',
        '{"reason": "ok", "grounded": false}',
    ]
    assert chat.calls == [(conversations, 300, 0.0, 1.0)]
    plain = ScriptedChat(lambda m: "")
    J.ChatJudge(plain).judge([[{"role": "user", "content": "p"}]])
    assert plain.calls == [([[{"role": "user", "content": "p"}]], 512, 0.0, 1.0)]


def test_evidence_answerer_uses_r_search_prompt():
    chat = ScriptedChat(lambda m: "  Lisul River \n")
    answerer = J.ChatEvidenceAnswerer(chat)
    assert answerer.answer(["Which river flows through Velmar?"], ["The Lisul flows through {Velmar}."]) == [
        "Lisul River"
    ]
    prompt = (
        "Answer the question based on the given passages. Only give me the answer and do not output any "
        "other words.\n\nThe following are given passages:\nThe Lisul flows through {Velmar}.\n\n"
        "Question: Which river flows through Velmar?\nAnswer:"
    )
    # R-Search's evidence.yaml samples the evidence model at temperature 0.1, top_p 0.9
    assert chat.calls == [([[{"role": "user", "content": prompt}]], 512, 0.1, 0.9)]


def test_evidence_answerer_reads_the_answer_tag_when_asked():
    replies = {
        "q1": "<think>The passage says so.</think> <answer> Lisul River </answer>",
        "q2": "Lisul River",
    }
    chat = ScriptedChat(lambda m: replies[m[0]["content"].split("Q: ")[1].split("\n")[0]])
    answerer = J.ChatEvidenceAnswerer(chat, "E: {evidence}\nQ: {question}\nReply inside <answer></answer>.")
    assert answerer.answer(["q1", "q2"], ["e", "e"]) == ["Lisul River", ""]
    with pytest.raises(ValueError, match=r"fields \{evidence\} and \{question\}, got \['evidence'\]"):
        J.ChatEvidenceAnswerer(chat, "E: {evidence}")
    with pytest.raises(ValueError, match=r"got \['evidence', 'question', 'x'\]"):
        J.ChatEvidenceAnswerer(chat, "{evidence} {question} {x}")


def test_evidence_reward_end_to_end():
    answers = {"river": "Lisul", "founder": "Maren Orrin"}
    chat = ScriptedChat(lambda m: next(a for k, a in answers.items() if k in m[0]["content"]))
    samples = [
        RewardInput(
            "<information>d</information><evidence>the river</evidence><answer>x</answer>", ["Lisul River"]
        ),
        RewardInput("<answer>x</answer>", ["Lisul River"]),  # no evidence: 0 and not sent
        RewardInput("<information>d</information><evidence>the founder</evidence>", ["Maren Orrin"]),
    ]
    rewards = evidence_reward(J.ChatEvidenceAnswerer(chat))(samples)
    # "Lisul" vs "Lisul River": P=1, R=1/2, F1 2/3, rounded to 2 decimals as R-Search's F1_check
    np.testing.assert_allclose(rewards, [0.67, 0.0, 1.0])
    assert len(chat.calls) == 1 and len(chat.calls[0][0]) == 2
