"""EKA's Table 2 (seed 000, Graph-R1 setting) Search-R1 rows as configs: each loads through launch/train.py's
`--config FILE:DATASET` flag, converts to a RunConfig, and holds the values of the authors' scripts
(yxzwang/EarlyKnowledgeAlignment run_grpo.sh / run_ppo.sh and their veRL fork's ppo_trainer.yaml for the
setting; PeterGriffinJin/Search-R1 for the method); an EKA row differs from its backbone only by P0 (D.4)."""

import os
import sys
from unittest import mock

import pytest
from absl import flags
from ml_collections import config_flags

from jaxsearch.config import RunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Table 2 row -> config
ROWS = {
    "Search-R1": "search_r1_graphr1_7b",
    "Search-R1 + EKA": "eka_search_r1_graphr1_7b",
    "Search-R1-PPO": "search_r1_ppo_graphr1_7b",
    "Search-R1-PPO + EKA": "eka_search_r1_ppo_graphr1_7b",
}

# (key, value, source) shared by the four rows
SETTING = [
    ("model.hf_path", "checkpoints/Qwen2.5-7B-Instruct", "seed 000 §5.1 backbone"),
    ("data.train", "datasets/HotpotQA/raw/qa_train.json", "Graph-R1 script_process.py layout"),
    ("data.eval", {"HotpotQA": "datasets/HotpotQA/raw/qa_test.json"}, "run_grpo.sh data.val_files=test"),
    ("data.eval_examples", 0, "veRL validates the whole test file"),
    ("data.batch_size", 128, "run_grpo.sh / run_ppo.sh data.train_batch_size"),
    ("optim.lr", 5e-7, "run_grpo.sh / run_ppo.sh actor.optim.lr"),
    ("optim.warmup_ratio", 0.0, "ppo_trainer.yaml actor.optim.lr_warmup_steps_ratio"),
    ("rollout.max_turns", 10, "ppo_trainer.yaml tool.max_turns"),
    ("rollout.max_segment_tokens", 4096, "data.max_response_length"),
    ("rollout.max_obs_tokens", 4096, "data.max_tool_response_length"),
    ("rollout.cache_len", 4096, "data.max_prompt_length"),
    ("rollout.top_p", 1.0, "ppo_trainer.yaml rollout.top_p"),
    ("rollout.retrieval_k", 3, "Search-R1 train_grpo.sh retriever.topk"),
    ("rollout.eval_retrieval_k", 3, "Search-R1 train_grpo.sh retriever.topk"),
    ("retriever.url", "http://127.0.0.1:8002/retrieve", "the dataset's chunk server"),
    ("reward.terms", (("em", 1.0),), "Search-R1 main_ppo.py qa_em.compute_score_em"),
    ("protocol.data_prompt", False, "Search-R1's prompt, never Graph-R1's parquet prompt"),
]
GRPO = [
    ("algo.advantage", "grpo", "run_grpo.sh algorithm.adv_estimator"),
    ("data.group_size", 5, "run_grpo.sh rollout.n_repeat"),
    ("algo.kl_coef", 0.001, "run_grpo.sh actor.kl_loss_coef"),
    ("algo.kl_in_reward", 0.0, "run_grpo.sh actor.use_kl_loss=True"),
    ("algo.mini_batches", 10, "ppo_mini_batch_size=64 of 128 x 5"),
    ("total_epochs", 3, "EKA run_grpo.sh trainer.total_epochs"),
]
PPO = [
    ("algo.advantage", "gae", "run_ppo.sh algorithm.adv_estimator"),
    ("data.group_size", 1, "ppo_trainer.yaml rollout.n_repeat"),
    ("algo.kl_coef", 0.0, "ppo_trainer.yaml actor.use_kl_loss=False"),
    ("algo.kl_in_reward", 0.001, "run_ppo.sh algorithm.kl_ctrl.kl_coef"),
    ("algo.gamma", 1.0, "ppo_trainer.yaml algorithm.gamma"),
    ("algo.lam", 1.0, "ppo_trainer.yaml algorithm.lam"),
    ("algo.mini_batches", 2, "ppo_mini_batch_size=64 of 128 x 1"),
    ("algo.micro_batches", 8, "ppo_micro_batch_size_per_gpu=2 on 4 GPUs"),
    ("critic.lr", 1e-5, "run_ppo.sh critic.optim.lr"),
    ("critic.warmup_ratio", 0.0, "ppo_trainer.yaml critic.optim.lr_warmup_steps_ratio"),
    ("critic.clip_eps", 0.5, "ppo_trainer.yaml critic.cliprange_value"),
    ("total_epochs", 1, "run_ppo.sh trainer.total_epochs"),
    ("eval_every", 10, "run_ppo.sh trainer.test_freq"),
]


