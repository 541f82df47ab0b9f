"""An agent engine from a `config.AgentConfig` (a RunConfig's tokenizer, protocol, retriever,
initial_retriever and rollout sections, or launch/eval.py's command line).

    engine = build_engine(cfg, model_config, mesh)                  # training rollouts
    eval_engine = for_evaluation(engine, cfg.rollout)                # eval sampling and top-k, same parts
    engine = with_disturbance(engine, cfg.retriever, questions)      # SOAR's "w/ disturb" (training only)
"""

from __future__ import annotations

from jaxsearch.agent import sampler as sampler_lib
from jaxsearch.agent import rsearch_eval  # noqa: F401 (registers the rsearch_eval protocol)
from jaxsearch.agent.engine import AgentEngine
from jaxsearch.agent.protocols import get_protocol
from jaxsearch.config import AgentConfig, RunConfig
from jaxsearch.models.spans import default_buckets
from jaxsearch.retrieval.disturb import DisturbedRetriever, undisturbed
from jaxsearch.retrieval.factory import make_retriever
from jaxsearch.retrieval.host_split import HostSplitRetriever


def load_tokenizer(tcfg):
    """config.tokenizer: kind qwen (the Qwen2.5 BPE) or word (a world tokenizer JSON at `path`)."""
    if tcfg.kind == "qwen":
        from jaxsearch.models.tokenizer import QwenTokenizer

        return QwenTokenizer()
    if tcfg.kind == "word":
        from jaxsearch.models.word_tokenizer import WordTokenizer

        return WordTokenizer.load(tcfg.path)
    raise ValueError(f"config.tokenizer.kind={tcfg.kind!r}: expected 'qwen' or 'word'")


def build_retriever(rcfg):
    """config.retriever (or initial_retriever): bm25 / dense / remote, split across hosts if asked."""
    retriever = make_retriever(
        rcfg.kind,
        corpus=rcfg.corpus,
        index=rcfg.index,
        url=rcfg.url,
        encoder=rcfg.encoder,
        progress=False,
        deadline_s=rcfg.deadline_s,
        attempt_timeout_s=rcfg.attempt_timeout_s,
    )
    return HostSplitRetriever(retriever) if rcfg.split_across_hosts else retriever


def build_protocol(pcfg):
    """config.protocol: the method's protocol (EKA takes its tag set)."""
    return get_protocol(pcfg.name, **({"tags": pcfg.tags} if pcfg.name == "eka" else {}))


def build_sampler(
    r, model_config, tokenizer, protocol, mesh, temperature: float, top_p: float, max_segment: int = 0
):
    """The rollout's KV-cache sampler (`r`: a `config.RolloutConfig`) at one temperature / top_p
    (temperature 0: greedy, no top-p / top-k), decoding up to `max_segment` tokens a call (0:
    r.max_segment_tokens)."""
    table = sampler_lib.StopTable.build(
        tokenizer, protocol.stop_strings, [tokenizer.eos_id], model_config.vocab_size
    )
    sampling = sampler_lib.SamplingParams(
        temperature, top_p if temperature else 1.0, r.top_k if temperature else 0
    )
    return sampler_lib.Sampler(
        model_config,
        table,
        r.cache_len,
        max_segment or r.max_segment_tokens,
        sampling,
        chunk_buckets=default_buckets(r.max_obs_tokens + 512),
        mesh=mesh,
    )


def build_engine(cfg: AgentConfig | RunConfig, model_config, mesh, evaluation: bool = False) -> AgentEngine:
    """The agent of `cfg` (a RunConfig's agent sections, or an AgentConfig) with the training sampling
    (temperature, top_p, retrieval_k), or with `evaluation` the evaluation's (`for_evaluation`). SOAR's
    internal stream samples at the evaluation settings."""
    cfg = cfg if isinstance(cfg, AgentConfig) else RunConfig.from_dict(cfg).agent
    r = cfg.rollout
    tokenizer = load_tokenizer(cfg.tokenizer)
    protocol = build_protocol(cfg.protocol)
    eval_sampler = build_sampler(
        r, model_config, tokenizer, protocol, mesh, r.eval_temperature, r.eval_top_p, r.eval_max_segment_tokens
    )
    engine = AgentEngine(
        tokenizer,
        protocol,
        build_retriever(cfg.retriever),
        build_sampler(r, model_config, tokenizer, protocol, mesh, r.temperature, r.top_p),
        r.episode,
        initial_retriever=None if cfg.initial_retriever is None else build_retriever(cfg.initial_retriever),
        internal_sampler=eval_sampler,
    )
    return for_evaluation(engine, r) if evaluation else engine


def for_evaluation(engine: AgentEngine, rollout) -> AgentEngine:
    """The same agent (tokenizer, retrievers, compiled functions) with the evaluation's sampler
    (eval_temperature, eval_top_p) and top-k (eval_retrieval_k), turn cap (eval_max_turns) and tokens per
    decode call (eval_max_segment_tokens) of `rollout` (a `config.RolloutConfig`); its retriever searches
    undisturbed (`with_disturbance` is for training only)."""
    limits = engine.limits.replace(
        retrieval_k=rollout.eval_retrieval_k,
        max_turns=rollout.eval_max_turns or rollout.max_turns,
        max_segment_tokens=rollout.eval_max_segment_tokens or rollout.max_segment_tokens,
    )
    return engine.replace(
        sampler=engine.internal_sampler, limits=limits, retriever=undisturbed(engine.retriever)
    )


def with_disturbance(engine: AgentEngine, rcfg, donors) -> AgentEngine:
    """The training engine whose searches replace `rcfg.disturb_rate` of their passages by passages for one of
    `donors` (the training questions; `retrieval.disturb`, SOAR's Tables 5-6); `engine` itself at rate 0."""
    if not rcfg.disturb_rate:
        return engine
    retriever = DisturbedRetriever(engine.retriever, rcfg.disturb_rate, rcfg.disturb_seed, donors)
    return engine.replace(retriever=retriever)
