"""GRPO and PPO as objects, in process: their update batches against numpy references, their updates, and a
whole training run whose step time is attributed to named sections."""

import json
import os

import jax
import ml_collections
import numpy as np
import pytest

from jaxsearch import parallel
from jaxsearch.agent.trajectories import Trajectories
from jaxsearch.models import qwen2
from jaxsearch.rl.algorithms import GRPO, PPO, make_algorithm
from jaxsearch.rl.step_log import StepTimer
from jaxsearch.models.sharding import param_shardings

from hang import HANG_S
from tiny_models import numpy_logprobs, tiny_qwen2_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH = 24


def _cfg(**algo):
    from configs import tiny_cpu

    cfg = ml_collections.ConfigDict(tiny_cpu.get_config().to_dict())
    cfg.data.batch_size, cfg.data.group_size = 2, 2
    cfg.algo.update(dict(mini_batches=2, micro_batches=1, pad_multiple=0, kl_coef=0.0, kl_in_reward=0.0))
    cfg.algo.update(algo)
    cfg.rollout.cache_len, cfg.rollout.temperature = WIDTH, 1.0
    cfg.total_steps = 4
    return cfg


def _model():
    config = tiny_qwen2_config(vocab_size=50)
    mesh = parallel.make_mesh({"fsdp": 1}, jax.devices()[:1])
    params = jax.device_put(
        qwen2.init_params(config, jax.random.PRNGKey(0)), param_shardings(config, mesh)
    )
    return config, mesh, params


