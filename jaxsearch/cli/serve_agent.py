"""Serve a trained search agent over an OpenAI-compatible HTTP API (jaxsearch/serving/server.py).

    jaxsearch-serve --run runs/tiny_cpu --port 8000        # a training run's final policy, as it was trained
    python launch/serve_agent.py --checkpoint ckpt/ --retriever bm25 --corpus wiki-18.jsonl --port 8000
    python launch/serve_agent.py --checkpoint Qwen2.5-7B-Instruct/ --protocol eka --retriever remote \\
        --url http://127.0.0.1:8001/retrieve --port 8000

    curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "tiny_cpu", "messages": [{"role": "user", "content": "Who wrote Hamlet?"}]}'

--run DIR serves a launch/train.py workdir: its RL stage's final policy (DIR/grpo/params, or DIR/ppo/params
for PPO) with the tokenizer, protocol, retrievers, corpus and episode limits of DIR/config.json, sampled as
the run's held-out evaluation was (eval_temperature, eval_top_p, eval_retrieval_k, eval_max_turns, ...);
the model id is DIR's name. With --run, the checkpoint, agent and retrieval flags are an error (the run's
config sets them), except --temperature / --top-p. Relative paths in config.json are from the directory
training ran in: serve from there.

GET /v1/models, GET /v1/models/{id}; POST /v1/chat/completions (OpenAI's body: temperature, top_p,
max_tokens / max_completion_tokens, stop, seed, n, stream, stream_options honoured; what the server cannot
honour is a 400 naming it). The question is the last user message; the agent runs its protocol's prompt and
full search loop and answers with OpenAI's chat.completion plus a `search_agent` field per choice (turns,
queries and retrieved docs, EKA's P0, the whole response); `stream: true` streams the episode as it runs.
POST /v1/rstool (RSTool, R-Search's evidence step as a search tool, seed 002 §6): body {"model", "question"}
(and temperature, top_p, max_tokens, seed); the same episode, batched with the chat requests, answered with
the evidence the policy distilled (`evidence`, `reader_prompt`: R-Search's reader prompt around it for a
downstream model, `answer`, `search_agent`, `usage`). Only a policy whose protocol writes evidence (rsearch,
rsearch_eval) serves it; any other answers 404 rstool_unavailable.

    curl -s http://127.0.0.1:8000/v1/rstool -d '{"model": "tiny_cpu_rsearch", "question": "Who wrote it?"}'

Concurrent requests are batched: up to --max-batch rows (padded to it: one compiled shape), waiting at most
--batch-wait-ms for company. --temperature / --top-p are the sampling of requests that omit theirs (with
--run: the run's evaluation's). --checkpoint, --tokenizer, --protocol, the retriever and the episode limits
mean what they mean for launch/eval.py (both take them from jaxsearch/agent/cli.py). Binds 127.0.0.1
unless --host.

Limits, each answered with an error naming it before the work it bounds: --max-body-bytes (413, from
Content-Length, before reading); JSON nested at most 32 levels, UTF-8 (400, before parsing);
--max-message-tokens for the question (400 context_length_exceeded, before it joins a batch: an oversized
question never holds up the requests batched with it).
"""

import argparse
import json
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

# agent flags a --run may still set: the sampling of requests that omit theirs
RUN_OVERRIDES = ("temperature", "top_p")


