"""Knowledge extraction for Graph-R1's hypergraph: n-ary facts (hyper-relations) and their entities per chunk.

A `HyperRelation` is a knowledge segment with a completeness score (0-10) and the `EntityMention`s it holds
(name, type, description, key score 0-100). Two extractors return them:

- `OpenAIExtractor`: any OpenAI-compatible chat endpoint (Graph-R1 used gpt-4o-mini; a vLLM server works the
  same) in Graph-R1's record grammar, with up to 2 gleaning passes, bounded concurrency, retries, and a
  response cache on disk (an interrupted build resumes without asking twice).
- `jaxsearch.data.world.extractor.WorldExtractor`: rule-based, for the synthetic world: one hyper-relation per
  statement sentence, its subject and object (or value) as entities; no model, runs offline.

The record grammar (graphr1/prompt.py, graphr1/operate.py; facts only, the prompt wording is ours):
`("hyper-relation"<|>knowledge segment<|>completeness)` and, after it,
`("entity"<|>name<|>type<|>description<|>key score)`, records separated by `##`, ended by `<|COMPLETE|>`.
Differences from Graph-R1's parser, on purpose: one pair of surrounding double quotes is dropped from every
field (Graph-R1 keeps them, so "ALEX" and ALEX were two entities there), a record may span lines, and gleaning
passes are joined with the record delimiter (Graph-R1 concatenates them, fusing the last record of one pass
with the first of the next when a model omits `<|COMPLETE|>`).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import html
import json
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import httpx


TUPLE_DELIMITER = "<|>"  # graphr1/prompt.py DEFAULT_TUPLE_DELIMITER
RECORD_DELIMITER = "##"  # graphr1/prompt.py DEFAULT_RECORD_DELIMITER
COMPLETION_DELIMITER = "<|COMPLETE|>"  # graphr1/prompt.py DEFAULT_COMPLETION_DELIMITER
DEFAULT_COMPLETENESS = 1.0  # graphr1/operate.py _handle_single_hyperrelation_extraction: non-numeric score
DEFAULT_KEY_SCORE = 50.0  # graphr1/operate.py _handle_single_entity_extraction: non-numeric score
MAX_GLEANING = 2  # graphr1/graphr1.py entity_extract_max_gleaning
LLM_CONCURRENCY = 16  # graphr1/graphr1.py llm_model_max_async
LLM_ATTEMPTS = 3  # graphr1/llm.py openai_complete_if_cache: stop_after_attempt(3)
LLM_BACKOFF = (4.0, 10.0)  # graphr1/llm.py: wait_exponential(min=4, max=10) seconds


@dataclasses.dataclass(frozen=True)
class EntityMention:
    """An entity as one hyper-relation mentions it. `name` is upper-cased (entities merge by exact name)."""

    name: str
    type: str
    description: str
    key_score: float  # 0-100: how central the entity is to the segment


@dataclasses.dataclass(frozen=True)
class HyperRelation:
    """An n-ary fact: a knowledge segment, its completeness (0-10) and the entities it connects."""

    text: str
    completeness: float
    entities: tuple[EntityMention, ...] = ()

    def to_json(self) -> list:
        return [self.text, self.completeness, [dataclasses.astuple(e) for e in self.entities]]

    @classmethod
    def from_json(cls, row: list) -> HyperRelation:
        text, completeness, entities = row
        return cls(text, float(completeness), tuple(EntityMention(n, t, d, float(k)) for n, t, d, k in entities))


# ------------------------------------------------------------------------------------------ the record grammar

_SCORE = re.compile(r"^[-+]?[0-9]*\.?[0-9]+$")  # a number as graphr1/utils.py is_float_regex accepts it
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SPLIT_RECORDS = re.compile("|".join(map(re.escape, (RECORD_DELIMITER, COMPLETION_DELIMITER))))


def clean_field(field: str) -> str:
    """HTML entities unescaped, control characters removed (as graphr1/utils.py clean_str), one pair of
    surrounding double quotes dropped."""
    text = _CONTROL.sub("", html.unescape(field.strip())).strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1].strip()
    return text


def _score(field: str, default: float) -> float:
    text = clean_field(field)
    return float(text) if _SCORE.match(text) else default


def parse_records(output: str) -> tuple[list[HyperRelation], list[str]]:
    """An extraction reply in the record grammar -> (hyper-relations in order, records skipped).

    An entity record belongs to the last hyper-relation before it; one before any, or after a malformed
    hyper-relation, is skipped, as are records without parentheses, of another kind, with too few fields or an
    empty name or segment. A score that is not a number takes Graph-R1's default (completeness 1, key score 50).
    """
    facts: list[tuple[str, float, list[EntityMention]]] = []
    skipped = []
    current: list[EntityMention] | None = None  # the entities of the last well-formed hyper-relation
    for record in (r.strip() for r in _SPLIT_RECORDS.split(output)):
        if not record:
            continue
        inner = re.search(r"\((.*)\)", record, re.DOTALL)
        fields = [f.strip() for f in inner.group(1).split(TUPLE_DELIMITER)] if inner else []
        kind = clean_field(fields[0]).lower() if fields else ""
        if kind == "hyper-relation":
            current = None  # a malformed one takes its entities with it
            if len(fields) >= 3 and clean_field(fields[1]):
                current = []
                facts.append((clean_field(fields[1]), _score(fields[-1], DEFAULT_COMPLETENESS), current))
                continue
        elif kind == "entity" and len(fields) >= 5 and current is not None and clean_field(fields[1].upper()):
            name, entity_type = clean_field(fields[1].upper()), clean_field(fields[2].upper())
            key_score = _score(fields[-1], DEFAULT_KEY_SCORE)
            current.append(EntityMention(name, entity_type, clean_field(fields[3]), key_score))
            continue
        skipped.append(record)
    return [HyperRelation(text, score, tuple(entities)) for text, score, entities in facts], skipped


# ------------------------------------------------------------------------------------------------ the prompts
# Ours, asking for Graph-R1's grammar; `--prompt-file` takes another (e.g. graphr1/prompt.py's, filled in).

_T, _R, _C = TUPLE_DELIMITER, RECORD_DELIMITER, COMPLETION_DELIMITER
EXTRACTION_PROMPT = f"""Split the text below into self-contained knowledge segments, each one sentence that still makes \
sense on its own. For each segment write one record
("hyper-relation"{_T}<the segment>{_T}<completeness: 0-10, how complete the segment is on its own>)
and after it, for each entity the segment mentions, one record
("entity"{_T}<entity name, capitalised>{_T}<entity type>{_T}<what the text says about the entity>{_T}<key score: 0-100, \
how central the entity is>)
Separate the records with {_R}. When everything is listed, write {_C}.

