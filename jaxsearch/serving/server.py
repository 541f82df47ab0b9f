"""A search agent behind OpenAI's chat-completions API; concurrent requests share one batched rollout.

    server = make_server(engine, params, "my-agent", port=8000)    # engine: agent.engine.AgentEngine
    server.serve_forever()                                          # jaxsearch/cli/serve_agent.py does this

`GET /v1/models` -> `{"object": "list", "data": [MODEL]}`; `GET /v1/models/{id}` -> MODEL
`{"id", "object": "model", "created", "owned_by": "jaxsearch"}` (another id: 404 `model_not_found`).

`POST /v1/chat/completions` takes OpenAI's body. The question is the content of the last `user` message (a
string, or a list of `{"type": "text", "text": ...}` parts, joined); other messages are not shown to the
agent: it runs its own protocol's prompt around the question and its full search loop (`AgentEngine.rollout`).
Honoured, each a per-row setting of the rollout (`agent.requests.RowRequest`; rows of different settings
share one decode call):
- `temperature` [0, 2] (0: greedy) and `top_p` (0, 1]; absent: the server's --temperature / --top-p;
- `max_tokens` / `max_completion_tokens`: a cap on the tokens the policy samples over the whole episode
  (retrieved passages do not count); reached: finish_reason "length", no answer;
- `stop`: a string or up to 4, each 1..32 UTF-8 bytes; the policy writing one ends the episode there
  (finish_reason "stop"; the answer is the protocol's answer before it, or the text after an opened answer
  tag, else "");
- `seed` (0..2**32-1): the row samples with fold_in(key(seed), choice), whatever else is in the batch;
  without it, the batch's key (not reproducible);
- `n` (1..--max-batch): n rows of the question, one choice each;
- `stream`, `stream_options.include_usage`.
Accepted and ignored (bookkeeping): `user`, `metadata`, `store`, `service_tier`, `safety_identifier`,
`prompt_cache_key`. Accepted only at their "off" value, else a 400 naming them: `presence_penalty`,
`frequency_penalty` (0), `logit_bias` ({}), `logprobs` (false), `tools` ([]), `response_format`
({"type": "text"}), ... (`chat_request.NEUTRAL`). Any other field: a 400 naming it. Nothing is silently
ignored.

`POST /v1/rstool` (RSTool, seed 002 §6; serving/rstool.py) takes `{"model", "question"}` (and temperature,
top_p, max_tokens, seed), runs the same episode batched with the chat requests, and answers the evidence the
policy distilled (`evidence`, `reader_prompt`, `answer`, `search_agent`, `usage`); a 404 `rstool_unavailable`
when the served protocol writes no evidence (only rsearch and rsearch_eval do).

The reply is OpenAI's `chat.completion`: per choice the agent's answer as the assistant message,
`finish_reason` "stop" (answered, or a stop string) or "length" (no answer: max_tokens, out of turns or
cache room; the content is then ""), and an extra `search_agent` field (`replies.search_agent`: turns, each
search's query and retrieved docs `{id, title, text}`, EKA's initial docs, the whole response text, cache
truncation); `usage` (`replies.usage`): prompt_tokens (once for the n choices), completion_tokens = the
tokens the policy sampled, total_tokens = their sum, and `retrieved_tokens` = observation and hint tokens
appended (counted in neither).

`stream: true` answers with server-sent events as the episode runs: a chunk `delta {"role": "assistant"}`
per choice at once; per decode call the policy's new text, and each search (query and docs) and the text
appended after it, as `delta {"search_agent": {"type": ..., ...}}` (`replies.event_delta`: the texts
concatenate to the choice's `search_agent.response`); when a choice's row ends, its answer as
`delta {"content": ...}` and a chunk with its `finish_reason` and `search_agent`; with
`stream_options.include_usage` a last chunk with empty `choices` and the `usage`; then `data: [DONE]`. A
request is answered when its own rows end, not when its batch does.

Batching (`batcher.Batcher`): a worker thread takes the pending requests (whole requests, up to `max_batch`
rows, waiting at most `batch_wait_s` after the first), pads them to `max_batch` rows (one compiled shape;
the padding rows are cancelled from the start) and runs one `engine.rollout` for all. A client that
disconnects (noticed while its reply is pending, every POLL_S) has its rows cancelled: they end at the
next host turn and free their slots.

Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`: 400 `invalid_request_error` naming
the bad field in `param` (`messages[1].content`, `temperature`, `logit_bias`, ...), 404 for an unknown path
or model, 405 for a wrong method, 500 `server_error` when a rollout fails. A question whose prompt leaves the
cache no room to act gets a 400 (param `messages`) without failing the requests batched with it.

Limits (`Limits`; the command's flags), each checked before the work it bounds and answered with
an error naming it: body bytes from Content-Length, before reading (413, --max-body-bytes); UTF-8 and JSON
nesting depth before parsing (400, `retrieval.request_limits`); the question's tokens in the HTTP thread,
before it joins a batch (400 `context_length_exceeded`, --max-message-tokens; a question over 16 characters
per allowed token is refused without tokenizing it). So an oversized question never reaches a rollout, and
the requests that would have been batched with it do not wait for it. A client that disconnects mid-request
is logged in one line.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import queue
import select
import socket
import threading
import time
import urllib.parse
import uuid

from jaxsearch.retrieval.request_limits import too_large
from jaxsearch.serving.batcher import Batcher, Job
from jaxsearch.serving.chat_request import ChatRequest, Defaults, RequestError, parse_chat_request
from jaxsearch.serving.replies import chunk, completion, event_delta, search_agent, usage
from jaxsearch.serving.rstool import RSTOOL_PATH, check_protocol, parse_rstool_request, rstool_reply

MODELS_PATH = "/v1/models"
CHAT_PATH = "/v1/chat/completions"
# how often a pending reply checks that its client is still connected (seconds)
POLL_S = 0.25


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold (the command's flags)."""

    max_body_bytes: int = 4 << 20  # --max-body-bytes
    max_message_tokens: int | None = None  # --max-message-tokens; None: what the cache leaves (`make_server`)


