"""The RL trainer, top to bottom: setup -> resume -> (rollout -> rewards -> advantages -> update -> log
-> evaluate -> checkpoint) per step.

    train(config, workdir)      # config: an ml_collections ConfigDict from configs/*.py

Everything a step needs to be reproduced is derived from (config.seed, step) or restored from the last
checkpoint (params, optimizer state, step, data-iterator position), so a rerun after a crash continues
exactly where the last checkpoint left off. SIGTERM saves a checkpoint and exits (preemption). A run that
reaches `total_steps` also writes the final policy to `workdir/params` (`checkpoint.save_params`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jaxsearch import checkpoint, parallel
from jaxsearch.data import qa
from jaxsearch.data.sft import padded_width
from jaxsearch.eval import metrics as qa_metrics
from jaxsearch.models import hf_io, qwen2
from jaxsearch.retrieval.factory import make_retriever
from jaxsearch.retrieval.host_split import HostSplitRetriever
from jaxsearch.rl import advantages as adv_lib
from jaxsearch.rl import judge as judge_lib
from jaxsearch.rl import rewards as rewards_lib
from jaxsearch.rl import train_step as ts
from jaxsearch.agent import episode, segments
from jaxsearch.agent import sampler as sampler_lib
from jaxsearch.agent.protocols import get_protocol

log = logging.getLogger("jaxsearch.trainer")


# ------------------------------------------------------------------------------------------- setup


def load_tokenizer(cfg):
    if cfg.tokenizer.kind == "qwen":
        from jaxsearch.models.tokenizer import QwenTokenizer

        return QwenTokenizer()
    if cfg.tokenizer.kind == "word":
        from jaxsearch.data.word_tokenizer import WordTokenizer

        return WordTokenizer.load(cfg.tokenizer.path)
    raise ValueError(f"config.tokenizer.kind={cfg.tokenizer.kind!r}: expected 'qwen' or 'word'")


def _runtime_fields(m) -> dict:
    """Qwen2Config fields that a config sets whatever the checkpoint says (how to run, not what the model is)."""
    return dict(
        remat=m.remat,
        logprob_chunk=m.logprob_chunk,
        attention_chunk=m.attention_chunk,
        scan_layers=m.scan_layers,
    )


def model_config(cfg) -> qwen2.Qwen2Config:
    """The architecture of a random init (the HF / orbax paths carry their own config)."""
    m = cfg.model
    numerics = dict(dtype=m.dtype, param_dtype=m.param_dtype, **_runtime_fields(m))
    if m.vocab_size:
        return qwen2.Qwen2Config(
            vocab_size=m.vocab_size,
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads,
            num_hidden_layers=m.num_hidden_layers,
            tie_word_embeddings=m.tie_word_embeddings,
            **numerics,
        )
    return qwen2.preset(m.preset, **numerics)


def load_policy(cfg, mesh):
    """(model config, params placed on the mesh): from hf_path, orbax_path, or a seeded random init."""
    m = cfg.model
    overrides = _runtime_fields(m)
    if m.hf_path or m.orbax_path:
        # shardings need only the shapes in config.json: read each checkpoint once, onto its devices
        path = m.hf_path or m.orbax_path
        shardings = parallel.param_shardings(
            qwen2.Qwen2Config.from_hf_json(os.path.join(path, "config.json")), mesh
        )
        if m.hf_path:
            config, params = hf_io.load_hf(path, jnp.dtype(m.param_dtype), shardings, overrides)
        else:
            config, params = checkpoint.restore_params(path, dtype=m.param_dtype, shardings=shardings)
            config = config.replace(**overrides)
    else:
        config = model_config(cfg)
        shardings = parallel.param_shardings(config, mesh)
        params = jax.jit(lambda k: qwen2.init_params(config, k), out_shardings=shardings)(
            jax.random.PRNGKey(cfg.seed)
        )
    return config.replace(dtype=m.dtype), params


def build_retriever(rcfg):
    retriever = make_retriever(
        rcfg.kind,
        corpus=rcfg.corpus or None,
        index=rcfg.index or None,
        url=rcfg.url or None,
        encoder=rcfg.encoder or None,
        progress=False,
    )
    return HostSplitRetriever(retriever) if rcfg.get("split_across_hosts") else retriever


def chat_model(mcfg):
    """A judge / evidence model from its config: kind openai (base_url, model) or local (path, tokenizer)."""
    if mcfg.kind == "openai":
        return judge_lib.make_chat_model("openai", base_url=mcfg.base_url, model=mcfg.model)
    if mcfg.kind == "local":
        return judge_lib.make_chat_model(
            "local",
            path=mcfg.path,
            tokenizer=mcfg.tokenizer,
            cache_len=mcfg.cache_len,
            max_new_tokens=mcfg.max_new_tokens,
        )
    if mcfg.kind == "world":  # the synthetic world's rule-based judge and evidence reader
        from jaxsearch.rl.pipeline import WorldChatModel

        return WorldChatModel()
    raise ValueError(f"config: chat model kind {mcfg.kind!r}: expected 'openai', 'local' or 'world'")


def chat_judge(cfg) -> judge_lib.ChatJudge:
    """SOAR's judge (fabrication, and source consistency by a judge) from config.judge."""
    j = cfg.judge
    return judge_lib.ChatJudge(chat_model(j), max_tokens=j.max_new_tokens, temperature=j.temperature)


