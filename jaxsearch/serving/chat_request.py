"""A chat-completions request body, checked: `parse_chat_request(raw, model, temperature)` -> `ChatRequest`
(the question, where it came from, the stream flag), or a `RequestError` naming the bad field in OpenAI's
error object. The fields and what is checked: serving/server.py's docstring."""

from __future__ import annotations

import dataclasses

from jaxsearch.retrieval.request_limits import BodyError, parse_json_body


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
class ChatRequest:
    """What the server uses of a chat-completions body."""

    question: str
    stream: bool
    question_field: str = "messages"  # where the question came from: messages[i].content


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


def parse_chat_request(raw: bytes, model_name: str, temperature: float) -> ChatRequest:
    """The question and stream flag of a chat-completions body, or a RequestError naming the bad field."""
    try:
        body = parse_json_body(raw)  # UTF-8 and nesting depth checked before json.loads
    except BodyError as e:
        raise _bad(None, e.message) from None
    if not isinstance(body, dict):
        raise _bad(None, f"expected a JSON object, got {type(body).__name__}")
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
    messages = body.get("messages")
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
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", "expected a boolean")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise _bad("n", f"only n=1 is supported, got {n!r}")
    t = body.get("temperature")
    if t is not None:
        if not _is_number(t) or not 0 <= t <= 2:
            raise _bad("temperature", f"expected a number in [0, 2], got {t!r}")
        if float(t) != temperature:
            raise _bad(
                "temperature",
                f"this server samples at temperature {temperature} (its --temperature) for every request; "
                f"got {t}: leave temperature out or send {temperature}",
            )
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not _is_int(value) or value < 1):
            raise _bad(name, f"expected a positive integer, got {value!r}")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise _bad("seed", f"expected an integer, got {seed!r}")
    return ChatRequest(question[0], bool(stream), question[1])
