"""DAPO, Dr.GRPO and GSPO against numpy re-implementations of their papers' formulas on hand-made batches
(masks with retrieved-token runs and a padding row), their gradients against the closed forms, micro-batch
accumulation under their aggregations, DAPO's dynamic sampling and overlong shaping on hand-made cases, and
each tiny_cpu_* config's update step.

DAPO: Yu et al. 2025, arXiv 2503.14476 (Eqs. 10-13). Dr.GRPO: Liu et al. 2025, arXiv 2503.20783 (§3.2).
GSPO: Zheng et al. 2025, arXiv 2507.18071 (Eqs. 5-7, §5.1).
"""

import dataclasses
import importlib
import os
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxsearch import parallel
from jaxsearch.agent.trajectories import Trajectories
from jaxsearch.config import ConfigError, RunConfig
from jaxsearch.models import qwen2
from jaxsearch.models.sharding import param_shardings
from jaxsearch.rl import algorithms, dynamic_sampling, losses
from jaxsearch.rl import train_step as ts
from jaxsearch.rl.advantages import get_advantage_fn
from jaxsearch.rl.step_log import StepTimer
from jaxsearch.scoring.rewards import overlong_penalty

from tiny_models import tiny_qwen2_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the configs package


def batch(seed=0, rows=5, width=10):
    """[rows, width] log-probs and a mask: each row a response with a retrieved run (mask 0) inside it,
    the last row batch padding; masked positions hold wild log-probs that must not matter."""
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.5, 0.5, (rows, width))
    logp = old + rng.normal(0.0, 0.3, (rows, width))
    mask = np.zeros((rows, width))
    for b in range(rows - 1):
        mask[b, 1 : 3 + 2 * b] = 1
        mask[b, 3:5] = 0  # <information> ... </information>: retrieved, not the policy's
    logp[mask == 0] = 30.0  # would dominate any sum that let them in
    adv = rng.normal(size=rows)
    return tuple(x.astype(np.float32) for x in (logp, old, adv, mask))


def pessimistic(r, a, low, high):
    """max(-A r, -A clip(r, 1 - low, 1 + high)), and whether its gradient in r is live (the unclipped term
    is the max)."""
    clipped = min(max(r, 1 - low), 1 + high)
    return max(-a * r, -a * clipped), -a * r >= -a * clipped and not (
        (a > 0 and r > 1 + high) or (a < 0 and r < 1 - low)
    )


def token_objective(logp, old, adv, mask, low, high, norm=None):
    """DAPO (norm None: Eq. 12's 1 / sum_i |o_i| over all tokens) or Dr.GRPO (each row's sum / norm, mean over
    rows): (loss, d loss / d logp) by loops over the policy's tokens."""
    rows = [b for b in range(len(adv)) if mask[b].any()]
    total, grad = 0.0, np.zeros_like(logp)
    scale = 1.0 / mask.sum() if norm is None else 1.0 / (norm * len(rows))
    for b in rows:
        for t in np.flatnonzero(mask[b]):
            r = np.exp(logp[b, t] - old[b, t])
            value, live = pessimistic(r, adv[b], low, high)
            total += value * scale
            grad[b, t] = -adv[b] * r * scale if live else 0.0
    return total, grad


def gspo_objective(logp, old, adv, mask, low, high):
    """GSPO (Eq. 5, 7): s_i = exp(mean log-ratio over row i's tokens), 1/G sum_i max(-A s, -A clip(s)), and
    its gradient: -A_i s_i / (G |y_i|) on each token of a row whose unclipped term is live."""
    rows = [b for b in range(len(adv)) if mask[b].any()]
    total, grad = 0.0, np.zeros_like(logp)
    for b in rows:
        n = mask[b].sum()
        s = np.exp(sum(logp[b, t] - old[b, t] for t in np.flatnonzero(mask[b])) / n)
        value, live = pessimistic(s, adv[b], low, high)
        total += value / len(rows)
        if live:
            grad[b] = -adv[b] * s / (len(rows) * n) * mask[b]
    return total, grad