def _parser() -> tuple[argparse.ArgumentParser, list[argparse.Action]]:
    """The parser and the agent actions that --run replaces (checkpoint, dtype, agent and retrieval groups)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    before = len(p._actions)
    add_agent_arguments(p, checkpoint_required=False)
    agent_actions = [a for a in p._actions[before:] if a.dest not in RUN_OVERRIDES]
    p.add_argument(
        "--run", default="", help="serve a launch/train.py workdir's final policy as it was trained"
    )
    p.add_argument(
        "--model-name", default="", help="the model id clients send (default: checkpoint / run dir name)"
    )
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8000, help="0: a free port (printed at start)")
    g.add_argument(
        "--max-batch", type=int, default=8, help="rows per rollout (requests are padded to it); the most n"
    )
    g.add_argument(
        "--batch-wait-ms", type=float, default=20.0, help="how long a batch waits for more requests"
    )
    g.add_argument("--seed", type=int, default=0, help="sampling seed of requests without their own")
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=4 << 20,
        help="refuse a larger request body (413; default 4 MiB)",
    )
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
    return p, agent_actions


def _given(p: argparse.ArgumentParser, actions: list[argparse.Action], argv) -> list[argparse.Action]:
    """Which of `actions` the command line sets (parsed again with their defaults suppressed)."""
    saved = [a.default for a in actions]
    for a in actions:
        a.default = argparse.SUPPRESS
    try:
        given = vars(p.parse_args(argv))
    finally:
        for a, default in zip(actions, saved):
            a.default = default
    return [a for a in actions if a.dest in given]


def parse_args(argv=None) -> argparse.Namespace:
    p, agent_actions = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = finish_agent_args(p.parse_args(argv))
    args.builtin_prompt = True  # agent_config's field: the protocol's own prompt (no dataset prompt here)
    overrides = [a for a in p._actions if a.dest in RUN_OVERRIDES]
    args.given = {a.dest for a in _given(p, overrides, argv)}
    if args.run:
        conflicts = _given(p, agent_actions, argv)
        if conflicts:
            p.error(
                f"--run {args.run} takes the checkpoint, agent and retrieval settings from the run's config.json; "
                f"drop {', '.join(a.option_strings[0] for a in conflicts)}"
            )
        args.run = os.path.abspath(args.run)
        args.model_name = args.model_name or os.path.basename(args.run.rstrip(os.sep))
    elif not args.checkpoint:
        p.error("one of --checkpoint or --run is required")
    else:
        args.model_name = args.model_name or os.path.basename(args.checkpoint.rstrip(os.sep))
    return args


def run_policy(run_dir: str):
    """(RunConfig of DIR/config.json, DIR/<rl stage>/params) of a launch/train.py workdir, or a
    FileNotFoundError / ValueError naming what is missing."""
    from jaxsearch.config import RunConfig
    from jaxsearch.rl.pipeline import rl_stage

    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"--run {run_dir}: no config.json (launch/train.py writes WORKDIR/config.json)"
        )
    try:
        with open(path) as f:
            recorded = json.load(f)
        # record_config writes an absent section (initial_retriever, judge, ...) as null; from_dict reads {}
        cfg = RunConfig.from_dict({k: {} if v is None else v for k, v in recorded.items()})
    except (json.JSONDecodeError, ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{path}: not a run config: {e}") from None
    stage = os.path.join(run_dir, rl_stage(cfg))
    params = os.path.join(stage, "params")
    if not os.path.isfile(os.path.join(params, "config.json")):
        checkpoints = os.path.join(stage, "checkpoints")
        steps = (
            sorted(int(n) for n in os.listdir(checkpoints) if n.isdigit())
            if os.path.isdir(checkpoints)
            else []
        )
        kept = (
            f"its newest checkpoint is step {steps[-1]} of {cfg.total_steps} ({checkpoints}/{steps[-1]})"
            if steps
            else "no checkpoint yet"
        )
        raise FileNotFoundError(
            f"--run {run_dir}: no final policy yet ({params}): the RL stage has not finished ({kept}); "
            "rerun the training command to finish it"
        )
    for field, value in (
        ("tokenizer.path", cfg.tokenizer.path),
        ("retriever.corpus", cfg.retriever.corpus),
        ("retriever.index", cfg.retriever.index),
        ("initial_retriever.corpus", cfg.initial_retriever and cfg.initial_retriever.corpus),
        ("initial_retriever.index", cfg.initial_retriever and cfg.initial_retriever.index),
    ):
        if value and not os.path.exists(value):
            raise FileNotFoundError(
                f"{path}: {field} {value}: no such file or directory (relative paths are from the directory "
                "training ran in: serve from there)"
            )
    return cfg, params


def check_inputs(args) -> None:
    """Cheap checks before the heavy imports: a ValueError / FileNotFoundError naming the bad input."""
    if args.max_body_bytes < 1 or args.max_message_tokens < 0:
        raise ValueError("--max-body-bytes must be >= 1 and --max-message-tokens >= 0 (0: from --cache-len)")
    if args.max_batch < 1:
        raise ValueError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.batch_wait_ms < 0 or args.temperature < 0 or not 0 <= args.port < 65536:
        raise ValueError("--batch-wait-ms and --temperature must be >= 0, --port in 0..65535")
    if args.run:
        run_policy(args.run)
        return
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
    for flag in ("topk", "max_turns", "max_segment_tokens", "max_obs_tokens", "cache_len"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")


def build(args, mesh=None):
    """(engine, params) of the command line, as launch/eval.py builds them, or with --run as the run's
    trainer built its held-out evaluation's engine (mesh: default all devices). With --run, the sampling
    defaults (args.temperature / args.top_p) become the run's eval_temperature / eval_top_p unless given."""
    import dataclasses

    from jaxsearch import parallel
    from jaxsearch.agent.build import build_engine
    from jaxsearch.agent.policy import load_policy

    mesh = mesh or parallel.make_mesh({"fsdp": -1})
    if not args.run:
        config, params = load_policy(model_config(args), args.seed, mesh)
        return build_engine(agent_config(args), config, mesh, evaluation=True), params
    cfg, params_dir = run_policy(args.run)
    model = dataclasses.replace(cfg.model, orbax_path=params_dir, hf_path=None)
    config, params = load_policy(model, cfg.seed, mesh)
    if "temperature" not in args.given:
        args.temperature = cfg.rollout.eval_temperature
    if "top_p" not in args.given:
        args.top_p = cfg.rollout.eval_top_p
    return build_engine(cfg, config, mesh, evaluation=True), params


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
            args.top_p,
        )
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.no_warmup:  # compile the one batch shape before the first client waits for it
        from jaxsearch.serving.chat_request import ChatRequest

        try:  # a greedy row and a seeded sampled one: what requests use (one batch)
            greedy = ChatRequest("warmup", temperature=0.0)
            sampled = ChatRequest("warmup", temperature=1.0, top_p=0.9, seed=0)
            for job in [server.batcher.submit(r) for r in (greedy, sampled)]:
                job.future.result()
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
