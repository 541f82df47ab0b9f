"""The sharded policy update against the single-device update, accumulation against the full batch."""

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxsearch import parallel
from jaxsearch.rl import train_step as ts
from jaxsearch.models.sharding import param_shardings

from tiny_models import FORWARD, INIT, tiny_qwen2_config

CONFIG = tiny_qwen2_config(vocab_size=96, num_hidden_layers=2, tie_word_embeddings=False)
POLICY_LOSS = jax.jit(ts.policy_loss, static_argnums=(0, 1))


def make_batch(b=8, t=24, seed=0, per_token_adv=False):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CONFIG.vocab_size, (b, t)).astype(np.int32)
    lengths = rng.integers(t // 2, t + 1, b)
    attn = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    loss = attn.copy()
    loss[:, :6] = 0  # prompt
    loss[:, 10:13] = 0  # an observation
    adv = rng.normal(size=(b, t) if per_token_adv else (b,)).astype(np.float32)
    old = (-rng.uniform(1, 5, (b, t))).astype(np.float32) * attn
    ref = old + rng.normal(scale=0.1, size=(b, t)).astype(np.float32) * attn
    return dict(
        tokens=tokens, attention_mask=attn, loss_mask=loss, advantages=adv, old_logprobs=old, ref_logprobs=ref
    )


def run(loss_cfg, batch, mesh_shape=None, steps=2):
    """Train `steps` updates from the same init; mesh_shape None: one device."""
    devices = jax.devices() if mesh_shape else jax.devices()[:1]
    mesh = parallel.make_mesh(mesh_shape or {"fsdp": 1}, devices=devices)
    params = INIT(CONFIG, jax.random.PRNGKey(0))
    params = jax.device_put(params, param_shardings(CONFIG, mesh))
    optimizer = ts.make_optimizer(1e-3, total_steps=10, warmup_steps=1)
    state = ts.init_state(params, optimizer, mesh)
    step = ts.make_train_step(
        ts.policy_loss_fn(CONFIG, loss_cfg),
        loss_cfg.agg_mode,
        loss_cfg.micro_batches,
        optimizer,
        mesh,
        state,
        batch,
    )
    history = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        history.append(jax.device_get(metrics))
    return jax.device_get(state), history


@pytest.mark.parametrize("mesh_shape", [{"data": 8}, {"fsdp": 4, "tensor": 2}])
def test_sharded_step_equals_single_device(mesh_shape):
    batch = make_batch()
    cfg = ts.LossConfig(kl_coef=0.01, entropy_coef=0.01)
    ref_state, ref_hist = run(cfg, batch)
    state, hist = run(cfg, batch, mesh_shape)
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(ref_state.params)):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(hist[-1]["loss"], ref_hist[-1]["loss"], atol=1e-5)
    assert int(state.step) == 2


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_gradient_accumulation_equals_full_batch(agg_mode):
    batch = make_batch(per_token_adv=True, seed=1)
    full, full_hist = run(ts.LossConfig(agg_mode=agg_mode, kl_coef=0.01), batch, steps=1)
    acc, acc_hist = run(ts.LossConfig(agg_mode=agg_mode, kl_coef=0.01, micro_batches=4), batch, steps=1)
    np.testing.assert_allclose(acc_hist[0]["loss"], full_hist[0]["loss"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(acc_hist[0]["grad_norm"], full_hist[0]["grad_norm"], rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(acc.params), jax.tree_util.tree_leaves(full.params)):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_loss_equals_numpy_reference(temperature):
    """pg + kl terms recomputed in numpy from the model's log-probs (of logits / the rollout temperature)."""
    batch = make_batch(seed=2)
    cfg = ts.LossConfig(kl_coef=0.1, temperature=temperature)
    params = INIT(CONFIG, jax.random.PRNGKey(0))
    loss, stats = POLICY_LOSS(CONFIG, cfg, params, {k: jnp.asarray(v) for k, v in batch.items()})
    logits = np.asarray(FORWARD(CONFIG, params, batch["tokens"], batch["attention_mask"]), np.float64)
    logits = logits / temperature
    lsm = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    logp = np.zeros(batch["tokens"].shape)
    logp[:, 1:] = np.take_along_axis(lsm[:, :-1], batch["tokens"][:, 1:, None], -1)[..., 0]
    m = batch["loss_mask"].astype(np.float64)
    ratio = np.exp(logp - batch["old_logprobs"])
    adv = batch["advantages"][:, None]
    pg = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.2))
    d = batch["ref_logprobs"] - logp
    kl = np.clip(np.exp(d) - d - 1, -10, 10)
    expect = (pg * m).sum() / m.sum() + 0.1 * (kl * m).sum() / m.sum()
    np.testing.assert_allclose(float(loss), expect, rtol=1e-4)


