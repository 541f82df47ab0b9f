"""Every shipped config builds, is locked, and names real registry entries; the 7B/14B shapes are the presets."""

import importlib
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
NAMES = sorted(
    f[:-3] for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py") and f != "__init__.py"
)


@pytest.mark.parametrize("name", NAMES)
def test_config_builds_locked_and_consistent(name):
    from jaxsearch.rl import advantages, losses, rewards
    from jaxsearch.rollout import protocols

    cfg = importlib.import_module(f"configs.{name}").get_config()
    with pytest.raises(AttributeError, match="kl_coeff"):
        cfg.algo.kl_coeff = 1.0
    protocols.get_protocol(
        cfg.protocol.name, **({"tags": cfg.protocol.tags} if cfg.protocol.name == "eka" else {})
    )
    advantages.get_advantage_fn(cfg.algo.advantage)
    losses.get_policy_loss(cfg.algo.policy_loss)
    for term, _ in cfg.reward.terms:
        assert term in rewards.REWARDS or term in ("evidence", "grounded"), term
    if any(t == "evidence" for t, _ in cfg.reward.terms):
        assert cfg.evidence_model.kind
    rows = cfg.data.batch_size * cfg.data.group_size
    assert rows % cfg.algo.mini_batches == 0 and (rows // cfg.algo.mini_batches) % cfg.algo.micro_batches == 0


def test_published_hyperparameters():
    from configs import eka_14b, search_r1_7b

    c = search_r1_7b.get_config()
    assert (c.optim.lr, c.optim.warmup_ratio, c.data.batch_size, c.data.group_size) == (1e-6, 0.285, 512, 5)
    assert (c.algo.kl_coef, c.algo.kl_kind, c.algo.clip_eps, c.rollout.max_turns, c.rollout.retrieval_k) == (
        0.001,
        "low_var_kl",
        0.2,
        4,
        3,
    )
    assert eka_14b.get_config().model.preset == "qwen2.5-14b"
