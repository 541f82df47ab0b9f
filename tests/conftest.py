"""Test setup: 8 fake CPU devices and offline HF hub, set before jax or transformers is imported."""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA compilation cache for this test session, in-process and in the training subprocesses the
# tests start (they inherit the environment): runs of the same tiny shapes (a run, its killed copy, its resume)
# compile each program once. Removed at exit; compiles under a second are not cached (JAX's default).
# The tiny searcher that the tests train (`train_tiny_searcher`) goes to a fresh directory too, so every run is a
# fresh machine's run: nothing a test needs may come from an earlier run. Set JAXSEARCH_TEST_CACHE=DIR to keep it
# between runs while working on one test. pytest-xdist's workers inherit both from the controller's environment.
import atexit
import shutil
import tempfile

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
