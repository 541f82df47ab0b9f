"""The policy (and critic) update: one jitted function, sharded over a mesh, with donation.

    update = make_train_step(policy_loss_fn(config, loss_cfg), agg_mode, micro_batches, optimizer, mesh,
                             state, batch_example)             # jitted, shardings fixed, state donated
    state, metrics = update(state, batch)

`batch` holds a rollout's trajectories, each row prompt + response, right-padded ([B, T]):
    tokens, attention_mask, loss_mask      int32
    advantages                             [B] (GRPO, per sequence) or [B, T] (GAE)
    old_logprobs, ref_logprobs             [B, T] fp32, the log-prob of tokens[b, t] (position 0 unused)
The loss is the clipped surrogate over loss-mask tokens + kl_coef * KL(policy || reference) as a
loss - entropy_coef * entropy. Gradient accumulation runs the micro-batches in a `lax.scan` and
weights each by its share of the full batch's normaliser, so it equals the full-batch gradient.
A non-finite loss or gradient skips the update (params and optimizer state unchanged) and counts it.

LoRA (`models/lora.py`): the state's params are the adapters and `frozen` the base, an argument of the update
that is neither trained nor donated; the loss sees `lora.with_adapters(frozen, adapters)` and a dropout key
derived from the update count (so a resumed run draws the same masks).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxsearch import multihost, parallel
from jaxsearch.models import lora, qwen2
from jaxsearch.rl import losses


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The policy objective. Static under jit."""

    policy_loss: str = "ppo"
    clip_eps: float = 0.2
    clip_eps_low: float | None = None
    clip_eps_high: float | None = None
    dual_clip_c: float | None = None
    agg_mode: str = "token-mean"
    agg_norm: float | None = None  # agg_mode seq-mean-token-sum-norm's constant (Dr.GRPO)
    kl_coef: float = 0.001  # KL as a loss; 0 switches it off (KL as a reward penalty is the trainer's)
    kl_kind: str = "low_var_kl"
    entropy_coef: float = 0.0
    micro_batches: int = 1
    temperature: float = 1.0  # the rollout's: log-probs of logits / temperature


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    params: Any
    opt_state: Any
    step: jax.Array  # int32 scalar: updates applied
    skipped: jax.Array  # int32 scalar: updates skipped for a non-finite loss or gradient


