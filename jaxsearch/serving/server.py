"""A search agent behind OpenAI's chat-completions API; concurrent requests share one batched rollout.

    server = make_server(engine, params, "my-agent", port=8000)    # engine: agent.engine.AgentEngine
    server.serve_forever()                                          # launch/serve_agent.py does this

`GET /v1/models` -> `{"object": "list", "data": [{"id": NAME, "object": "model", "owned_by": "jaxsearch"}]}`.

`POST /v1/chat/completions` takes OpenAI's body (`model`, `messages`, optional `stream`, `temperature`,
`max_tokens`, `n`, `seed`; other fields are ignored). The question is the content of the last `user`
message (a string, or a list of `{"type": "text", "text": ...}` parts, joined); other messages are not
shown to the agent: it runs its own protocol's prompt around the question and its full search loop
(`AgentEngine.rollout`). The reply is OpenAI's `chat.completion` with the agent's answer as the assistant
message, `finish_reason` "stop" (it answered) or "length" (no answer: out of turns or cache room; the
content is then ""), `usage` (prompt tokens; completion tokens = the tokens the policy sampled,
observations not counted) and an extra `search_agent` field: turns, each search's query (as the engine
parsed it from the policy segment that asked for it: `Trajectories.queries`) and retrieved docs
`{id, title, text}`, EKA's initial docs, the whole response text, and whether the episode ran out of cache
room.

`stream: true` answers with server-sent events as OpenAI does: a chunk with `delta {"role": "assistant"}`
at once, then, once the rollout is done, a chunk with the answer as `delta {"content": ...}`, a last chunk
with `finish_reason`, `usage` and `search_agent`, and `data: [DONE]`. The answer is not streamed token by
token: it is known only when the episode ends.

Batching: a worker thread takes the pending requests (up to `max_batch`, waiting at most `batch_wait_s`
after the first), pads them to `max_batch` rows with the last question (one compiled shape, as
`eval.evaluate.run_batch` does) and runs one `engine.rollout` for all. Greedy rows do not disturb each
other, so a greedy answer does not depend on what it was batched with. The batch is lockstep: a request
arriving during a rollout waits for the next one.

Sampling is the engine's (`--temperature` of launch/serve_agent.py; greedy by default). A request's
`temperature` must be absent, null or equal to it (else 400); `seed` is checked and, as `max_tokens`, not
used: the engine's limits (turns, segment tokens, cache length) bound an episode. With temperature > 0
batch b samples with `fold_in(key(seed), b)`, row i of it as the engine does.

Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`: 400 `invalid_request_error` naming
the bad field in `param` (`messages[1].content`, `temperature`, ...), 404 for an unknown path or model,
405 for a wrong method, 500 `server_error` when a rollout fails. A question whose prompt leaves the cache no
room to act gets a 400 (param `messages`) without failing the requests batched with it.

Limits (`Limits`; launch/serve_agent.py's flags), each checked before the work it bounds and answered with
an error naming it: body bytes from Content-Length, before reading (413, --max-body-bytes); UTF-8 and JSON
nesting depth before parsing (400, `retrieval.request_limits`); the question's tokens in the HTTP thread,
before it joins a batch (400 `context_length_exceeded`, --max-message-tokens; a question over 16 characters
per allowed token is refused without tokenizing it). So an oversized question never reaches a rollout, and
the requests that would have been batched with it do not wait for it. A client that disconnects mid-request
is logged in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import queue
import threading
import time
import uuid
from concurrent.futures import Future

import numpy as np

from jaxsearch.retrieval.request_limits import too_large
from jaxsearch.serving.chat_request import ChatRequest, RequestError, parse_chat_request

MODELS_PATH = "/v1/models"
CHAT_PATH = "/v1/chat/completions"


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold (launch/serve_agent.py's flags)."""

    max_body_bytes: int = 4 << 20  # --max-body-bytes
    max_message_tokens: int | None = None  # --max-message-tokens; None: what the cache leaves (`make_server`)


# A question longer than this many characters per allowed token is refused before it is tokenized (no
# tokenizer here averages half that: Qwen2.5's BPE about 4 characters a token on English text).
CHARS_PER_TOKEN_BOUND = 16


# ------------------------------------------------------------------------------------------- episodes


def _doc(doc) -> dict:
    return {"id": doc.id, "title": doc.title, "text": doc.text}