def build_reward_fn(cfg) -> rewards_lib.WeightedSum:
    """config.reward.terms -> one reward function, its terms named as in the config. Names come from
    `rewards.REWARDS`, plus the model-backed `evidence` (R-Search, needs config.evidence_model),
    `grounded` (SOAR's fabrication judge) and `source_consistency_judge` (SOAR's Table 7 check by a judge;
    both need config.judge)."""
    terms = []
    for name, weight in cfg.reward.terms:
        if name == "evidence":
            e = cfg.evidence_model
            answerer = judge_lib.ChatEvidenceAnswerer(
                chat_model(e), max_tokens=e.max_new_tokens, temperature=e.temperature, top_p=e.top_p
            )
            fn = rewards_lib.evidence_reward(answerer)
        elif name == "grounded":
            fn = rewards_lib.fabrication_reward(chat_judge(cfg))
        elif name == "source_consistency_judge":
            fn = rewards_lib.source_consistency_judge_reward(chat_judge(cfg))
        else:
            fn = rewards_lib.get_reward(name)
        terms.append((name, fn, float(weight)))
    return rewards_lib.WeightedSum(tuple(terms))


@dataclasses.dataclass
class Setup:
    """Everything the loop uses, built once."""

    cfg: Any
    tokenizer: Any
    protocol: Any
    retriever: Any
    initial_retriever: Any
    reward_fn: rewards_lib.WeightedSum
    train_sampler: sampler_lib.Sampler
    eval_sampler: sampler_lib.Sampler
    episode_cfg: episode.EpisodeConfig
    eval_sets: dict
    judge: Any  # SOAR's fabrication judge for evaluation (None without config.judge)


def make_setup(cfg, mesh, config) -> Setup:
    tokenizer = load_tokenizer(cfg)
    protocol = get_protocol(
        cfg.protocol.name, **({"tags": cfg.protocol.tags} if cfg.protocol.name == "eka" else {})
    )
    retriever = build_retriever(cfg.retriever)
    initial = build_retriever(cfg.initial_retriever) if cfg.initial_retriever.kind else retriever
    table = sampler_lib.StopTable.build(
        tokenizer, protocol.stop_strings, [tokenizer.eos_id], config.vocab_size
    )
    r = cfg.rollout

    def sampler(temperature, top_p):
        sampling = sampler_lib.SamplingParams(
            temperature, top_p if temperature else 1.0, r.top_k if temperature else 0
        )
        return sampler_lib.Sampler(
            config,
            table,
            r.cache_len,
            r.max_segment_tokens,
            sampling,
            chunk_buckets=sampler_lib.default_buckets(r.max_obs_tokens + 512),
            mesh=mesh,
        )

    ep = episode.EpisodeConfig(
        max_turns=r.max_turns,
        retrieval_k=r.retrieval_k,
        max_segment_tokens=r.max_segment_tokens,
        max_obs_tokens=r.max_obs_tokens,
        initial_k=r.initial_k,
        internal_k=r.internal_k,
    )
    d = cfg.data
    eval_sets = {
        name: qa.eval_subset(qa.load_examples(path), d.eval_examples, d.eval_sample, d.eval_seed)
        for name, path in d.eval.items()
    }
    return Setup(
        cfg,
        tokenizer,
        protocol,
        retriever,
        initial,
        build_reward_fn(cfg),
        sampler(r.temperature, r.top_p),
        sampler(r.eval_temperature, r.eval_top_p),
        ep,
        eval_sets,
        chat_judge(cfg) if cfg.judge.kind else None,
    )


