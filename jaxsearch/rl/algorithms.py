"""GRPO and PPO as objects the training loop calls the same way:

    algo = make_algorithm(cfg, model_config, mesh)       # cfg.algo.advantage: "gae" -> PPO, else GRPO
    state = algo.init_state(params)                      # {"policy": TrainState[, "critic": TrainState]}
    params = algo.decode_params(state)                   # the policy as the sampler reads it
    state, metrics = algo.step(state, traj, scores, timer)   # overlong shaping, prepare, then update:
    batches = algo.prepare(state, traj, scores, timer)   # mini-batches: padded rows, log-probs, advantages
    state, metrics = algo.update(state, batches)         # ppo_epochs x mini_batches jitted updates

`prepare` computes, before any update, the log-probs of the rollout policy (old) and of the frozen reference
(its params are kept by the algorithm), and for PPO the critic's values, the outcome token rewards (minus the
KL penalty when `algo.kl_in_reward`) and GAE; GRPO normalises the scores within each group. Each jitted
function is built once for [rows / mini_batches, width] batches (`update_functions`).

DAPO, Dr.GRPO and GSPO are GRPO with other settings (configs/tiny_cpu_{dapo,drgrpo,gspo}.py): the clip bounds
(`algo.clip_eps_low/high`), the aggregation (`algo.agg_mode`, with Dr.GRPO's constant `max_policy_tokens`),
the estimator (`dr_grpo`), the loss (`gspo`), DAPO's overlong shaping of the scores (`overlong_shaping`) and
its dynamic sampling, which the trainer runs (rl/dynamic_sampling.py).

With a `lora` section (GRPO family only) the trained state is the adapters (and their optimizer moments): the
base stays frozen here, once, and serves as the reference policy (adapters off: no second copy); the sampler
reads base + adapters merged once per step (`decode_params`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxsearch.agent.trajectories import Trajectories, pad_to, padded_width
from jaxsearch.config import RunConfig
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxsearch.models import lora as lora_lib
from jaxsearch.models.sharding import copy_shardings, to_decode_layout
from jaxsearch.rl import advantages as adv_lib
from jaxsearch.rl import train_step as ts
from jaxsearch.scoring import rewards as rewards_lib


def lora_spec(cfg) -> lora_lib.LoraSpec | None:
    """The adapters of a config's `lora` section (None: every parameter trained)."""
    c = cfg.lora
    if c is None:
        return None
    return lora_lib.LoraSpec(rank=c.rank, alpha=c.alpha, dropout=c.dropout, targets=c.targets, rslora=c.rslora)


def init_adapters(model_config, spec: lora_lib.LoraSpec, seed: int, mesh):
    """Fresh fp32 adapters, replicated over the mesh (small: rank x (in + out) per projection)."""
    init = functools.partial(lora_lib.init_adapters, model_config, spec)
    return jax.jit(init, out_shardings=NamedSharding(mesh, P()))(jax.random.PRNGKey(seed))


def max_policy_tokens(cfg) -> int:
    """The most tokens the policy can write in one row: max_turns + 1 segments of max_segment_tokens, within
    cache_len. Dr.GRPO's constant loss normaliser and DAPO's L_max unless the config sets them."""
    r = cfg.rollout
    return min(r.cache_len, (r.max_turns + 1) * r.max_segment_tokens)


def overlong_max_tokens(cfg) -> int:
    """DAPO's L_max: algo.overlong_max_tokens, else `max_policy_tokens`."""
    return cfg.algo.overlong_max_tokens or max_policy_tokens(cfg)


def loss_config(cfg) -> ts.LossConfig:
    """The policy objective of a config's `algo` section."""
    a = cfg.algo
    return ts.LossConfig(
        policy_loss=a.policy_loss,
        clip_eps=a.clip_eps,
        clip_eps_low=a.clip_eps_low,
        clip_eps_high=a.clip_eps_high,
        agg_mode=a.agg_mode,
        agg_norm=float(a.loss_norm_tokens or max_policy_tokens(cfg))
        if a.agg_mode == "seq-mean-token-sum-norm"
        else None,
        kl_coef=a.kl_coef,
        kl_kind=a.kl_kind,
        entropy_coef=a.entropy_coef,
        micro_batches=a.micro_batches,
        temperature=cfg.rollout.temperature,
    )