def loss_and_grad(name, logp, old, adv, mask, **kw):
    fn = lambda lp: losses.get_policy_loss(name)(lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), **kw)
    (loss, stats), grad = jax.jit(jax.value_and_grad(fn, has_aux=True))(jnp.asarray(logp))
    return float(loss), np.asarray(grad), stats


def test_dapo_decoupled_clip_token_mean_matches_eq_10_and_its_gradient():
    logp, old, adv, mask = batch(0)
    loss, grad, _ = loss_and_grad("ppo", logp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    ref, ref_grad = token_objective(logp, old, adv, mask, 0.2, 0.28)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-7)
    assert not grad[mask == 0].any()  # retrieved tokens and padding get no gradient
    # clip-higher on a hand case: a token at ratio 1.25 with A > 0 is clipped at 1 + 0.2, live at 1 + 0.28
    one = dict(old=np.zeros((1, 1)), adv=np.ones(1), mask=np.ones((1, 1)))
    lp = np.full((1, 1), np.log(1.25))
    sym = loss_and_grad("ppo", lp, one["old"], one["adv"], one["mask"], clip_eps=0.2)
    dapo = loss_and_grad("ppo", lp, one["old"], one["adv"], one["mask"], clip_eps_low=0.2, clip_eps_high=0.28)
    assert (sym[0], dapo[0]) == (pytest.approx(-1.2), pytest.approx(-1.25))
    assert sym[1][0, 0] == 0.0 and dapo[1][0, 0] == pytest.approx(-1.25)


def test_drgrpo_sums_each_row_over_a_constant_and_centres_without_std():
    logp, old, adv, mask = batch(1)
    loss, grad, _ = loss_and_grad("ppo", logp, old, adv, mask, agg_mode="seq-mean-token-sum-norm", agg_norm=16.0)
    ref, ref_grad = token_objective(logp, old, adv, mask, 0.2, 0.2, norm=16.0)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-7)
    # no length normalisation: a token's gradient does not shrink with its row's length (unlike seq-mean-token-mean)
    hand = jnp.asarray([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0]])
    hand_mask = jnp.asarray([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert float(losses.agg_loss(hand, hand_mask, "seq-mean-token-sum-norm", 8.0)) == pytest.approx((6 / 8 + 4 / 8) / 2)
    with pytest.raises(ValueError, match="needs a constant norm"):
        losses.agg_loss(hand, hand_mask, "seq-mean-token-sum-norm")
    # A_i = r_i - group mean (Dr.GRPO §3.2), where GRPO divides by the group's std
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 0.0, 2.0])
    expected = (rewards.reshape(3, 4) - rewards.reshape(3, 4).mean(1, keepdims=True)).reshape(-1)
    np.testing.assert_allclose(get_advantage_fn("dr_grpo")(jnp.asarray(rewards), 4), expected, atol=1e-6)


def test_gspo_sequence_ratio_and_clip_match_eqs_5_and_7():
    logp, old, adv, mask = batch(2)
    # sequence log-ratios placed about the paper's bounds 1 - 3e-4 / 1 + 4e-4: inside, above, below, above
    targets, adv = np.array([2e-4, 1e-3, -1e-3, 1e-3, 0.0]), np.array([1.0, 1.0, -1.0, -0.5, 0.7])
    noise = np.random.default_rng(3).normal(0, 1e-3, logp.shape)  # token ratios straddle the bounds
    for b in range(4):
        sel = mask[b] == 1
        noise[b, sel] -= noise[b, sel].mean()  # the row's mean log-ratio is its target exactly
        logp[b, sel] = old[b, sel] + targets[b] + noise[b, sel]
    kw = dict(clip_eps_low=3e-4, clip_eps_high=4e-4, agg_mode="seq-mean-token-mean")
    loss, grad, stats = loss_and_grad("gspo", logp, old, adv, mask, **kw)
    ref, ref_grad = gspo_objective(logp, old, adv, mask, 3e-4, 4e-4)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-9)
    # rows 1 (A > 0 above 1 + eps_high) and 2 (A < 0 below 1 - eps_low) are clipped: no gradient at all
    assert float(stats["clip_frac"]) == pytest.approx(0.5)
    assert not grad[1].any() and not grad[2].any() and grad[0][mask[0] == 1].all() and grad[3][mask[3] == 1].all()
    np.testing.assert_allclose(float(stats["ratio_max"]), np.exp(1e-3), rtol=1e-6)
    # token-level ratios would clip some of row 0's tokens, which GSPO keeps whole
    token_grad = loss_and_grad("ppo", logp, old, adv, mask, **kw)[1]
    assert (token_grad[0][mask[0] == 1] == 0).any()
    with pytest.raises(ValueError, match="one advantage per sequence"):
        losses.gspo_policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.ones(logp.shape), jnp.asarray(mask))


