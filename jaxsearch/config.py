"""The run's configuration, typed: frozen dataclasses built once from a configs/*.py ConfigDict and checked.

    cfg = RunConfig.from_dict(get_config())        # or a ConfigDict after --config.key=value overrides
    cfg.rollout.max_turns, cfg.judge is None, ...
    cfg.to_dict()                                  # what WORKDIR/config.json records (rl/pipeline.py)

Config files keep ml_collections' conventions (a flag override must keep a key's type), so they write "not
set" as "" or 0; here every such value becomes an explicit None, in one place (`_OPTIONAL`):

    model.hf_path / orbax_path / preset ""      -> None     model.vocab_size, hidden_size, ... 0 or -1 -> None
    tokenizer.path, retriever.corpus / index / url / encoder ""  -> None
    initial_retriever.kind ""  -> initial_retriever None (P0 from the retriever)
    judge.kind / evidence_model.kind ""  -> judge / evidence_model None
    world.size ""  -> world None           sft.steps 0 -> sft None (no warm start)
    lora.rank 0 -> lora None (every parameter trained)
    sft.mistake ""  -> None                sft.questions 0 -> None (SFT and RL share the questions)
    algo.clip_eps_low / clip_eps_high 0.0, loss_norm_tokens / overlong_buffer / overlong_max_tokens 0  -> None
    distributed.coordinator "", num_processes 0, process_id -1  -> None (from the environment)

A key the dataclasses do not know, a value of the wrong type or out of range is a `ConfigError` naming the key
(`config.rollout.max_turns=-1: expected >= 0`); `unknown_key` names a --config.key override that the config file
lacks, with the nearest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    hf_path: str | None
    orbax_path: str | None
    preset: str | None  # a `qwen2.preset` name (random init), when no path and no explicit sizes
    dtype: str
    param_dtype: str
    remat: bool
    logprob_chunk: int
    attention_chunk: int  # query chunk of the training forward's attention (0: dense)
    scan_layers: bool
    # explicit sizes of a random init (None: from the checkpoint or preset; a world run fills vocab_size)
    vocab_size: int | None
    hidden_size: int | None
    intermediate_size: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    num_hidden_layers: int | None
    tie_word_embeddings: bool
    # the decoder of explicit sizes: qwen2 (q/k/v biases) | qwen3 (q/k RMSNorm, no biases); a preset or a
    # checkpoint's config.json names its own
    family: str = "qwen2"
    head_dim: int = 0  # explicit sizes: per-head dims (0: hidden_size // num_attention_heads)
    # prefill / training attention (models/attention.py IMPLS): reference | xla | cudnn | auto (cuDNN's flash
    # attention on a GPU for bf16 / fp16, else reference)
    attention_impl: str = "auto"

    def __post_init__(self):
        if self.family not in ("qwen2", "qwen3"):
            raise ConfigError(f"config.model.family={self.family!r}: expected one of qwen2, qwen3")
        if self.head_dim < 0:
            raise ConfigError(f"config.model.head_dim={self.head_dim}: expected >= 0")


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    kind: str  # qwen | word
    path: str | None  # word: the WordTokenizer JSON


@dataclasses.dataclass(frozen=True)
class ProtocolConfig:
    name: str
    tags: str  # EKA's tag set: search_r1 | graph_r1
    data_prompt: bool  # search_r1: prompt with a dataset row's own `prompt`


@dataclasses.dataclass(frozen=True)
class RetrieverConfig:
    kind: str  # bm25 | dense | remote | hypergraph
    corpus: str | None
    index: str | None
    url: str | None
    encoder: str | None
    split_across_hosts: bool = False
    # remote: a search call gives up after deadline_s seconds in all, an attempt after attempt_timeout_s
    # (retrieval/client.py RemoteRetriever); then training stops, its checkpoints kept
    deadline_s: float = 30.0
    attempt_timeout_s: float = 15.0
    # SOAR's "w/ disturb" (Tables 5-6): this share of each search's passages replaced by a donor question's,
    # in training rollouts only, deterministic in disturb_seed (retrieval/disturb.py); 0: off
    disturb_rate: float = 0.0
    disturb_seed: int = 0


@dataclasses.dataclass(frozen=True)
class DataConfig:
    train: str
    eval: dict  # name -> FlashRAG JSONL / parquet path
    eval_examples: int
    eval_sample: str  # first | random
    eval_seed: int
    batch_size: int  # questions per step
    group_size: int  # samples per question
    shuffle: bool
    # eval dataset name -> the /retrieve URL of a remote retriever over that dataset's own corpus (R-Search's
    # src/eval/config.yaml: 2WikiMQA, HotpotQA and MuSiQue each their own, wiki-18 the others); "*": every
    # dataset not named; without either, `retriever` (`eval.evaluate.dataset_urls`)
    eval_retrievers: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """The limits of one rollout and how its rows are scheduled: what the agent engine reads
    (`AgentEngine.limits`), the first keys of a run's `rollout` section (`RolloutConfig` adds the sampler's)
    and the defaults of the agent command line (`agent/cli.py`). Token counts are per row."""

    max_turns: int = 4  # turns that may search; a last turn without search follows
    retrieval_k: int = 3  # passages per search
    initial_k: int = 3  # EKA's P0 passages
    internal_k: int = 3  # SOAR: facts listed by the internal-knowledge generation
    max_segment_tokens: int = 500  # one decode segment
    max_obs_tokens: int = 500  # an observation is cut to this many tokens (Search-R1's max_obs_length)
    micro_batch: int = 0  # rows per sampler call, or decode slots (0: all rows)
    scheduler: str = "slots"  # lockstep: a turn waits for its slowest row; slots: rows never wait
    steps_per_call: int = 16  # slots: decode steps per device call

    def replace(self, **changes) -> EpisodeConfig:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig(EpisodeConfig):
    """A run's `rollout` section: the episode's limits (`EpisodeConfig`) and the sampler's settings."""

    cache_len: int
    temperature: float
    top_p: float
    top_k: int  # 0: off
    eval_temperature: float
    eval_top_p: float
    eval_retrieval_k: int
    # the evaluation's turn cap and tokens per decode call where the authors' evaluation loop differs from their
    # training rollout (R-Search's src/eval/main.py); 0: max_turns / max_segment_tokens
    eval_max_turns: int = 0
    eval_max_segment_tokens: int = 0
    decode_layout: str = "train"  # the params the sampler reads: train | replicated | tensor (parallel.py)

    @property
    def episode(self) -> EpisodeConfig:
        """The engine's part of the section."""
        return EpisodeConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EpisodeConfig)})


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    terms: tuple  # ((name, weight), ...)