# A question longer than this many characters per allowed token is refused before it is tokenized (no
# tokenizer here averages half that: Qwen2.5's BPE about 4 characters a token on English text).
CHARS_PER_TOKEN_BOUND = 16


# ------------------------------------------------------------------------------------------- HTTP


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
        defaults: Defaults = Defaults(),
        verbose: bool = False,
        limits: Limits = Limits(),
    ):
        self.batcher, self.model_name, self.defaults, self.verbose = batcher, model_name, defaults, verbose
        self.created = int(time.time())  # the model object's `created`
        if limits.max_message_tokens is None:
            limits = dataclasses.replace(limits, max_message_tokens=default_message_tokens(batcher.engine))
        if limits.max_message_tokens < 1:
            raise ValueError(f"max_message_tokens must be >= 1, got {limits.max_message_tokens}")
        self.limits = limits
        super().__init__(address, _Handler)

    def model(self) -> dict:
        """The served model as OpenAI's model object."""
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "jaxsearch"}

    def check_question(self, request: ChatRequest) -> None:
        """A RequestError 400 if the question is over `limits.max_message_tokens` (by its length first, then
        tokenized): checked in the HTTP thread, so it never joins (and slows) a batch."""
        limit, field = self.limits.max_message_tokens, request.question_field
        param = field.split("[")[0]  # "messages" (chat), "question" (RSTool)
        fix = "send a shorter question, or start the server with a larger --max-message-tokens (and --cache-len)"
        chars = len(request.question)
        if chars > limit * CHARS_PER_TOKEN_BOUND:
            message = (
                f"{field}: the question has {chars:,} characters, over {limit * CHARS_PER_TOKEN_BOUND:,} "
                f"({CHARS_PER_TOKEN_BOUND} per token of the limit of {limit:,} tokens); {fix}"
            )
            raise RequestError(400, message, param, code="context_length_exceeded")
        tokens = len(self.batcher.engine.tokenizer.encode(request.question))
        if tokens > limit:
            message = f"{field}: the question is {tokens:,} tokens, over the limit of {limit:,}; {fix}"
            raise RequestError(400, message, param, code="context_length_exceeded")

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
    around = tokenizer.apply_chat_template(
        engine.protocol.build_messages("x", None), add_generation_prompt=True
    )
    prompt = len(tokenizer.encode(around, allow_special=True)) - len(tokenizer.encode("x"))
    return engine.sampler.cache_len - engine.limits.max_segment_tokens - prompt


class _ClientGone(Exception):
    """The client closed the connection before its request was read or answered."""