@pytest.mark.parametrize(
    "name, kw",
    [
        ("ppo", dict(agg_mode="seq-mean-token-sum-norm", agg_norm=12.0)),
        ("gspo", dict(agg_mode="seq-mean-token-mean", clip_eps_low=3e-4, clip_eps_high=4e-4)),
        ("ppo", dict(agg_mode="token-mean", clip_eps_low=0.2, clip_eps_high=0.28)),
    ],
)
def test_micro_batches_accumulate_to_the_full_batch_update(name, kw):
    """train_step's per-micro-batch weights (its share of the aggregation's normaliser) under each objective's
    aggregation: 2 micro-batches give the full batch's loss and SGD update."""
    logp, old, adv, mask = batch(4, rows=4, width=8)
    data = dict(x=np.abs(logp), old=old, adv=adv, loss_mask=mask)

    def loss_fn(params, b):
        fn = losses.get_policy_loss(name)
        pg, stats = fn(-b["x"] * params["w"], b["old"], b["adv"], b["loss_mask"], **kw)
        return pg, {}

    state = ts.TrainState({"w": jnp.asarray(1.1)}, None, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    out = []
    for m in (1, 2):
        opt = optax.sgd(1.0)
        s = ts.TrainState(state.params, opt.init(state.params), state.step, state.skipped)
        step = jax.jit(lambda s, b: ts.train_step(loss_fn, kw["agg_mode"], m, opt, s, b))
        new, metrics = step(s, jax.tree_util.tree_map(jnp.asarray, data))
        out.append((float(metrics["loss"]), float(new.params["w"])))
    assert out[0][1] != 1.1
    np.testing.assert_allclose(out[1], out[0], rtol=1e-5)


def test_overlong_penalty_is_eq_13_on_hand_lengths():
    # L_max 20, L_cache 5: free up to 15 tokens, then -1/5 per token, -1 past 20
    lengths = np.array([0, 15, 16, 18, 20, 21, 40])
    np.testing.assert_allclose(overlong_penalty(lengths, 20, 5), [0, 0, -0.2, -0.6, -1.0, -1.0, -1.0])
    with pytest.raises(ValueError, match="L_cache=20 < L_max=20"):
        overlong_penalty(lengths, 20, 20)


def test_dynamic_sampling_keeps_groups_with_a_reward_spread():
    scores = np.array([1, 1, 1, 0, 0, 0, 0.5, 0.5, 1, 0, 0, 1], float)  # groups of 3: spread in 2 and 3
    assert dynamic_sampling.informative_groups(scores, 3).tolist() == [False, False, True, True]
    assert dynamic_sampling.informative_groups(scores, 2).tolist() == [False, True, False, False, True, True]
    assert dynamic_sampling.select_groups([False, True, True, False, True], 2) == [1, 2]
    # short of a batch (the draw cap): completed by the earliest constant groups
    assert dynamic_sampling.select_groups([False, True, False, False], 3) == [1, 0, 2]
    with pytest.raises(ValueError, match="group_size=1"):
        dynamic_sampling.informative_groups(scores, 1)


def fake_trajectories(ids: list[int], width: int) -> Trajectories:
    """Rows that carry their id in tokens[:, 0], answers and responses, of `width` columns."""
    n = len(ids)
    tokens = np.zeros((n, width), np.int32)
    tokens[:, 0] = ids
    ones, z = np.ones((n, width), np.int32), np.zeros((n, width), np.float32)
    lists = [[] for _ in range(n)]
    text = [str(i) for i in ids]
    return Trajectories(
        tokens, ones, ones, np.zeros_like(tokens), z, z, np.zeros(n, np.int32), np.ones(n, np.int32),
        np.zeros(n, np.int32), np.zeros(n, bool), text, text, lists, lists, lists, lists, lists, lists, text,
        [None] * n, [None] * n, {"decode": 1.0}, ["stop"] * n, [width] * n,
    )  # fmt: skip


def test_dynamic_sampling_draws_until_the_batch_is_full_then_trains_on_the_kept_rows():
    # batches of 2 questions x 2 samples; the rewards of each draw by group: draw 0 (a, constant), draw 1
    # (constant, b), draw 2 (c, d): the step keeps a, b, c and stops; draw 3 is never made
    draws = [[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.5, 0.0], [1.0, 0.0, 1.0, 0.0]]
    made = []

    def draw(attempt):
        made.append(attempt)
        ids = [10 * attempt + j for j in range(4)]
        return fake_trajectories(ids, 3 + attempt), np.array(draws[attempt]), {"reward": float(attempt)}

    traj, scores, metrics = dynamic_sampling.collect(draw, batch_size=3, group_size=2, max_draws=5)
    assert made == [0, 1, 2]
    assert traj.tokens[:, 0].tolist() == [0, 1, 12, 13, 20, 21] and traj.answers == ["0", "1", "12", "13", "20", "21"]
    assert scores.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 0.0] and traj.tokens.shape == (6, 5)
    assert metrics["reward"] == 0.0  # the ordinary sample's metrics, as GRPO logs them
    assert metrics["dynamic_sampling/draws"] == 3 and metrics["dynamic_sampling/filled_groups"] == 0
    assert metrics["dynamic_sampling/informative"] == pytest.approx(4 / 6)
    assert traj.timings == {"decode": 3.0}
    # the cap: 2 draws hold 2 informative groups; the third group is draw 0's constant one
    made.clear()
    traj, scores, metrics = dynamic_sampling.collect(draw, batch_size=3, group_size=2, max_draws=2)
    assert made == [0, 1] and traj.tokens[:, 0].tolist() == [0, 1, 12, 13, 2, 3]
    assert metrics["dynamic_sampling/filled_groups"] == 1


