"""The command line of an agent to run (launch/eval.py, launch/serve_agent.py): its arguments and what they build.

    add_agent_arguments(parser)            # --checkpoint --tokenizer --dtype, the agent and retrieval groups
    args = finish_agent_args(parser.parse_args())               # paths made absolute
    agent_config(args), model_config(args)  # -> agent.build.build_engine, agent.policy.load_policy

Light to import (no jax): the launchers parse and check before the heavy imports.
"""

from __future__ import annotations

import argparse
import os

from jaxsearch.config import EpisodeConfig

EPISODE = EpisodeConfig()  # the defaults of the rollout flags


def add_agent_arguments(p: argparse.ArgumentParser, checkpoint_required: bool = True) -> tuple:
    """The checkpoint, tokenizer and dtype, and the "agent" and "retrieval" argument groups (returned, so a
    launcher can add its own flags to them). `checkpoint_required` False: the launcher checks it (serve's
    --run replaces it)."""
    p.add_argument(
        "--checkpoint", required=checkpoint_required, default="", help="HF safetensors dir or jaxsearch params dir"
    )
    p.add_argument("--tokenizer", default="qwen", help="qwen, or a word tokenizer JSON (synthetic world)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="params and compute")
    agent = p.add_argument_group("agent")
    agent.add_argument("--protocol", default="search_r1", help="search_r1 | graph_r1 | eka | soar | rsearch")
    agent.add_argument(
        "--eka-tags", default="search_r1", choices=["search_r1", "graph_r1"], help="EKA's tag set"
    )
    agent.add_argument("--topk", type=int, default=5, help="passages per search")
    agent.add_argument("--initial-k", type=int, default=None, help="EKA's P0 passages (default: --topk)")
    agent.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    agent.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (temperature > 0)")
    agent.add_argument("--max-turns", type=int, default=EPISODE.max_turns, help="turns that may search")
    agent.add_argument(
        "--max-segment-tokens", type=int, default=EPISODE.max_segment_tokens, help="tokens per decode segment"
    )
    agent.add_argument(
        "--max-obs-tokens", type=int, default=EPISODE.max_obs_tokens, help="an observation is cut to this"
    )
    agent.add_argument("--cache-len", type=int, default=4096, help="KV cache length (prompt + whole episode)")
    agent.add_argument(
        "--scheduler",
        default=EPISODE.scheduler,
        choices=["lockstep", "slots"],
        help="lockstep: a turn waits for its slowest row; slots: rows never wait (decode slots)",
    )
    agent.add_argument(
        "--slots", type=int, default=EPISODE.micro_batch, help="slots: decode slots (0: one per row)"
    )
    agent.add_argument(
        "--steps-per-call",
        type=int,
        default=EPISODE.steps_per_call,
        help="slots: decode steps per device call",
    )
    retrieval = p.add_argument_group("retrieval")
    retrieval.add_argument("--retriever", default="bm25", choices=["bm25", "dense", "remote", "hypergraph"])
    retrieval.add_argument(
        "--corpus", default="", help="corpus JSONL (bm25 / dense; eval.py with remote: gold passages for R-S)"
    )
    retrieval.add_argument(
        "--index", default="", help="index dir from build_index.py (default: index in RAM), or hypergraph: the "
        "dir from build_hypergraph.py"
    )
    retrieval.add_argument("--url", default="", help="remote: the /retrieve endpoint")
    retrieval.add_argument(
        "--encoder",
        default="",
        help="dense: query encoder (e5 | bge | minilm | model; default e5); hypergraph: default the one it was "
        "built with",
    )
    retrieval.add_argument(
        "--initial-corpus", default="", help="EKA: P0 from this corpus instead (noisy-P0 ablation)"
    )
    retrieval.add_argument(
        "--initial-retriever",
        default="bm25",
        choices=["bm25", "dense"],
        help="EKA: how P0 is searched in --initial-corpus (dense: with --encoder, default e5)",
    )
    retrieval.add_argument(
        "--initial-index", default="", help="EKA: index of --initial-corpus from build_index.py (BM25 or FAISS)"
    )
    return agent, retrieval


def finish_agent_args(args: argparse.Namespace) -> argparse.Namespace:
    """The parsed arguments with the checkpoint, tokenizer JSON and retrieval paths made absolute; a
    SystemExit naming the flag when --initial-retriever / --initial-index come without --initial-corpus."""
    if not args.initial_corpus:
        given = {"--initial-retriever": args.initial_retriever != "bm25", "--initial-index": args.initial_index}
        for flag in (f for f, on in given.items() if on):
            raise SystemExit(f"{flag} searches --initial-corpus for P0: give --initial-corpus too")
    for key in ("checkpoint", "corpus", "index", "initial_corpus", "initial_index"):
        if getattr(args, key):
            setattr(args, key, os.path.abspath(getattr(args, key)))
    if args.tokenizer != "qwen":
        args.tokenizer = os.path.abspath(args.tokenizer)
    return args


def checkpoint_kind(path: str) -> str:
    """'orbax' (config.json + params/), 'hf' (*.safetensors) or a FileNotFoundError naming the path."""
    if os.path.isfile(os.path.join(path, "config.json")) and os.path.isdir(os.path.join(path, "params")):
        return "orbax"
    if os.path.isdir(path) and any(f.endswith(".safetensors") for f in os.listdir(path)):
        return "hf"
    raise FileNotFoundError(
        f"{path}: not an HF safetensors dir nor a jaxsearch params dir (config.json + params/)"
    )


def agent_config(args):
    """The agent to evaluate (tokenizer, protocol, retrievers, decoding) from the command line."""
    from jaxsearch.config import AgentConfig, ProtocolConfig, RetrieverConfig, RolloutConfig, TokenizerConfig

    tokenizer = (
        TokenizerConfig("qwen", None) if args.tokenizer == "qwen" else TokenizerConfig("word", args.tokenizer)
    )
    encoder = args.encoder or ("e5" if args.retriever == "dense" else None)
    retriever = RetrieverConfig(args.retriever, args.corpus or None, args.index or None, args.url or None, encoder)
    initial = None
    if args.initial_corpus:  # EKA's noisy-P0 ablation: P0 from another corpus, by BM25 or a dense encoder
        kind = args.initial_retriever
        initial_encoder = (args.encoder or "e5") if kind == "dense" else None
        initial = RetrieverConfig(kind, args.initial_corpus, args.initial_index or None, None, initial_encoder)
    rollout = RolloutConfig(
        max_turns=args.max_turns,
        retrieval_k=args.topk,
        initial_k=args.initial_k or args.topk,
        internal_k=EPISODE.internal_k,  # SOAR's listed facts per search
        max_segment_tokens=args.max_segment_tokens,
        max_obs_tokens=args.max_obs_tokens,
        cache_len=args.cache_len,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=0,
        eval_temperature=args.temperature,
        eval_top_p=args.top_p,
        eval_retrieval_k=args.topk,
        micro_batch=args.slots,
        scheduler=args.scheduler,
        steps_per_call=args.steps_per_call,
    )
    protocol = ProtocolConfig(args.protocol, args.eka_tags, data_prompt=not args.builtin_prompt)
    return AgentConfig(tokenizer, protocol, retriever, initial, rollout)


def model_config(args):
    """The checkpoint to load, in --dtype (params and compute), without rematerialisation (no training)."""
    from jaxsearch.config import ModelConfig

    kind = checkpoint_kind(args.checkpoint)
    sizes = dict.fromkeys(
        "vocab_size hidden_size intermediate_size num_attention_heads num_key_value_heads num_hidden_layers".split()
    )
    return ModelConfig(
        hf_path=args.checkpoint if kind == "hf" else None,
        orbax_path=args.checkpoint if kind == "orbax" else None,
        preset=None,
        dtype=args.dtype,
        param_dtype=args.dtype,
        remat=False,
        logprob_chunk=512,
        attention_chunk=512,
        scan_layers=False,
        tie_word_embeddings=False,
        **sizes,
    )
