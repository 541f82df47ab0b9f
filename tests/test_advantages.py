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
