"""GRPO and GAE advantages against independent numpy / plain-Python references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsearch.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    gae_advantages,
    get_advantage_fn,
    grpo_advantages,
    register_advantage,
)


def grpo_reference(rewards, group_size, normalize_std=True, eps=1e-6):
    out = np.zeros(len(rewards))
    for start in range(0, len(rewards), group_size):
        group = [float(r) for r in rewards[start : start + group_size]]
        mean = sum(group) / len(group)
        std = (sum((r - mean) ** 2 for r in group) / (len(group) - 1)) ** 0.5
        for i, r in enumerate(group):
            if max(group) == min(group):
                out[start + i] = 0.0
            elif normalize_std:
                out[start + i] = (r - mean) / (std + eps)
            else:
                out[start + i] = r - mean
    return out


def gae_reference(rewards, values, mask, gamma, lam):
    """Textbook GAE run on each row's mask-1 tokens only (observations removed), scattered back."""
    adv = np.zeros_like(values)
    for b in range(values.shape[0]):
        idx = [t for t in range(values.shape[1]) if mask[b, t]]
        last_adv, next_value = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            last_adv = delta + gamma * lam * last_adv
            adv[b, t] = last_adv
            next_value = values[b, t]
    returns = (adv + values) * mask
    return adv, returns


def whiten_reference(x, mask):
    sel = x[mask.astype(bool)]
    return (x - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8) * mask


@pytest.mark.parametrize("group_size", [2, 4, 5])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_matches_reference(group_size, normalize_std):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=3 * group_size).astype(np.float32)
    got = grpo_advantages(jnp.asarray(rewards), group_size, normalize_std=normalize_std)
    assert got.shape == rewards.shape
    np.testing.assert_allclose(got, grpo_reference(rewards, group_size, normalize_std), rtol=1e-5, atol=1e-6)


def test_grpo_hand_case():
    # group [1, 0]: mean 0.5, unbiased std = sqrt(0.5); group [0.1]*2 is constant
    got = grpo_advantages(jnp.array([1.0, 0.0, 0.1, 0.1]), 2, eps=0.0)
    np.testing.assert_allclose(got, [0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5), 0.0, 0.0], rtol=1e-6)


def test_grpo_zero_variance_is_exactly_zero():
    rewards = jnp.array([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.3, 0.3, 0.3], jnp.float32)
    for normalize_std in (True, False):
        got = np.asarray(grpo_advantages(rewards, 3, normalize_std=normalize_std))
        assert not np.isnan(got).any()
        assert (got == 0.0).all()


def test_grpo_bad_shapes():
    with pytest.raises(ValueError, match="group_size"):
        grpo_advantages(jnp.zeros(4), 1)
    with pytest.raises(ValueError, match="divisible"):
        grpo_advantages(jnp.zeros(5), 2)


def test_grpo_jits():
    rewards = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    fn = jax.jit(grpo_advantages, static_argnames=("group_size", "normalize_std"))
    np.testing.assert_allclose(fn(rewards, group_size=3), grpo_reference(np.asarray(rewards), 3), rtol=1e-5)


def test_gae_hand_case():
    # gamma = lam = 1, no mask: A_t = sum_{s>=t} r_s - V_t
    rewards = jnp.array([[0.0, 0.0, 1.0]])
    values = jnp.array([[0.2, 0.5, 0.4]])
    adv, ret = gae_advantages(rewards, values, jnp.ones((1, 3)), gamma=1.0, lam=1.0, whiten=False)
    np.testing.assert_allclose(adv, [[0.8, 0.5, 0.6]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[1.0, 1.0, 1.0]], rtol=1e-6)


def test_gae_skips_observation_tokens():
    # tokens: policy, observation, observation, policy; the observation's values are ignored
    rewards = jnp.array([[0.0, 5.0, 5.0, 1.0]])
    values = jnp.array([[0.3, 9.0, 9.0, 0.6]])
    mask = jnp.array([[1, 0, 0, 1]])
    gamma, lam = 0.9, 0.8
    adv, _ = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam, whiten=False)
    a3 = 1.0 - 0.6
    a0 = (0.0 + gamma * 0.6 - 0.3) + gamma * lam * a3
    np.testing.assert_allclose(adv, [[a0, 0.0, 0.0, a3]], rtol=1e-6)


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)])
def test_gae_matches_reference_random_masks(gamma, lam):
    rng = np.random.default_rng(1)
    b, t = 4, 17
    rewards = rng.normal(size=(b, t)).astype(np.float32)
    values = rng.normal(size=(b, t)).astype(np.float32)
    mask = (rng.random((b, t)) < 0.6).astype(np.float32)
    mask[:, -3:] = 0.0  # trailing padding
    adv, ret = gae_advantages(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma, lam, whiten=False)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)

    white, ret_w = jax.jit(gae_advantages, static_argnames="whiten")(
        jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma, lam, whiten=True
    )
    np.testing.assert_allclose(white, whiten_reference(ref_adv, mask), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ret_w, ref_ret, rtol=1e-5, atol=1e-5)
    sel = np.asarray(white)[mask.astype(bool)]
    assert abs(sel.mean()) < 1e-5 and abs(sel.std(ddof=1) - 1.0) < 1e-3