CONFIGS = ["tiny_cpu_dapo", "tiny_cpu_drgrpo", "tiny_cpu_gspo"]


def config(name):
    return importlib.import_module(f"configs.{name}").get_config()


def test_objective_configs_carry_the_papers_values():
    dapo, drgrpo, gspo = (RunConfig.from_dict(config(n)) for n in CONFIGS)
    assert algorithms.max_policy_tokens(dapo) == (4 + 1) * 48
    lc = algorithms.loss_config(dapo)
    assert (lc.clip_eps_low, lc.clip_eps_high, lc.agg_mode, lc.kl_coef) == (0.2, 0.28, "token-mean", 0.0)
    assert dapo.algo.dynamic_sampling and dapo.algo.overlong_buffer == 48 and dapo.algo.overlong_max_tokens is None
    lc = algorithms.loss_config(drgrpo)
    assert (drgrpo.algo.advantage, lc.agg_mode, lc.agg_norm) == ("dr_grpo", "seq-mean-token-sum-norm", 240.0)
    lc = algorithms.loss_config(gspo)
    assert (lc.policy_loss, lc.clip_eps_low, lc.clip_eps_high, lc.agg_mode) == ("gspo", 3e-4, 4e-4, "seq-mean-token-mean")
    assert algorithms.loss_config(RunConfig.from_dict(config("tiny_cpu"))).agg_norm is None
    raw = ml_collections.ConfigDict(config("tiny_cpu_dapo").to_dict())
    raw.algo.overlong_max_tokens = 48
    with pytest.raises(ConfigError, match="overlong_buffer=48: expected < algo.overlong_max_tokens=48"):
        RunConfig.from_dict(raw)
    raw.algo.overlong_max_tokens, raw.data.group_size = 0, 1
    with pytest.raises(ValueError, match="dynamic_sampling drops .* data.group_size >= 2, got 1"):
        algorithms.make_algorithm(raw, None, None)


