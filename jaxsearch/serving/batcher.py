"""Pending chat requests -> one padded `engine.rollout` per batch, in a worker thread (serving/server.py).

    batcher = Batcher(engine, params, max_batch=8, batch_wait_s=0.02)
    job = batcher.submit(chat_request, stream=True)    # a Job: .future (a list of RowSummary per choice),
                                                        # .events (a queue of (choice, agent.requests.Event))
    job.cancel()                                        # the client left: its rows end at the next host turn

A request of n choices is n rows (`ChatRequest.rows`: its own temperature, top_p, max_tokens, stop, seed);
a batch takes whole requests until max_batch rows, pads to max_batch rows (one compiled shape, as
`eval.evaluate.run_batch` does) with rows cancelled from the start (they cost no decoding), and runs one
`engine.rollout` with per-row requests, the `events` callback and the `cancelled` callback. A request is
answered as soon as its own rows are done (their "done" events), not when the batch ends.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from concurrent.futures import Future

from jaxsearch.serving.chat_request import ChatRequest, RequestError


class Job:
    """One request in the batcher: its rows' summaries (the future's result: a list, one per choice), and with
    `stream` a queue of (choice, Event) as the episode runs ((None, RequestError) if it failed)."""

    def __init__(self, request: ChatRequest, stream: bool = False):
        self.request = request
        self.rows = request.rows()
        self.summaries = [None] * request.n
        self.future: Future = Future()
        self.events: queue.Queue | None = queue.Queue() if stream else None
        self.cancelled = False

    def cancel(self) -> None:
        """The client is gone: a queued job is dropped, a running one's rows end at the next host turn."""
        self.cancelled = True
        self.future.cancel()

    def event(self, choice: int, event) -> None:
        """An engine event of this job's row `choice` (the rollout's thread)."""
        if self.events is not None:
            self.events.put((choice, event))
        if event.kind == "done" and self.summaries[choice] is None:
            self.summaries[choice] = event.summary
            if all(s is not None for s in self.summaries) and not self.future.done():
                self.future.set_result(list(self.summaries))

    def fail(self, error: RequestError) -> None:
        if not self.future.done():
            self.future.set_exception(error)
            if self.events is not None:
                self.events.put((None, error))


class Batcher:
    """Pending jobs -> one padded `engine.rollout` per batch, in a worker thread.

    A batch whose rollout raises a ValueError (a prompt without cache room) is rerun one request at a time, so
    only the offending request fails (a RequestError 400); any other exception fails the batch's requests
    (500). The batch's key is fold_in(key(seed), batch number): rows without a seed sample with
    fold_in(batch key, row), as the engine does; rows with one are reproducible in any batch.
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
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._carry: Job | None = None  # a job that did not fit the last batch: first in the next
        self._open = threading.Event()  # cleared by `held()`: the worker waits before collecting a batch
        self._open.set()
        self._thread = threading.Thread(target=self._run, name="agent-batcher", daemon=True)
        self._thread.start()

    def submit(self, request: ChatRequest | str, stream: bool = False) -> Job:
        """Queue a request (a question alone: the engine's own sampling, n=1)."""
        job = Job(ChatRequest(request) if isinstance(request, str) else request, stream)
        if job.request.n > self.max_batch:
            raise ValueError(f"n={job.request.n} is over max_batch={self.max_batch}")
        self._queue.put(job)
        with self._count_lock:  # HTTP handler threads submit concurrently
            self.submitted += 1
        return job

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

    def _next(self, timeout: float | None) -> Job | None:
        if self._carry is not None:
            job, self._carry = self._carry, None
            return job
        return self._queue.get(timeout=timeout)

    def _run(self) -> None:
        while True:
            first = self._next(None)
            if first is None:
                return
            self._open.wait()
            jobs, rows, closing = [first], first.request.n, False
            deadline = time.monotonic() + self.batch_wait_s
            while rows < self.max_batch:
                try:  # wait until the deadline, then take only what is already queued
                    job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    closing = True
                    break
                if rows + job.request.n > self.max_batch:
                    self._carry = job  # whole requests only: it leads the next batch
                    break
                jobs.append(job)
                rows += job.request.n
            jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if jobs:
                self._answer(jobs)
            if closing:
                carry = self._carry
                if carry is not None and carry.future.set_running_or_notify_cancel():
                    self._answer([carry])
                return

    def rollout(self, jobs: list[Job]):
        """One rollout of the jobs' rows padded to `max_batch` rows (cancelled from the start); events and
        the rows' summaries go to their jobs. Returns the Trajectories."""
        import jax

        from jaxsearch.agent.requests import Event, summarize

        owners = [(job, choice) for job in jobs for choice in range(job.request.n)]
        questions = [job.request.question for job, _ in owners]
        requests = [job.rows[choice] for job, choice in owners]
        real = len(owners)
        questions += [questions[-1]] * (self.max_batch - real)
        requests += [None] * (self.max_batch - real)
        key = jax.random.fold_in(self.key, self.batches)
        self.batches += 1

        def events(event) -> None:
            if event.row < real:
                job, choice = owners[event.row]
                job.event(choice, event)

        def cancelled(i: int) -> bool:
            return i >= real or owners[i][0].cancelled

        traj = self.engine.rollout(
            self.params, questions, key, requests=requests, events=events, cancelled=cancelled
        )
        for i, (job, choice) in enumerate(owners):  # rows the engine ended without a "done" event
            if job.summaries[choice] is None:
                job.event(choice, Event(i, "done", summary=summarize(traj, i)))
        return traj

    def _answer(self, jobs: list[Job]) -> None:
        try:
            self.rollout(jobs)
        except ValueError as e:
            if len(jobs) > 1:
                for job in jobs:  # find the request that does not fit; the others are answered
                    if not job.future.done():
                        self._answer([job])
                return
            jobs[0].fail(RequestError(400, f"messages: {e}", "messages"))
            return
        except Exception as e:  # noqa: BLE001 - the requests get a 500; the server keeps serving
            error = RequestError(500, f"rollout failed: {type(e).__name__}: {e}", None, "server_error")
            for job in jobs:
                job.fail(error)
            return
        self.requests += len(jobs)