Example
Text: Velmar Rising is a film directed by Tomas Quell. It premiered in 1921.
Output:
("hyper-relation"{_T}"Velmar Rising is a film directed by Tomas Quell."{_T}9){_R}
("entity"{_T}"Velmar Rising"{_T}"film"{_T}"Velmar Rising is a film directed by Tomas Quell."{_T}95){_R}
("entity"{_T}"Tomas Quell"{_T}"person"{_T}"Tomas Quell directed the film Velmar Rising."{_T}85){_R}
("hyper-relation"{_T}"The film Velmar Rising premiered in 1921."{_T}8){_R}
("entity"{_T}"Velmar Rising"{_T}"film"{_T}"Velmar Rising premiered in 1921."{_T}90){_R}
("entity"{_T}"1921"{_T}"date"{_T}"The year Velmar Rising premiered."{_T}60){_C}

Text: {{input_text}}
Output:
"""
CONTINUE_PROMPT = (f"Some knowledge segments or entities of the text were left out. List them in the same format, "
                   f"then {_C}")
IF_LOOP_PROMPT = "Are knowledge segments of the text still missing from the lists? Answer YES or NO."


# ------------------------------------------------------------------------------------ OpenAI-compatible models


class ExtractorUnavailable(RuntimeError):
    """The chat endpoint failed (connection errors, timeouts, 429 or 5xx) through every attempt."""


class ResponseCache:
    """Chat replies by request hash in a JSONL file, appended as they arrive (thread-safe). A line cut by a
    kill is skipped when the file is read again."""

    def __init__(self, path: str):
        self.path = path
        self.replies: dict[str, str] = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    try:
                        row = json.loads(line)
                        self.replies[row["key"]] = row["reply"]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        continue  # a torn last line
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")
        if self._file.tell() and not _ends_with_newline(path):
            self._file.write("\n")
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        return self.replies.get(key)

    def put(self, key: str, reply: str) -> None:
        with self._lock:
            self.replies[key] = reply
            self._file.write(json.dumps({"key": key, "reply": reply}) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class OpenAIExtractor:
    """Hyper-relations from an OpenAI-compatible `/chat/completions` endpoint, Graph-R1's extraction loop.

    Per chunk: the extraction prompt, then up to `max_gleaning` "continue" passes; between passes the model
    is asked whether segments are missing and stops unless it answers yes (graphr1/operate.py
    extract_entities). Requests go `concurrency` at a time; connection errors, timeouts, 429 and 5xx are
    retried `attempts` times in all with exponential backoff in [backoff_min, backoff_max] seconds; replies are
    cached in `cache_path` by a hash of (model, messages, temperature, max_tokens).
    """

    def __init__(self, url: str, model: str, cache_path: str, api_key: str | None = None,
                 concurrency: int = LLM_CONCURRENCY, attempts: int = LLM_ATTEMPTS,
                 backoff: tuple[float, float] = LLM_BACKOFF, timeout: float = 300.0,
                 max_gleaning: int = MAX_GLEANING,
                 temperature: float | None = None, max_tokens: int | None = None, prompt: str = EXTRACTION_PROMPT):
        if "{input_text}" not in prompt:
            raise ValueError("the extraction prompt must contain {input_text} where the chunk goes")
        if concurrency < 1 or attempts < 1 or max_gleaning < 0:
            raise ValueError(f"need concurrency >= 1, attempts >= 1, max_gleaning >= 0; got {concurrency}, "
                             f"{attempts}, {max_gleaning}")
        url = url.rstrip("/")
        self.url = url if url.endswith("/chat/completions") else url + "/chat/completions"
        self.model, self.prompt, self.max_gleaning = model, prompt, max_gleaning
        self.temperature, self.max_tokens = temperature, max_tokens
        self.concurrency, self.attempts, self.backoff = concurrency, attempts, backoff
        self.cache = ResponseCache(cache_path)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout, headers=headers)
        self.counts = collections.Counter()  # requests, cached, retries, skipped_records
        self._counts_lock = threading.Lock()

    @property
    def spec(self) -> dict:
        """What decides the extraction (recorded with the build; a different spec starts extraction over)."""
        return {"kind": "openai", "url": self.url, "model": self.model, "max_gleaning": self.max_gleaning,
                "temperature": self.temperature, "max_tokens": self.max_tokens,
                "prompt_sha1": hashlib.sha1(self.prompt.encode()).hexdigest()}

    def chat(self, messages: list[dict]) -> str:
        """The reply to `messages`, from the cache or the endpoint."""
        body = {"model": self.model, "messages": messages}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        if (reply := self.cache.get(key)) is not None:
            self._count("cached")
            return reply
        reply = self._post(body)
        self.cache.put(key, reply)
        return reply

    def _count(self, name: str, n: int = 1) -> None:
        with self._counts_lock:  # worker threads count at once
            self.counts[name] += n

    def _post(self, body: dict) -> str:
        error = ""
        for attempt in range(self.attempts):
            if attempt:
                self._count("retries")
                time.sleep(min(self.backoff[1], self.backoff[0] * 2 ** (attempt - 1)))
            self._count("requests")
            try:
                response = self._http.post(self.url, json=body)
            except httpx.TransportError as e:
                error = f"{type(e).__name__}: {e}"
                continue
            if response.status_code == 429 or response.status_code >= 500:
                error = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                raise ValueError(f"{self.url} rejected the request (HTTP {response.status_code}): "
                                 f"{response.text[:500]}")
            return _reply_text(response, self.url)
        raise ExtractorUnavailable(f"chat endpoint {self.url} failed {self.attempts} attempts; last error: "
                                   f"{error}. What was extracted is kept: rerun the same command to resume.")

    def extract(self, text: str) -> list[HyperRelation]:
        """The hyper-relations of one chunk (1 to max(1, 2 * max_gleaning) chat calls)."""
        prompt = self.prompt.replace("{input_text}", text)
        history = [{"role": "user", "content": prompt}]
        reply = self.chat(history)
        passes = [reply]
        history.append({"role": "assistant", "content": reply})
        for glean in range(self.max_gleaning):
            reply = self.chat(history + [{"role": "user", "content": CONTINUE_PROMPT}])
            passes.append(reply)
            history += [{"role": "user", "content": CONTINUE_PROMPT}, {"role": "assistant", "content": reply}]
            if glean == self.max_gleaning - 1:
                break
            more = self.chat(history + [{"role": "user", "content": IF_LOOP_PROMPT}])
            if more.strip().strip('"').strip("'").lower() != "yes":
                break
        facts, skipped = parse_records(RECORD_DELIMITER.join(passes))
        self._count("skipped_records", len(skipped))
        return facts

    def extract_many(self, texts: Sequence[str]) -> Iterator[tuple[int, list[HyperRelation]]]:
        """(index, hyper-relations) for each text as it finishes; at most `concurrency` chunks in flight."""
        with ThreadPoolExecutor(self.concurrency) as pool:
            pending: dict[Future, int] = {}
            todo = iter(range(len(texts)))
            try:
                while True:
                    for i in todo:
                        pending[pool.submit(self.extract, texts[i])] = i
                        if len(pending) >= self.concurrency:
                            break
                    if not pending:
                        return
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        yield pending.pop(future), future.result()
            finally:
                for future in pending:
                    future.cancel()

    def close(self) -> None:
        self._http.close()
        self.cache.close()


def _reply_text(response: httpx.Response, url: str) -> str:
    """`choices[0].message.content` of a chat completion; a clear error naming the missing field."""
    try:
        body = response.json()
    except json.JSONDecodeError:
        raise ValueError(f"{url}: the reply is not JSON: {response.text[:200]!r}") from None
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"{url}: the reply has no field 'choices[0].message.content': "
                         f"{str(body)[:200]!r}") from None
    if not isinstance(content, str):
        raise ValueError(f"{url}: field 'choices[0].message.content' must be a string, got {content!r}")
    return content
