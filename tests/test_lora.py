"""LoRA: the adapted forward against a numpy merge of the weights in transformers' layout, the update of the
adapters against the gradient through that merge, GRPO with a frozen base as its reference, and a whole LoRA run
(peft-format adapters, the merged policy, checkpoints of the adapters alone, an exact resume).
peft's own forward and files: tests/test_peft_io.py."""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxsearch import parallel
from jaxsearch.config import ConfigError, RunConfig
from jaxsearch.models import hf_io, lora, qwen2
from jaxsearch.rl import train_step as ts

from tiny_models import FORWARD, INIT, LOGPROBS, numpy_logprobs, tiny_qwen2_config

CONFIG = tiny_qwen2_config(vocab_size=64, num_hidden_layers=2, tie_word_embeddings=False)
QWEN3 = tiny_qwen2_config(vocab_size=64, num_hidden_layers=2, family="qwen3", head_dim=12, tie_word_embeddings=True)
MERGE = jax.jit(lora.merge, static_argnums=(0, 1))  # jitted as tiny_models' FORWARD, INIT, LOGPROBS
INIT_ADAPTERS = jax.jit(lora.init_adapters, static_argnums=(0, 1))


def _adapters(config, spec, seed=1):
    """Adapters with B != 0 (fresh ones start with B = 0: the base itself)."""
    fresh = INIT_ADAPTERS(config, spec, jax.random.PRNGKey(seed))
    leaves, tree = jax.tree_util.tree_flatten(fresh)
    keys = jax.random.split(jax.random.PRNGKey(seed + 100), len(leaves))
    return tree.unflatten([x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def _numpy_merge(config, spec, params, adapters):
    """W_hf [out, in] + scale * (A @ B).T for every adapted projection, in transformers' layout (hf_io's
    mapping there and back), in float64 numpy."""
    host = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
    out = dict(host)
    for i in range(config.num_hidden_layers):
        tensors = hf_io._layer_to_hf(config, host[f"layers_{i}"], i)
        for module in adapters[f"layers_{i}"].values():
            for name, ad in module.items():
                key = next(k for k in tensors if k.endswith(f".{name}.weight"))
                a, b = np.asarray(ad["a"], np.float64), np.asarray(ad["b"], np.float64)
                tensors[key] = tensors[key] + spec.scale * (a @ b).T
        out[f"layers_{i}"] = hf_io._layer_to_params(config, tensors.__getitem__, i)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), out)


BATCH = np.random.default_rng(0).integers(1, 64, (2, 9)).astype(np.int32)
MASK = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9], np.int32)  # a left-padded row


@pytest.mark.parametrize(
    "config, targets, rslora",
    [
        (CONFIG, lora.TARGETS, False),
        (CONFIG, ("q_proj", "v_proj"), False),  # peft's default for Qwen2: half of the fused k/v kernel
        (CONFIG, ("k_proj", "up_proj", "down_proj"), True),
        (QWEN3, lora.TARGETS, False),  # head_dim != hidden / heads, tied embeddings
    ],
)
def test_adapted_forward_equals_a_numpy_merge_of_the_weights(config, targets, rslora):
    spec = lora.LoraSpec(rank=4, alpha=8.0, targets=targets, rslora=rslora)
    base = INIT(config, jax.random.PRNGKey(0))
    adapters = _adapters(config, spec)
    expected = FORWARD(config, _numpy_merge(config, spec, base, adapters), BATCH, MASK)
    lc = lora.lora_config(config, spec)
    for c in (lc, lc.replace(scan_layers=True)):  # the layers unrolled and in a scan
        got = FORWARD(c, lora.with_adapters(base, adapters), BATCH, MASK)
        np.testing.assert_allclose(got, expected, atol=2e-5)
    merged = MERGE(config, spec, base, adapters)
    np.testing.assert_allclose(FORWARD(config, merged, BATCH, MASK), expected, atol=2e-5)
    # fresh adapters (B = 0) are the base, exactly
    fresh = lora.with_adapters(base, INIT_ADAPTERS(config, spec, jax.random.PRNGKey(3)))
    np.testing.assert_array_equal(FORWARD(lc, fresh, BATCH, MASK), FORWARD(config, base, BATCH, MASK))
    # the cached path (prefill, then one decode step) reads the adapters too
    prefill = jax.jit(qwen2.prefill, static_argnums=(0, 4))
    logits, _ = prefill(lc, lora.with_adapters(base, adapters), BATCH, MASK, 16)
    np.testing.assert_allclose(logits, expected[:, -1], atol=2e-5)


