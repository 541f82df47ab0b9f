"""The served agent through the official `openai` client (issue 44): README's serving example as written, a
run served by `jaxsearch-serve --run` in a real process on loopback, every honoured request parameter, the
refused ones (400s naming them), streaming as the episode runs, concurrent requests of mixed settings, and
client disconnects (an in-process server over a scripted engine).

References: a seeded or greedy request's reply sent alone (replies of the same request must be equal
whatever they are batched with), the greedy reply cut by hand (stop, max_tokens), greedy itself (top_p
towards 0, n copies), and the non-streamed completion (streams)."""

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import httpx
import numpy as np
import pytest

from hang import HANG_S
from tiny_models import save_tiny_searcher

openai = pytest.importorskip("openai")  # the [test] extra

# the worker of tests/test_serve_agent.py runs the module: its tests share one server process, whose
# programs that module's server process compiled (the session's XLA cache)
pytestmark = pytest.mark.xdist_group("serve_agent")

ROOT = Path(__file__).resolve().parents[1]
RUN = "runs/tiny_cpu"
MODEL = "tiny_cpu"  # the run directory's name
QUESTION = "What is the birthplace of the director of Feirum Night?"  # the tiny world's first test question

# README's "## Serving" section, as written there (tests/test_serve_openai.py runs both)
SERVE_COMMAND = "jaxsearch-serve --run runs/tiny_cpu --port 8000"
CLIENT_SNIPPET = '''\
from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
question = "What is the birthplace of the director of Feirum Night?"
reply = client.chat.completions.create(model="tiny_cpu", messages=[{"role": "user", "content": question}])
print(reply.choices[0].message.content, [s["query"] for s in reply.choices[0].search_agent["searches"]])
'''


def make_run(run_dir: Path) -> None:
    """A launch/train.py workdir as the Quickstart leaves it, built on purpose: config.json of
    configs/tiny_cpu.py resolved as rl/pipeline.py resolves it (paths relative to the cwd training ran in),
    onto the tiny searcher: its params as the RL stage's final policy, its word tokenizer and corpus."""
    from configs import tiny_cpu
    from jaxsearch.config import RunConfig, TokenizerConfig
    from jaxsearch.rl.pipeline import record_config, rl_stage

    world = run_dir / "world"
    world.mkdir(parents=True)
    _, _, tokenizer, _, retriever = save_tiny_searcher(world)  # world/ckpt, tokenizer.json, test.jsonl
    shutil.copy(retriever.corpus.path, world / "corpus.jsonl")
    cfg = RunConfig.from_dict(tiny_cpu.get_config())
    os.makedirs(run_dir / rl_stage(cfg))
    os.rename(world / "ckpt", run_dir / rl_stage(cfg) / "params")
    relative = f"{RUN}/world"
    cfg = cfg.replace(
        tokenizer=TokenizerConfig("word", f"{relative}/tokenizer.json"),
        retriever=dataclasses.replace(cfg.retriever, corpus=f"{relative}/corpus.jsonl"),
        data=dataclasses.replace(
            cfg.data, train=f"{relative}/test.jsonl", eval={"synthetic": f"{relative}/test.jsonl"}
        ),
        model=dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size, orbax_path=None),
        # the limits tests/test_serve_agent.py serves the tiny searcher with: the same programs, so this
        # module's server process finds them in the session's XLA cache when that module ran first
        rollout=dataclasses.replace(cfg.rollout, max_turns=2, max_obs_tokens=150, cache_len=768),
    )
    record_config(cfg, str(run_dir))


