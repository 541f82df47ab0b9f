"""Serving throughput (issue 44): requests/s and policy tokens/s of the agent server at 1, 16 and 64 concurrent
clients, against the same episodes run through the engine directly; the ratio server / direct is the
server's overhead (HTTP, JSON, batching waits, the per-request bookkeeping).

    PYTHONPATH=. python bench/serving.py                 # ~5 min on 2 CPU cores (+ the tiny searcher's training once)
    PYTHONPATH=. python bench/serving.py --clients 1 16 --requests 32

Model: the tiny searcher (jaxsearch.testing.train_tiny_searcher) with the tiny configuration of
tests/test_serve_agent.py (BM25 k=1, 2 turns, 48-token segments, cache 768), greedy. Server:
launch/serve_agent.py in a subprocess, --max-batch 8, default --batch-wait-ms; each client is a thread with
its own connection sending one request after another (the test set's questions, in turn) until --requests
requests are answered (at least 2 per client). Direct: `engine.rollout` in this process on the same
questions, in batches as the server forms them from C clients (min(C, 8) requests, padded to 8 rows that
are cancelled from the start), with the same per-row requests. Each configuration runs once untimed first
(compiles). "direct + events": the direct rollouts with an events callback that drops them (the server
always passes one: its rows' "done" events answer a request early, the others feed streams), i.e. the
engine's cost of reporting events. Tokens: the policy's sampled tokens (usage.completion_tokens; the direct rollouts' policy
tokens), checked equal between the two.

Prints a markdown table (bench/RESULTS.md, section "Serving throughput").
"""

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_BATCH = 8


def cpu_name() -> str:
    names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
    return f"{names[0]} x {len(names)}" if names else platform.processor() or "unknown CPU"


def serve_flags(d: Path, corpus: str) -> list[str]:
    return ["--checkpoint", str(d / "ckpt"), "--tokenizer", str(d / "tokenizer.json"), "--dtype", "float32",
            "--retriever", "bm25", "--corpus", corpus, "--topk", "1", "--max-turns", "2",
            "--max-segment-tokens", "48", "--max-obs-tokens", "150", "--cache-len", "768",
            "--max-batch", str(MAX_BATCH), "--model-name", "tiny"]  # fmt: skip


def through_server(url: str, questions: list[str], clients: int, total: int) -> tuple[float, int]:
    """(seconds, policy tokens) for `total` greedy requests from `clients` concurrent clients."""
    lock, sent, tokens = threading.Lock(), [0], [0]

    def client():
        with httpx.Client(timeout=1800) as http:
            while True:
                with lock:
                    if sent[0] >= total:
                        return
                    i = sent[0]
                    sent[0] += 1
                body = {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": questions[i % len(questions)]}],
                }
                r = http.post(url + "/v1/chat/completions", json=body)
                r.raise_for_status()
                with lock:
                    tokens[0] += r.json()["usage"]["completion_tokens"]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, tokens[0]


def through_engine(
    engine, params, questions: list[str], clients: int, total: int, events=None
) -> tuple[float, int]:
    """(seconds, policy tokens) of the same requests as `engine.rollout` batches of min(clients, 8) rows
    (`events`: the engine's events callback, as the server passes one)."""
    import jax

    from jaxsearch.agent.requests import RowRequest

    per_batch = min(clients, MAX_BATCH)
    asked = [questions[i % len(questions)] for i in range(total)]
    start, tokens = time.perf_counter(), 0
    for b, at in enumerate(range(0, total, per_batch)):
        batch = asked[at : at + per_batch]
        real = len(batch)
        rows = batch + [batch[-1]] * (MAX_BATCH - real)
        requests = [RowRequest(temperature=0.0, top_p=1.0)] * real + [None] * (MAX_BATCH - real)
        traj = engine.rollout(
            params, rows, jax.random.key(b), requests=requests, events=events, cancelled=lambda i, r=real: i >= r
        )
        tokens += int(sum(int(traj.policy_tokens[i]) for i in range(real)))
    return time.perf_counter() - start, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument(
        "--requests", type=int, default=64, help="requests per configuration (at least 2 per client)"
    )
    args = p.parse_args()

    from jaxsearch.cli import serve_agent
    from jaxsearch.models import orbax_io
    from jaxsearch.testing import train_tiny_searcher

    config, params, tokenizer, world, retriever = train_tiny_searcher()
    questions = [ex.question for ex in world.questions["test"]]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        orbax_io.save_params(str(d / "ckpt"), config, params)
        tokenizer.save(d / "tokenizer.json")
        flags = serve_flags(d, retriever.corpus.path)
        cmd = [sys.executable, os.path.join(ROOT, "launch", "serve_agent.py"), *flags, "--port", "0"]
        env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        try:
            line = proc.stdout.readline()
            if not line.startswith("serving"):
                raise RuntimeError(f"serve_agent.py: {line!r}")
            url = line.split(" on ")[1].split()[0].removesuffix("/v1")
            served = {}
            for c in args.clients:
                total = max(args.requests, 2 * c)
                through_server(url, questions, c, total)  # compiles, untimed
                served[c] = (total, *through_server(url, questions, c, total))
        finally:
            proc.terminate()
            proc.wait()
        # the engine the command builds, in this process (the server's process is gone: the cores are free)
        engine, params = serve_agent.build(serve_agent.parse_args(flags))
        direct, with_events = {}, {}
        for c in args.clients:
            total = served[c][0]
            through_engine(engine, params, questions, c, total)
            direct[c] = through_engine(engine, params, questions, c, total)
            with_events[c] = through_engine(engine, params, questions, c, total, events=lambda e: None)
    print(f"Serving throughput, tiny searcher, greedy, --max-batch {MAX_BATCH}; {cpu_name()}\n")
    print("| clients | requests | server req/s | server tok/s | direct req/s | direct tok/s | server / direct "
          "| direct + events req/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in args.clients:
        total, s_time, s_tokens = served[c]
        d_time, d_tokens = direct[c]
        if s_tokens != d_tokens:
            print(f"warning: {c} clients: the server's {s_tokens} policy tokens != the engine's {d_tokens}")
        print(
            f"| {c} | {total} | {total / s_time:.2f} | {s_tokens / s_time:.0f} | {total / d_time:.2f} | "
            f"{d_tokens / d_time:.0f} | {d_time / s_time:.2f} | {total / with_events[c][0]:.2f} |"
        )


if __name__ == "__main__":
    main()
