"""A FastAPI retrieval server with Search-R1's API; concurrent requests are answered by batched searches.

`POST /retrieve` `{"queries": [str], "topk": int, "return_scores": bool}` ->
`{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}`
(without scores: `{"result": [[{"id", "contents"}, ...], ...]}`). `GET /health` -> status and counters.

Every request Search-R1's `retrieval_server.py` accepts within the server's `Limits` is accepted, with the
coercions of its pydantic model (`topk: "3"` -> 3, `return_scores: 1` -> true, extra fields ignored): an
empty `queries` list gets `{"result": []}`, `topk` 0 empty lists (Search-R1 falls back to its default
there), a missing or null `topk` the server's default. `contents` is the corpus line's, byte for byte.
Anything else (no `queries`, a non-string query, `topk` -1 or "abc") is a 4xx naming the field.

Limits (`Limits`; launch/serve_retriever.py's flags), checked before the body is parsed or searched: body
bytes (from Content-Length, and counted while reading: 413), JSON nesting depth and UTF-8
(`request_limits`: 400), queries per request and characters per query (400); each message names the limit
and its flag. A large request is searched in bounded parts with fair admission (`Batcher`), so it does
not hold up the small ones that arrive meanwhile.

With `search_topk` set, also Graph-R1's `POST /search` `{"queries": [str]}` -> one JSON string per query,
`'{"results": [{"<knowledge>": text, "<coherence>": score}, ...]}'` (top `search_topk`; script_api.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from jaxsearch.retrieval.base import Doc, Retriever, graph_r1_result_string
from jaxsearch.retrieval.request_limits import BodyError, parse_json_body, too_large


class RetrieveRequest(BaseModel):
    """Search-R1's request body with its field types (so pydantic coerces as it does there); `topk`
    defaults to the server's `default_topk`."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class GraphR1SearchRequest(BaseModel):
    """Graph-R1's `/search` request body (script_api.py SearchRequest)."""

    queries: list[str]


@dataclasses.dataclass(eq=False)
class _Job:
    """One request's queries, searched in parts; `served` (characters handed to search calls, started at the
    least-served pending request's count) orders the requests for fair admission."""

    queries: list[str]
    k: int
    future: asyncio.Future
    arrival: int
    served: int
    results: list = dataclasses.field(default_factory=list)
    taken: int = 0  # queries handed to search calls
    answered: int = 0  # queries with results


class Batcher:
    """Queues requests; a worker thread answers them with batched `retriever.search` calls (the event loop
    only parses requests and sends answers, so it keeps accepting requests meanwhile).

    Fair admission: each call takes the pending requests least served first (a request that just arrived
    goes before one that has been searched for a while), each with its next queries while the call has room:
    at most `max_batch` queries and `max_batch_chars` characters (always at least one query). So a large
    request is searched in bounded parts, and a small one that arrives meanwhile waits for at most the call
    in progress, not for the large one.
    """

    def __init__(self, retriever: Retriever, max_batch: int, max_batch_chars: int = 256):
        self.retriever = retriever
        self.max_batch, self.max_batch_chars = max_batch, max_batch_chars
        self.pending: list[_Job] = []
        self._work = threading.Condition()  # guards pending and each job's taken / served
        self._arrivals = 0
        self._closed = False
        self.batches = 0
        self.queries = 0
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._work:
            self._closed = True
            self._work.notify()
        self._thread.join()

    async def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """Top-k docs per query."""
        loop = asyncio.get_running_loop()
        with self._work:
            served = min((job.served for job in self.pending), default=0)
            job = _Job(list(queries), k, loop.create_future(), self._arrivals, served)
            job.results = [None] * len(job.queries)
            self._arrivals += 1
            self.pending.append(job)
            self._work.notify()
        return await job.future

    def _run(self) -> None:
        while True:
            with self._work:
                parts = self._take_batch()
                while not parts and not self._closed:
                    self._work.wait()
                    parts = self._take_batch()
                if self._closed:
                    return
            self._search_batch(parts)

    def _take_batch(self) -> list[tuple[_Job, int, int]]:
        """(job, start, end) parts for one search call; see the class docstring. Holds `_work`."""
        self.pending = [job for job in self.pending if not job.future.done()]  # failed or client gone
        parts, room, chars_room = [], self.max_batch, self.max_batch_chars
        for job in sorted(self.pending, key=lambda j: (j.served, -j.arrival)):
            n = chars = 0
            while job.taken + n < len(job.queries) and n < room:
                size = len(job.queries[job.taken + n])
                if chars + size > chars_room and (parts or n):
                    break
                chars, n = chars + size, n + 1
            if n:
                parts.append((job, job.taken, job.taken + n))
                job.taken, job.served = job.taken + n, job.served + chars
                room, chars_room = room - n, chars_room - chars
            if room <= 0 or chars_room <= 0:
                break
        self.pending = [job for job in self.pending if job.taken < len(job.queries)]
        return parts

    def _search_batch(self, parts: list[tuple[_Job, int, int]]) -> None:
        queries = [q for job, start, end in parts for q in job.queries[start:end]]
        try:
            results = self.retriever.search(queries, max(job.k for job, _, _ in parts))
        except Exception as e:  # the failing requests get a 500; the server keeps serving
            for job, _, _ in parts:
                job.future.get_loop().call_soon_threadsafe(_settle, job.future, e)
            return
        self.batches += 1
        self.queries += len(queries)
        offset = 0
        for job, start, end in parts:
            job.results[start:end] = [docs[:job.k] for docs in results[offset:offset + end - start]]
            job.answered += end - start
            offset += end - start
            if job.answered == len(job.queries):
                job.future.get_loop().call_soon_threadsafe(_settle, job.future, job.results)