@dataclasses.dataclass(frozen=True)
class ChatModelConfig:
    kind: str  # openai | local | world
    base_url: str
    model: str
    path: str
    tokenizer: str
    cache_len: int
    max_new_tokens: int
    temperature: float
    top_p: float


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
    """The RL objective. GRPO, PPO, DAPO, Dr.GRPO and GSPO are settings of these keys (configs/tiny_cpu_*.py)."""

    advantage: str  # grpo | dr_grpo | gae (PPO with a critic)
    policy_loss: str  # ppo (token ratio) | gspo (sequence ratio)
    clip_eps: float
    agg_mode: str
    kl_coef: float
    kl_kind: str
    kl_in_reward: float
    entropy_coef: float
    ppo_epochs: int
    mini_batches: int
    micro_batches: int
    pad_multiple: int  # 0: update batches are cache_len wide
    gamma: float
    lam: float
    # PPO: GAE, its whitening and the critic's loss over every "response" token (Search-R1's veRL) or the
    # "policy" tokens only (later veRL's multi-turn rule)
    gae_tokens: str = "response"
    # decoupled clip bounds 1 - low, 1 + high (None: clip_eps); DAPO's clip-higher, GSPO's 3e-4 / 4e-4
    clip_eps_low: float | None = None
    clip_eps_high: float | None = None
    # agg_mode seq-mean-token-sum-norm (Dr.GRPO) divides each row's sum by this constant (None: the most
    # tokens the policy can write in a row, `rl.algorithms.max_policy_tokens`)
    loss_norm_tokens: int | None = None
    # DAPO's dynamic sampling: groups whose rewards are all equal are dropped and more questions rolled out,
    # up to max_draws rollouts per step (rl/dynamic_sampling.py)
    dynamic_sampling: bool = False
    max_draws: int = 10
    # DAPO's soft overlong punishment (Eq. 13): L_cache (None: off) and L_max (None: max_policy_tokens)
    overlong_buffer: int | None = None
    overlong_max_tokens: int | None = None

    def __post_init__(self):
        if self.gae_tokens not in ("response", "policy"):
            raise ConfigError(f"config.algo.gae_tokens={self.gae_tokens!r}: expected 'response' or 'policy'")
        buffer, longest = self.overlong_buffer, self.overlong_max_tokens
        if buffer is not None and longest is not None and buffer >= longest:
            raise ConfigError(
                f"config.algo.overlong_buffer={buffer}: expected < algo.overlong_max_tokens={longest}"
            )


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA fine-tuning of the policy (models/lora.py): the base frozen, only the adapters trained."""

    rank: int
    alpha: float
    dropout: float  # on the adapters' input, in the update's forward only
    # transformers' projection names, comma-separated (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj),
    # or "all-linear": all seven (peft's name)
    target_modules: str
    rslora: bool = False  # scale alpha / sqrt(rank) instead of alpha / rank (peft's use_rslora)

    @property
    def targets(self) -> tuple[str, ...]:
        if self.target_modules.strip() == "all-linear":
            return LORA_TARGETS
        return tuple(t.strip() for t in self.target_modules.split(",") if t.strip())

    def __post_init__(self):
        unknown = [t for t in self.targets if t not in LORA_TARGETS]
        if unknown or not self.targets:
            raise ConfigError(
                f"config.lora.target_modules={self.target_modules!r}: expected 'all-linear' or comma-separated "
                f"names among {', '.join(LORA_TARGETS)}"
            )


# the projections LoRA can adapt, by transformers' names (models/lora.py's TARGETS)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float
    warmup_ratio: float
    schedule: str  # constant | cosine
    weight_decay: float
    grad_clip: float


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    lr: float
    warmup_ratio: float
    clip_eps: float


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    size: str  # tiny | small
    seed: int
    eval_split: str  # a split, or splits joined by "+"


@dataclasses.dataclass(frozen=True)
class SftConfig:
    steps: int
    lr: float
    batch_size: int
    warmup: int
    max_len: int
    truncate: bool
    mistake: str | None
    mistake_share: float
    questions: int | None
    pad_multiple: int
    use_p0: bool
    save_every: int = 100  # steps between the stage's checkpoints (WORKDIR/sft/checkpoints)


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    coordinator: str | None
    num_processes: int | None
    process_id: int | None


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """What an agent engine is built from (`agent.build.build_engine`): a training run's sections, or
    `launch/eval.py`'s command line."""

    tokenizer: TokenizerConfig
    protocol: ProtocolConfig
    retriever: RetrieverConfig
    initial_retriever: RetrieverConfig | None  # EKA's P0 from another corpus (None: the retriever)
    rollout: RolloutConfig


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seed: int
    total_steps: int
    total_epochs: int  # > 0: total_steps is this many passes over data.train (`resolve_total_steps`)
    log_every: int
    eval_every: int
    save_every: int
    keep_checkpoints: int
    model: ModelConfig
    tokenizer: TokenizerConfig
    protocol: ProtocolConfig
    retriever: RetrieverConfig
    initial_retriever: RetrieverConfig | None
    data: DataConfig
    rollout: RolloutConfig
    reward: RewardConfig
    judge: ChatModelConfig | None
    evidence_model: ChatModelConfig | None
    algo: AlgoConfig
    optim: OptimConfig
    critic: CriticConfig
    world: WorldConfig | None
    sft: SftConfig | None
    mesh: dict  # axis -> size (-1: the remaining devices)
    distributed: DistributedConfig
    lora: LoraConfig | None = None  # None (lora.rank 0): every parameter trained

    @classmethod
    def from_dict(cls, cfg) -> RunConfig:
        """From a ConfigDict (or nested dicts) shaped like configs/base.py; see the module docstring."""
        if isinstance(cfg, RunConfig):
            return cfg
        tree = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
        return _build(cls, tree, "config")

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    @property
    def agent(self) -> AgentConfig:
        return AgentConfig(
            self.tokenizer, self.protocol, self.retriever, self.initial_retriever, self.rollout
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# section key -> when the whole section is absent (None)
_ABSENT_SECTION = {
    "initial_retriever": lambda d: not d.get("kind"),
    "judge": lambda d: not d.get("kind"),
    "evidence_model": lambda d: not d.get("kind"),
    "world": lambda d: not d.get("size"),
    "sft": lambda d: not d.get("steps"),
    "lora": lambda d: not d.get("rank"),
}
# "section.key" -> the config file values that mean "not set"
_OPTIONAL = {
    **{f"model.{k}": ("",) for k in ("hf_path", "orbax_path", "preset")},
    **{
        f"model.{k}": (0, -1)
        for k in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "num_hidden_layers",
        )
    },
    "tokenizer.path": ("",),
    **{
        f"{s}.{k}": ("",)
        for s in ("retriever", "initial_retriever")
        for k in ("corpus", "index", "url", "encoder")
    },
    **{f"algo.{k}": (0.0,) for k in ("clip_eps_low", "clip_eps_high")},
    **{f"algo.{k}": (0,) for k in ("loss_norm_tokens", "overlong_buffer", "overlong_max_tokens")},
    "sft.mistake": ("",),
    "sft.questions": (0,),
    "distributed.coordinator": ("",),
    "distributed.num_processes": (0,),
    "distributed.process_id": (-1,),
}
# "section.key" -> (allowed values) or a (test, what) pair
_CHECKS = {
    "model.attention_impl": ("reference", "xla", "cudnn", "auto"),
    "tokenizer.kind": ("qwen", "word"),
    "retriever.kind": ("bm25", "dense", "remote", "hypergraph"),
    "initial_retriever.kind": ("bm25", "dense", "remote", "hypergraph"),
    "judge.kind": ("openai", "local", "world"),
    "evidence_model.kind": ("openai", "local", "world"),
    "protocol.tags": ("search_r1", "graph_r1"),
    "data.eval_sample": ("first", "random"),
    "rollout.scheduler": ("lockstep", "slots"),
    "rollout.decode_layout": ("train", "replicated", "tensor"),
    "optim.schedule": ("constant", "cosine"),
    "algo.agg_mode": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
    "world.size": ("tiny", "small"),
    "total_steps": (lambda v: v >= 0, ">= 0"),
    "total_epochs": (lambda v: v >= 0, ">= 0"),
    "rollout.max_turns": (lambda v: v >= 0, ">= 0"),
    "rollout.eval_max_turns": (lambda v: v >= 0, ">= 0 (0: max_turns)"),
    "rollout.eval_max_segment_tokens": (lambda v: v >= 0, ">= 0 (0: max_segment_tokens)"),
    "data.batch_size": (lambda v: v >= 1, ">= 1"),
    "data.group_size": (lambda v: v >= 1, ">= 1"),
    "algo.mini_batches": (lambda v: v >= 1, ">= 1"),
    "algo.micro_batches": (lambda v: v >= 1, ">= 1"),
    "algo.ppo_epochs": (lambda v: v >= 1, ">= 1"),
    "algo.clip_eps_low": (lambda v: 0 < v < 1, "in (0, 1)"),
    "algo.clip_eps_high": (lambda v: v > 0, "> 0"),
    "algo.loss_norm_tokens": (lambda v: v >= 1, ">= 1"),
    "algo.max_draws": (lambda v: v >= 1, ">= 1"),
    "lora.rank": (lambda v: v >= 1, ">= 1"),
    "lora.alpha": (lambda v: v > 0, "> 0"),
    "lora.dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "algo.overlong_buffer": (lambda v: v >= 1, ">= 1"),
    "algo.overlong_max_tokens": (lambda v: v >= 1, ">= 1"),
    "rollout.cache_len": (lambda v: v >= 1, ">= 1"),
    "sft.save_every": (lambda v: v >= 1, ">= 1"),
    "rollout.steps_per_call": (lambda v: v >= 1, ">= 1"),
    "rollout.temperature": (lambda v: v >= 0, ">= 0"),
    "rollout.eval_temperature": (lambda v: v >= 0, ">= 0"),
    "rollout.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.eval_top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "retriever.disturb_rate": (lambda v: 0 <= v <= 1, "in [0, 1]"),
}