def test_fresh_adapters_follow_peft_init():
    """peft's default init (LoraLayer.reset_lora_parameters): A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in),
    1/sqrt(in)), B = 0; one pair per targeted projection of every layer, shaped [in, r] and [r, out]."""
    spec = lora.LoraSpec(rank=8, alpha=16.0, targets=("q_proj", "o_proj", "down_proj"))
    adapters = lora.init_adapters(CONFIG, spec, jax.random.PRNGKey(0))
    assert sorted(adapters) == ["layers_0", "layers_1"]
    layer = adapters["layers_1"]
    assert {n: v["a"].shape + v["b"].shape for m in layer.values() for n, v in m.items()} == {
        "q_proj": (32, 8, 8, 32), "o_proj": (32, 8, 8, 32), "down_proj": (64, 8, 8, 32)
    }  # fmt: skip
    a = np.asarray(layer["mlp"]["down_proj"]["a"])
    assert np.abs(a).max() <= 1 / np.sqrt(64) and np.abs(a).max() > 0.9 / np.sqrt(64)
    assert not np.asarray(layer["mlp"]["down_proj"]["b"]).any()
    assert lora.count(adapters) == 2 * (32 * 8 + 8 * 32 + 32 * 8 + 8 * 32 + 64 * 8 + 8 * 32)
    assert spec.scale == 2.0 and lora.LoraSpec(8, 16.0, rslora=True).scale == pytest.approx(16 / np.sqrt(8))
    with pytest.raises(ValueError, match="targets"):
        lora.LoraSpec(4, 8.0, targets=("qkv",))


def test_dropout_applies_to_the_adapters_input_only_in_a_training_forward():
    spec = lora.LoraSpec(rank=4, alpha=8.0, dropout=0.5)
    base = INIT(CONFIG, jax.random.PRNGKey(0))
    params = lora.with_adapters(base, _adapters(CONFIG, spec))
    lc = lora.lora_config(CONFIG, spec)
    logp = jax.jit(
        lambda p, rng: qwen2.token_logprobs(lc, p, BATCH, MASK, BATCH, dropout_rng=rng), static_argnums=()
    )
    plain = LOGPROBS(lc, params, BATCH, MASK, BATCH)
    merged = MERGE(CONFIG, spec, base, params["lora"])
    np.testing.assert_allclose(plain, LOGPROBS(CONFIG, merged, BATCH, MASK, BATCH), atol=2e-5)
    one, again, other = (logp(params, jax.random.PRNGKey(k)) for k in (1, 1, 2))
    np.testing.assert_array_equal(one, again)
    assert np.abs(one - plain).max() > 1e-3 and np.abs(one - other).max() > 1e-3
    # with the adapters' B = 0 dropout changes nothing: it drops the adapters' input, not the base's
    zero_b = jax.tree_util.tree_map_with_path(
        lambda kp, x: jnp.zeros_like(x) if kp[-1].key == "b" else x, params["lora"]
    )
    np.testing.assert_allclose(
        logp(lora.with_adapters(base, zero_b), jax.random.PRNGKey(1)),
        LOGPROBS(CONFIG, base, BATCH, MASK, BATCH),
        atol=1e-6,
    )


def _batch(b=4, t=12, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 64, (b, t)).astype(np.int32)
    attn = np.ones((b, t), np.int32)
    loss = attn.copy()
    loss[:, :4] = 0
    old = (-rng.uniform(1, 5, (b, t))).astype(np.float32)
    return dict(
        tokens=tokens, attention_mask=attn, loss_mask=loss, advantages=rng.normal(size=b).astype(np.float32),
        old_logprobs=old, ref_logprobs=old + 0.1,
    )  # fmt: skip


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_update_moves_only_the_adapters_by_the_gradient_through_the_merge(micro_batches):
    """One SGD step (lr 1) of the jitted update over a frozen base: the adapters move by minus the gradient of
    the loss of `merge(base, adapters)` (another path to the same function); the base is untouched."""
    spec = lora.LoraSpec(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "gate_proj", "down_proj"))
    mesh = parallel.make_mesh({"fsdp": 1}, jax.devices()[:1])
    base = INIT(CONFIG, jax.random.PRNGKey(0))
    adapters = _adapters(CONFIG, spec)
    loss_cfg = ts.LossConfig(kl_coef=0.01, micro_batches=micro_batches)
    batch = _batch()
    jbatch = {k: jnp.asarray(v) for k, v in batch.items()}
    grads = jax.jit(
        jax.grad(lambda ad: ts.policy_loss(CONFIG, loss_cfg, lora.merge(CONFIG, spec, base, ad), jbatch)[0])
    )(adapters)
    base_copy = jax.tree_util.tree_map(np.array, base)
    state = ts.init_state(jax.tree_util.tree_map(jnp.copy, adapters), optax.sgd(1.0), mesh)  # donated
    update = ts.make_train_step(
        ts.policy_loss_fn(lora.lora_config(CONFIG, spec), loss_cfg), loss_cfg.agg_mode, micro_batches,
        optax.sgd(1.0), mesh, state, batch, frozen=base,
    )  # fmt: skip
    new, metrics = update(state, batch)
    assert int(new.step) == 1 and not bool(metrics["update_skipped"])
    for got, a, g in zip(*(jax.tree_util.tree_leaves(t) for t in (new.params, adapters, grads))):
        np.testing.assert_allclose(got, np.asarray(a) - np.asarray(g), atol=2e-6)
    for x, y in zip(jax.tree_util.tree_leaves(base), jax.tree_util.tree_leaves(base_copy)):
        np.testing.assert_array_equal(x, y)


