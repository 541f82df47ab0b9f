"""Test setup: 8 fake CPU devices and offline HF hub, set before jax or transformers is imported."""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One torch/BLAS thread per process: pytest-xdist runs one worker per core, and torch's second OpenMP thread,
# spinning for a core that another process holds, made each MiniLM query encode (the hypergraph searches) 12x
# the CPU time and 0.7 s instead of 0.05 s on a busy 2-core machine. The tests' subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# One persistent XLA compilation cache for this test session, in-process and in the training subprocesses the
# tests start (they inherit the environment): runs of the same tiny shapes (a run, its killed copy, its resume)
# compile each program once. Removed at exit; compiles under a second are not cached (JAX's default).
# The tiny searcher that the tests train (`train_tiny_searcher`) goes to a fresh directory too, so every run is a
# fresh machine's run: nothing a test needs may come from an earlier run. Set JAXSEARCH_TEST_CACHE=DIR to keep it
# between runs while working on one test. pytest-xdist's workers inherit both from the controller's environment.
import atexit
import shutil
import tempfile

# Every compile goes to that cache, not only those over a second (JAX's default): a tiny job compiles ~130
# programs, most well under a second each (eager random inits, small helpers), and the tests run the same tiny
# shapes in many subprocesses (a run, its killed copy, its resume; a config's two runs).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
for _variable, _prefix in [
    ("JAX_COMPILATION_CACHE_DIR", "jaxsearch-tests-xla-cache-"),
    ("JAXSEARCH_TEST_CACHE", "jaxsearch-tests-cache-"),
]:
    if _variable not in os.environ:
        os.environ[_variable] = tempfile.mkdtemp(prefix=_prefix)
        atexit.register(shutil.rmtree, os.environ[_variable], ignore_errors=True)


import threading
import time

import pytest

from net import free_port


# The xdist groups whose module fixtures load the tiny trained searcher (`testing.train_tiny_searcher`): the
# first caller trains it (~1.5 minutes) while any other waits on its lock, so they run as one group, on one
# worker, and the other worker meanwhile runs tests that do not need it.
TINY_SEARCHER_GROUPS = {"evaluate", "serve_agent", "serve_openai"}


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (pyproject.toml's default) with the TINY_SEARCHER_GROUPS as one group."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class TinySearcherScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "tiny_searcher" if scope in TINY_SEARCHER_GROUPS else scope

    return TinySearcherScheduling(config, log)


def pytest_collection_modifyitems(items):
    """Tests marked `slow` first, otherwise in collection order: pytest-xdist hands out tests in this order
    (after the modules kept on one worker), so the longest ones start early instead of holding one worker
    while the others are done."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def in_process_server():
    """Run `retrieval.server.create_app(retriever, "test", **options)` with uvicorn in a thread; yields a function
    (retriever, **options) -> its base url. The servers stop after the test."""
    import uvicorn

    from jaxsearch.retrieval.server import create_app

    servers = []

    def serve(retriever, **options):
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(retriever, "test", **options), port=port, log_level="warning"))
        thread = threading.Thread(target=server.run)
        thread.start()
        servers.append((server, thread))
        while not server.started:
            time.sleep(0.01)
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, thread in servers:
        server.should_exit = True
        thread.join()