def _build(cls, tree: dict, where: str):
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(tree) - names)
    if unknown:
        near = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f"did you mean {where}.{near[0]}? " if near else ""
        raise ConfigError(f"{where}.{unknown[0]}: unknown key ({hint}known: {', '.join(sorted(names))})")
    values = {}
    for field in dataclasses.fields(cls):
        key = f"{where}.{field.name}"
        short = key.split(".", 1)[1]
        if field.name not in tree:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{key}: missing")
            continue
        value, hint = tree[field.name], hints[field.name]
        section = _section_class(hint)
        if section is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"{key}: expected a section, got {value!r}")
            absent = _ABSENT_SECTION.get(short)
            values[field.name] = None if absent and absent(value) else _build(section, value, key)
            continue
        if short in _OPTIONAL and value in _OPTIONAL[short] and type(value) is type(_OPTIONAL[short][0]):
            value = None
        values[field.name] = _check(key, short, _coerce(key, value, hint))
    return cls(**values)


def _section_class(hint):
    """The dataclass of a section field (`X` or `X | None`), else None."""
    for t in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(t):
            return t
    return None


def _coerce(key: str, value, hint):
    if value is None:
        if type(None) in typing.get_args(hint):
            return None
        raise ConfigError(f"{key}: must be set")
    base = next((t for t in (hint, *typing.get_args(hint)) if t is not type(None)), hint)
    base = typing.get_origin(base) or base
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base is tuple and isinstance(value, list):
        value = tuple(value)
    if base is tuple:
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    if base in (bool, int, float, str, dict, tuple) and not (
        isinstance(value, base) and not (base is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{key}={value!r}: expected {base.__name__}")
    return value


def _check(key: str, short: str, value):
    rule = _CHECKS.get(short)
    if rule is None or value is None:
        return value
    if isinstance(rule[0], str):
        if value not in rule:
            raise ConfigError(f"{key}={value!r}: expected one of {', '.join(rule)}")
    elif not rule[0](value):
        raise ConfigError(f"{key}={value!r}: expected {rule[1]}")
    return value


def unknown_key(tree, key: str, prefix: str = "") -> str | None:
    """Why the dotted `key` (of a --config.key override) is not in `tree` (a config file's ConfigDict, or nested
    dicts), naming the nearest valid key (difflib) written as `prefix` + key; None when it is there."""
    node, path = tree, []
    names = key.split(".")
    for i, name in enumerate(names):
        if not hasattr(node, "keys"):
            return f"{'.'.join(path)} is a value, not a section"
        if name not in node:
            kind = "key" if i == len(names) - 1 else "section"
            where = f"under {'.'.join(path)}" if path else "at the top"
            return f"no {kind} {name!r} {where}; {_nearest(tree, path, names[i:], prefix)}"
        node, path = node[name], path + [name]
    return None


def _nearest(tree, path: list[str], rest: list[str], prefix: str) -> str:
    """A 'did you mean' for the unknown `rest` of a key under `path`: a close name there, else a key anywhere whose
    last components are close to `rest`, else the names there."""
    node = tree
    for name in path:
        node = node[name]
    here = sorted(node.keys())
    near = difflib.get_close_matches(rest[0], here, n=1)
    if near:
        return f"did you mean {prefix}{'.'.join(path + near + rest[1:])}?"
    tails = {".".join(k.split(".")[-len(rest):]): k for k in _dotted(tree) if k.count(".") + 1 >= len(rest)}
    near = difflib.get_close_matches(".".join(rest), tails, n=1)
    if near:
        return f"did you mean {prefix}{tails[near[0]]}?"
    return f"valid names there: {', '.join(here)}"


def _dotted(tree, prefix: str = "") -> list[str]:
    """Every key of nested mappings, dotted: sections and values."""
    out = []
    for name in tree.keys():
        out.append(prefix + name)
        if hasattr(tree[name], "keys"):
            out += _dotted(tree[name], f"{prefix}{name}.")
    return out
