"""Losses against numpy loops and hand-computed cases; gradients checked with jax.grad."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsearch.rl.losses import (
    agg_loss,
    entropy_from_logits,
    get_policy_loss,
    kl_penalty,
    ppo_policy_loss,
    value_loss,
)

B, T = 5, 11


def random_batch(seed=0):
    rng = np.random.default_rng(seed)
    logp = rng.normal(-1.5, 0.5, size=(B, T)).astype(np.float32)
    old_logp = (logp + rng.normal(0.0, 0.4, size=(B, T))).astype(np.float32)
    adv = rng.normal(size=(B, T)).astype(np.float32)
    mask = (rng.random((B, T)) < 0.7).astype(np.float32)
    mask[2] = 0.0  # a padding row
    return logp, old_logp, adv, mask


def agg_reference(loss, mask, mode):
    if mode == "token-mean":
        total, count = 0.0, 0
        for b in range(loss.shape[0]):
            for t in range(loss.shape[1]):
                if mask[b, t]:
                    total += loss[b, t]
                    count += 1
        return total / max(count, 1)
    rows = []
    for b in range(loss.shape[0]):
        vals = [loss[b, t] for t in range(loss.shape[1]) if mask[b, t]]
        if vals:
            rows.append(sum(vals) if mode == "seq-mean-token-sum" else sum(vals) / len(vals))
    return sum(rows) / max(len(rows), 1)


def ppo_token_reference(logp, old_logp, adv, low, high, dual_c):
    out = np.zeros_like(logp)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            r = np.exp(np.clip(logp[b, t] - old_logp[b, t], -20, 20))
            a = adv[b, t]
            v = max(-a * r, -a * min(max(r, 1 - low), 1 + high))
            if dual_c is not None and a < 0:
                v = min(v, -a * dual_c)
            out[b, t] = v
    return out


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_agg_loss_matches_loops(mode):
    _, _, loss, mask = random_batch(1)
    np.testing.assert_allclose(agg_loss(jnp.asarray(loss), jnp.asarray(mask), mode), agg_reference(loss, mask, mode), rtol=1e-5)


def test_agg_loss_hand_case_and_errors():
    loss = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert float(agg_loss(loss, mask, "token-mean")) == pytest.approx(10.0 / 4)
    assert float(agg_loss(loss, mask, "seq-mean-token-sum")) == pytest.approx((6.0 + 4.0) / 2)
    assert float(agg_loss(loss, mask, "seq-mean-token-mean")) == pytest.approx((2.0 + 4.0) / 2)
    assert float(agg_loss(loss, jnp.zeros_like(mask), "seq-mean-token-mean")) == 0.0
    with pytest.raises(ValueError, match="aggregation mode"):
        agg_loss(loss, mask, "sum")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("low, high, dual_c", [(0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 3.0)])
def test_ppo_loss_matches_reference(mode, low, high, dual_c):
    logp, old_logp, adv, mask = random_batch(2)
    loss, stats = jax.jit(functools.partial(ppo_policy_loss, clip_eps=0.5, clip_eps_low=low, clip_eps_high=high, dual_clip_c=dual_c, agg_mode=mode))(
        jnp.asarray(logp), jnp.asarray(old_logp), jnp.asarray(adv), jnp.asarray(mask)
    )
    ref_tokens = ppo_token_reference(logp, old_logp, adv, low, high, dual_c)
    np.testing.assert_allclose(loss, agg_reference(ref_tokens, mask, mode), rtol=1e-5, atol=1e-6)

    sel = mask.astype(bool)
    ratio = np.exp(logp - old_logp)
    clipped = -adv * np.clip(ratio, 1 - low, 1 + high)
    np.testing.assert_allclose(stats["clip_frac"], (clipped > -adv * ratio)[sel].mean(), rtol=1e-5)
    np.testing.assert_allclose(stats["approx_kl"], (old_logp - logp)[sel].mean(), rtol=1e-5)
    np.testing.assert_allclose(stats["ratio_mean"], ratio[sel].mean(), rtol=1e-5)
    np.testing.assert_allclose(stats["ratio_max"], ratio[sel].max(), rtol=1e-5)


def test_ppo_sequence_advantages_broadcast():
    logp, old_logp, _, mask = random_batch(3)
    seq_adv = np.linspace(-1.0, 1.0, B).astype(np.float32)
    a, _ = ppo_policy_loss(jnp.asarray(logp), jnp.asarray(old_logp), jnp.asarray(seq_adv), jnp.asarray(mask))
    b, _ = ppo_policy_loss(jnp.asarray(logp), jnp.asarray(old_logp), jnp.asarray(np.repeat(seq_adv[:, None], T, 1)), jnp.asarray(mask))
    assert float(a) == pytest.approx(float(b))


def test_ppo_hand_case():
    # one token: ratio e^0.5 ~ 1.6487 > 1.2 with A = 2 -> clipped: loss = -2 * 1.2
    loss, stats = ppo_policy_loss(jnp.array([[0.5]]), jnp.array([[0.0]]), jnp.array([[2.0]]), jnp.array([[1.0]]))
    assert float(loss) == pytest.approx(-2.4)
    assert float(stats["clip_frac"]) == 1.0


def test_ppo_gradient_zero_where_clipped():
    logp, old_logp, adv, mask = random_batch(4)
    low, high, c = 0.2, 0.3, 3.0
    old_logp = logp - np.random.default_rng(5).normal(0.0, 0.8, size=(B, T)).astype(np.float32)  # many clipped

    def loss_fn(lp):
        return ppo_policy_loss(lp, jnp.asarray(old_logp), jnp.asarray(adv), jnp.asarray(mask),
                               clip_eps_low=low, clip_eps_high=high, dual_clip_c=c)[0]

    grad = np.asarray(jax.grad(loss_fn)(jnp.asarray(logp)))
    ratio = np.exp(logp - old_logp)
    count = mask.sum()
    n_clipped = n_free = 0
    for b in range(B):
        for t in range(T):
            r, a = ratio[b, t], adv[b, t]
            clipped = (a > 0 and r > 1 + high) or (a < 0 and r < 1 - low) or (a < 0 and r > c)
            if not mask[b, t] or clipped:
                assert grad[b, t] == 0.0
                n_clipped += bool(mask[b, t])
            else:
                assert grad[b, t] == pytest.approx(-a * r / count, rel=1e-4)
                n_free += 1
    assert n_clipped > 0 and n_free > 0


def test_ppo_rejects_bad_dual_clip():
    z = jnp.zeros((1, 1))
    with pytest.raises(ValueError, match="dual_clip_c"):
        ppo_policy_loss(z, z, z, z + 1, dual_clip_c=1.0)


def test_policy_loss_registry():
    assert get_policy_loss("ppo") is ppo_policy_loss
    with pytest.raises(ValueError, match="unknown policy loss"):
        get_policy_loss("nope")


def test_kl_penalty_kinds():
    rng = np.random.default_rng(6)
    logp = rng.normal(-2, 1, size=(B, T)).astype(np.float32)
    ref = rng.normal(-2, 1, size=(B, T)).astype(np.float32)
    logp[0, 0], ref[0, 0] = 0.0, -40.0  # extreme: k3 clamps
    d = logp - ref
    expected = {
        "kl": d, "k1": d, "abs": np.abs(d), "mse": 0.5 * d**2, "k2": 0.5 * d**2,
        "low_var_kl": np.clip(np.exp(np.clip(-d, -20, 20)) + d - 1, -10, 10),
    }
    expected["k3"] = expected["low_var_kl"]
    for kind, ref_val in expected.items():
        got = jax.jit(kl_penalty, static_argnames="kind")(jnp.asarray(logp), jnp.asarray(ref), kind=kind)
        np.testing.assert_allclose(got, ref_val, rtol=1e-5, atol=1e-6)
    k3 = np.asarray(kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k3"))
    assert k3[0, 0] == 10.0 and (k3 >= 0).all()
    with pytest.raises(ValueError, match="unknown KL kind"):
        kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "full")


def test_kl_penalty_zero_and_gradient_at_reference():
    x = jnp.array([[-1.0, -2.0]])
    for kind in ("k1", "k2", "k3"):
        assert np.allclose(kl_penalty(x, x, kind), 0.0)
    # k2 and k3 have zero gradient at logp == ref_logp; k1 has gradient 1
    for kind, g in (("k1", 1.0), ("k2", 0.0), ("k3", 0.0)):
        grad = jax.grad(lambda lp: kl_penalty(lp, x, kind).sum())(x)
        np.testing.assert_allclose(grad, g, atol=1e-6)


def test_entropy_from_logits():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(2, 3, 13)).astype(np.float32)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(entropy_from_logits(jnp.asarray(logits)), -(p * np.log(p)).sum(-1), rtol=1e-5)
    np.testing.assert_allclose(entropy_from_logits(jnp.zeros((1, 1, 8), jnp.bfloat16)), [[np.log(8)]], rtol=1e-5)


def test_value_loss():
    # hand case: V_old = 0, V = 1, R = 1, clip 0.2 -> clipped V = 0.2, losses 0 vs 0.64 -> max 0.64
    loss, stats = value_loss(jnp.array([[1.0]]), jnp.array([[0.0]]), jnp.array([[1.0]]), jnp.array([[1.0]]))
    assert float(loss) == pytest.approx(0.5 * 0.64)
    assert float(stats["vf_clip_frac"]) == 1.0

    rng = np.random.default_rng(8)
    v, v_old, ret = (rng.normal(size=(B, T)).astype(np.float32) for _ in range(3))
    mask = (rng.random((B, T)) < 0.7).astype(np.float32)
    for mode in ("token-mean", "seq-mean-token-mean"):
        got, _ = value_loss(jnp.asarray(v), jnp.asarray(v_old), jnp.asarray(ret), jnp.asarray(mask), clip_eps=0.3, agg_mode=mode)
        vc = v_old + np.clip(v - v_old, -0.3, 0.3)
        ref = 0.5 * agg_reference(np.maximum((v - ret) ** 2, (vc - ret) ** 2), mask, mode)
        np.testing.assert_allclose(got, ref, rtol=1e-5)

    grad = np.asarray(jax.grad(lambda x: value_loss(x, jnp.asarray(v_old), jnp.asarray(ret), jnp.asarray(mask), clip_eps=0.3)[0])(jnp.asarray(v)))
    vc = v_old + np.clip(v - v_old, -0.3, 0.3)
    outside = (np.abs(v - v_old) > 0.3) & ((vc - ret) ** 2 > (v - ret) ** 2)
    assert outside[mask.astype(bool)].any()
    assert (grad[outside] == 0).all() and (grad[mask == 0] == 0).all()