# ------------------------------------------------------------------------------------------- rollout


def rollout(
    setup: Setup, params, questions, seed, sampler=None, episode_cfg=None, messages=None
) -> episode.Trajectories:
    """Episodes for all rows, in sampler calls of `rollout.micro_batch` rows (0: one call). messages: per row,
    chat messages replacing the protocol's prompt (None: the protocol's; see `qa.prompt_messages`)."""
    sampler = sampler or setup.train_sampler
    n = setup.cfg.rollout.micro_batch or len(questions)
    internal = None
    if setup.protocol.needs_internal_knowledge:
        internal = episode.text_generator(setup.eval_sampler, params, setup.tokenizer, seed)
    parts = [
        episode.run_episodes(
            sampler,
            params,
            setup.tokenizer,
            setup.protocol,
            setup.retriever,
            questions[i : i + n],
            episode_cfg or setup.episode_cfg,
            seed + i,
            setup.initial_retriever,
            internal,
            None if messages is None else messages[i : i + n],
        )
        for i in range(0, len(questions), n)
    ]
    return parts[0] if len(parts) == 1 else concat_trajectories(parts)


def concat_trajectories(parts: list[episode.Trajectories]) -> episode.Trajectories:
    width = max(p.tokens.shape[1] for p in parts)
    out = {}
    for f in dataclasses.fields(episode.Trajectories):
        values = [getattr(p, f.name) for p in parts]
        if isinstance(values[0], list):
            out[f.name] = sum(values, [])
        elif isinstance(values[0], dict):  # timings
            out[f.name] = {k: sum(v[k] for v in values) for k in values[0]}
        elif values[0].ndim == 2:
            out[f.name] = np.concatenate([pad_to(v, width) for v in values])
        else:
            out[f.name] = np.concatenate(values)
    return episode.Trajectories(**out)


def reward_inputs(traj: episode.Trajectories, examples: list[qa.QAExample]) -> list[rewards_lib.RewardInput]:
    """The rewards' view of each row: SOAR's internal facts and retrieved passages as separate streams."""
    return [
        rewards_lib.RewardInput(
            traj.responses[i],
            ex.golden_answers,
            ex.question,
            internal_knowledge="\n".join(traj.internal_knowledge[i]),
            external_knowledge="\n".join(traj.retrieved[i]),
            external_response=traj.external_responses[i],
        )
        for i, ex in enumerate(examples)
    ]


def pad_to(x: np.ndarray, width: int) -> np.ndarray:
    """[B, width]: `x` [B, T] cut or zero-padded on the right."""
    x = x[:, :width]
    return np.pad(x, ((0, 0), (0, width - x.shape[1])))


def update_width(attention_mask: np.ndarray, cache_len: int, multiple: int) -> int:
    """Columns of an update batch: `cache_len` (one shape for the run), or with `multiple` > 0 the last
    attended column rounded up to a multiple of it (`padded_width`)."""
    used = np.flatnonzero(attention_mask.any(0))
    return padded_width(int(used[-1]) + 1 if used.size else 1, cache_len, multiple)


def rollout_stats(traj: episode.Trajectories, examples) -> dict:
    """Search-R1's rollout metrics plus entropy per segment type."""
    answered = np.asarray([a is not None for a in traj.answers])
    resp_len = traj.attention_mask.sum(1) - traj.prompt_lengths
    em = [qa_metrics.exact_match(a or "", ex.golden_answers) for a, ex in zip(traj.answers, examples)]
    f1 = [qa_metrics.f1_score(a or "", ex.golden_answers) for a, ex in zip(traj.answers, examples)]
    stats = {
        "em": float(np.mean(em)),
        "f1": float(np.mean(f1)),
        "response_length": float(resp_len.mean()),
        "policy_tokens": float(traj.loss_mask.sum(1).mean()),
        "turns": float(traj.turns.mean()),
        "searches": float(traj.searches.mean()),
        "finish_ratio": float(answered.mean()),
        "valid_action_ratio": float(((traj.searches + answered) / np.maximum(traj.turns, 1)).mean()),
        "valid_search_ratio": float((traj.searches / np.maximum(traj.turns, 1)).mean()),
        "truncated_ratio": float(traj.truncated.mean()),
        "entropy": float((traj.entropy * traj.loss_mask).sum() / max(traj.loss_mask.sum(), 1)),
    }
    gold = [
        (set(ex.supporting_ids or ()), {d for ids in found for d in ids})
        for ex, found in zip(examples, traj.doc_ids)
    ]
    if any(g for g, _ in gold):  # retrieval recall: share of the supporting passages a search returned
        stats["recall"] = float(np.mean([len(g & found) / len(g) for g, found in gold if g]))
    for name, sid in segments.SEGMENT_IDS.items():
        sel = (traj.segment_ids == sid) & (traj.loss_mask == 1)
        if sel.any():
            stats[f"entropy/{name}"] = float(traj.entropy[sel].mean())
    return stats