def test_non_finite_loss_skips_the_update():
    batch = make_batch(seed=3)
    batch["advantages"] = batch["advantages"].copy()
    batch["advantages"][0] = np.nan
    state, hist = run(ts.LossConfig(), batch)
    params0 = INIT(CONFIG, jax.random.PRNGKey(0))
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(params0)):
        np.testing.assert_array_equal(a, b)
    assert int(state.step) == 0 and int(state.skipped) == 2 and bool(hist[0]["update_skipped"])


def test_critic_values_see_only_earlier_tokens_and_fit_returns():
    """values[:, t] is the value of the state before tokens[:, t]; the critic update regresses to returns."""
    batch = make_batch(seed=4)
    params = INIT(CONFIG, jax.random.PRNGKey(0))
    critic = ts.init_critic(CONFIG, params, jax.random.PRNGKey(1))
    values = np.asarray(ts.critic_values(CONFIG, critic, batch["tokens"], batch["attention_mask"]))
    changed = batch["tokens"].copy()
    changed[:, 10] = (changed[:, 10] + 1) % CONFIG.vocab_size
    values2 = np.asarray(ts.critic_values(CONFIG, critic, changed, batch["attention_mask"]))
    np.testing.assert_array_equal(values[:, :11], values2[:, :11])
    assert np.abs(values[:, 11:] - values2[:, 11:]).max() > 0
    assert np.all(values[:, 0] == 0)

    mesh = parallel.make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    optimizer = ts.make_optimizer(1e-2, total_steps=50)
    state = ts.init_state(jax.device_put(critic, jax.devices()[0]), optimizer, mesh)
    returns = np.where(batch["loss_mask"] > 0, 0.7, 0.0).astype(np.float32)
    critic_batch = dict(batch, old_values=values, returns=returns)
    loss_fn = functools.partial(ts.critic_loss, CONFIG, 100.0, "token-mean")  # clip off: plain regression
    step = ts.make_train_step(loss_fn, "token-mean", 1, optimizer, mesh, state, critic_batch)
    first = None
    for _ in range(30):
        state, m = step(state, critic_batch)
        first = float(m["vf_loss"]) if first is None else first
    assert float(m["vf_loss"]) < 0.1 * first


def test_outcome_token_rewards_sit_on_the_last_policy_token():
    from jaxsearch.rl.algorithms import outcome_token_rewards

    mask = np.array([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    out = outcome_token_rewards(np.array([2.0, 3.0, -1.0], np.float32), mask)
    expect = np.zeros((3, 6), np.float32)
    expect[0, 4], expect[2, 5] = 2.0, -1.0
    np.testing.assert_array_equal(out, expect)


def test_update_width_rounds_the_last_attended_column_up():
    from jaxsearch.agent.trajectories import pad_to
    from jaxsearch.rl.algorithms import update_width

    attn = np.zeros((3, 160), np.int32)
    attn[0, :5], attn[1, :130], attn[2, 2:9] = 1, 1, 1  # the longest row ends at column 130
    assert update_width(attn, 512, 0) == 512  # off: the cache length
    assert update_width(attn, 512, 128) == 256
    assert update_width(attn, 200, 128) == 200  # never past the cache
    assert update_width(attn[[0, 2]], 512, 8) == 16
    x = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(pad_to(x, 5), [[0, 1, 2, 0, 0], [3, 4, 5, 0, 0]])
    np.testing.assert_array_equal(pad_to(x, 2), [[0, 1], [3, 4]])


@pytest.mark.slow  # started first under pytest-xdist (conftest)
def test_loss_does_not_depend_on_right_padding():
    """An update batch cut to `update_width` columns scores exactly what the cache-wide one does."""
    batch = make_batch(seed=3)  # rows end by column 24
    wide = {k: np.pad(v, ((0, 0), (0, 40))) if v.ndim == 2 else v for k, v in batch.items()}
    cfg = ts.LossConfig(kl_coef=0.1)
    params = INIT(CONFIG, jax.random.PRNGKey(0))
    loss_and_grad = jax.jit(jax.value_and_grad(lambda p, b: ts.policy_loss(CONFIG, cfg, p, b)[0]))
    (loss, grad), (wide_loss, wide_grad) = loss_and_grad(params, batch), loss_and_grad(params, wide)
    for a, b in zip(jax.tree_util.tree_leaves(grad), jax.tree_util.tree_leaves(wide_grad)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(loss, wide_loss, rtol=1e-6)