def test_gae_all_masked_is_finite():
    adv, ret = gae_advantages(jnp.ones((2, 4)), jnp.ones((2, 4)), jnp.zeros((2, 4)), 0.9, 0.9, whiten=True)
    assert np.isfinite(adv).all() and (np.asarray(adv) == 0).all() and (np.asarray(ret) == 0).all()


def test_registry():
    assert get_advantage_fn("grpo") is grpo_advantages
    assert get_advantage_fn("gae") is gae_advantages
    np.testing.assert_allclose(
        get_advantage_fn("dr_grpo")(jnp.array([1.0, 0.0, 3.0, 1.0]), 2), [0.5, -0.5, 1.0, -1.0]
    )
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        get_advantage_fn("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda r: r)

    @register_advantage("test_identity")
    def identity(rewards):
        return rewards

    try:
        assert get_advantage_fn("test_identity") is identity
    finally:
        del ADVANTAGE_ESTIMATORS["test_identity"]


# Search-R1's veRL (verl/trainer/ppo/core_algos.py compute_gae_advantage_return, with verl/utils/torch_functional.py
# masked_whiten), run on the response part of the batch in `test_ppo_gae_over_the_response_is_search_r1s`:
# rewards 1.0 at row 0's token 6 and 0.25 at row 1's token 5, response_mask = attention_mask of the response.
SEARCH_R1_GAE = {
    (1.0, 1.0): (
        [[0.01507569, 1.38695848, 0.79900873, -0.37689081, 1.77892518, 0.40704209, 0.60302538],
         [-0.67086601, -1.25881588, 0.11306711, -1.65078232, -0.86684918, -0.27889934]],
        [[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [0.25, 0.25, 0.25, 0.25, 0.25, 0.25]],
    ),
    (0.9, 0.8): (
        [[-1.11016846, 0.65052605, 0.19796731, -1.14760935, 1.7338109, 0.56724316, 1.3072108],
         [-0.31452355, -1.05275142, 0.70039606, -1.37594652, -0.49538487, 0.33922982]],
        [[0.17619625, 0.29471701, 0.38432914, 0.35879052, 0.59832001, 0.756, 1.0],
         [0.14607975, 0.10288858, 0.21790081, 0.15264001, 0.16200002, 0.25]],
    ),
}


@pytest.mark.parametrize("gamma, lam", sorted(SEARCH_R1_GAE))
def test_ppo_gae_over_the_response_is_search_r1s(gamma, lam):
    """PPO with `algo.gae_tokens="response"` (the papers' setting): the recursion runs through the retrieved
    tokens on the critic's values there, whitening covers every response token, and the critic learns on them;
    the outcome reward sits on the last response token. Two prompt tokens, then row 0: policy 3, retrieved 2,
    policy 2, padding 1; row 1: policy 2, retrieved 3, policy 1, padding 2."""
    from types import SimpleNamespace

    from jaxsearch.rl import algorithms

    response = np.array([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 0, 0]])
    policy = np.array([[1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 1, 0, 0]])
    values_r = np.array(
        [[0.5, -0.2, 0.1, 0.7, -0.4, 0.3, 0.2, 0.0], [0.1, 0.4, -0.3, 0.6, 0.2, -0.1, 0.0, 0.0]], np.float32
    )
    prompt = np.ones((2, 2), np.int64)
    attn = np.concatenate([prompt, response], axis=1)
    lmask = np.concatenate([0 * prompt, policy], axis=1)
    values = np.concatenate([np.full((2, 2), 0.9, np.float32), values_r], axis=1)
    zeros = np.zeros(attn.shape, np.float32)
    algo = SimpleNamespace(gae_tokens="response", gamma=gamma, lam=lam, kl_in_reward=0.0)
    out = algorithms.gae_batch(algo, np.array([1.0, 0.25], np.float32), values, attn, lmask, zeros, zeros)
    np.testing.assert_array_equal(out["value_mask"], np.concatenate([0 * prompt, response], axis=1))
    want_adv, want_ret = SEARCH_R1_GAE[(gamma, lam)]
    for b in range(2):
        n = response[b].sum()
        np.testing.assert_allclose(out["advantages"][b, 2 : 2 + n], want_adv[b], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["returns"][b, 2 : 2 + n], want_ret[b], rtol=1e-5, atol=1e-6)
    # the later veRL rule (`gae_tokens="policy"`) differs: retrieved tokens are passed over
    algo.gae_tokens = "policy"
    skip = algorithms.gae_batch(algo, np.array([1.0, 0.25], np.float32), values, attn, lmask, zeros, zeros)
    assert not np.allclose(skip["advantages"][0, 2:9], want_adv[0])
    np.testing.assert_array_equal(skip["value_mask"], lmask)