def episode(traj, i: int) -> dict:
    """Row i of a rollout as the server answers it: answer, finish_reason, usage and `search_agent`."""
    answer = traj.answers[i]
    prompt = int(traj.prompt_lengths[i])
    sampled = int(np.asarray(traj.loss_mask[i]).sum())
    searches = [{"query": q, "docs": [_doc(d) for d in docs]} for q, docs in zip(traj.queries[i], traj.docs[i])]
    return {
        "content": "" if answer is None else answer,
        "finish_reason": "length" if answer is None else "stop",
        "usage": {"prompt_tokens": prompt, "completion_tokens": sampled, "total_tokens": prompt + sampled},
        "search_agent": {
            "turns": int(traj.turns[i]),
            "searches": searches,
            "initial_docs": [_doc(d) for d in traj.initial_docs[i]],
            "response": traj.responses[i],
            "truncated": bool(traj.truncated[i]),
        },
    }


@dataclasses.dataclass
class _Job:
    question: str
    future: Future


class Batcher:
    """Pending questions -> one padded `engine.rollout` per batch, in a worker thread.

    `submit(question)` returns a Future of `episode(...)`'s dict. A batch whose rollout raises a ValueError
    (a prompt without cache room) is rerun one question at a time, so only the offending request fails
    (its Future holds a RequestError 400); any other exception fails the batch's requests (500).
    """

    def __init__(self, engine, params, max_batch: int, batch_wait_s: float, seed: int = 0):
        import jax

        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.engine, self.params = engine, params
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self.key = jax.random.key(seed)
        self.batches = 0  # rollouts run
        self.requests = 0  # requests answered
        self.submitted = 0  # requests queued
        self._count_lock = threading.Lock()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._open = threading.Event()  # cleared by `held()`: the worker waits before collecting a batch
        self._open.set()
        self._thread = threading.Thread(target=self._run, name="agent-batcher", daemon=True)
        self._thread.start()

    def submit(self, question: str) -> Future:
        future = Future()
        self._queue.put(_Job(question, future))
        with self._count_lock:  # HTTP handler threads submit concurrently
            self.submitted += 1
        return future

    @contextlib.contextmanager
    def held(self):
        """While inside, the worker takes no batch: requests queue up (tests batch deterministically with it)."""
        self._open.clear()
        try:
            yield
        finally:
            self._open.set()

    def close(self) -> None:
        """Stop the worker once the batches already queued are answered."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            self._open.wait()
            jobs, closing = [first], False
            deadline = time.monotonic() + self.batch_wait_s
            while len(jobs) < self.max_batch:
                try:  # wait until the deadline, then take only what is already queued
                    job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    closing = True
                    break
                jobs.append(job)
            jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if jobs:
                self._answer(jobs)
            if closing:
                return

    def rollout(self, questions: list[str]):
        """One rollout of `questions` padded to `max_batch` rows with the last one."""
        import jax

        padded = list(questions) + [questions[-1]] * (self.max_batch - len(questions))
        key = jax.random.fold_in(self.key, self.batches)
        self.batches += 1
        return self.engine.rollout(self.params, padded, key)

    def _answer(self, jobs: list[_Job]) -> None:
        try:
            traj = self.rollout([j.question for j in jobs])
        except ValueError as e:
            if len(jobs) > 1:
                for job in jobs:  # find the request that does not fit; the others are answered
                    self._answer([job])
                return
            jobs[0].future.set_exception(RequestError(400, f"messages: {e}", "messages"))
            return
        except Exception as e:  # noqa: BLE001 - the requests get a 500; the server keeps serving
            error = RequestError(500, f"rollout failed: {type(e).__name__}: {e}", None, "server_error")
            for job in jobs:
                job.future.set_exception(error)
            return
        for i, job in enumerate(jobs):
            try:
                job.future.set_result(episode(traj, i))
            except Exception as e:  # noqa: BLE001
                job.future.set_exception(RequestError(500, f"{type(e).__name__}: {e}", None, "server_error"))
            self.requests += 1


# ------------------------------------------------------------------------------------------- HTTP


def completion(model: str, result: dict, request_id: str, created: int) -> dict:
    """OpenAI's chat.completion object for one episode (`episode`'s dict)."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result["content"]},
                "finish_reason": result["finish_reason"],
            }
        ],
        "usage": result["usage"],
        "search_agent": result["search_agent"],
    }