class _Handler(http.server.BaseHTTPRequestHandler):
    server: AgentServer
    protocol_version = "HTTP/1.1"
    # headers and body (and each SSE event) are separate small writes: with Nagle's algorithm the second waits
    # for the client's delayed ACK, ~40 ms a reply on loopback (bench/serving.py: 1 client, 0.47x the engine)
    disable_nagle_algorithm = True
    ROUTES = {MODELS_PATH: "GET", CHAT_PATH: "POST", RSTOOL_PATH: "POST"}  # and GET MODELS_PATH/{id}

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
            allowed = "GET" if path.startswith(MODELS_PATH + "/") else self.ROUTES.get(path)
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
                self._send_json(200, {"object": "list", "data": [self.server.model()]})
            elif path.startswith(MODELS_PATH + "/"):
                self._model(urllib.parse.unquote(path[len(MODELS_PATH) + 1 :]))
            elif path == RSTOOL_PATH:
                self._rstool()
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

    def _model(self, model_id: str) -> None:
        if model_id != self.server.model_name:
            message = f"The model {model_id!r} does not exist; this server serves {self.server.model_name!r}"
            raise RequestError(404, message, "model", code="model_not_found")
        self._send_json(200, self.server.model())

    def _client_gone(self) -> bool:
        """Whether the client closed its connection (readable with nothing to read), without consuming input."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
        except (OSError, ValueError):
            return True

    def _wait(self, job: Job):
        """The job's summaries; its rows are cancelled if the client leaves first."""
        while True:
            try:
                return job.future.result(timeout=POLL_S)
            except TimeoutError:
                if self._client_gone():
                    job.cancel()
                    raise _ClientGone("closed the connection before its reply") from None

    def _chat(self) -> None:
        server = self.server
        request = parse_chat_request(
            self._read_body(), server.model_name, server.defaults, server.batcher.max_batch
        )
        server.check_question(request)
        job = server.batcher.submit(request, stream=request.stream)
        request_id, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), server.model_name
        if not request.stream:
            self._send_json(200, completion(model, self._wait(job), request_id, created))
            return
        try:
            self._stream(job, request, request_id, created, model)
        finally:
            if not job.future.done() or job.future.cancelled():
                job.cancel()  # the client left mid-stream: its rows free their slots

    def _rstool(self) -> None:
        """RSTool (serving/rstool.py): the question's episode, batched with chat requests; its evidence."""
        server = self.server
        raw = self._read_body()
        protocol = server.batcher.engine.protocol
        check_protocol(protocol)
        request = parse_rstool_request(raw, server.model_name, server.defaults)
        server.check_question(request)
        (summary,) = self._wait(server.batcher.submit(request))
        request_id, created = f"rstool-{uuid.uuid4().hex}", int(time.time())
        reply = rstool_reply(server.model_name, request.question, summary, protocol, request_id, created)
        self._send_json(200, reply)

    def _stream(self, job: Job, request: ChatRequest, request_id: str, created: int, model: str) -> None:
        """Server-sent events of the job's rows as the rollout reports them (server docstring)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for choice in range(request.n):
            self._event(chunk(model, request_id, created, choice, {"role": "assistant"}))
        summaries = [None] * request.n
        while any(s is None for s in summaries):
            try:
                choice, event = job.events.get(timeout=POLL_S)
            except queue.Empty:
                if self._client_gone():
                    raise _ClientGone("closed the connection mid-stream") from None
                continue
            if choice is None:  # the request failed: the error as an event (the headers went out)
                self._event(event.body())
                break
            if event.kind != "done":
                self._event(chunk(model, request_id, created, choice, {"search_agent": event_delta(event)}))
                continue
            summaries[choice] = s = event.summary
            if s.answer:
                self._event(chunk(model, request_id, created, choice, {"content": s.answer}))
            agent = search_agent(s)
            self._event(chunk(model, request_id, created, choice, {}, s.finish_reason, search_agent=agent))
        else:
            if request.include_usage:
                self._event(chunk(model, request_id, created, None, usage=usage(summaries)))
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
    top_p: float = 1.0,
) -> AgentServer:
    """An `AgentServer` bound to (host, port) (port 0: a free one, see `.url`); call `serve_forever()`.

    temperature, top_p: the sampling of requests that omit them; seed: the batches' key (rows without a seed
    of their own); limits: see `Limits`."""
    batcher = Batcher(engine, params, max_batch, batch_wait_ms / 1000.0, seed)
    try:
        return AgentServer(
            (host, port), batcher, model_name, Defaults(float(temperature), float(top_p)), verbose, limits
        )
    except BaseException:
        batcher.close()
        raise


def serve_in_thread(server: AgentServer) -> threading.Thread:
    """Run `server.serve_forever()` in a daemon thread (tests, notebooks); `server.close()` stops it."""
    thread = threading.Thread(target=server.serve_forever, name="agent-http", daemon=True)
    thread.start()
    return thread