def _cfg(**lora_keys):
    from configs import tiny_cpu_lora

    cfg = ml_collections.ConfigDict(tiny_cpu_lora.get_config().to_dict())
    cfg.data.batch_size, cfg.data.group_size = 2, 2
    cfg.algo.update(dict(mini_batches=2, micro_batches=1, pad_multiple=0, kl_coef=0.01))
    cfg.rollout.cache_len, cfg.rollout.temperature = 12, 1.0
    cfg.lora.update(lora_keys)
    return cfg


def test_grpo_with_lora_trains_adapters_over_a_frozen_base_that_is_the_reference():
    from jaxsearch.rl.algorithms import make_algorithm
    from jaxsearch.rl.step_log import StepTimer
    from jaxsearch.models.sharding import param_shardings

    mesh = parallel.make_mesh({"fsdp": 1}, jax.devices()[:1])
    base = jax.device_put(INIT(CONFIG, jax.random.PRNGKey(0)), param_shardings(CONFIG, mesh))
    before = jax.tree_util.tree_map(np.array, base)
    cfg = _cfg(rank=4, alpha=8.0, target_modules="q_proj,v_proj,up_proj")
    algo = make_algorithm(cfg, CONFIG, mesh)
    state = algo.init_state(base)
    spec = algo.lora
    assert spec.targets == ("q_proj", "v_proj", "up_proj") and spec.scale == 2.0
    # the trained state is the adapters and their moments only
    assert jax.tree_util.tree_structure(state["policy"].params) == jax.tree_util.tree_structure(
        lora.init_adapters(CONFIG, spec, jax.random.PRNGKey(0))
    )
    batch = _batch()
    traj = _Traj(batch["tokens"], batch["attention_mask"], batch["loss_mask"])
    scores = np.array([1.0, 0.0, 0.5, 0.0], np.float32)
    state, _ = algo.update(state, algo.prepare(state, traj, scores, StepTimer()))
    state, _ = algo.update(state, algo.prepare(state, traj, scores, StepTimer()))
    joined = {
        k: np.concatenate([b[k] for b in algo.prepare(state, traj, scores, StepTimer())])
        for k in ("old_logprobs", "ref_logprobs")
    }
    adapters = jax.device_get(state["policy"].params)
    merged = _numpy_merge(CONFIG, spec, before, adapters)
    np.testing.assert_allclose(
        joined["old_logprobs"], numpy_logprobs(CONFIG, merged, traj.tokens, traj.attention_mask), atol=1e-4
    )
    np.testing.assert_allclose(
        joined["ref_logprobs"], numpy_logprobs(CONFIG, before, traj.tokens, traj.attention_mask), atol=1e-4
    )
    assert np.abs(joined["old_logprobs"] - joined["ref_logprobs"]).max() > 1e-4  # the adapters moved
    for x, y in zip(jax.tree_util.tree_leaves(algo.base), jax.tree_util.tree_leaves(before)):
        np.testing.assert_array_equal(x, y)
    # the sampler's params: base + adapters merged, in the compute dtype and the params' layout
    decode = algo.decode_params(state)
    for x, y in zip(jax.tree_util.tree_leaves(decode), jax.tree_util.tree_leaves(merged)):
        np.testing.assert_allclose(x, y, atol=1e-6)
    final = algo.final_params(state)
    assert jax.tree_util.tree_structure(final) == jax.tree_util.tree_structure(base)


class _Traj:
    """The three arrays of a rollout that `GRPO.prepare` reads."""

    def __init__(self, tokens, attention_mask, loss_mask):
        self.tokens, self.attention_mask, self.loss_mask = tokens, attention_mask, loss_mask