def chunk(model: str, request_id: str, created: int, delta: dict, finish_reason=None, **extra) -> dict:
    """One `chat.completion.chunk` of a stream."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
        **extra,
    }


class AgentServer(http.server.ThreadingHTTPServer):
    """A ThreadingHTTPServer answering the OpenAI routes with `batcher`'s rollouts."""

    daemon_threads = True
    # socketserver's default listen backlog is 5: 16 clients connecting at once on a loaded machine got
    # "connection reset by peer" (a CI run of tests/test_serve_agent.py, 2026-12-04)
    request_queue_size = 128

    def __init__(
        self,
        address,
        batcher: Batcher,
        model_name: str,
        temperature: float,
        verbose: bool = False,
        limits: Limits = Limits(),
    ):
        self.batcher, self.model_name, self.temperature, self.verbose = (
            batcher,
            model_name,
            temperature,
            verbose,
        )
        if limits.max_message_tokens is None:
            limits = dataclasses.replace(limits, max_message_tokens=default_message_tokens(batcher.engine))
        if limits.max_message_tokens < 1:
            raise ValueError(f"max_message_tokens must be >= 1, got {limits.max_message_tokens}")
        self.limits = limits
        super().__init__(address, _Handler)

    def check_question(self, request: ChatRequest) -> None:
        """A RequestError 400 if the question is over `limits.max_message_tokens` (by its length first, then
        tokenized): checked in the HTTP thread, so it never joins (and slows) a batch."""
        limit, field = self.limits.max_message_tokens, request.question_field
        fix = "send a shorter question, or start the server with a larger --max-message-tokens (and --cache-len)"
        chars = len(request.question)
        if chars > limit * CHARS_PER_TOKEN_BOUND:
            message = (f"{field}: the question has {chars:,} characters, over {limit * CHARS_PER_TOKEN_BOUND:,} "
                       f"({CHARS_PER_TOKEN_BOUND} per token of the limit of {limit:,} tokens); {fix}")
            raise RequestError(400, message, "messages", code="context_length_exceeded")
        tokens = len(self.batcher.engine.tokenizer.encode(request.question))
        if tokens > limit:
            message = f"{field}: the question is {tokens:,} tokens, over the limit of {limit:,}; {fix}"
            raise RequestError(400, message, "messages", code="context_length_exceeded")

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        """Stop serving (when `serve_forever` runs in another thread), then the batcher."""
        self.shutdown()
        self.server_close()
        self.batcher.close()


def default_message_tokens(engine) -> int:
    """Tokens a question may have: what the cache leaves after the protocol's prompt around it and one segment
    to act. EKA's P0 passages come per question and are not counted here: a prompt that still does not fit
    is refused by the rollout (400, that request alone)."""
    tokenizer = engine.tokenizer
    around = tokenizer.apply_chat_template(engine.protocol.build_messages("x", None), add_generation_prompt=True)
    prompt = len(tokenizer.encode(around, allow_special=True)) - len(tokenizer.encode("x"))
    return engine.sampler.cache_len - engine.limits.max_segment_tokens - prompt


class _ClientGone(Exception):
    """The client closed the connection before its request was read or answered."""


