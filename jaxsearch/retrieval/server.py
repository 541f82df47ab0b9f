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
and its flag. A large request is searched in bounded parts with fair admission (`Batcher`; a long BM25
query in pieces of its text), and the search thread gives way while the event loop parses a request or
writes an answer, so a large request does not hold up the small ones that arrive meanwhile.

With `search_topk` set, also Graph-R1's `POST /search` `{"queries": [str]}` -> one JSON string per query,
`'{"results": [{"<knowledge>": text, "<coherence>": score}, ...]}'` (top `search_topk`; script_api.py).
"""
from __future__ import annotations

import asyncio
import collections
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
    taken: int = 0  # queries handed to search calls (the last one maybe in part: `pieces` holds the rest)
    answered: int = 0  # queries with results
    pieces: collections.deque = dataclasses.field(default_factory=collections.deque)  # of query taken - 1
    scores: object = None  # query taken - 1's scores so far, when it is scored piece by piece
    returned: bool = False  # back in the event loop's hands (`Batcher._return`)


class Batcher:
    """Queues requests; a worker thread answers them with batched `retriever.search` calls (the event loop
    only parses requests and sends answers, so it keeps accepting requests meanwhile).

    Fair admission: each call takes the pending requests least served first (a request that just arrived
    goes before one that has been searched for a while), each with its next queries while the call has room:
    at most `max_batch` queries and `max_batch_chars` characters (always at least one query). So a large
    request is searched in bounded parts, and a small one that arrives meanwhile waits for at most the call
    in progress, not for the large one.

    The event loop comes first: between calls the worker waits (up to `LOOP_FIRST_S`) while the loop is
    working on a request (`loop_working`: parsing it, or writing the answer the worker just handed it), so
    a small request is not slowed by the worker taking the GIL from the loop every switch interval (a
    search call is short; the loop's work on a small request is too).

    A retriever whose scores add up over a query's pieces (BM25: `split_query`, `scores(piece, into)`,
    `top_docs`) has a query longer than `max_batch_chars` scored piece by piece, each piece a part of a call
    like a short query; else such a query is a call of its own.
    """

    def __init__(self, retriever: Retriever, max_batch: int, max_batch_chars: int = 256):
        self.retriever = retriever
        self.max_batch, self.max_batch_chars = max_batch, max_batch_chars
        self.pieces_add_up = all(hasattr(retriever, m) for m in ("split_query", "scores", "top_docs"))
        self.pending: list[_Job] = []
        self._work = threading.Condition()  # guards pending and each job's taken / served / pieces
        self._arrivals = 0
        self._closed = False
        self._loop_work = 0  # requests the event loop is working on (`loop_working`)
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

    def loop_working(self, change: int) -> None:
        """On the event loop: `change` (+1 / -1) the number of requests it is working on."""
        with self._work:
            self._loop_work += change
            if not self._loop_work:
                self._work.notify()

    async def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """Top-k docs per query (the event loop not working on the request meanwhile)."""
        loop = asyncio.get_running_loop()
        with self._work:
            served = min((job.served for job in self.pending), default=0)
            job = _Job(list(queries), k, loop.create_future(), self._arrivals, served)
            job.results = [None] * len(job.queries)
            self._arrivals += 1
            self.pending.append(job)
            self._loop_work -= 1
            self._work.notify()
        try:
            return await job.future
        finally:
            with self._work:
                self._return(job)  # cancelled (client gone) before its answer came: here

    def _return(self, job: _Job) -> None:
        """The request is the event loop's work again (once: its answer or its cancellation). Holds `_work`."""
        if not job.returned:
            job.returned = True
            self._loop_work += 1

    def _answer(self, job: _Job, outcome) -> None:
        """Hand `job`'s results (or exception) to the event loop, counted as its work from now on: the search
        thread waits for the loop to write the answer instead of taking the GIL from it."""
        with self._work:
            self._return(job)
        job.future.get_loop().call_soon_threadsafe(_settle, job.future, outcome)

    def _loop_first(self) -> None:
        """Wait (at most LOOP_FIRST_S) while the event loop is working on a request. Holds `_work`."""
        self._work.wait_for(lambda: self._loop_work <= 0 or self._closed, timeout=LOOP_FIRST_S)

    def _run(self) -> None:
        while True:
            with self._work:
                while not self._closed:
                    self._loop_first()
                    parts = self._take_batch()
                    if parts or self._closed:  # close() may have ended `_loop_first`'s wait: never wait again
                        break
                    self._work.wait()
                if self._closed:
                    return
            self._search_batch(parts)

    def _split(self, query: str) -> list[str]:
        if self.pieces_add_up and len(query) > self.max_batch_chars:
            return self.retriever.split_query(query, self.max_batch_chars)
        return [query]

    def _take_batch(self) -> list[tuple[_Job, int, str, bool]]:
        """(job, query index, query or piece of it, whether it is the query's last) parts for one search call;
        see the class docstring. Holds `_work`."""
        self.pending = [job for job in self.pending if not job.future.done()]  # failed or client gone
        parts, room, chars_room = [], self.max_batch, self.max_batch_chars
        for job in sorted(self.pending, key=lambda j: (j.served, -j.arrival)):
            n = chars = 0
            while n < room:
                if not job.pieces:
                    if job.taken == len(job.queries):
                        break
                    job.pieces.extend(self._split(job.queries[job.taken]))
                    job.taken += 1
                size = len(job.pieces[0])
                if chars + size > chars_room and (parts or n):
                    break
                piece = job.pieces.popleft()
                parts.append((job, job.taken - 1, piece, not job.pieces))
                chars, n = chars + size, n + 1
            job.served += chars
            room, chars_room = room - n, chars_room - chars
            if room <= 0 or chars_room <= 0:
                break
        self.pending = [job for job in self.pending if job.taken < len(job.queries) or job.pieces]
        return parts

    def _search_batch(self, parts: list[tuple[_Job, int, str, bool]]) -> None:
        """Search `parts`, answering each request once its last query has results. Where a query or piece is
        scored at a time (BM25: no batching to gain), that is as soon as its last part is scored, and the
        event loop's work comes first between parts too."""
        try:
            if self.pieces_add_up:
                for job, i, piece, last in parts:
                    if self._loop_work > 0:
                        with self._work:
                            self._loop_first()
                    job.scores = self.retriever.scores(piece, into=job.scores)
                    if last:
                        job.results[i], job.scores = self.retriever.top_docs(job.scores, job.k), None
                        self._answered(job, 1)
            else:
                results = self.retriever.search([q for _, _, q, _ in parts], max(job.k for job, *_ in parts))
                for (job, i, _, _), docs in zip(parts, results):
                    job.results[i] = docs[:job.k]
                    self._answered(job, 1)
        except Exception as e:  # the failing requests get a 500; the server keeps serving
            for job, *_ in parts:
                self._answer(job, e)
            return
        self.batches += 1

    def _answered(self, job: _Job, n: int) -> None:
        """`n` more of `job`'s queries have results: answer it once all have."""
        self.queries += n
        job.answered += n
        if job.answered == len(job.queries):
            self._answer(job, job.results)


def _settle(future: asyncio.Future, outcome) -> None:
    """On the event loop: the job's results, or its exception (unless the client is gone)."""
    if future.done():
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


# Longest the search thread waits for the event loop's work on the requests in hand before a search call (or
# piece): it parses and answers a small request in well under 1 ms, an 8 MiB one in ~0.1 s (2 CPU cores),
# during which the searches go on a call every 5 ms
LOOP_FIRST_S = 0.005


class _LoopFirst:
    """ASGI middleware: counts the requests the event loop is working on for `Batcher` (from the request's
    start to its answer's end, less its waits: for the body's bytes, for its search, for the client to read)."""

    def __init__(self, app, batcher: Batcher):
        self.app, self.batcher = app, batcher

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def receive_waiting():
            self.batcher.loop_working(-1)
            try:
                return await receive()
            finally:
                self.batcher.loop_working(+1)

        async def send_waiting(message):
            self.batcher.loop_working(-1)
            try:
                await send(message)
            finally:
                self.batcher.loop_working(+1)

        self.batcher.loop_working(+1)
        try:
            await self.app(scope, receive_waiting, send_waiting)
        finally:
            self.batcher.loop_working(-1)


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
    app.add_middleware(_LoopFirst, batcher=batcher)

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
