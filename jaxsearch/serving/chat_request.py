"""A chat-completions request body, checked: `parse_chat_request(raw, model, defaults, max_n)` -> `ChatRequest`
(the question, where it came from, the stream flags, the sampling of its n rows), or a `RequestError` naming
the bad field in OpenAI's error object. The fields honoured, accepted or refused: serving/server.py's
docstring (and the tables below)."""

from __future__ import annotations

import dataclasses

from jaxsearch.retrieval.request_limits import BodyError, parse_json_body

# OpenAI's limits on `stop`: up to 4 sequences (the engine's device table holds as many: agent.requests);
# each at most 32 UTF-8 bytes here (agent.requests.MAX_STOP_BYTES: the table's width)
MAX_STOPS = 4
MAX_STOP_BYTES = 32
# a seed is a 32-bit key: jax.random.key(seed) wraps larger ones (2**32 + 5 and 5 would sample alike)
SEED_RANGE = 2**32

# Fields that change nothing here, accepted with any value (OpenAI's bookkeeping and routing hints).
HARMLESS = frozenset(("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"))
# Fields this server cannot honour: accepted only with the value that means "off" (a predicate), else a 400
# naming them. Anything not in this table, HARMLESS or the honoured fields is an unknown field: a 400.
NEUTRAL = {
    "presence_penalty": lambda v: v is None or v == 0,
    "frequency_penalty": lambda v: v is None or v == 0,
    "logit_bias": lambda v: v is None or v == {},
    "logprobs": lambda v: v is None or v is False,
    "top_logprobs": lambda v: v is None,
    "tools": lambda v: v is None or v == [],
    "tool_choice": lambda v: v is None or v == "none",
    "parallel_tool_calls": lambda v: v is None,
    "functions": lambda v: v is None or v == [],
    "function_call": lambda v: v is None or v == "none",
    "response_format": lambda v: v is None or v == {"type": "text"},
    "modalities": lambda v: v is None or v == ["text"],
    "audio": lambda v: v is None,
    "prediction": lambda v: v is None,
    "web_search_options": lambda v: v is None,
    "reasoning_effort": lambda v: v is None,
    "verbosity": lambda v: v is None,
}
HONOURED = frozenset(
    (
        "model messages stream stream_options temperature top_p max_tokens max_completion_tokens stop seed n"
    ).split()
)