def test_lora_config_is_checked_at_the_boundary():
    with pytest.raises(ConfigError, match=r"config.lora.target_modules='qkv_proj'"):
        RunConfig.from_dict(_cfg(target_modules="qkv_proj"))
    with pytest.raises(ConfigError, match=r"config.lora.dropout=1.0: expected in \[0, 1\)"):
        RunConfig.from_dict(_cfg(dropout=1.0))
    assert RunConfig.from_dict(_cfg(rank=0)).lora is None  # rank 0: every parameter trained
    assert RunConfig.from_dict(_cfg(target_modules="all-linear")).lora.targets == lora.TARGETS
    from jaxsearch.rl.algorithms import make_algorithm

    cfg = _cfg()
    cfg.algo.advantage = "gae"
    mesh = parallel.make_mesh({"fsdp": 1}, jax.devices()[:1])
    with pytest.raises(ValueError, match="config.lora: LoRA trains GRPO-family runs"):
        make_algorithm(cfg, CONFIG, mesh)


@pytest.mark.slow  # started first under pytest-xdist (conftest)
def test_lora_run_writes_peft_adapters_and_the_merged_policy_and_resumes_exactly(tmp_path):
    """configs/tiny_cpu_lora.py shortened, in this process: WORKDIR/grpo/adapter in peft's format (read back),
    WORKDIR/grpo/params = base + adapters merged, checkpoints that hold the adapters' state alone; a rerun
    after the last checkpoint is lost resumes from the one before and ends with the same adapters, bit for bit."""
    import shutil

    from configs import tiny_cpu_lora
    from jaxsearch import checkpoint
    from jaxsearch.models import orbax_io, peft_io
    from jaxsearch.rl import pipeline

    cfg = ml_collections.ConfigDict(tiny_cpu_lora.get_config().to_dict())
    overrides = {
        "total_steps": 2, "save_every": 1, "eval_every": 0, "sft.steps": 4, "data.batch_size": 2,
        "data.group_size": 2, "data.eval_examples": 2, "rollout.max_turns": 1, "rollout.max_segment_tokens": 16,
        "model.hidden_size": 32, "model.intermediate_size": 64, "model.num_hidden_layers": 1,
        "algo.mini_batches": 1, "algo.micro_batches": 1, "lora.dropout": 0.1, "mesh": {"fsdp": 2, "tensor": 4},
    }  # fmt: skip
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        (cfg[section] if section else cfg)[name] = value
    cfg.lock()
    workdir = tmp_path / "run"
    pipeline.run(cfg, str(workdir), progress=False)
    grpo = workdir / "grpo"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(grpo / "adapter"))
    assert json.load(open(grpo / "adapter" / "adapter_config.json"))["r"] == 8
    config, sft = orbax_io.restore_params(str(workdir / "sft" / "params"))
    spec, adapters = peft_io.load_peft(str(grpo / "adapter"), config)
    assert spec.targets == lora.TARGETS and spec.alpha == 16.0 and spec.dropout == 0.1
    _, merged = orbax_io.restore_params(str(grpo / "params"))
    expected = _numpy_merge(config, spec, sft, adapters)
    for x, y in zip(jax.tree_util.tree_leaves(merged), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(x, y, atol=1e-6)
    # a checkpoint restores as the adapters' TrainState (a state with the base in it would not)
    mesh = parallel.make_mesh({"fsdp": 1}, jax.devices()[:1])
    fresh = lora.init_adapters(lora.lora_config(config, spec), spec, jax.random.PRNGKey(0))
    from jaxsearch.rl import algorithms

    abstract = {"policy": ts.init_state(fresh, algorithms.optimizers(RunConfig.from_dict(cfg))["policy"], mesh)}
    step, restored, _ = checkpoint.TrainCheckpointer(str(grpo), save_every=1).restore_latest(abstract)
    assert step == 2
    for x, y in zip(jax.tree_util.tree_leaves(restored["policy"].params), jax.tree_util.tree_leaves(adapters)):
        np.testing.assert_array_equal(x, y)
    # lose step 2 and the outputs: the rerun resumes from step 1 and ends where the first run did
    for name in ("checkpoints/2", "adapter", "params"):
        shutil.rmtree(grpo / name)
    pipeline.run(cfg, str(workdir), progress=False)
    _, again = peft_io.load_peft(str(grpo / "adapter"), config)
    for x, y in zip(jax.tree_util.tree_leaves(again), jax.tree_util.tree_leaves(adapters)):
        np.testing.assert_array_equal(x, y)
