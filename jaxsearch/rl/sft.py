"""Supervised fine-tuning on agent trajectories: masked next-token cross-entropy, a jitted AdamW step, a loop.

    optimizer = sft_optimizer(lr=3e-3, warmup=20, steps=300)
    step = make_sft_step(config, optimizer)                  # jitted; params and opt_state are donated
    params, opt_state, metrics = step(params, opt_state, ids, attention_mask, loss_mask)
    params, history = sft_train(config, params, batches, steps=300, lr=3e-3, warmup=20, log_every=25)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from jaxsearch.checkpoint import TrainCheckpointer
from jaxsearch.models import qwen2


def masked_nll(config: qwen2.Qwen2Config, params, ids, attention_mask, loss_mask):
    """Mean cross-entropy of the tokens where loss_mask is 1, each predicted from the tokens before it.

    ids, attention_mask, loss_mask: [B, T]. The prediction at t scores token t+1, so position 0 is never
    scored. Returns (mean loss, number of scored tokens), both scalars.
    """
    targets = jnp.roll(ids, -1, axis=1)  # column T-1 wraps around; its weight is 0 below
    logp = qwen2.token_logprobs(config, params, ids, attention_mask, targets)
    weights = jnp.pad(loss_mask[:, 1:], ((0, 0), (0, 1))).astype(jnp.float32)
    count = weights.sum()
    return -(logp * weights).sum() / jnp.maximum(count, 1.0), count


def sft_optimizer(
    lr: float, warmup: int, steps: int, weight_decay: float = 0.01, clip_norm: float = 1.0
) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW with linear warmup to `lr` and cosine decay to lr/10 at `steps`."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), lr / 10)
    return optax.chain(optax.clip_by_global_norm(clip_norm), optax.adamw(schedule, weight_decay=weight_decay))


def make_sft_step(config: qwen2.Qwen2Config, optimizer: optax.GradientTransformation) -> Callable:
    """`step(params, opt_state, ids, attention_mask, loss_mask) -> (params, opt_state, metrics)`, jitted
    with params and opt_state donated; metrics: loss, tokens (scored), grad_norm (before clipping)."""

    def step(params, opt_state, ids, attention_mask, loss_mask):
        def loss_fn(p):
            return masked_nll(config, p, ids, attention_mask, loss_mask)

        (loss, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "tokens": count, "grad_norm": optax.tree.norm(grads)}

    return jax.jit(step, donate_argnums=(0, 1))


def sft_train(
    config: qwen2.Qwen2Config,
    params,
    batches_iter: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]],
    steps: int,
    lr: float,
    warmup: int,
    log_every: int,
    progress: bool = True,
    checkpointer: TrainCheckpointer | None = None,
) -> tuple[object, list[float]]:
    """`steps` SFT steps over (ids, attention_mask, loss_mask) [B, T] batches (`agent.sft_traces.sft_batches`).

    Returns the trained params and the loss of every step. `params` is donated to the first step: do not use
    the array passed in afterwards. The progress bar shows the loss every `log_every` steps.

    `checkpointer`: params, optimizer state and the losses so far are saved at its save steps, and a run
    that finds a checkpoint there continues from the newest one: the batches it had consumed are drawn again
    and dropped (`batches_iter` must be the same deterministic sequence), so a resumed run ends with the
    params and losses of one that was never stopped, bit for bit.
    """
    optimizer = sft_optimizer(lr, warmup, steps)
    step = make_sft_step(config, optimizer)
    opt_state = optimizer.init(params)
    start, losses, pending = 0, [], []
    if checkpointer is not None:
        restored = checkpointer.restore_latest({"params": params, "opt_state": opt_state})
        if restored is not None:
            start, state, meta = restored
            params, opt_state, losses = state["params"], state["opt_state"], list(meta["losses"])
            if start > steps or len(losses) != start:
                raise ValueError(
                    f"{checkpointer.directory}: a checkpoint of step {start} with {len(losses)} losses does not"
                    f" belong to a run of {steps} steps"
                )
    batches = iter(batches_iter)
    for _ in range(start):
        next(batches)
    with tqdm(total=steps, initial=start, desc="sft", disable=not progress) as bar:
        for i in range(start, steps):
            ids, attention_mask, loss_mask = next(batches)
            params, opt_state, metrics = step(params, opt_state, ids, attention_mask, loss_mask)
            pending.append(metrics["loss"])
            saving = checkpointer is not None and checkpointer.should_save(i + 1) and i + 1 < steps
            if (i + 1) % log_every == 0 or i + 1 == steps or saving:
                losses += [float(x) for x in jax.device_get(pending)]
                pending = []
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if saving:
                checkpointer.save(i + 1, {"params": params, "opt_state": opt_state}, {"losses": losses})
            bar.update(1)
    if checkpointer is not None:
        checkpointer.wait()
    return params, losses
