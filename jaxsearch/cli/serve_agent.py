"""Serve a trained search agent over an OpenAI-compatible HTTP API (jaxsearch/serving/server.py).

    python launch/serve_agent.py --checkpoint ckpt/ --retriever bm25 --corpus wiki-18.jsonl --port 8000
    python launch/serve_agent.py --checkpoint Qwen2.5-7B-Instruct/ --protocol eka --retriever remote \\
        --url http://127.0.0.1:8001/retrieve --port 8000

    curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "ckpt", "messages": [{"role": "user", "content": "Who wrote Hamlet?"}]}'

GET /v1/models; POST /v1/chat/completions (OpenAI's body; `stream: true` for server-sent events). The
question is the last user message; the agent runs its protocol's prompt and full search loop and answers
with OpenAI's chat.completion plus a `search_agent` field (turns, queries and retrieved docs, EKA's P0, the
whole response). Concurrent requests are batched: up to --max-batch rows (padded to it: one compiled
shape), waiting at most --batch-wait-ms for company. Decoding is greedy unless --temperature; a request's
own temperature must equal it. --checkpoint, --tokenizer, --protocol, the retriever and the episode limits
mean what they mean for launch/eval.py (both take them from jaxsearch/agent/cli.py). Binds 127.0.0.1
unless --host.

Limits, each answered with an error naming it before the work it bounds: --max-body-bytes (413, from
Content-Length, before reading); JSON nested at most 32 levels, UTF-8 (400, before parsing);
--max-message-tokens for the question (400 context_length_exceeded, before it joins a batch: an oversized
question never holds up the requests batched with it).
"""

import argparse
import os
import sys


# FAISS's OpenMP threads spin between calls and starve its BLAS threads (see build_index.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from jaxsearch.agent.cli import (  # noqa: E402
    add_agent_arguments,
    agent_config,
    checkpoint_kind,
    finish_agent_args,
    model_config,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_agent_arguments(p)
    p.add_argument(
        "--model-name", default="", help="the model id clients send (default: checkpoint dir name)"
    )
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8000, help="0: a free port (printed at start)")
    g.add_argument("--max-batch", type=int, default=8, help="rows per rollout (requests are padded to it)")
    g.add_argument(
        "--batch-wait-ms", type=float, default=20.0, help="how long a batch waits for more requests"
    )
    g.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    g.add_argument("--max-body-bytes", type=int, default=4 << 20,
                   help="refuse a larger request body (413; default 4 MiB)")
    g.add_argument(
        "--max-message-tokens",
        type=int,
        default=0,
        help="refuse a longer question (400); 0 (default): what --cache-len leaves after the protocol's "
        "prompt and one --max-segment-tokens segment",
    )
    g.add_argument(
        "--no-warmup", action="store_true", help="compile on the first request instead of at start"
    )
    g.add_argument("--verbose", action="store_true", help="log each request to stderr")
    args = finish_agent_args(p.parse_args(argv))
    args.builtin_prompt = True  # agent_config's field: the protocol's own prompt (no dataset prompt here)
    args.model_name = args.model_name or os.path.basename(args.checkpoint.rstrip(os.sep))
    return args


def check_inputs(args) -> None:
    """Cheap checks before the heavy imports: a ValueError / FileNotFoundError naming the bad input."""
    checkpoint_kind(args.checkpoint)
    if args.tokenizer != "qwen" and not os.path.isfile(args.tokenizer):
        raise FileNotFoundError(
            f"--tokenizer {args.tokenizer}: no such file (a word tokenizer JSON, or qwen)"
        )
    if args.retriever in ("bm25", "dense") and not args.corpus:
        raise ValueError(f"--retriever {args.retriever} needs --corpus")
    if args.retriever == "remote" and not args.url:
        raise ValueError("--retriever remote needs --url (the /retrieve endpoint)")
    for flag in ("corpus", "index", "initial_corpus", "initial_index"):
        path = getattr(args, flag)
        if path and not os.path.exists(path):
            raise FileNotFoundError(f"--{flag.replace('_', '-')} {path}: no such file or directory")
    if args.max_body_bytes < 1 or args.max_message_tokens < 0:
        raise ValueError("--max-body-bytes must be >= 1 and --max-message-tokens >= 0 (0: from --cache-len)")
    for flag in ("max_batch", "topk", "max_turns", "max_segment_tokens", "max_obs_tokens", "cache_len"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.batch_wait_ms < 0 or args.temperature < 0 or not 0 <= args.port < 65536:
        raise ValueError("--batch-wait-ms and --temperature must be >= 0, --port in 0..65535")


def build(args, mesh=None):
    """(engine, params) of the command line, as launch/eval.py builds them (mesh: default all devices)."""
    from jaxsearch import parallel
    from jaxsearch.agent.build import build_engine
    from jaxsearch.agent.policy import load_policy

    mesh = mesh or parallel.make_mesh({"fsdp": -1})
    config, params = load_policy(model_config(args), args.seed, mesh)
    engine = build_engine(agent_config(args), config, mesh, evaluation=True)
    return engine, params


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        check_inputs(args)
        engine, params = build(args)
        from jaxsearch.serving.server import Limits, make_server

        server = make_server(
            engine,
            params,
            args.model_name,
            args.host,
            args.port,
            args.max_batch,
            args.batch_wait_ms,
            args.temperature,
            args.seed,
            args.verbose,
            Limits(args.max_body_bytes, args.max_message_tokens or None),
        )
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.no_warmup:  # compile the one batch shape before the first client waits for it
        try:
            server.batcher.submit("warmup").result()
        except Exception as e:  # noqa: BLE001 - e.g. a cache too short for the protocol's prompt
            server.server_close()
            server.batcher.close()
            print(f"error: warmup rollout failed: {getattr(e, 'message', e)}", file=sys.stderr)
            return 2
    print(f"serving {args.model_name!r} on {server.url}/v1 (max batch {args.max_batch})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.batcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