def learning_rate_schedule(
    learning_rate: float,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "constant",
    updates_per_step: int = 1,
) -> optax.Schedule:
    """optimizer update count -> learning rate: linear warmup from 0, then constant or cosine decay.

    `total_steps` and `warmup_steps` count training steps; each makes `updates_per_step` optimizer updates
    (mini-batches x epochs), all at that step's learning rate: veRL steps its lr scheduler once per training
    step (`fsdp_workers.update_actor`), whatever the number of mini-batches.
    """
    if schedule == "constant":
        decay = optax.constant_schedule(learning_rate)
    elif schedule == "cosine":
        decay = optax.cosine_decay_schedule(learning_rate, max(total_steps - warmup_steps, 1))
    else:
        raise ValueError(f"schedule={schedule!r}: expected 'constant' or 'cosine'")
    per_step = optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, warmup_steps), decay], [warmup_steps]
    )
    return per_step if updates_per_step == 1 else (lambda count: per_step(count // updates_per_step))


def make_optimizer(
    learning_rate: float,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "constant",
    weight_decay: float = 0.01,
    grad_clip: float = 1.0,
    b1: float = 0.9,
    b2: float = 0.999,
    updates_per_step: int = 1,
) -> optax.GradientTransformation:
    """AdamW at `learning_rate_schedule(...)` after global-norm clipping."""
    lr = learning_rate_schedule(learning_rate, total_steps, warmup_steps, schedule, updates_per_step)
    return optax.chain(
        optax.clip_by_global_norm(grad_clip), optax.adamw(lr, b1, b2, weight_decay=weight_decay)
    )


def init_state(params, optimizer: optax.GradientTransformation, mesh) -> TrainState:
    """Optimizer state is created under jit so it inherits the params' shardings; scalars (counts, step)
    are replicated over the mesh."""
    replicated = NamedSharding(mesh, P())

    def place(x):
        on_mesh = isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
        return x if on_mesh else jax.device_put(x, replicated)

    opt_state = jax.tree_util.tree_map(place, jax.jit(optimizer.init)(params))
    zero = lambda: jax.device_put(jnp.zeros((), jnp.int32), replicated)  # two buffers: both are donated
    return TrainState(params, opt_state, zero(), zero())


def sequence_logprobs(
    config: qwen2.Qwen2Config,
    params,
    tokens,
    attention_mask,
    return_entropy=False,
    temperature=1.0,
    dropout_rng=None,
):
    """log p(tokens[b, t] | tokens[b, :t]) as [B, T] (0 at t = 0), and the entropy there if asked, under the
    rollout's sampling `temperature` (as veRL's actor: the policy trained is the one that sampled)."""
    out = qwen2.token_logprobs(
        config,
        params,
        tokens[:, :-1],
        attention_mask[:, :-1],
        tokens[:, 1:],
        return_entropy=return_entropy,
        temperature=temperature,
        dropout_rng=dropout_rng,
    )
    pad = lambda x: jnp.pad(x, ((0, 0), (1, 0)))
    return tuple(pad(x) for x in out) if return_entropy else pad(out)


def _normaliser(loss_mask, agg_mode):
    """What `agg_loss` divides by: mask-1 tokens, or rows with at least one mask-1 token."""
    if agg_mode == "token-mean":
        return jnp.sum(loss_mask)
    return jnp.sum(jnp.any(loss_mask > 0, axis=-1))


def policy_loss(config: qwen2.Qwen2Config, loss_cfg: LossConfig, params, batch, rng=None):
    """(scalar loss, stats) for one (micro-)batch, both normalised within it. `rng`: LoRA dropout's key
    (used when `config.lora_dropout` > 0)."""
    mask = batch["loss_mask"].astype(jnp.float32)
    logp, entropy = sequence_logprobs(
        config,
        params,
        batch["tokens"],
        batch["attention_mask"],
        True,
        loss_cfg.temperature,
        dropout_rng=rng if config.lora_dropout else None,
    )
    pg_loss, stats = losses.get_policy_loss(loss_cfg.policy_loss)(
        logp,
        batch["old_logprobs"],
        batch["advantages"],
        mask,
        clip_eps=loss_cfg.clip_eps,
        clip_eps_low=loss_cfg.clip_eps_low,
        clip_eps_high=loss_cfg.clip_eps_high,
        dual_clip_c=loss_cfg.dual_clip_c,
        agg_mode=loss_cfg.agg_mode,
        agg_norm=loss_cfg.agg_norm,
    )
    agg = functools.partial(losses.agg_loss, mode=loss_cfg.agg_mode, norm=loss_cfg.agg_norm)
    loss = pg_loss
    stats = dict(stats, pg_loss=pg_loss, entropy=agg(entropy, mask))
    if loss_cfg.kl_coef:
        kl = agg(losses.kl_penalty(logp, batch["ref_logprobs"], loss_cfg.kl_kind), mask)
        loss = loss + loss_cfg.kl_coef * kl
        stats["kl"] = kl
    if loss_cfg.entropy_coef:
        loss = loss - loss_cfg.entropy_coef * stats["entropy"]
    return loss, stats


def critic_values(config: qwen2.Qwen2Config, critic_params, tokens, attention_mask):
    """values[b, t] = V(tokens[b, :t]), the value of the state in which tokens[b, t] is chosen, as [B, T]
    fp32 (0 at t = 0; aligned like `sequence_logprobs`, as veRL's critic): a Qwen2 trunk's final hidden
    state through a linear value head."""
    hidden = qwen2.hidden_states(config, critic_params["trunk"], tokens[:, :-1], attention_mask[:, :-1])
    head = critic_params["value_head"]
    values = hidden.astype(jnp.float32) @ head["kernel"].astype(jnp.float32) + head["bias"]
    return jnp.pad(values, ((0, 0), (1, 0)))


def init_critic(config: qwen2.Qwen2Config, policy_params, rng):
    """Critic params: a copy of the policy as the trunk (as veRL initialises it) and a small value head."""
    trunk = jax.tree_util.tree_map(jnp.copy, policy_params)
    kernel = jax.random.normal(rng, (config.hidden_size,), jnp.float32) * 0.02
    head = {"kernel": kernel, "bias": jnp.zeros((), jnp.float32)}
    sharding = jax.tree_util.tree_leaves(policy_params)[0].sharding
    replicated = NamedSharding(sharding.mesh, P()) if isinstance(sharding, NamedSharding) else sharding
    return {"trunk": trunk, "value_head": jax.device_put(head, replicated)}


def critic_loss(config: qwen2.Qwen2Config, clip_eps: float, agg_mode: str, params, batch):
    """Clipped value loss over loss-mask tokens; batch adds `old_values` and `returns` [B, T]."""
    values = critic_values(config, params, batch["tokens"], batch["attention_mask"])
    loss, stats = losses.value_loss(
        values,
        batch["old_values"],
        batch["returns"],
        batch["loss_mask"].astype(jnp.float32),
        clip_eps=clip_eps,
        agg_mode=agg_mode,
    )
    return loss, dict(stats, vf_loss=loss)


def policy_loss_fn(config: qwen2.Qwen2Config, loss_cfg: LossConfig):
    return functools.partial(policy_loss, config, loss_cfg)


def train_step(
    loss_fn,
    agg_mode: str,
    micro_batches: int,
    optimizer,
    state: TrainState,
    batch,
    frozen=None,
    *,
    param_shardings=None,
):
    """One update of `state.params` by `loss_fn(params, batch) -> (loss, stats)`, accumulated over
    `micro_batches` (each weighted by its share of the `agg_mode` normaliser). `param_shardings`: each
    micro-batch's gradients are constrained to them, so they are reduce-scattered and accumulated sharded
    like the params instead of whole on every device. `frozen`: a LoRA base, `state.params` its adapters: the
    loss is `loss_fn(lora.with_adapters(frozen, adapters), batch, dropout_key)`."""
    m = micro_batches
    total = jnp.maximum(_normaliser(batch["loss_mask"], agg_mode), 1)
    dropout_key = jax.random.fold_in(jax.random.key(0), state.step)

    def loss_of(p, b, j):
        if frozen is None:
            return loss_fn(p, b)
        return loss_fn(lora.with_adapters(frozen, p), b, jax.random.fold_in(dropout_key, j))

    def like_params(grads):
        if param_shardings is None:
            return grads
        return jax.lax.with_sharding_constraint(grads, param_shardings)

    def micro(b, j=0):
        weight = _normaliser(b["loss_mask"], agg_mode) / total
        (loss, stats), grads = jax.value_and_grad(
            lambda p: jax.tree_util.tree_map(lambda x: x * weight, loss_of(p, b, j)), has_aux=True
        )(state.params)
        return loss, stats, like_params(grads)

    if m == 1:
        loss, stats, grads = micro(batch)
    else:
        # micro-batch j takes rows j, j + m, j + 2m, ...: each one keeps the batch's sharding over the data
        # axes (contiguous chunks would each sit on one device group and be gathered to every device)
        split = jax.tree_util.tree_map(
            lambda x: x.reshape(x.shape[0] // m, m, *x.shape[1:]).swapaxes(0, 1), batch
        )

        def body(acc, xs):
            loss, stats, grads = jax.tree_util.tree_map(jnp.add, acc, micro(*xs))
            return (loss, stats, like_params(grads)), None

        # the accumulator starts (and stays) sharded like the params: left to propagation, a zeros carry
        # can come out replicated, i.e. a whole fp32 gradient on every device
        loss0, stats0, grads0 = jax.tree_util.tree_map(
            jnp.zeros_like, jax.eval_shape(micro, jax.tree_util.tree_map(lambda x: x[0], split))
        )
        zeros = (loss0, stats0, like_params(grads0))
        (loss, stats, grads), _ = jax.lax.scan(body, zeros, (split, jnp.arange(m)))

    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt = optimizer.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)
    new_state = TrainState(
        params=keep(new_params, state.params),
        opt_state=keep(new_opt, state.opt_state),
        step=state.step + finite.astype(jnp.int32),
        skipped=state.skipped + (~finite).astype(jnp.int32),
    )
    metrics = dict(stats, loss=loss, grad_norm=grad_norm, update_skipped=~finite)
    return new_state, metrics


def state_shardings(state: TrainState):
    return jax.tree_util.tree_map(lambda x: x.sharding, state)


def batch_shardings(mesh, batch: dict):
    return {k: parallel.batch_sharding(mesh, jnp.ndim(v)) for k, v in batch.items()}


def jit_train_step(
    loss_fn,
    agg_mode: str,
    micro_batches: int,
    optimizer,
    mesh,
    state_shardings,
    batch_shardings,
    frozen_shardings=None,
):
    """`train_step` jitted with the state's shardings in and out, the batch over the data axes, the state
    donated, under the mesh's activation sharding: what `make_train_step` runs and `launch/plan.py` lowers.
    With `frozen_shardings` (LoRA) it takes a third argument, the frozen base, not donated."""
    step = functools.partial(
        train_step, loss_fn, agg_mode, micro_batches, optimizer, param_shardings=state_shardings.params
    )
    in_shardings = (state_shardings, batch_shardings)
    if frozen_shardings is not None:
        in_shardings += (frozen_shardings,)
    return jax.jit(
        parallel.with_activation_sharding(step, mesh),
        in_shardings=in_shardings,
        out_shardings=(state_shardings, None),
        donate_argnums=(0,),
    )


def make_train_step(
    loss_fn,
    agg_mode: str,
    micro_batches: int,
    optimizer,
    mesh,
    state: TrainState,
    batch_example: dict,
    frozen=None,
):
    """`jit_train_step` for host batches: `update(state, batch) -> (state, metrics)`. `state` and
    `batch_example` give the shardings; later batches may have any number of columns (one compile per width)
    but the example's rows. `frozen`: a LoRA base (on its devices) that every update reads.

    Policy: `make_train_step(policy_loss_fn(config, loss_cfg), loss_cfg.agg_mode, loss_cfg.micro_batches, ...)`;
    critic: `functools.partial(critic_loss, config, clip_eps, agg_mode)` as the loss."""
    b_shard = batch_shardings(mesh, batch_example)
    f_shard = None if frozen is None else jax.tree_util.tree_map(lambda x: x.sharding, frozen)
    jitted = jit_train_step(
        loss_fn, agg_mode, micro_batches, optimizer, mesh, state_shardings(state), b_shard, f_shard
    )

    def update(state: TrainState, batch: dict):
        # a host batch (the same on every process) becomes global arrays: jit cannot place numpy inputs on
        # the devices of other processes
        batch = multihost.tree_to_global(batch, b_shard)
        return jitted(state, batch) if frozen is None else jitted(state, batch, frozen)

    return update


def make_value_fn(config, mesh, critic_params, batch_example: dict):
    """Jitted critic values [B, T] of `tokens`, sharded like the step; host arrays in and out."""
    shard = batch_shardings(mesh, {k: batch_example[k] for k in ("tokens", "attention_mask")})
    p_shard = jax.tree_util.tree_map(lambda x: x.sharding, critic_params)
    fn = lambda p, tokens, mask: critic_values(config, p, tokens, mask)
    jitted = jax.jit(
        parallel.with_activation_sharding(fn, mesh),
        in_shardings=(p_shard, shard["tokens"], shard["attention_mask"]),
    )
    return _host_in_out(jitted, shard)


def make_logprob_fn(config, mesh, params, batch_example: dict, temperature: float = 1.0):
    """Jitted [B, T] log-probs of `tokens` under `params` (old policy or reference) at the rollout's
    `temperature`, sharded like the step; host arrays in and out."""
    shard = batch_shardings(mesh, {k: batch_example[k] for k in ("tokens", "attention_mask")})
    p_shard = jax.tree_util.tree_map(lambda x: x.sharding, params)
    fn = lambda p, tokens, mask: sequence_logprobs(config, p, tokens, mask, temperature=temperature)
    jitted = jax.jit(
        parallel.with_activation_sharding(fn, mesh),
        in_shardings=(p_shard, shard["tokens"], shard["attention_mask"]),
    )
    return _host_in_out(jitted, shard)


def _host_in_out(jitted, shard: dict):
    """`jitted(params, tokens, mask)` on host [B, T] arrays, returning a host [B, T] array (the global value,
    on every process)."""

    def fn(params, tokens, mask):
        tokens = multihost.to_global(tokens, shard["tokens"])
        mask = multihost.to_global(mask, shard["attention_mask"])
        return multihost.to_host(jitted(params, tokens, mask))

    return fn