def _settle(future: asyncio.Future, outcome) -> None:
    """On the event loop: the job's results, or its exception (unless the client is gone)."""
    if future.done():
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold. Search-R1's training client sends 512 prompts x 5 samples = 2560 queries
    per turn (train_grpo.sh), each a query the policy wrote within one segment (500 tokens by default)."""

    max_body_bytes: int = 8 << 20  # --max-body-bytes: 413 above it, before reading (or while reading) the body
    max_queries: int = 8192  # --max-queries: per request
    max_query_chars: int = 16384  # --max-query-chars: per query

    def check(self, queries: list[str]) -> None:
        """HTTPException 400 naming the first limit `queries` is over."""
        if len(queries) > self.max_queries:
            raise HTTPException(400, f"queries: {len(queries):,} queries is over the limit of {self.max_queries:,} "
                                "per request (the server's --max-queries); send them in several requests")
        for i, q in enumerate(queries):
            if len(q) > self.max_query_chars:
                raise HTTPException(400, f"queries[{i}]: {len(q):,} characters is over the limit of "
                                    f"{self.max_query_chars:,} per query (the server's --max-query-chars)")


EXPECTED = 'expected a JSON object {"queries": [str, ...], "topk": int, "return_scores": bool}'


def _field(loc: tuple) -> str:
    """("body", "queries", 1) -> "queries[1]"."""
    name = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:]).lstrip(".")
    return name or "body"


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each bad field, never a 500."""
    problems = "; ".join(f"{_field(e['loc'])}: {e['msg']}" for e in exc.errors())
    return JSONResponse({"detail": f"{problems}; {EXPECTED}"}, 422)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) from its Content-Length before reading, or once more than `limit` bytes came."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise HTTPException(413, too_large(int(length), limit, "--max-body-bytes").message)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, too_large(size, limit, "--max-body-bytes", counted=True).message)
        chunks.append(chunk)
    return b"".join(chunks)


async def _parse(request: Request, model: type[BaseModel], limits: Limits) -> BaseModel:
    """The body as `model`, each limit checked before the work it bounds: bytes before parsing, JSON depth and
    UTF-8 before json.loads, queries and characters before searching."""
    try:
        body = parse_json_body(await _read_body(request, limits.max_body_bytes))
    except BodyError as e:
        raise HTTPException(e.status, f"{e.message}; {EXPECTED}") from None
    try:
        parsed = model.model_validate(body)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None
    limits.check(parsed.queries)
    return parsed


def _doc_json(doc: Doc) -> dict:
    return {"id": doc.id, "contents": doc.contents}


# Queries whose results are encoded at a time: a large response is sent in such pieces, the event loop
# answering other requests between them (encoded at once, 8192 queries' held it for 0.1-0.9 s)
RESULTS_PER_PIECE = 64


async def _result_pieces(results: list[list[Doc]], item):
    """`{"result": [...]}` as JSONResponse encodes it, in pieces of RESULTS_PER_PIECE queries' results."""
    yield b'{"result":['
    for start in range(0, len(results), RESULTS_PER_PIECE):
        part = [[item(d) for d in docs] for docs in results[start:start + RESULTS_PER_PIECE]]
        text = json.dumps(part, ensure_ascii=False, allow_nan=False, separators=(",", ":"))[1:-1]
        yield (("," if start else "") + text).encode()
        await asyncio.sleep(0)  # sending a piece need not suspend: let the other requests in
    yield b"]}"


def create_app(retriever: Retriever, name: str, num_docs: int | None = None, default_topk: int = 3,
               max_topk: int | None = None, max_batch: int = 1024, search_topk: int | None = None,
               limits: Limits = Limits(), max_batch_chars: int = 256) -> FastAPI:
    """The app serving `retriever`; a malformed request gets a 4xx naming the field. max_topk: None, no limit
    but the corpus size; max_batch / max_batch_chars: queries / characters per search call (see `Batcher`);
    search_topk: None, no Graph-R1 `/search`; else the results each of its queries gets."""
    batcher = Batcher(retriever, max_batch, max_batch_chars)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        yield
        batcher.close()

    app = FastAPI(title="jaxsearch retriever", lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, _validation_error)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "retriever": name, "num_docs": num_docs,
                "batches": batcher.batches, "queries": batcher.queries}

    @app.post("/retrieve")
    async def retrieve(raw: Request) -> JSONResponse:
        request = await _parse(raw, RetrieveRequest, limits)
        k = default_topk if request.topk is None else request.topk
        if k < 0 or (max_topk is not None and k > max_topk):
            limit = "" if max_topk is None else f" and at most {max_topk}"
            raise HTTPException(422, f"topk: must be at least 0{limit}, got {k}; {EXPECTED}")
        if num_docs is not None:
            k = min(k, num_docs)
        if k == 0 or not request.queries:
            results = [[] for _ in request.queries]
        else:
            results = await batcher.search(request.queries, k)
        if request.return_scores:
            item = lambda d: {"document": _doc_json(d), "score": d.score}  # noqa: E731
        else:
            item = _doc_json
        if len(results) <= RESULTS_PER_PIECE:
            return JSONResponse({"result": [[item(d) for d in docs] for docs in results]})
        return StreamingResponse(_result_pieces(results, item), media_type="application/json")

    if search_topk is not None:

        @app.post("/search")
        async def search(raw: Request) -> JSONResponse:
            request = await _parse(raw, GraphR1SearchRequest, limits)
            results = await batcher.search(request.queries, search_topk) if request.queries else []
            return JSONResponse([graph_r1_result_string(docs) for docs in results])

    return app