@pytest.fixture(scope="module")
def run_cwd(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("serve_openai")
    make_run(cwd / RUN)
    return cwd


@pytest.fixture(scope="module")
def server(run_cwd):
    """README's command, run as written in a cwd holding runs/tiny_cpu, on a free port (the only change)."""
    cmd = shlex.split(SERVE_COMMAND.replace("--port 8000", "--port 0"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    proc = subprocess.Popen(
        cmd, cwd=run_cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith(f"serving '{MODEL}' on http://127.0.0.1:"):
            proc.wait(timeout=HANG_S)  # stdout closed: the process is ending
            pytest.fail(f"{SERVE_COMMAND} printed {line!r}; stderr:\n{proc.stderr.read()}")
        url = line.split(" on ")[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=HANG_S)
        yield types.SimpleNamespace(url=url, client=client, cwd=run_cwd, replies={})
    finally:
        proc.terminate()
        proc.wait(timeout=HANG_S)
        proc.stdout.close()
        proc.stderr.close()


def create(server, **kw):
    return server.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": kw.pop("question", QUESTION)}], **kw
    )


def record(completion) -> tuple:
    """What must be equal between two replies of one request: per choice the answer, finish reason and
    search_agent (queries, docs, response), and the usage."""
    choices = [(c.index, c.message.content, c.finish_reason, c.search_agent) for c in completion.choices]
    return choices, completion.usage.model_dump()


def alone(server, **kw) -> tuple:
    """The reply of a request sent alone (cached per request: a reference for the tests)."""
    key = json.dumps(kw, sort_keys=True)
    if key not in server.replies:
        server.replies[key] = record(create(server, **kw))
    return server.replies[key]


def agent_of(rec, choice=0) -> dict:
    return rec[0][choice][3]


# ------------------------------------------------------------------------------------------- README


def readme_serving_blocks() -> list[str]:
    """The fenced blocks of README.md's "## Serving" section."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^## Serving\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if match is None:
        pytest.skip(
            "README.md has no '## Serving' section yet (its text: SERVE_COMMAND and CLIENT_SNIPPET here)"
        )
    return [b for _, b in re.findall(r"```(\w*)\n(.*?)```", match.group(1), re.S)]


def test_readme_serving_section_is_what_the_tests_run():
    blocks = readme_serving_blocks()
    assert SERVE_COMMAND + "\n" in blocks and CLIENT_SNIPPET in blocks


def test_readme_client_snippet_runs_as_written(server):
    """The snippet (only its port changed) against README's command: the greedy reply of the question."""
    port = server.url.split(":")[-1].removesuffix("/v1")
    snippet = CLIENT_SNIPPET.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    assert snippet.count(port) == 1
    proc = subprocess.run(
        [sys.executable, "-c", snippet], cwd=server.cwd, capture_output=True, text=True, timeout=HANG_S
    )
    assert proc.returncode == 0, proc.stderr
    ref = alone(server)
    assert proc.stdout == f"{ref[0][0][1]} {[s['query'] for s in agent_of(ref)['searches']]}\n"


# ------------------------------------------------------------------------------------------- models, --run


def test_models_retrieve(server):
    """GET /v1/models/{id} (the issue: models.retrieve was a 404); the id is the run directory's name."""
    model = server.client.models.retrieve(MODEL)
    assert (model.id, model.object, model.owned_by) == (MODEL, "model", "jaxsearch")
    assert [m.id for m in server.client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError) as e:
        server.client.models.retrieve("params")
    assert e.value.code == "model_not_found" and "'params'" in e.value.message


def test_run_flags_conflict_and_an_unfinished_run(run_cwd, tmp_path, capsys):
    from jaxsearch.cli import serve_agent

    with pytest.raises(SystemExit) as e:
        serve_agent.parse_args(
            ["--run", str(run_cwd / RUN), "--checkpoint", "x", "--topk", "3", "--temperature", "1"]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "drop --checkpoint, --topk" in err and "--temperature" not in err.split("drop")[1]
    unfinished = tmp_path / "run"
    shutil.copytree(run_cwd / RUN, unfinished, ignore=shutil.ignore_patterns("params"))
    (unfinished / "grpo" / "checkpoints" / "20").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no final policy yet .*grpo/params.* step 20 of 40"):
        serve_agent.run_policy(str(unfinished))


# ------------------------------------------------------------------------------------------- parameters


def test_max_tokens_caps_the_policys_tokens(server):
    """max_tokens / max_completion_tokens (the issue: ignored, a 67-token reply to max_tokens=16): the greedy
    episode cut at the cap, finish_reason "length", no answer."""
    full = alone(server)
    tokens = full[1]["completion_tokens"]
    cap = min(16, tokens - 1)
    for field in ("max_tokens", "max_completion_tokens"):
        capped = alone(server, **{field: cap})
        (_, content, finish, agent), usage = capped[0][0], capped[1]
        assert (content, finish) == ("", "length") and usage["completion_tokens"] == cap
        assert agent_of(full)["response"].startswith(agent["response"])
    assert alone(server, max_tokens=tokens) == full  # a cap the episode does not pass changes nothing


def test_seed_temperature_and_top_p(server):
    """The issue: a temperature other than the server's was a 400, and the same seed at 0.7 gave two answers."""
    greedy = alone(server)
    assert (
        record(create(server, temperature=0)) == greedy
    )  # the server's default (the run's eval_temperature)
    seeded = record(create(server, temperature=0.7, seed=5))
    assert seeded == record(create(server, temperature=0.7, seed=5))
    # sampling at all: three seeds at temperature 1 do not all write the same episode
    responses = {agent_of(alone(server, temperature=1.0, seed=s))["response"] for s in (1, 2, 3)}
    assert len(responses) > 1
    # top_p towards 0 keeps only the most likely token: greedy, whatever the temperature and seed
    assert record(create(server, temperature=1.0, top_p=1e-6, seed=1)) == greedy


def test_stop_strings_cut_the_episode(server):
    """A stop string (str or list) ends the episode where the policy writes it: the greedy response cut before
    its first occurrence."""
    response = agent_of(alone(server))["response"]
    stop = response[12:20]  # inside the policy's first segment
    cut = response[: response.find(stop)]
    assert cut and len(stop.encode()) <= 32
    for value in (stop, ["\x01never", stop]):
        rec = alone(server, stop=value)
        (_, content, finish, agent), usage = rec[0][0], rec[1]
        assert (finish, agent["response"], content) == ("stop", cut, "")
        assert usage["completion_tokens"] < alone(server)[1]["completion_tokens"]


def test_n_choices(server):
    """n rows of one request (the issue: n=2 was a 400): greedy, n copies of the greedy episode; seeded, choice
    0 is the request's n=1 reply."""
    greedy = alone(server)
    choices, usage = alone(server, n=2)
    assert [c[0] for c in choices] == [0, 1] and [c[1:] for c in choices] == [greedy[0][0][1:]] * 2
    assert usage["prompt_tokens"] == greedy[1]["prompt_tokens"]
    assert usage["completion_tokens"] == 2 * greedy[1]["completion_tokens"]
    assert usage["retrieved_tokens"] == 2 * greedy[1]["retrieved_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    sampled = alone(server, n=3, temperature=1.0, seed=2)
    assert sampled[0][0] == alone(server, temperature=1.0, seed=2)[0][0]


def test_stream_as_the_episode_runs(server):
    """stream=True (the issue: one chunk after the episode ended): the policy's text per decode call and each
    search as `delta.search_agent` events, the answer as `delta.content`; they concatenate to the completion
    of the same seeded request; include_usage's last chunk holds its usage."""
    kw = dict(temperature=0.7, seed=11)
    ref = alone(server, **kw)
    stream = create(server, stream=True, stream_options={"include_usage": True}, **kw)
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == ref[1]
    choices = [c.choices[0] for c in chunks[:-1]]
    assert choices[0].delta.role == "assistant"
    assert "".join(c.delta.content or "" for c in choices) == ref[0][0][1]
    finish = [c for c in choices if c.finish_reason]
    assert [(c.finish_reason, c.search_agent) for c in finish] == [(ref[0][0][2], agent_of(ref))]
    events = [c.delta.search_agent for c in choices if getattr(c.delta, "search_agent", None)]
    assert "".join(e.get("text", "") for e in events) == agent_of(ref)["response"]
    assert [{"query": e["query"], "docs": e["docs"]} for e in events if e["type"] == "search"] == agent_of(
        ref
    )["searches"]
    # streamed in parts, not as one blob: several policy chunks, a search between two of them
    kinds = [e["type"] for e in events]
    assert kinds.count("policy") > 1 and "search" in kinds[kinds.index("policy") :]


def test_concurrent_requests_of_mixed_settings(server):
    """8 clients at once with different settings: each reply equals the same request sent alone."""
    response = agent_of(alone(server))["response"]
    requests = [
        dict(question=QUESTION),
        dict(temperature=0.7, seed=5),
        dict(max_tokens=9),
        dict(stop=response[12:20]),
        dict(n=2, temperature=1.0, seed=7),
        dict(temperature=1.0, top_p=1e-6, seed=1),
        dict(question="Who employs the founder of Shaishavei Guild?"),
        dict(question="Who employs the founder of Shaishavei Guild?", temperature=1.0, seed=3),
    ]
    refs = [alone(server, **kw) for kw in requests]
    results = [None] * len(requests)
    barrier = threading.Barrier(len(requests))

    def client(i):
        barrier.wait()
        results[i] = record(create(server, **requests[i]))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=HANG_S)
    assert results == refs


REFUSED = [
    (dict(presence_penalty=0.5), "presence_penalty"),
    (dict(frequency_penalty=1.0), "frequency_penalty"),
    (dict(logit_bias={"5": 10}), "logit_bias"),
    (dict(logprobs=True), "logprobs"),
    (dict(top_logprobs=2), "top_logprobs"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools"),
    (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(extra_body={"best_of": 2}), "best_of"),
    (dict(n=9), "n"),  # over --max-batch (8)
    (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(stop="x" * 33), "stop"),
    (dict(seed=2**32), "seed"),
    (dict(top_p=0), "top_p"),
    (dict(temperature=2.5), "temperature"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=8, max_completion_tokens=9), "max_completion_tokens"),
    (dict(stream_options={"include_usage": True}), "stream_options"),  # without stream
]


@pytest.mark.parametrize("kw,param", REFUSED, ids=[p for _, p in REFUSED])
def test_a_parameter_the_server_cannot_honour_is_a_400_naming_it(server, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        create(server, **kw)
    assert e.value.param == param and param in e.value.message


def test_bookkeeping_fields_are_accepted(server):
    assert record(create(server, user="u", metadata={"k": "v"}, store=False, service_tier="auto")) == alone(
        server
    )


# ------------------------------------------------------------------------------------------- disconnects


class ScriptedEngine:
    """What the server uses of an `AgentEngine`, with a rollout that reports a "policy" event for each live
    row, then waits until `release` is set or every real row is cancelled, and ends each row ("done")."""

    def __init__(self):
        self.tokenizer = types.SimpleNamespace(
            encode=lambda text, allow_special=False: text.split(),
            apply_chat_template=lambda m, add_generation_prompt=True: m[0]["content"],
        )
        self.protocol = types.SimpleNamespace(build_messages=lambda q, ctx: [{"role": "user", "content": q}])
        self.sampler = types.SimpleNamespace(cache_len=64)
        self.limits = types.SimpleNamespace(max_segment_tokens=14)
        self.cancelled_at_start, self.cancelled_at_end = [], []
        self.release = threading.Event()
        self.first_done = (
            threading.Event()
        )  # set by the test: row 1 may end once row 0's client has its reply

    def rollout(self, params, questions, key, requests=None, events=None, cancelled=None):
        from jaxsearch.agent.requests import Event, RowSummary

        n = len(questions)
        self.cancelled_at_start.append([cancelled(i) for i in range(n)])
        live = [i for i in range(n) if not cancelled(i)]

        def done(i):
            reason = "cancelled" if cancelled(i) else "stop"
            summary = RowSummary(questions[i], reason, 1, 2, 0, 1, [], [], [], questions[i], False)
            events(Event(i, "done", summary=summary))

        for i in live:
            events(Event(i, "policy", text=questions[i]))
        if len(live) == 2:  # two requests: the first answered before the second's row ends
            done(live[0])
            assert self.first_done.wait(HANG_S), "the first request was not answered before its batch ended"
            done(live[1])
        else:
            deadline = time.monotonic() + HANG_S
            while (
                not self.release.is_set()
                and not all(cancelled(i) for i in live)
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)
            for i in live:
                done(i)
        self.cancelled_at_end.append([cancelled(i) for i in range(n)])
        return None


@pytest.fixture
def scripted():
    from jaxsearch.serving.server import make_server, serve_in_thread

    engine = ScriptedEngine()
    server = make_server(engine, None, "scripted", port=0, max_batch=4, batch_wait_ms=50.0)
    serve_in_thread(server)
    try:
        yield server, engine
    finally:
        engine.release.set()
        engine.first_done.set()
        server.close()


def _body(question, **kw):
    return {"model": "scripted", "messages": [{"role": "user", "content": question}], **kw}


def test_a_client_that_leaves_cancels_its_rows(scripted):
    """A streaming client that disconnects after its first event, and one that gives up waiting: their rows
    are cancelled (the engine's `cancelled`) and the rollout ends; the batch's padding rows were cancelled
    from the start."""
    server, engine = scripted
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=_body("q0", stream=True), timeout=HANG_S
    ) as r:
        for line in r.iter_lines():
            if "search_agent" in line:
                break  # leave mid-stream
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=_body("q1"), timeout=1.0)
    deadline = time.monotonic() + HANG_S
    while len(engine.cancelled_at_end) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.cancelled_at_start == [[False, True, True, True]] * 2
    assert engine.cancelled_at_end == [[True] * 4] * 2


def test_a_request_is_answered_when_its_own_rows_end(scripted):
    server, engine = scripted
    replies = {}

    def client(q):
        replies[q] = httpx.post(server.url + "/v1/chat/completions", json=_body(q), timeout=HANG_S)
        engine.first_done.set()  # a reply came while its batch still runs: the other row may end now

    threads = [threading.Thread(target=client, args=(q,)) for q in ("first", "second")]
    with server.batcher.held():  # both in one batch
        for t in threads:
            t.start()
        deadline = time.monotonic() + HANG_S
        while server.batcher.submitted < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    for t in threads:
        t.join(timeout=HANG_S)
    assert [replies[q].json()["choices"][0]["message"]["content"] for q in ("first", "second")] == [
        "first",
        "second",
    ]
    assert engine.cancelled_at_start == [[False, False, True, True]]
    assert np.array_equal(engine.cancelled_at_end, [[False, False, True, True]])