def optimizers(cfg) -> dict:
    """{"policy": AdamW[, "critic": AdamW]} with the config's warmup and clipping. The lr schedule counts
    training steps (veRL's warmup: int(lr_warmup_steps_ratio * total steps)), each making
    mini_batches x ppo_epochs updates."""
    updates_per_step = cfg.algo.mini_batches * cfg.algo.ppo_epochs

    def adamw(lr, warmup_ratio, schedule):
        return ts.make_optimizer(
            lr,
            cfg.total_steps,
            int(warmup_ratio * cfg.total_steps),
            schedule,
            cfg.optim.weight_decay,
            cfg.optim.grad_clip,
            updates_per_step=updates_per_step,
        )

    out = {"policy": adamw(cfg.optim.lr, cfg.optim.warmup_ratio, cfg.optim.schedule)}
    if cfg.algo.advantage == "gae":
        out["critic"] = adamw(cfg.critic.lr, cfg.critic.warmup_ratio, "constant")
    return out


def mini_batch_rows(cfg) -> int:
    """Rows of one update batch; the step's rows must split into mini-batches of whole micro-batches."""
    rows, mini = cfg.data.batch_size * cfg.data.group_size, cfg.algo.mini_batches
    if rows % mini or (rows // mini) % cfg.algo.micro_batches:
        raise ValueError(
            f"config: batch_size*group_size={rows} rows must split into algo.mini_batches={mini} "
            f"of algo.micro_batches={cfg.algo.micro_batches} each"
        )
    return rows // mini


def example_batch(rows: int, width: int, ppo: bool, critic: bool = False) -> dict:
    """The arrays of one update batch, [rows, width] (advantages [rows] for GRPO): what the jitted functions'
    shardings are built for. Host zeros; `plan.py` uses the same shapes abstractly."""
    zeros = lambda dtype: np.zeros((rows, width), dtype)
    batch = dict(
        tokens=zeros(np.int32),
        attention_mask=zeros(np.int32),
        loss_mask=zeros(np.int32),
        advantages=zeros(np.float32) if ppo else np.zeros((rows,), np.float32),
        old_logprobs=zeros(np.float32),
        ref_logprobs=zeros(np.float32),
    )
    if critic:
        batch.update(old_values=zeros(np.float32), returns=zeros(np.float32), value_mask=zeros(np.int32))
    return batch


def gae_batch(algo, scores, values, attn, lmask, old, ref) -> dict:
    """PPO's update arrays from a rollout's [B] scores and the critic's [B, T] values, over `algo.gae_tokens`
    (all response tokens, or the policy's): the outcome reward on each row's last such token (Search-R1's
    reward manager: reward_tensor[i, valid_response_length - 1]) minus `kl_in_reward` x (old - ref) on the
    policy's tokens (ray_trainer.py apply_kl_penalty over info_mask), GAE whitened over those tokens, the
    returns, and the mask the critic learns on."""
    gae_mask = response_mask(attn, lmask) if algo.gae_tokens == "response" else lmask
    token_rewards = outcome_token_rewards(scores, gae_mask)
    if algo.kl_in_reward:
        token_rewards -= algo.kl_in_reward * (old - ref) * lmask
    advantages, returns = adv_lib.gae_advantages(
        jnp.asarray(token_rewards), jnp.asarray(values), jnp.asarray(gae_mask), algo.gamma, algo.lam
    )
    return {
        "advantages": np.asarray(advantages),
        "old_values": values,
        "returns": np.asarray(returns),
        "value_mask": gae_mask.astype(lmask.dtype),
    }


def response_mask(attention_mask: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """[B, T] 1 on every response token (from the policy's first token on, retrieved tokens included, not
    padding): the mask of veRL's `compute_advantage` (ray_trainer.py: attention_mask[:, -response_length:])."""
    first = np.where(loss_mask.any(axis=1), loss_mask.argmax(axis=1), loss_mask.shape[1])
    return attention_mask * (np.arange(loss_mask.shape[1])[None, :] >= first[:, None])


def overlong_shaping(cfg, traj: Trajectories, scores: np.ndarray) -> tuple[np.ndarray, dict]:
    """DAPO's soft overlong punishment added to the [B] scores when `algo.overlong_buffer` is set (L_cache;
    L_max is algo.overlong_max_tokens or `max_policy_tokens`), the length being the policy's tokens per row
    (retrieved text excluded) -> (scores, {"overlong_penalty": its mean}); else the scores unchanged, {}."""
    buffer = cfg.algo.overlong_buffer
    if buffer is None:
        return scores, {}
    penalty = rewards_lib.overlong_penalty(traj.loss_mask.sum(axis=1), overlong_max_tokens(cfg), buffer)
    return (scores + penalty).astype(np.float32), {"overlong_penalty": float(penalty.mean())}


def outcome_token_rewards(scores: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """[B, T] rewards: each row's score on its last mask-1 token, 0 elsewhere (the outcome reward of PPO)."""
    out = np.zeros(loss_mask.shape, np.float32)
    last = loss_mask.shape[1] - 1 - np.argmax(loss_mask[:, ::-1], axis=1)
    has = loss_mask.any(axis=1)
    out[np.arange(len(scores))[has], last[has]] = scores[has]
    return out


def update_width(attention_mask: np.ndarray, cache_len: int, multiple: int) -> int:
    """Columns of an update batch: `cache_len` (one shape for the run), or with `multiple` > 0 the last
    attended column rounded up to a multiple of it (`padded_width`)."""
    used = np.flatnonzero(attention_mask.any(0))
    return padded_width(int(used[-1]) + 1 if used.size else 1, cache_len, multiple)


class GRPO:
    """Group-normalised outcome advantages (cfg.algo.advantage: grpo, dr_grpo, ...), a policy update only:
    also DAPO, Dr.GRPO and GSPO, which differ in the loss, the clip bounds and the scores (configs/tiny_cpu_*)."""

    ppo = False

    def __init__(self, cfg, model_config, mesh):
        self.lora = lora_spec(cfg)
        if self.lora is not None:
            if self.ppo:
                raise ValueError(
                    "config.lora: LoRA trains GRPO-family runs; PPO's critic would be a full copy"
                )
            model_config = lora_lib.lora_config(model_config, self.lora)
        self.cfg, self.model_config, self.mesh = cfg, model_config, mesh
        self.optimizers = optimizers(cfg)
        self.rows = mini_batch_rows(cfg)
        self.ref_params = None
        self.base = None  # LoRA: the frozen base (also the reference)
        self.loss_config = loss_config(cfg)
        buffer, longest = cfg.algo.overlong_buffer, overlong_max_tokens(cfg)
        if buffer is not None and buffer >= longest:
            raise ValueError(
                f"config.algo.overlong_buffer={buffer} (L_cache) must be below L_max = {longest} "
                f"(algo.overlong_max_tokens, else min(rollout.cache_len, (rollout.max_turns + 1) * "
                f"rollout.max_segment_tokens))"
            )
        if cfg.algo.dynamic_sampling and cfg.data.group_size < 2:
            raise ValueError(
                f"config.algo.dynamic_sampling drops groups of equal rewards: it needs data.group_size >= 2, "
                f"got {cfg.data.group_size}"
            )

    def init_state(self, params) -> dict:
        """The trained state from the initial policy; keeps a frozen reference copy when a KL term needs it
        (the policy's buffers are donated to the update). LoRA: `params` become the frozen base (the reference
        too) and the state holds fresh adapters (seeded by config.seed)."""
        a = self.cfg.algo
        if self.lora is not None:
            self.base = params
            if a.kl_coef or a.kl_in_reward:
                self.ref_params = params  # the same buffers: the base is never donated
            params = init_adapters(self.model_config, self.lora, self.cfg.seed + 2, self.mesh)
        elif a.kl_coef or a.kl_in_reward:
            self.ref_params = jax.tree_util.tree_map(jnp.copy, params)
        state = {"policy": ts.init_state(params, self.optimizers["policy"], self.mesh)}
        self._build(state)
        return state

    def policy_params(self, state):
        """The policy as the model functions take it: the params, or (LoRA) the base with the adapters."""
        if self.base is None:
            return state["policy"].params
        return lora_lib.with_adapters(self.base, state["policy"].params)

    def _build(self, state) -> None:
        """The jitted update and log-prob functions, their shardings fixed by `state` and an example batch."""
        example = example_batch(self.rows, self.cfg.rollout.cache_len, self.ppo)
        lc = self.loss_config
        self.update_policy = ts.make_train_step(
            ts.policy_loss_fn(self.model_config, lc),
            lc.agg_mode,
            lc.micro_batches,
            self.optimizers["policy"],
            self.mesh,
            state["policy"],
            example,
            frozen=self.base,
        )
        temperature = self.cfg.rollout.temperature
        self.logprobs = ts.make_logprob_fn(
            self.model_config, self.mesh, self.policy_params(state), example, temperature
        )
        self.ref_logprobs = self.logprobs
        if self.base is not None:  # the reference is the base alone: another pytree, another function
            self.ref_logprobs = ts.make_logprob_fn(self.model_config, self.mesh, self.base, example, temperature)
            self._merge = self._merge_fn()

    def _merge_fn(self):
        """LoRA: jitted (base, adapters) -> merged params in the compute dtype, laid out as the sampler reads
        them (`rollout.decode_layout`; "train": the base's shardings)."""
        config = self.model_config
        shardings = copy_shardings(config, self.base, self.mesh, self.cfg.rollout.decode_layout)
        merge = functools.partial(lora_lib.merge, config, self.lora, dtype=config.compute_dtype)
        return jax.jit(merge, out_shardings=shardings)

    def decode_params(self, state):
        """The policy as the sampler reads it (`rollout.decode_layout`): a copy made now, or the params; LoRA:
        base + adapters merged now, in the compute dtype."""
        if self.base is not None:
            return self._merge(self.base, state["policy"].params)
        layout = self.cfg.rollout.decode_layout
        return to_decode_layout(self.model_config, state["policy"].params, self.mesh, layout)

    def final_params(self, state):
        """The trained policy as plain params (LoRA: merged into the base, in its dtype)."""
        if self.base is None:
            return state["policy"].params
        return jax.jit(functools.partial(lora_lib.merge, self.model_config, self.lora))(
            self.base, state["policy"].params
        )

    def step(self, state, traj: Trajectories, scores: np.ndarray, timer) -> tuple[dict, dict]:
        """One RL update from a rollout and its [B] scores: DAPO's overlong shaping where configured, the update
        batches (`prepare`: old and reference log-probs, advantages), then `update` (timed as "update")
        -> (state, metrics)."""
        scores, shaping = overlong_shaping(self.cfg, traj, scores)
        batches = self.prepare(state, traj, scores, timer)
        with timer("update"):
            state, metrics = self.update(state, batches)
        return state, dict(metrics, **shaping)

    def slices(self) -> list[slice]:
        n = self.cfg.algo.mini_batches
        return [slice(j * self.rows, (j + 1) * self.rows) for j in range(n)]

    def _per_mini_batch(self, fn, params, tokens, attn) -> np.ndarray:
        return np.concatenate([fn(params, tokens[sl], attn[sl]) for sl in self.slices()])

    def prepare(self, state, traj: Trajectories, scores: np.ndarray, timer) -> list[dict]:
        """Update batches from a rollout and its [B] scores, before any update (see the module docstring)."""
        width = update_width(traj.attention_mask, self.cfg.rollout.cache_len, self.cfg.algo.pad_multiple)
        tokens, attn, lmask = (pad_to(x, width) for x in (traj.tokens, traj.attention_mask, traj.loss_mask))
        with timer("old_logprobs"):
            old = self._per_mini_batch(self.logprobs, self.policy_params(state), tokens, attn)
        with timer("ref_logprobs"):
            ref = (
                old
                if self.ref_params is None
                else self._per_mini_batch(self.ref_logprobs, self.ref_params, tokens, attn)
            )
        extra = self._advantages(state, scores, tokens, attn, lmask, old, ref, timer)
        full = dict(
            tokens=tokens, attention_mask=attn, loss_mask=lmask, old_logprobs=old, ref_logprobs=ref, **extra
        )
        return [{k: v[sl] for k, v in full.items()} for sl in self.slices()]

    def _advantages(self, state, scores, tokens, attn, lmask, old, ref, timer) -> dict:
        fn = adv_lib.get_advantage_fn(self.cfg.algo.advantage)
        return {"advantages": np.asarray(fn(jnp.asarray(scores), self.cfg.data.group_size))}

    def update(self, state, batches: list[dict]) -> tuple[dict, dict]:
        """ppo_epochs passes over the mini-batches; metrics averaged over the updates."""
        step_metrics = []
        for _ in range(self.cfg.algo.ppo_epochs):
            for batch in batches:
                step_metrics.append(self._update_one(state, batch))
        jax.block_until_ready(state["policy"].params)
        metrics = {k: float(np.mean([jax.device_get(m[k]) for m in step_metrics])) for k in step_metrics[0]}
        metrics["skipped_updates"] = float(jax.device_get(state["policy"].skipped))
        return state, metrics

    def _update_one(self, state, batch) -> dict:
        policy_batch = {k: v for k, v in batch.items() if k not in ("old_values", "returns", "value_mask")}
        state["policy"], m = self.update_policy(state["policy"], policy_batch)
        return m


class PPO(GRPO):
    """GAE over a critic initialised from the policy (as veRL), the critic updated beside the policy."""

    ppo = True

    def init_state(self, params) -> dict:
        critic = ts.init_critic(self.model_config, params, jax.random.PRNGKey(self.cfg.seed + 1))
        state = super().init_state(params)
        state["critic"] = ts.init_state(critic, self.optimizers["critic"], self.mesh)
        self._build_critic(state)
        return state

    def _build_critic(self, state) -> None:
        example = example_batch(self.rows, self.cfg.rollout.cache_len, ppo=True, critic=True)
        a = self.cfg.algo
        self.update_critic = ts.make_train_step(
            functools.partial(ts.critic_loss, self.model_config, self.cfg.critic.clip_eps, a.agg_mode),
            a.agg_mode,
            a.micro_batches,
            self.optimizers["critic"],
            self.mesh,
            state["critic"],
            example,
        )
        self.values = ts.make_value_fn(self.model_config, self.mesh, state["critic"].params, example)

    def _advantages(self, state, scores, tokens, attn, lmask, old, ref, timer) -> dict:
        a = self.cfg.algo
        with timer("values"):
            values = self._per_mini_batch(self.values, state["critic"].params, tokens, attn)
        return gae_batch(a, scores, values, attn, lmask, old, ref)

    def _update_one(self, state, batch) -> dict:
        m = super()._update_one(state, batch)
        critic_batch = dict(batch, loss_mask=batch["value_mask"])  # the critic learns where GAE ran
        state["critic"], critic_m = self.update_critic(state["critic"], critic_batch)
        return dict(m, **{f"critic/{k}": v for k, v in critic_m.items()})


def make_algorithm(cfg, model_config, mesh) -> GRPO:
    """PPO for `algo.advantage == "gae"`, else GRPO with that group estimator. cfg: a `config.RunConfig`
    (a ConfigDict is converted)."""
    cfg = RunConfig.from_dict(cfg)
    return (PPO if cfg.algo.advantage == "gae" else GRPO)(cfg, model_config, mesh)
