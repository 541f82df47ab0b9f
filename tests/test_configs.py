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
    from jaxsearch.agent import protocols

    cfg = importlib.import_module(f"configs.{name}").get_config()
    with pytest.raises(AttributeError, match="kl_coeff"):
        cfg.algo.kl_coeff = 1.0
    protocols.get_protocol(
        cfg.protocol.name, **({"tags": cfg.protocol.tags} if cfg.protocol.name == "eka" else {})
    )
    advantages.get_advantage_fn(cfg.algo.advantage)
    losses.get_policy_loss(cfg.algo.policy_loss)
    for term, _ in cfg.reward.terms:
        assert term in rewards.REWARDS or term in ("evidence", "grounded", "source_consistency_judge"), term
    if any(t == "evidence" for t, _ in cfg.reward.terms):
        assert cfg.evidence_model.kind
    if any(t in ("grounded", "source_consistency_judge") for t, _ in cfg.reward.terms):
        assert cfg.judge.kind
    rows = cfg.data.batch_size * cfg.data.group_size
    assert rows % cfg.algo.mini_batches == 0 and (rows // cfg.algo.mini_batches) % cfg.algo.micro_batches == 0


# (config, key, value, where the value comes from). Search-R1: PeterGriffinJin/Search-R1 scripts/nq_hotpotqa/v0.2/
# train_grpo.sh and train_ppo.sh, and its veRL fork's verl/trainer/config/ppo_trainer.yaml for what they leave
# unset; R-Search: QingFei1/R-Search scripts/train_grpo_7b.sh, scripts/evidence.yaml, src/eval/main.py and
# seed 002; EKA: seed 000 appendix D.4 (Search-R1's settings) and the EKA code for P0's k.
SEARCH_R1 = [
    ("total_steps", 1005, "train_grpo.sh trainer.total_training_steps"),
    ("optim.lr", 1e-6, "train_grpo.sh actor.optim.lr"),
    ("optim.warmup_ratio", 0.285, "train_grpo.sh actor.optim.lr_warmup_steps_ratio"),
    ("optim.schedule", "constant", "ppo_trainer.yaml actor.optim.warmup_style"),
    ("optim.grad_clip", 1.0, "ppo_trainer.yaml actor.grad_clip"),
    ("optim.weight_decay", 0.01, "fsdp_workers.py AdamW weight_decay default"),
    ("data.batch_size", 512, "train_grpo.sh data.train_batch_size"),
    ("data.group_size", 5, "train_grpo.sh rollout.n_agent"),
    ("algo.mini_batches", 10, "ppo_mini_batch_size=256 trajectories (x rollout.n = 1) of 512 x 5"),
    ("algo.micro_batches", 4, "ppo_micro_batch_size=64 of a 256-trajectory mini-batch"),
    ("algo.ppo_epochs", 1, "ppo_trainer.yaml actor.ppo_epochs"),
    ("algo.clip_eps", 0.2, "ppo_trainer.yaml actor.clip_ratio"),
    ("algo.kl_coef", 0.001, "train_grpo.sh actor.kl_loss_coef"),
    ("algo.kl_kind", "low_var_kl", "train_grpo.sh actor.kl_loss_type"),
    ("algo.entropy_coef", 0.001, "ppo_trainer.yaml actor.entropy_coeff"),
    ("rollout.max_turns", 4, "train_grpo.sh max_turns"),
    ("rollout.retrieval_k", 3, "train_grpo.sh retriever.topk"),
    ("rollout.max_segment_tokens", 500, "train_grpo.sh data.max_response_length"),
    ("rollout.max_obs_tokens", 500, "train_grpo.sh data.max_obs_length"),
    ("rollout.temperature", 1.0, "train_grpo.sh rollout.temperature"),
    ("rollout.top_p", 0.95, "ppo_trainer.yaml rollout.top_p, passed to vLLM's SamplingParams"),
    ("rollout.eval_temperature", 1.0, "validation loses do_sample=False in generation.py run_llm_loop"),
    ("rollout.eval_top_p", 0.95, "ditto: validation samples as the rollout does"),
    ("reward.terms", (("em", 1.0),), "main_ppo.py: qa_em.compute_score_em"),
    ("data.eval_examples", 0, "train_grpo.sh data.val_data_num=null: the whole test set (SOAR Table 8 likewise)"),
]
RSEARCH = [
    ("data.batch_size", 256, "train_grpo_7b.sh data.train_batch_size; seed 002 §4.3"),
    ("data.group_size", 5, "train_grpo_7b.sh rollout.n_agent"),
    ("total_steps", 120, "train_grpo_7b.sh trainer.total_training_steps"),
    ("optim.lr", 1e-6, "train_grpo_7b.sh actor.optim.lr"),
    ("optim.warmup_ratio", 0.95, "train_grpo_7b.sh actor.optim.lr_warmup_steps_ratio"),
    ("algo.mini_batches", 5, "ppo_mini_batch_size=256 of 256 x 5 trajectories"),
    ("algo.entropy_coef", 0.001, "src/verl/trainer/config/ppo_trainer.yaml actor.entropy_coeff"),
    ("rollout.retrieval_k", 3, "train_grpo_7b.sh retriever.topk; seed 002 §4.3"),
    ("rollout.max_obs_tokens", 1800, "train_grpo_7b.sh data.max_obs_length"),
    ("rollout.top_p", 0.95, "src/verl/trainer/config/ppo_trainer.yaml rollout.top_p"),
    ("rollout.eval_temperature", 0.1, "src/eval/main.py temperature; seed 002 §A.3"),
    ("rollout.eval_top_p", 0.9, "src/eval/main.py top_p"),
    ("rollout.eval_retrieval_k", 5, "src/eval/main.py --retrieve_top_k; seed 002 §4.3"),
    ("data.eval_examples", 500, "seed 002 §A.1: 500 test questions per dataset (Bamboogle: its 125)"),
    ("data.eval_sample", "random", "seed 002 §A.1: sampled at random"),
    ("evidence_model.model", "Llama-3.2-3B-Instruct", "scripts/evidence.yaml LOCAL_MODEL; seed 002 §4.2"),
    ("evidence_model.temperature", 0.1, "qa_f1.py call_llm"),
    ("evidence_model.top_p", 0.9, "qa_f1.py call_llm"),
    ("evidence_model.max_new_tokens", 512, "qa_f1.py call_llm max_tokens"),
    (
        "reward.terms",
        (("rsearch_f1", 1.0), ("evidence", 1.0), ("rsearch_format", 1.0)),
        "qa_f1.py compute_score_f1",
    ),
]


def _get(cfg, key):
    for part in key.split("."):
        cfg = cfg[part]
    return tuple(tuple(t) for t in cfg) if key == "reward.terms" else cfg


@pytest.mark.parametrize("name", ["search_r1_7b", "eka_7b", "eka_14b", "soar_7b"])
@pytest.mark.parametrize("key, value, source", SEARCH_R1, ids=[k for k, _, _ in SEARCH_R1])
def test_search_r1_setting(name, key, value, source):
    """Search-R1's published GRPO setting, which EKA in its Search-R1 setting (seed 000 D.4) and SOAR share."""
    cfg = importlib.import_module(f"configs.{name}").get_config()
    if name == "soar_7b" and key == "reward.terms":
        return  # SOAR adds its source-consistency term (checked below)
    if name == "eka_14b" and key == "algo.micro_batches":
        return  # gradient accumulation: how a 14B mini-batch fits in memory, not a training setting
    assert _get(cfg, key) == value, f"{name}: {key} should be {value!r} ({source})"


@pytest.mark.parametrize("key, value, source", RSEARCH, ids=[k for k, _, _ in RSEARCH])
def test_rsearch_setting(key, value, source):
    from configs import rsearch_7b

    assert _get(rsearch_7b.get_config(), key) == value, f"{key} should be {value!r} ({source})"


def test_method_specific_values():
    from configs import eka_7b, eka_ppo_7b, search_r1_ppo_7b, soar_7b

    eka = eka_7b.get_config()
    assert (eka.protocol.name, eka.protocol.tags, eka.rollout.initial_k) == (
        "eka",
        "search_r1",
        5,
    )  # get_knowledge.py
    assert eka.data.train == "data/nq_hotpotqa_train/train.parquet"  # Search-R1's training data (D.4)
    soar = soar_7b.get_config()
    assert tuple(map(tuple, soar.reward.terms)) == (("em", 1.0), ("source_consistency", 0.2))
    ppo = search_r1_ppo_7b.get_config()
    # train_ppo.sh: n_agent 1, ppo_mini_batch_size 256 of 512 -> 2 updates, KL 0.001 in the reward
    assert (ppo.data.group_size, ppo.algo.mini_batches, ppo.algo.kl_in_reward, ppo.algo.kl_coef) == (
        1,
        2,
        0.001,
        0.0,
    )
    assert (ppo.critic.lr, ppo.critic.warmup_ratio) == (1e-5, 0.015)  # train_ppo.sh critic.optim
    assert eka_ppo_7b.get_config().algo.mini_batches == 2


def test_lr_schedule_steps_once_per_training_step():
    """veRL steps its scheduler once per training step (fsdp_workers.update_actor): with 10 updates per step,
    Search-R1's warmup of int(0.285 * 1005) = 286 training steps spans 2860 optimizer updates."""
    import jax.numpy as jnp
    import optax

    from jaxsearch.rl import train_step as ts

    assert int(0.285 * 1005) == 286
    lr = ts.learning_rate_schedule(1e-6, 1005, 286, "constant", updates_per_step=10)
    for count, step in [(0, 0), (9, 0), (10, 1), (2859, 285), (2860, 286), (10000, 1000)]:
        assert float(lr(count)) == pytest.approx(1e-6 * min(step / 286, 1.0), rel=1e-4, abs=1e-15)  # float32
    # the optimizer follows it: the 10 updates of training step 0 run at lr 0 and leave the params as they were
    opt = ts.make_optimizer(1e-2, 100, warmup_steps=2, updates_per_step=10)
    params = {"w": jnp.ones(3)}
    state = opt.init(params)
    for i in range(11):
        if i == 10:
            assert float(jnp.abs(params["w"] - 1).max()) == 0.0
        updates, state = opt.update({"w": jnp.ones(3)}, state, params)
        params = optax.apply_updates(params, updates)
    assert float(jnp.abs(params["w"] - 1).max()) > 0.0  # step 1: lr 0.5e-2


# Graph-R1 setting: yxzwang/EarlyKnowledgeAlignment run_grpo.sh (EKA's runs of the backbone and of itself, seed 000
# D.4) and its veRL fork's verl/trainer/config/ppo_trainer.yaml for what the script leaves unset.
GRAPH_R1 = [
    ("data.batch_size", 128, "run_grpo.sh data.train_batch_size"),
    ("data.group_size", 5, "run_grpo.sh rollout.n_repeat"),
    ("optim.lr", 5e-7, "run_grpo.sh actor.optim.lr"),
    ("optim.warmup_ratio", 0.0, "ppo_trainer.yaml actor.optim.lr_warmup_steps_ratio"),
    ("optim.schedule", "constant", "ppo_trainer.yaml actor.optim.warmup_style"),
    ("algo.mini_batches", 10, "run_grpo.sh ppo_mini_batch_size=64 of 128 x 5 trajectories"),
    ("algo.kl_coef", 0.001, "run_grpo.sh actor.kl_loss_coef"),
    ("algo.kl_kind", "low_var_kl", "run_grpo.sh actor.kl_loss_type"),
    ("algo.entropy_coef", 0.001, "ppo_trainer.yaml actor.entropy_coeff"),
    ("algo.clip_eps", 0.2, "ppo_trainer.yaml actor.clip_ratio"),
    ("total_epochs", 3, "run_grpo.sh trainer.total_epochs"),
    ("eval_every", 10, "run_grpo.sh trainer.test_freq"),
    ("rollout.max_turns", 10, "ppo_trainer.yaml tool.max_turns"),
    ("rollout.max_segment_tokens", 4096, "run_grpo.sh data.max_response_length"),
    ("rollout.max_obs_tokens", 4096, "run_grpo.sh data.max_tool_response_length"),
    ("rollout.cache_len", 4096, "run_grpo.sh data.max_prompt_length"),
    ("rollout.temperature", 1.0, "ppo_trainer.yaml rollout.temperature"),
    ("rollout.top_p", 1.0, "ppo_trainer.yaml rollout.top_p"),
    ("rollout.retrieval_k", 10, "script_api.py QueryParam(top_k=10)"),
    ("reward.terms", (("graph_r1", 1.0),), "Graph-R1's reward (rewards.graph_r1_score)"),
]


@pytest.mark.parametrize("name", ["graphr1_7b", "eka_graphr1_7b"])
@pytest.mark.parametrize("key, value, source", GRAPH_R1, ids=[k for k, _, _ in GRAPH_R1])
def test_graph_r1_setting(name, key, value, source):
    cfg = importlib.import_module(f"configs.{name}").get_config()
    assert _get(cfg, key) == value, f"{name}: {key} should be {value!r} ({source})"


def test_eka_in_the_graph_r1_setting_adds_p0_only():
    from configs import eka_graphr1_7b, graphr1_7b

    eka, backbone = eka_graphr1_7b.get_config(), graphr1_7b.get_config()
    assert (eka.protocol.name, eka.protocol.tags, eka.rollout.initial_k) == ("eka", "graph_r1", 5)
    eka.protocol.update(dict(backbone.protocol))
    assert eka.to_dict() == backbone.to_dict()  # nothing else differs (appendix D.4)


def test_graph_r1_configs_take_the_dataset():
    from configs import eka_graphr1_7b

    c = eka_graphr1_7b.get_config("HotpotQA")  # `--config configs/eka_graphr1_7b.py:HotpotQA`
    assert c.data.train == "datasets/HotpotQA/raw/qa_train.json"  # Graph-R1's layout (script_process.py)
    assert dict(c.data.eval) == {"HotpotQA": "datasets/HotpotQA/raw/qa_test.json"}
    with pytest.raises(ValueError, match="expected one of 2WikiMultiHopQA, HotpotQA"):
        eka_graphr1_7b.get_config("hotpot")