WIDTH = 24


def tiny_step_inputs(seed):
    """Random rows of WIDTH: a prompt of 5, a response with a retrieved run at 9:11, of random length."""
    rng = np.random.default_rng(seed)
    traj = fake_trajectories(list(range(4)), WIDTH)
    tokens = rng.integers(1, 50, (4, WIDTH)).astype(np.int32)
    attn, loss = np.zeros_like(tokens), np.zeros_like(tokens)
    for b, n in enumerate((24, 12, 20, 17)):
        attn[b, :n], loss[b, 5:n] = 1, 1
        loss[b, 9:11] = 0
    traj = dataclasses.replace(traj, tokens=tokens * attn, attention_mask=attn, loss_mask=loss)
    return traj, np.array([1.0, 0.0, 0.5, 0.5], np.float32)


@pytest.mark.parametrize("name", CONFIGS)
def test_objective_config_runs_an_update_step(name):
    """Each config's algorithm on a 1-layer model: its advantages (with DAPO's overlong shaping) are the
    paper's, and two steps update the policy with finite losses."""
    model = tiny_qwen2_config(vocab_size=50)
    mesh = parallel.make_mesh({"fsdp": 1}, jax.devices()[:1])
    params = jax.device_put(qwen2.init_params(model, jax.random.PRNGKey(0)), param_shardings(model, mesh))
    cfg = ml_collections.ConfigDict(config(name).to_dict())
    cfg.data.batch_size, cfg.data.group_size = 2, 2
    cfg.algo.update(dict(micro_batches=1, pad_multiple=0, mini_batches=min(cfg.algo.mini_batches, 2)))
    if name == "tiny_cpu_dapo":
        cfg.algo.overlong_buffer = 10  # L_max = cache_len 24 here: free up to 14 policy tokens
    cfg.rollout.cache_len, cfg.total_steps = WIDTH, 4
    algo = algorithms.make_algorithm(cfg, model, mesh)
    state = algo.init_state(params)
    traj, scores = tiny_step_inputs(0)
    shaped = scores.astype(np.float64)
    if name == "tiny_cpu_dapo":
        lengths = traj.loss_mask.sum(1)  # 17, 5, 13, 10 policy tokens
        shaped = shaped + np.minimum((14 - lengths) / 10, 0)
        assert shaped[0] == pytest.approx(1.0 - 0.3) and (shaped[1:] == scores[1:]).all()
    grouped = shaped.reshape(2, 2)
    centred = grouped - grouped.mean(1, keepdims=True)
    if name != "tiny_cpu_drgrpo":
        centred = np.where(centred == 0, 0, centred / (grouped.std(1, ddof=1, keepdims=True) + 1e-6))
    batches = algo.prepare(state, traj, algorithms.overlong_shaping(algo.cfg, traj, scores)[0], StepTimer())
    np.testing.assert_allclose(np.concatenate([b["advantages"] for b in batches]), centred.reshape(-1), rtol=1e-5)
    leaves = lambda: [np.asarray(x).copy() for x in jax.tree_util.tree_leaves(state["policy"].params)]
    before = leaves()
    for _ in range(2):
        state, metrics = algo.step(state, traj, scores, StepTimer())
        assert np.isfinite(metrics["loss"]) and metrics["skipped_updates"] == 0
    assert ("overlong_penalty" in metrics) == (name == "tiny_cpu_dapo")
    assert max(np.abs(a - b).max() for a, b in zip(leaves(), before)) > 0
