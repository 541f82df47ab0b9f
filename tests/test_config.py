"""The typed config boundary: every shipped config converts; "not set" values become None; bad keys and
values are errors naming the key."""

import glob
import importlib
import os

import ml_collections
import pytest

from jaxsearch.config import ConfigError, RunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(
    os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "configs", "*.py")) if "__" not in p
)


def _config(name):
    return importlib.import_module(f"configs.{name}").get_config()


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_converts_and_keeps_its_values(name):
    raw = _config(name)
    cfg = RunConfig.from_dict(raw)
    assert cfg.rollout.max_turns == raw.rollout.max_turns and cfg.algo.mini_batches == raw.algo.mini_batches
    assert cfg.reward.terms == tuple(tuple(t) for t in raw.reward.terms)
    assert (cfg.judge is None) == (raw.judge.kind == "")
    assert (cfg.world is None) == (raw.world.size == "") and (cfg.sft is None) == (raw.sft.steps == 0)
    assert RunConfig.from_dict(cfg) is cfg


def test_not_set_values_become_none():
    cfg = RunConfig.from_dict(_config("tiny_cpu"))
    assert cfg.model.hf_path is None and cfg.model.orbax_path is None and cfg.model.preset is None
    assert cfg.model.vocab_size is None and cfg.model.hidden_size == 128  # -1: from the world tokenizer
    assert cfg.initial_retriever is None and cfg.retriever.url is None and cfg.retriever.encoder is None
    assert cfg.distributed.coordinator is None and cfg.distributed.process_id is None
    assert cfg.judge.kind == "world" and cfg.evidence_model is None
    assert cfg.sft.mistake == "verbose_answer" and cfg.sft.questions is None
    base = RunConfig.from_dict(_config("base"))
    assert base.world is None and base.sft is None and base.model.preset == "qwen2.5-7b"
    assert base.model.vocab_size is None and base.tokenizer.path is None


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("rollout.max_turns", -1, "config.rollout.max_turns=-1: expected >= 0"),
        ("rollout.top_p", 1.5, "config.rollout.top_p=1.5: expected in (0, 1]"),
        ("tokenizer.kind", "bpe", "config.tokenizer.kind='bpe': expected one of qwen, word"),
        ("optim.schedule", "linear", "config.optim.schedule='linear': expected one of constant, cosine"),
        ("data.batch_size", 0, "config.data.batch_size=0: expected >= 1"),
    ],
)
def test_a_bad_value_names_its_key(key, value, message):
    raw = ml_collections.ConfigDict(_config("base").to_dict())
    section, name = key.split(".")
    raw[section][name] = value
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(raw)
    assert str(e.value) == message


def test_an_unknown_key_or_wrong_type_names_it():
    tree = _config("base").to_dict()
    tree["rollout"]["max_turn"] = 3
    with pytest.raises(ConfigError, match=r"^config.rollout.max_turn: unknown key"):
        RunConfig.from_dict(tree)
    tree = _config("base").to_dict()
    tree["algo"]["mini_batches"] = "10"
    with pytest.raises(ConfigError, match=r"^config.algo.mini_batches='10': expected int$"):
        RunConfig.from_dict(tree)
    tree = _config("base").to_dict()
    tree["optim"]["lr"] = 1  # an int where a float is expected is the float
    assert RunConfig.from_dict(tree).optim.lr == 1.0


def test_total_epochs_counts_full_batches_as_verl_does():
    from configs import base
    from jaxsearch.rl.trainer import resolve_total_steps

    c = base.get_config()
    c.data.batch_size = 128
    assert resolve_total_steps(RunConfig.from_dict(c), 5000).total_steps == 1005  # total_epochs 0: as set
    c.total_epochs = 3
    cfg = RunConfig.from_dict(c)
    assert resolve_total_steps(cfg, 5120).total_steps == 3 * 40
    assert resolve_total_steps(cfg, 5247).total_steps == 3 * 40  # the partial 41st batch is dropped
    with pytest.raises(ValueError, match="fewer than one batch"):
        resolve_total_steps(cfg, 127)