# ------------------------------------------------------------------------------------------- evaluation


def evaluate(setup: Setup, params, step: int) -> dict:
    """Held-out EM / F1 / turns / searches per dataset with the eval sampler (greedy by default)."""
    out = {}
    ep = dataclasses.replace(setup.episode_cfg, retrieval_k=setup.cfg.rollout.eval_retrieval_k)
    for name, examples in setup.eval_sets.items():
        messages = qa.prompt_messages(examples, setup.cfg.protocol.name, setup.cfg.protocol.data_prompt)
        questions = [e.question for e in examples]
        traj = rollout(setup, params, questions, 10_000_019 * (step + 1), setup.eval_sampler, ep, messages)
        stats = rollout_stats(traj, examples)
        if setup.judge is not None:  # SOAR's evidence-fabrication rate (share of judged-ungrounded episodes)
            scores = rewards_lib.judge_fabrication(setup.judge, reward_inputs(traj, examples))
            stats["fabrication_rate"] = rewards_lib.fabrication_rate(scores)
        for key, value in stats.items():
            out[f"eval/{name}/{key}"] = value
    return out


# ------------------------------------------------------------------------------------------- metrics


class MetricWriter:
    """One JSON object per logged step in WORKDIR/metrics.jsonl (+ TensorBoard if tensorboardX is there)."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = None
        if enabled:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(os.path.join(workdir, "tb"))
            except ImportError:
                pass

    def write(self, step: int, values: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: float(v) for k, v in values.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, float(v), step)
            self._tb.flush()

    def drop_after(self, step: int) -> None:
        """Forget rows logged after `step` (a resumed run redoes those steps)."""
        if not (self.enabled and os.path.exists(self.path)):
            return
        with open(self.path) as f:
            rows = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        with open(self.path, "w") as f:
            f.writelines(rows)


# ------------------------------------------------------------------------------------------- the loop


def init_distributed(cfg) -> None:
    """Multi-host: explicit coordinator flags, or the environment (TPU pods, SLURM) when num_processes > 1."""
    d = cfg.distributed
    # CPU devices of several processes talk through gloo (no effect on GPU / TPU collectives)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if d.coordinator:
        jax.distributed.initialize(d.coordinator, d.num_processes, d.process_id)
    elif (
        os.environ.get("JAX_COORDINATOR_ADDRESS")
        or os.environ.get("SLURM_NTASKS", "1") != "1"
        or os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0
    ):
        jax.distributed.initialize()


def train(cfg, workdir: str, progress: bool = True) -> dict:
    """Run (or resume) GRPO / PPO training; returns the last step's metrics."""
    os.makedirs(workdir, exist_ok=True)
    mesh = parallel.make_mesh(dict(cfg.mesh))
    config, params = load_policy(cfg, mesh)
    setup = make_setup(cfg, mesh, config)
    ref_params = None
    if cfg.algo.kl_coef or cfg.algo.kl_in_reward:  # a frozen copy (the policy's buffers are donated)
        ref_params = jax.tree_util.tree_map(jnp.copy, params)
    ppo = cfg.algo.advantage == "gae"

    # --- state: policy (+ critic for PPO), restored from the last checkpoint if there is one
    warmup = lambda ratio: int(ratio * cfg.total_steps)  # veRL: int(lr_warmup_steps_ratio * total steps)
    updates_per_step = cfg.algo.mini_batches * cfg.algo.ppo_epochs
    optimizer = ts.make_optimizer(
        cfg.optim.lr,
        cfg.total_steps,
        warmup(cfg.optim.warmup_ratio),
        cfg.optim.schedule,
        cfg.optim.weight_decay,
        cfg.optim.grad_clip,
        updates_per_step=updates_per_step,
    )
    state = {"policy": ts.init_state(params, optimizer, mesh)}
    if ppo:  # veRL initialises the critic from the policy
        critic_opt = ts.make_optimizer(
            cfg.critic.lr,
            cfg.total_steps,
            warmup(cfg.critic.warmup_ratio),
            "constant",
            cfg.optim.weight_decay,
            cfg.optim.grad_clip,
            updates_per_step=updates_per_step,
        )
        critic_params = ts.init_critic(config, params, jax.random.PRNGKey(cfg.seed + 1))
        state["critic"] = ts.init_state(critic_params, critic_opt, mesh)
    iterator = qa.QAIterator(
        qa.load_examples(cfg.data.train), cfg.data.batch_size, cfg.data.group_size, cfg.seed, cfg.data.shuffle
    )
    ckpt = checkpoint.TrainCheckpointer(workdir, save_every=cfg.save_every, max_to_keep=cfg.keep_checkpoints)
    start = 0
    restored = ckpt.restore_latest(state)
    if restored is not None:
        start, state, meta = restored
        iterator.restore(meta["iterator"])
        log.info("resumed from step %d", start)
    writer = MetricWriter(workdir, enabled=jax.process_index() == 0)
    writer.drop_after(start)
    preempted = checkpoint.install_sigterm_handler()

    # --- the jitted functions, for [rows / mini_batches, width] batches (width: `update_width`; the example's
    # cache_len columns only fix the shardings)
    rows, mini = cfg.data.batch_size * cfg.data.group_size, cfg.algo.mini_batches
    if rows % mini or (rows // mini) % cfg.algo.micro_batches:
        raise ValueError(
            f"config: batch_size*group_size={rows} rows must split into algo.mini_batches={mini} "
            f"of algo.micro_batches={cfg.algo.micro_batches} each"
        )
    mb = rows // mini
    zeros = lambda dtype: np.zeros((mb, cfg.rollout.cache_len), dtype)
    example = dict(
        tokens=zeros(np.int32),
        attention_mask=zeros(np.int32),
        loss_mask=zeros(np.int32),
        advantages=zeros(np.float32) if ppo else np.zeros((mb,), np.float32),
        old_logprobs=zeros(np.float32),
        ref_logprobs=zeros(np.float32),
    )
    loss_cfg = loss_config(cfg)
    update = ts.make_train_step(
        ts.policy_loss_fn(config, loss_cfg),
        loss_cfg.agg_mode,
        loss_cfg.micro_batches,
        optimizer,
        mesh,
        state["policy"],
        example,
    )
    logprob_fn = ts.make_logprob_fn(config, mesh, state["policy"].params, example, cfg.rollout.temperature)
    if ppo:
        critic_example = dict(example, old_values=zeros(np.float32), returns=zeros(np.float32))
        critic_update = ts.make_train_step(
            functools.partial(ts.critic_loss, config, cfg.critic.clip_eps, cfg.algo.agg_mode),
            cfg.algo.agg_mode,
            cfg.algo.micro_batches,
            critic_opt,
            mesh,
            state["critic"],
            critic_example,
        )
        value_fn = ts.make_value_fn(config, mesh, state["critic"].params, example)

    # --- the loop
    if start == 0 and setup.eval_sets:
        writer.write(0, evaluate(setup, state["policy"].params, 0))
    last, stop = {}, False
    bar = tqdm(
        range(start, cfg.total_steps),
        initial=start,
        total=cfg.total_steps,
        desc="ppo" if ppo else "grpo",
        disable=not progress or jax.process_index() != 0,
    )
    for step in bar:
        t0 = time.perf_counter()
        batch_examples = next(iterator)
        questions = [e.question for e in batch_examples]
        messages = qa.prompt_messages(batch_examples, cfg.protocol.name, cfg.protocol.data_prompt)
        seed = 7919 * (step + 1) + cfg.seed
        traj = rollout(setup, state["policy"].params, questions, seed, messages=messages)
        t_rollout = time.perf_counter() - t0

        scores, reward_terms = setup.reward_fn.score(reward_inputs(traj, batch_examples))
        scores = scores.astype(np.float32)
        width = update_width(traj.attention_mask, cfg.rollout.cache_len, cfg.algo.pad_multiple)
        tokens, attn, lmask = (pad_to(x, width) for x in (traj.tokens, traj.attention_mask, traj.loss_mask))
        t1 = time.perf_counter()
        # log-probs of the rollout policy, the reference and the critic's values, before any update
        slices = [slice(j * mb, (j + 1) * mb) for j in range(mini)]
        old = np.concatenate([logprob_fn(state["policy"].params, tokens[sl], attn[sl]) for sl in slices])
        ref = (
            old
            if ref_params is None
            else np.concatenate([logprob_fn(ref_params, tokens[sl], attn[sl]) for sl in slices])
        )
        if ppo:
            values = np.concatenate([value_fn(state["critic"].params, tokens[sl], attn[sl]) for sl in slices])
            token_rewards = outcome_token_rewards(scores, lmask)
            if cfg.algo.kl_in_reward:
                token_rewards -= cfg.algo.kl_in_reward * (old - ref) * lmask
            advantages, returns = (
                np.asarray(x)
                for x in adv_lib.gae_advantages(
                    jnp.asarray(token_rewards),
                    jnp.asarray(values),
                    jnp.asarray(lmask),
                    cfg.algo.gamma,
                    cfg.algo.lam,
                )
            )
        else:
            advantages = np.asarray(
                adv_lib.get_advantage_fn(cfg.algo.advantage)(jnp.asarray(scores), cfg.data.group_size)
            )
        step_metrics = []
        for _ in range(cfg.algo.ppo_epochs):
            for sl in slices:
                batch = dict(
                    tokens=tokens[sl],
                    attention_mask=attn[sl],
                    loss_mask=lmask[sl],
                    advantages=advantages[sl],
                    old_logprobs=old[sl],
                    ref_logprobs=ref[sl],
                )
                state["policy"], m = update(state["policy"], batch)
                if ppo:
                    batch = dict(batch, old_values=values[sl], returns=returns[sl])
                    state["critic"], critic_m = critic_update(state["critic"], batch)
                    m = dict(m, **{f"critic/{k}": v for k, v in critic_m.items()})
                step_metrics.append(m)
        t_update = time.perf_counter() - t1

        done = step + 1
        metrics = {k: float(np.mean([jax.device_get(m[k]) for m in step_metrics])) for k in step_metrics[0]}
        metrics.update(rollout_stats(traj, batch_examples))
        metrics.update({f"time/rollout_{k}_s": v for k, v in traj.timings.items()})
        elapsed = time.perf_counter() - t0
        metrics.update(
            {
                "reward": float(scores.mean()),
                **{f"reward/{name}": float(v.mean()) for name, v in reward_terms.items()},
                "time/rollout_s": t_rollout,
                "time/update_s": t_update,
                "time/step_s": elapsed,
                "tokens_per_s": float(traj.attention_mask.sum()) / elapsed,
                "skipped_updates": float(jax.device_get(state["policy"].skipped)),
            }
        )
        if cfg.eval_every and setup.eval_sets and (done % cfg.eval_every == 0 or done == cfg.total_steps):
            metrics.update(evaluate(setup, state["policy"].params, done))
        if done % cfg.log_every == 0 or done == cfg.total_steps:
            writer.write(done, metrics)
        bar.set_postfix(reward=f"{metrics['reward']:.3f}", em=f"{metrics['em']:.3f}")
        last = metrics
        stop = preempted()
        ckpt.save(done, state, {"iterator": iterator.state()}, force=stop or done == cfg.total_steps)
        if stop:
            log.warning("SIGTERM: saved step %d, exiting", done)
            break
    ckpt.wait()
    ckpt.close()
    if not stop:  # the final policy as a params dir: what launch/eval.py and convert_checkpoint.py read
        checkpoint.save_params(os.path.join(workdir, "params"), config, state["policy"].params)
    return last


def loss_config(cfg) -> ts.LossConfig:
    """The policy objective of a config's `algo` section."""
    a = cfg.algo
    return ts.LossConfig(
        policy_loss=a.policy_loss,
        clip_eps=a.clip_eps,
        agg_mode=a.agg_mode,
        kl_coef=a.kl_coef,
        kl_kind=a.kl_kind,
        entropy_coef=a.entropy_coef,
        micro_batches=a.micro_batches,
        temperature=cfg.rollout.temperature,
    )


def outcome_token_rewards(scores: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """[B, T] rewards: each row's score on its last policy token, 0 elsewhere (the outcome reward of PPO)."""
    out = np.zeros(loss_mask.shape, np.float32)
    last = loss_mask.shape[1] - 1 - np.argmax(loss_mask[:, ::-1], axis=1)
    has = loss_mask.any(axis=1)
    out[np.arange(len(scores))[has], last[has]] = scores[has]
    return out
