"""A FastAPI retrieval server with Search-R1's API; concurrent requests are answered by one batched search.

`POST /retrieve` `{"queries": [str], "topk": int, "return_scores": bool}` ->
`{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}`
(without scores: `{"result": [[{"id", "contents"}, ...], ...]}`). `GET /health` -> status and counters.
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
from pydantic import BaseModel, StrictBool, StrictInt, StrictStr

from jaxsearch.retrieval.base import Doc, Retriever


class RetrieveRequest(BaseModel):
    """Search-R1's request body; `topk` defaults to the server's `default_topk`."""

    queries: list[StrictStr]
    topk: StrictInt | None = None
    return_scores: StrictBool = False


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
        self.max_batch = max_batch  # queries per search call (a larger single request still goes alone)
        self.pending: collections.deque[_Job] = collections.deque()
        self._wake = asyncio.Event()
        self.batches = 0
        self.queries = 0
        self._executor = ThreadPoolExecutor(max_workers=1)

    async def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        job = _Job(queries, k, asyncio.get_running_loop().create_future())
        self.pending.append(job)
        self._wake.set()
        return await job.future

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
               max_topk: int = 100, max_queries: int = 1024, max_query_chars: int = 4096,
               max_batch: int = 1024) -> FastAPI:
    """The app serving `retriever`; requests outside the limits get a 422 naming the field."""
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
        if not 1 <= k <= max_topk:
            raise HTTPException(422, f"topk: must be between 1 and {max_topk}, got {k}")
        if not 1 <= len(request.queries) <= max_queries:
            raise HTTPException(422, f"queries: must hold 1 to {max_queries} queries, got {len(request.queries)}")
        for i, q in enumerate(request.queries):
            if len(q) > max_query_chars:
                raise HTTPException(422, f"queries[{i}]: longer than {max_query_chars} characters")
        results = await batcher.search(request.queries, k)
        if request.return_scores:
            body = [[{"document": _doc_json(d), "score": d.score} for d in docs] for docs in results]
        else:
            body = [[_doc_json(d) for d in docs] for docs in results]
        return JSONResponse({"result": body})

    return app
