"""Head-of-line blocking on both servers (issue 42): a small request's latency while a maximal allowed large
one is in flight, as a ratio to the same small request's latency alone, measured in the same run. Target:
within 2x.

    PYTHONPATH=. python bench/server_latency.py          # ~3 min on 2 CPU cores (+ the tiny searcher's training once)
    PYTHONPATH=. python bench/server_latency.py --skip-agent --max-query-chars 2048

Retrieval: launch/serve_retriever.py (BM25 over tests/data/corpus, 300 passages; default limits) in a
subprocess. Small: one one-word query, sent back to back. Large: the most search work the default limits
allow, (a) queries of --max-query-chars characters (corpus words) filling --max-body-bytes, (b)
--max-queries questions of the test set. The small requests run from the moment the large one is sent until
it is answered; alone: 100 just before, and as many as fit in as long again (at most 30 s) just after.
Agent: launch/serve_agent.py with the tiny searcher (jaxsearch.testing), default limits. Small: a test
question; large: a question of --max-message-tokens tokens (the most the default allows), sent together so
they share a batch; and the issue's case, 7 questions beside a 3.9 MB one (refused before batching).

Prints a markdown report (bench/RESULTS.md, section "Server latency under a large request").
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "data", "corpus", "corpus.jsonl")
QUESTIONS = [json.loads(line)["question"] for line in open(os.path.join(ROOT, "tests", "data", "corpus", "queries.jsonl"))]
ENV = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")


def cpu_name() -> str:
    names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
    return f"{names[0]} x {len(names)}" if names else "unknown CPU"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], ready) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV, text=True)
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[1]} exited with {proc.returncode}")
        if ready(proc):
            return proc
        time.sleep(0.2)
    raise TimeoutError(f"{cmd[1]} did not come up")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def beside(large, small, repeat_small: bool = True) -> tuple[list[float], float]:
    """Run `large()` in a thread; meanwhile `small()` back to back (once if not repeat_small) -> (small
    latencies, large seconds)."""
    done, out = threading.Event(), {}

    def run_large():
        out["large"] = timed(large)
        done.set()

    thread = threading.Thread(target=run_large)
    thread.start()
    latencies = [timed(small)]
    while repeat_small and not done.is_set():
        latencies.append(timed(small))
    thread.join()
    return latencies, out["large"]


def back_to_back(small, seconds: float) -> list[float]:
    """`small()` back to back for `seconds` -> its latencies."""
    latencies, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        latencies.append(timed(small))
    return latencies


def row(what: str, alone: list[float], during: list[float], large_s: float) -> str:
    a, d = statistics.median(alone), statistics.median(during)
    p90 = sorted(during)[int(0.9 * (len(during) - 1))]
    load = os.getloadavg()[0]  # the machine may be shared: a figure means little without it
    return (f"| {what} | {a * 1e3:.1f} | {d * 1e3:.1f} (p90 {p90 * 1e3:.1f}, n={len(during)}) | "
            f"**{d / a:.2f}x** | {large_s:.1f} s | {load:.1f} |")


def retrieval_rows(max_query_chars: int) -> list[str]:
    from jaxsearch.retrieval.server import Limits

    limits = Limits(max_query_chars=max_query_chars or Limits.max_query_chars)
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def healthy(_):
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    proc = start([sys.executable, os.path.join(ROOT, "launch", "serve_retriever.py"), "--corpus", CORPUS,
                  "--retriever", "bm25", "--port", str(port), "--max-query-chars", str(limits.max_query_chars)], healthy)
    http = httpx.Client(timeout=600)
    try:
        small = lambda: http.post(url + "/retrieve", json={"queries": ["River"], "topk": 3}).raise_for_status()
        for _ in range(20):
            small()
        words = open(CORPUS).read().split()
        rng = random.Random(0)
        long_query = lambda: " ".join(rng.choice(words) for _ in range(limits.max_query_chars // 4))[: limits.max_query_chars]
        n_long = (limits.max_body_bytes - 64) // (limits.max_query_chars + 4)  # '"...", ' per query
        larges = {
            f"{n_long} queries of {limits.max_query_chars:,} characters": [long_query() for _ in range(n_long)],
            f"{limits.max_queries:,} questions": [QUESTIONS[i % len(QUESTIONS)] for i in range(limits.max_queries)],
        }
        rows = []
        for what, queries in larges.items():
            body = json.dumps({"queries": queries, "topk": 3}, ensure_ascii=False).encode()
            while len(body) > limits.max_body_bytes:  # non-ASCII words take more than a byte a character
                queries = queries[:-1]
                body = json.dumps({"queries": queries, "topk": 3}, ensure_ascii=False).encode()
            what = what.replace(str(n_long), str(len(queries)), 1)

            def large(body=body):
                with httpx.Client(timeout=600) as c:
                    c.post(url + "/retrieve", content=body, headers={"content-type": "application/json"}).raise_for_status()

            # alone: just before and for as long again just after (the load of a shared machine drifts)
            alone = [timed(small) for _ in range(100)]
            during, large_s = beside(large, small)
            alone += back_to_back(small, min(large_s, 30.0))
            rows.append(row(f"retrieval: 1 one-word query beside {what} ({len(body) / 2**20:.1f} MiB)", alone, during, large_s))
        return rows
    finally:
        http.close()
        stop(proc)


def agent_rows(workdir: str) -> list[str]:
    from pathlib import Path

    from jaxsearch.models import orbax_io
    from jaxsearch.testing import train_tiny_searcher

    config, params, tokenizer, world, retriever = train_tiny_searcher()
    d = Path(workdir)
    orbax_io.save_params(str(d / "ckpt"), config, params)
    tokenizer.save(d / "tokenizer.json")
    questions = [ex.question for ex in world.questions["test"][:8]]
    cmd = [sys.executable, os.path.join(ROOT, "launch", "serve_agent.py"), "--checkpoint", str(d / "ckpt"),
           "--tokenizer", str(d / "tokenizer.json"), "--dtype", "float32", "--retriever", "bm25", "--corpus",
           retriever.corpus.path, "--topk", "1", "--max-turns", "2", "--max-segment-tokens", "48",
           "--max-obs-tokens", "150", "--cache-len", "768", "--max-batch", "8", "--batch-wait-ms", "50",
           "--model-name", "tiny", "--port", "0"]  # the tiny configuration of tests/test_serve_agent.py
    proc = start(cmd, lambda p: True)
    line = proc.stdout.readline()
    if not line.startswith("serving"):
        raise RuntimeError(f"serve_agent.py: {line!r}")
    url = line.split(" on ")[1].split()[0].removesuffix("/v1")
    http = httpx.Client(timeout=600)

    def chat(question):
        body = {"model": "tiny", "messages": [{"role": "user", "content": question}]}
        return http.post(url + "/v1/chat/completions", json=body)

    try:
        small = lambda: chat(questions[0]).raise_for_status()
        small()
        alone = [timed(small) for _ in range(8)]
        # the largest question the default --max-message-tokens allows: grow it until the server refuses
        words = [w for q in questions for w in q.split()]
        n = 16
        while chat(" ".join(words[i % len(words)] for i in range(n))).status_code == 200:
            n *= 2
        lo, hi = n // 2, n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if chat(" ".join(words[i % len(words)] for i in range(mid))).status_code == 200 else (lo, mid)
        biggest = " ".join(words[i % len(words)] for i in range(lo))
        rows = []
        during = []
        for _ in range(8):
            lat, large_s = beside(lambda: chat(biggest).raise_for_status(), small, repeat_small=False)
            during += lat
        rows.append(row(f"agent: 1 question beside the largest allowed ({lo} words, same batch)", alone, during, large_s))
        huge = "word " * 780_000  # the 3.9 MB message
        seven = []
        for _ in range(4):
            threads = [threading.Thread(target=lambda q=q: seven.append(timed(lambda: chat(q).raise_for_status())))
                       for q in questions[:7]]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            refused = chat(huge)
            huge_s = time.perf_counter() - t0
            assert refused.status_code == 400, refused.text
            for t in threads:
                t.join()
        rows.append(row(f"agent: 7 questions beside a 3.9 MB one (refused in {huge_s * 1e3:.0f} ms)", alone, seven, huge_s))
        return rows
    finally:
        http.close()
        stop(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--skip-agent", action="store_true")
    p.add_argument("--max-query-chars", type=int, default=0, help="the retrieval server's (0: its default)")
    args = p.parse_args()
    print(f"CPU: {cpu_name()}; python bench/server_latency.py; latencies in ms, median over the run\n")
    print("| small request, beside | alone | beside the large one | ratio | large one took | load average |")
    print("|---|---|---|---|---|---|")
    for r in retrieval_rows(args.max_query_chars):
        print(r, flush=True)
    if not args.skip_agent:
        with tempfile.TemporaryDirectory() as d:
            for r in agent_rows(d):
                print(r, flush=True)


if __name__ == "__main__":
    main()
