"""A FastAPI retrieval server with Search-R1's API; concurrent requests are answered by one batched search.

`POST /retrieve` `{"queries": [str], "topk": int, "return_scores": bool}` ->
`{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}`
(without scores: `{"result": [[{"id", "contents"}, ...], ...]}`). `GET /health` -> status and counters.

Every request Search-R1's `retrieval_server.py` accepts is accepted, with the coercions of its pydantic
model (`topk: "3"` -> 3, `return_scores: 1` -> true, extra fields ignored): an empty `queries` list gets
`{"result": []}`, `topk` 0 empty lists (Search-R1 falls back to its default there), a missing or null
`topk` the server's default; any number of queries (searched `max_batch` at a time) and queries of any
length. `contents` is the corpus line's, byte for byte. Anything else (no `queries`, a non-string query,
`topk` -1 or "abc") is a 4xx naming the field.

With `search_topk` set, also Graph-R1's `POST /search` `{"queries": [str]}` -> one JSON string per query,
`'{"results": [{"<knowledge>": text, "<coherence>": score}, ...]}'` (top `search_topk`; script_api.py).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from jaxsearch.retrieval.base import Doc, Retriever, graph_r1_result_string


class RetrieveRequest(BaseModel):
    """Search-R1's request body with its field types (so pydantic coerces as it does there); `topk`
    defaults to the server's `default_topk`."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class GraphR1SearchRequest(BaseModel):
    """Graph-R1's `/search` request body (script_api.py SearchRequest)."""

    queries: list[str]


@dataclasses.dataclass
class _Job:
    queries: list[str]
    k: int
    future: asyncio.Future


class Batcher:
    """Queues requests; one worker answers everything queued with a single `retriever.search` call
    (run in a thread so the event loop keeps accepting requests meanwhile)."""

    def __init__(self, retriever: Retriever, max_batch: int):
        self.retriever = retriever
        self.max_batch = max_batch  # queries per search call (a larger request is split into such jobs)
        self.pending: collections.deque[_Job] = collections.deque()
        self._wake = asyncio.Event()
        self.batches = 0
        self.queries = 0
        self._executor = ThreadPoolExecutor(max_workers=1)

    async def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """Top-k docs per query; a request over `max_batch` queries is queued as several jobs."""
        loop = asyncio.get_running_loop()
        jobs = [
            _Job(queries[i : i + self.max_batch], k, loop.create_future())
            for i in range(0, len(queries), self.max_batch)
        ]
        self.pending.extend(jobs)
        self._wake.set()
        results = await asyncio.gather(*(job.future for job in jobs))
        return [docs for part in results for docs in part]

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.pending:
                await self._search_batch(self._take_batch())

    def _take_batch(self) -> list[_Job]:
        """The oldest pending jobs, up to `max_batch` queries (at least one job)."""
        jobs = [self.pending.popleft()]
        size = len(jobs[0].queries)
        while self.pending and size + len(self.pending[0].queries) <= self.max_batch:
            jobs.append(self.pending.popleft())
            size += len(jobs[-1].queries)
        return jobs

    async def _search_batch(self, jobs: list[_Job]) -> None:
        queries = [q for job in jobs for q in job.queries]
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self._executor, self.retriever.search, queries, max(job.k for job in jobs))
        except Exception as e:  # the failing requests get a 500; the server keeps serving
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        self.batches += 1
        self.queries += len(queries)
        start = 0
        for job in jobs:
            if not job.future.done():  # a client that disconnected cancelled its future
                job.future.set_result([docs[:job.k] for docs in results[start:start + len(job.queries)]])
            start += len(job.queries)


EXPECTED = 'expected a JSON object {"queries": [str, ...], "topk": int, "return_scores": bool}'


def _field(loc: tuple) -> str:
    """("body", "queries", 1) -> "queries[1]"."""
    name = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:]).lstrip(".")
    return name or "body"


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each bad field (400 for a body that is not JSON), never a 500."""
    errors = exc.errors()
    if any(e["type"] == "json_invalid" for e in errors):
        return JSONResponse({"detail": f"invalid JSON: {errors[0].get('ctx', {}).get('error', '')}; {EXPECTED}"}, 400)
    problems = "; ".join(f"{_field(e['loc'])}: {e['msg']}" for e in errors)
    return JSONResponse({"detail": f"{problems}; {EXPECTED}"}, 422)


def _doc_json(doc: Doc) -> dict:
    return {"id": doc.id, "contents": doc.contents}


def create_app(retriever: Retriever, name: str, num_docs: int | None = None, default_topk: int = 3,
               max_topk: int | None = None, max_batch: int = 1024, search_topk: int | None = None) -> FastAPI:
    """The app serving `retriever`; a malformed request gets a 4xx naming the field. max_topk: None, no limit
    but the corpus size; max_batch: queries per search call (a larger request is searched in parts);
    search_topk: None, no Graph-R1 `/search`; else the results each of its queries gets."""
    batcher = Batcher(retriever, max_batch)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()

    app = FastAPI(title="jaxsearch retriever", lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, _validation_error)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "retriever": name, "num_docs": num_docs,
                "batches": batcher.batches, "queries": batcher.queries}

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> JSONResponse:
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
            body = [[{"document": _doc_json(d), "score": d.score} for d in docs] for docs in results]
        else:
            body = [[_doc_json(d) for d in docs] for docs in results]
        return JSONResponse({"result": body})

    if search_topk is not None:

        @app.post("/search")
        async def search(request: GraphR1SearchRequest) -> JSONResponse:
            results = await batcher.search(request.queries, search_topk) if request.queries else []
            return JSONResponse([graph_r1_result_string(docs) for docs in results])

    return app