class RequestError(Exception):
    """An error answered to the client as OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Defaults:
    """The sampling of a request that omits it (launch/serve_agent.py's --temperature / --top-p)."""

    temperature: float = 0.0
    top_p: float = 1.0


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """What the server uses of a chat-completions body: the question and the settings of its `n` rows."""

    question: str
    stream: bool = False
    question_field: str = "messages"  # where the question came from: messages[i].content
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    n: int = 1
    temperature: float | None = None  # None: the engine's own (only the warmup sends that)
    top_p: float | None = None
    max_tokens: int | None = None  # the policy's own tokens over the episode
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def rows(self) -> list:
        """One `agent.requests.RowRequest` per choice."""
        from jaxsearch.agent.requests import RowRequest

        return [
            RowRequest(self.temperature, self.top_p, self.max_tokens, self.stop, self.seed, choice)
            for choice in range(self.n)
        ]


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _bad(param: str | None, message: str) -> RequestError:
    return RequestError(400, f"{param}: {message}" if param else message, param)


def _content_text(content, param: str) -> str:
    """A message's content: a string, or a list of text parts (joined), else a 400 naming `param`."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            where = f"{param}[{j}]"
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise _bad(where, 'expected a text part {"type": "text", "text": str}')
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(param, f"expected a string or a list of text parts, got {type(content).__name__}")


def _question(messages) -> tuple[str, str]:
    """(the last user message's content, its field name)."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "expected a non-empty list of {role, content} messages")
    question = None
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f"messages[{i}]", "expected an object {role, content}")
        if not isinstance(message.get("role"), str):
            raise _bad(f"messages[{i}].role", "expected a string")
        content = message.get("content")
        if content is None and message["role"] != "user":
            continue  # an assistant message with tool calls only
        text = _content_text(content, f"messages[{i}].content")
        if message["role"] == "user":
            question = (text, f"messages[{i}].content")
    if question is None:
        raise _bad("messages", "no user message: the question is the last user message's content")
    if not question[0].strip():
        raise _bad(question[1], "the question (the last user message) is empty")
    return question


def _check_fields(body: dict) -> None:
    """A 400 naming the first field that is unknown, or that this server cannot honour."""
    for name, value in body.items():
        if name in HONOURED or name in HARMLESS:
            continue
        if name not in NEUTRAL:
            raise _bad(name, "unknown field (this server honours: " + ", ".join(sorted(HONOURED)) + ")")
        if not NEUTRAL[name](value):
            raise _bad(name, f"not supported by this search-agent server (got {value!r}); leave it out")


def _stop(value) -> tuple[str, ...]:
    """`stop`: null, a string or a list of up to MAX_STOPS strings of 1..MAX_STOP_BYTES UTF-8 bytes."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", f"expected a string or a list of strings, got {value!r}")
    if len(stops) > MAX_STOPS:
        raise _bad("stop", f"at most {MAX_STOPS} stop sequences, got {len(stops)}")
    for s in stops:
        if not 1 <= len(s.encode()) <= MAX_STOP_BYTES:
            raise _bad("stop", f"each stop sequence must be 1..{MAX_STOP_BYTES} UTF-8 bytes, got {s!r}")
    return tuple(dict.fromkeys(stops))  # duplicates dropped, order kept


def _positive_int(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is not None and (not _is_int(value) or value < 1):
        raise _bad(name, f"expected a positive integer, got {value!r}")
    return value


def json_object(raw: bytes) -> dict:
    """A request body as a JSON object (UTF-8 and nesting depth checked before parsing), else a 400."""
    try:
        body = parse_json_body(raw)  # UTF-8 and nesting depth checked before json.loads
    except BodyError as e:
        raise _bad(None, e.message) from None
    if not isinstance(body, dict):
        raise _bad(None, f"expected a JSON object, got {type(body).__name__}")
    return body


def check_model(body: dict, model_name: str) -> None:
    """A 400 when `model` is not a string, a 404 `model_not_found` when it is not the served model."""
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad("model", "expected a string (the served model: GET /v1/models)")
    if model != model_name:
        raise RequestError(
            404,
            f"model {model!r} does not exist; this server serves {model_name!r}",
            "model",
            code="model_not_found",
        )


def sampling_fields(body: dict, defaults: Defaults) -> tuple[float, float, int | None, int | None]:
    """(temperature, top_p, max_tokens, seed) of a body, each checked (a 400 naming it); the sampling from
    `defaults` where absent, max_tokens from `max_tokens` or `max_completion_tokens`."""
    t = body.get("temperature")
    if t is not None and (not _is_number(t) or not 0 <= t <= 2):
        raise _bad("temperature", f"expected a number in [0, 2], got {t!r}")
    top_p = body.get("top_p")
    if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
        raise _bad("top_p", f"expected a number in (0, 1], got {top_p!r}")
    max_tokens = _positive_int(body, "max_tokens")
    max_completion = _positive_int(body, "max_completion_tokens")
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise _bad(
            "max_completion_tokens", f"differs from max_tokens ({max_completion} != {max_tokens}); send one"
        )
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < SEED_RANGE):
        raise _bad("seed", f"expected an integer in 0..{SEED_RANGE - 1}, got {seed!r}")
    temperature = float(defaults.temperature if t is None else t)
    return temperature, float(defaults.top_p if top_p is None else top_p), max_completion or max_tokens, seed


def parse_chat_request(
    raw: bytes, model_name: str, defaults: Defaults = Defaults(), max_n: int = 1
) -> ChatRequest:
    """The question and row settings of a chat-completions body, or a RequestError naming the bad field.
    `defaults`: the sampling of a request that omits it; `max_n`: the most rows a request may ask for (n)."""
    body = json_object(raw)
    check_model(body, model_name)
    question, field = _question(body.get("messages"))
    _check_fields(body)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", "expected a boolean")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise _bad("stream_options", "only allowed with stream: true")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _bad("stream_options", f"expected {{'include_usage': bool}}, got {options!r}")
        include_usage = options.get("include_usage")
        if include_usage is not None and not isinstance(include_usage, bool):
            raise _bad("stream_options.include_usage", "expected a boolean")
    n = body.get("n")
    if n is not None and (not _is_int(n) or not 1 <= n <= max_n):
        raise _bad("n", f"expected an integer in 1..{max_n} (the server's --max-batch), got {n!r}")
    temperature, top_p, max_tokens, seed = sampling_fields(body, defaults)
    return ChatRequest(
        question,
        bool(stream),
        field,
        bool(include_usage),
        n or 1,
        temperature,
        top_p,
        max_tokens,
        _stop(body.get("stop")),
        seed,
    )