def load(name: str, *overrides: str, dataset: str = "HotpotQA"):
    """The ConfigDict launch/train.py gets from `--config configs/NAME.py:DATASET OVERRIDES...` (config_flags
    reads the overrides from sys.argv, as in the real command)."""
    argv = ["train", f"--config={os.path.join(ROOT, 'configs', name + '.py')}:{dataset}", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True)
    with mock.patch.object(sys, "argv", argv):
        values(argv)
    return values.config


def _get(cfg: dict, key: str):
    for part in key.split("."):
        cfg = cfg[part]
    return tuple(map(tuple, cfg)) if key == "reward.terms" else cfg


@pytest.mark.parametrize("row", ROWS)
def test_table2_row_loads_validates_and_holds_the_authors_values(row):
    raw = load(ROWS[row])
    cfg = RunConfig.from_dict(raw)  # the typed boundary every run goes through
    eka = row.endswith("+ EKA")
    assert (cfg.protocol.name, cfg.protocol.tags) == (("eka" if eka else "search_r1"), "search_r1")
    assert cfg.rollout.initial_k == 5  # get_knowledge.py --top_n 5 (used by the EKA rows only)
    assert cfg.initial_retriever is None  # P0 from the loop's own chunk server
    tree = cfg.to_dict()
    for key, value, source in SETTING + (PPO if "PPO" in row else GRPO):
        assert _get(tree, key) == value, f"{row}: {key} should be {value!r} ({source})"


def test_the_search_r1_row_differs_from_graph_r1_in_the_method_only():
    """Same data, hyperparameters and limits as Table 2's Graph-R1 row; only loop, retriever and reward."""
    search_r1, graph_r1 = load("search_r1_graphr1_7b").to_dict(), load("graphr1_7b").to_dict()
    for key in ("protocol", "retriever", "reward"):
        del search_r1[key], graph_r1[key]
    for key in ("retrieval_k", "eval_retrieval_k"):
        assert (search_r1["rollout"].pop(key), graph_r1["rollout"].pop(key)) == (3, 10)
    assert search_r1 == graph_r1


@pytest.mark.parametrize(
    "eka, backbone",
    [(ROWS["Search-R1 + EKA"], ROWS["Search-R1"]), (ROWS["Search-R1-PPO + EKA"], ROWS["Search-R1-PPO"])],
)
def test_an_eka_row_is_its_backbone_plus_p0(eka, backbone):
    eka, backbone = load(eka).to_dict(), load(backbone).to_dict()
    assert eka.pop("protocol") == {"name": "eka", "tags": "search_r1", "data_prompt": False}
    backbone.pop("protocol")
    assert eka == backbone  # appendix D.4: the backbone's hyperparameters


def test_flag_overrides_and_a_bad_dataset_name_the_culprit():
    assert load(ROWS["Search-R1"], "--config.total_epochs=1").total_epochs == 1  # Graph-R1's own schedule
    with pytest.raises(flags.IllegalFlagValueError, match="expected one of 2WikiMultiHopQA"):
        load(ROWS["Search-R1-PPO + EKA"], dataset="hotpot")