def _trajectories(rows=4, seed=0) -> Trajectories:
    """Random rows: a prompt of 5, then a response of some length whose odd stretches are policy tokens."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 50, (rows, WIDTH)).astype(np.int32)
    attn, loss = np.zeros_like(tokens), np.zeros_like(tokens)
    for b, n in enumerate(rng.integers(10, WIDTH, rows)):
        attn[b, :n] = 1
        loss[b, 5:n] = 1
        loss[b, 9:11] = 0  # an observation inside the response
        tokens[b, n:] = 0
    z = np.zeros((rows, WIDTH), np.float32)
    lists = [[] for _ in range(rows)]
    return Trajectories(
        tokens, attn, loss, np.zeros_like(tokens), z, z, np.full(rows, 5, np.int32), np.ones(rows, np.int32),
        np.zeros(rows, np.int32), np.zeros(rows, bool), [None] * rows, [""] * rows, lists, lists, lists, lists,
        lists, lists, [""] * rows, [None] * rows, [None] * rows, {}, ["length"] * rows, list(loss.sum(1)),
    )  # fmt: skip


def _numpy_gae(rewards, values, mask, gamma, lam):
    """GAE over mask-1 tokens by a backwards loop (observations skipped), returns before whitening, then
    advantages whitened over mask-1 tokens with the unbiased variance."""
    adv, ret = np.zeros_like(rewards), np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        next_v, next_a = 0.0, 0.0
        for t in reversed(range(rewards.shape[1])):
            if not mask[b, t]:
                continue
            delta = rewards[b, t] + gamma * next_v - values[b, t]
            next_a = delta + gamma * lam * next_a
            next_v = values[b, t]
            adv[b, t], ret[b, t] = next_a, next_a + values[b, t]
    sel = mask == 1
    mean, var = adv[sel].mean(), adv[sel].var(ddof=1)
    return np.where(sel, (adv - mean) / np.sqrt(var + 1e-8), 0.0), ret


def test_grpo_batches_hold_group_advantages_and_the_policy_logprobs():
    config, mesh, params = _model()
    cfg = _cfg(kl_coef=0.001)
    algo = make_algorithm(cfg, config, mesh)
    assert type(algo) is GRPO
    state = algo.init_state(params)
    traj, scores = _trajectories(), np.array([1.0, 0.0, 0.5, 0.5], np.float32)
    timer = StepTimer()
    batches = algo.prepare(state, traj, scores, timer)
    assert len(batches) == 2 and all(b["tokens"].shape == (2, WIDTH) for b in batches)
    joined = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    # GRPO: (r - group mean) / (unbiased group std + 1e-6); a constant group gets 0
    np.testing.assert_allclose(
        joined["advantages"], [0.5 / (np.sqrt(0.5) + 1e-6), -0.5 / (np.sqrt(0.5) + 1e-6), 0, 0], rtol=1e-5
    )
    expected = numpy_logprobs(config, params, traj.tokens, traj.attention_mask)
    mask = traj.attention_mask == 1
    np.testing.assert_allclose(joined["old_logprobs"][mask], expected[mask], atol=2e-4)
    np.testing.assert_allclose(joined["ref_logprobs"], joined["old_logprobs"])  # nothing updated yet
    assert {"old_logprobs", "ref_logprobs"} <= set(timer.seconds)
    # an update moves the policy; the reference stays the initial policy
    state, metrics = algo.update(state, batches)
    assert np.isfinite(metrics["loss"]) and metrics["skipped_updates"] == 0
    assert int(state["policy"].step) == 2  # one update per mini-batch
    again = {k: np.concatenate([b[k] for b in algo.prepare(state, traj, scores, timer)]) for k in batches[0]}
    np.testing.assert_allclose(again["ref_logprobs"][mask], expected[mask], atol=2e-4)
    assert np.abs(again["old_logprobs"] - again["ref_logprobs"])[traj.loss_mask == 1].max() > 1e-6


@pytest.mark.parametrize("gae_tokens", ["response", "policy"])
def test_ppo_batches_hold_gae_over_the_critic_with_the_kl_in_the_reward(gae_tokens):
    config, mesh, params = _model()
    cfg = _cfg(advantage="gae", kl_in_reward=0.1, gamma=0.9, lam=0.8, gae_tokens=gae_tokens)
    algo = make_algorithm(cfg, config, mesh)
    assert type(algo) is PPO
    state = algo.init_state(params)
    state, _ = algo.update(
        state, algo.prepare(state, _trajectories(seed=1), np.ones(4, np.float32), StepTimer())
    )
    traj, scores = _trajectories(seed=2), np.array([1.0, 0.0, 0.5, 2.0], np.float32)
    timer = StepTimer()
    joined = {k: np.concatenate([b[k] for b in algo.prepare(state, traj, scores, timer)]) for k in ("advantages", "returns", "old_values", "old_logprobs", "ref_logprobs", "value_mask")}  # fmt: skip
    assert "values" in timer.seconds
    lmask = traj.loss_mask
    mask = lmask.copy()
    if gae_tokens == "response":  # every token from the policy's first on, retrieved ones too, not padding
        for b in range(4):
            mask[b, np.flatnonzero(lmask[b])[0] : traj.attention_mask[b].sum()] = 1
        assert (mask != lmask).any()  # the rows hold retrieved tokens
    np.testing.assert_array_equal(joined["value_mask"][:, : mask.shape[1]], mask)
    rewards = -0.1 * (joined["old_logprobs"] - joined["ref_logprobs"]) * lmask
    for b in range(4):  # the outcome on the last token GAE runs over
        rewards[b, np.flatnonzero(mask[b])[-1]] += scores[b]
    adv, ret = _numpy_gae(
        rewards.astype(np.float64), joined["old_values"].astype(np.float64), mask, 0.9, 0.8
    )
    np.testing.assert_allclose(joined["returns"][mask == 1], ret[mask == 1], atol=1e-4)
    np.testing.assert_allclose(joined["advantages"][mask == 1], adv[mask == 1], atol=1e-3)
    state, metrics = algo.update(state, algo.prepare(state, traj, scores, timer))
    assert np.isfinite(metrics["critic/vf_loss"]) and int(state["critic"].step) == 4


@pytest.mark.slow  # started first under pytest-xdist (conftest)
def test_training_in_process_attributes_every_second_and_ppo_writes_its_own_dir(tmp_path):
    """The whole pipeline in this process (tiny world, SFT, 2 PPO steps): metrics under ppo/, and each logged
    step's sections plus `time/other_s` add up to `time/step_s`."""
    from configs import tiny_cpu
    from jaxsearch.rl import pipeline

    cfg = ml_collections.ConfigDict(tiny_cpu.get_config().to_dict())
    overrides = {
        "total_steps": 2, "save_every": 1, "eval_every": 2, "sft.steps": 4, "sft.save_every": 2, "data.batch_size": 2,
        "data.group_size": 2, "data.eval_examples": 2, "rollout.max_turns": 1, "rollout.max_segment_tokens": 16,
        "model.hidden_size": 32, "model.intermediate_size": 64, "model.num_hidden_layers": 1,
        "algo.advantage": "gae", "algo.mini_batches": 1, "algo.micro_batches": 1, "mesh": {"fsdp": 2, "tensor": 4},
    }  # fmt: skip
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        (cfg[section] if section else cfg)[name] = value
    cfg.lock()
    pipeline.run(cfg, str(tmp_path), progress=False)
    assert not (tmp_path / "grpo").exists()
    sft_rows = [json.loads(line) for line in open(tmp_path / "sft" / "metrics.jsonl")]
    assert [r["step"] for r in sft_rows] == [1, 2, 3, 4]
    assert os.path.isdir(tmp_path / "sft" / "params") and not (tmp_path / "sft" / "checkpoints").exists()
    rows = [json.loads(line) for line in open(tmp_path / "ppo" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows[1:]:
        sections = [k for k in row if k.startswith("time/") and k.count("/") == 1 and k != "time/step_s"]
        for name in ("rollout", "reward", "old_logprobs", "values", "update", "checkpoint", "other"):
            assert f"time/{name}_s" in sections
        assert sum(row[k] for k in sections) == pytest.approx(row["time/step_s"], rel=1e-6)
    assert "time/evaluate_s" in rows[2] and "eval/synthetic/em" in rows[2]
    assert np.isfinite(rows[2]["critic/vf_loss"]) and np.isfinite(rows[2]["pg_loss"])
    assert os.path.isdir(tmp_path / "ppo" / "params")


def test_metric_writer_writes_jsonl_and_tensorboard_without_importing_torch(tmp_path):
    """A step's metrics go to metrics.jsonl and to a TensorBoard event file (read back here: its TFRecord framing,
    tensorboardX's Event protobuf); tensorboardX is imported without torch (installed here, for the parity tests), which cost every
    training process ~3 s of start-up."""
    import subprocess
    import sys

    script = (
        "import sys; from jaxsearch.rl.step_log import MetricWriter\n"
        f"w = MetricWriter({str(tmp_path)!r}); w.write(3, {{'reward/em': 0.25}}); w.write(4, {{'reward/em': 0.5}})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows == [{"step": 3, "reward/em": 0.25}, {"step": 4, "reward/em": 0.5}]
    from tensorboardX.proto.event_pb2 import Event

    (events,) = (tmp_path / "tb").iterdir()
    scalars = []
    data = events.read_bytes()
    while data:  # TFRecord framing: length (8 bytes), its crc (4), the record, its crc (4)
        n = int.from_bytes(data[:8], "little")
        event = Event.FromString(data[12 : 12 + n])
        scalars += [(event.step, v.tag, v.simple_value) for v in event.summary.value]
        data = data[16 + n :]
    assert scalars == [(3, "reward/em", 0.25), (4, "reward/em", 0.5)]