class _Handler(http.server.BaseHTTPRequestHandler):
    server: AgentServer
    protocol_version = "HTTP/1.1"
    ROUTES = {MODELS_PATH: "GET", CHAT_PATH: "POST"}

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        if self.server.verbose:
            super().log_message(format, *args)

    # --------------------------------------------------------------- responses

    def _send_json(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, error: RequestError, headers: dict | None = None) -> None:
        self._send_json(error.status, error.body(), headers)

    def _event(self, body) -> None:
        text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
        self.wfile.write(f"data: {text}\n\n".encode())
        self.wfile.flush()

    # --------------------------------------------------------------- routing

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            self._dispatch(method, path)
        except (BrokenPipeError, ConnectionResetError, _ClientGone) as e:  # one line, not a traceback
            self.close_connection = True
            reason = str(e) if isinstance(e, _ClientGone) else type(e).__name__
            http.server.BaseHTTPRequestHandler.log_message(
                self, "client disconnected during %s %s: %s", method, path, reason
            )

    def _dispatch(self, method: str, path: str) -> None:
        try:
            allowed = self.ROUTES.get(path)
            if allowed is None:
                self._drain()
                raise RequestError(
                    404,
                    f"no route {method} {path}; try GET {MODELS_PATH} or POST {CHAT_PATH}",
                    code="not_found",
                )
            if method != allowed:
                self._drain()
                error = RequestError(405, f"{path} takes {allowed}, not {method}", code="method_not_allowed")
                self._send_error(error, {"Allow": allowed})
                return
            if path == MODELS_PATH:
                self._models()
            else:
                self._chat()
        except RequestError as e:
            self._send_error(e)
        except (BrokenPipeError, ConnectionResetError, _ClientGone):
            raise
        except Exception as e:  # noqa: BLE001 - never a bare traceback
            self._send_error(RequestError(500, f"{type(e).__name__}: {e}", None, "server_error"))

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._route("GET")

    def do_POST(self):  # noqa: N802
        self._route("POST")

    def do_PUT(self):  # noqa: N802
        self._route("PUT")

    def do_DELETE(self):  # noqa: N802
        self._route("DELETE")

    def do_PATCH(self):  # noqa: N802
        self._route("PATCH")

    def _drain(self) -> None:
        """Read (and drop) a request body so the connection stays usable."""
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= self.server.limits.max_body_bytes:
            self._read(int(length))
        elif length:
            self.close_connection = True

    def _read(self, length: int) -> bytes:
        data = self.rfile.read(length)
        if len(data) < length:
            raise _ClientGone(f"closed the connection after {len(data):,} of {length:,} body bytes")
        return data

    def _read_body(self) -> bytes:
        """The body, refused from its Content-Length (413, before reading) when over --max-body-bytes."""
        length, limit = self.headers.get("Content-Length"), self.server.limits.max_body_bytes
        if length is None or not length.isdigit():
            self.close_connection = True
            raise RequestError(411, "a Content-Length header is required", None, code="length_required")
        if int(length) > limit:
            self.close_connection = True
            message = too_large(int(length), limit, "--max-body-bytes").message
            raise RequestError(413, message, None, code="request_too_large")
        return self._read(int(length))

    def _models(self) -> None:
        self._send_json(
            200,
            {
                "object": "list",
                "data": [{"id": self.server.model_name, "object": "model", "owned_by": "jaxsearch"}],
            },
        )

    def _chat(self) -> None:
        request = parse_chat_request(self._read_body(), self.server.model_name, self.server.temperature)
        self.server.check_question(request)
        future = self.server.batcher.submit(request.question)
        request_id, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), self.server.model_name
        if not request.stream:
            self._send_json(200, completion(model, future.result(), request_id, created))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self._event(chunk(model, request_id, created, {"role": "assistant"}))
        try:
            result = future.result()
        except RequestError as e:
            self._event(e.body())
        except Exception as e:  # noqa: BLE001
            self._event(RequestError(500, f"{type(e).__name__}: {e}", None, "server_error").body())
        else:
            if result["content"]:
                self._event(chunk(model, request_id, created, {"content": result["content"]}))
            extra = {"usage": result["usage"], "search_agent": result["search_agent"]}
            self._event(chunk(model, request_id, created, {}, result["finish_reason"], **extra))
        self._event("[DONE]")


def make_server(
    engine,
    params,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch: int = 8,
    batch_wait_ms: float = 20.0,
    temperature: float = 0.0,
    seed: int = 0,
    verbose: bool = False,
    limits: Limits = Limits(),
) -> AgentServer:
    """An `AgentServer` bound to (host, port) (port 0: a free one, see `.url`); call `serve_forever()`.

    temperature: the engine's sampling temperature (a request may only restate it); limits: see `Limits`."""
    batcher = Batcher(engine, params, max_batch, batch_wait_ms / 1000.0, seed)
    try:
        return AgentServer((host, port), batcher, model_name, float(temperature), verbose, limits)
    except BaseException:
        batcher.close()
        raise


def serve_in_thread(server: AgentServer) -> threading.Thread:
    """Run `server.serve_forever()` in a daemon thread (tests, notebooks); `server.close()` stops it."""
    thread = threading.Thread(target=server.serve_forever, name="agent-http", daemon=True)
    thread.start()
    return thread
