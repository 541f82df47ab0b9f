"""Qwen3 in Flax against transformers' Qwen3ForCausalLM on the same random weights (tied and untied, head_dim
!= hidden / heads), its checkpoints both ways, its presets, and the tiny Qwen3 config through the trainer."""

import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import Qwen3Config as HFQwen3Config
from transformers import Qwen3ForCausalLM

from jaxsearch.models import hf_io, qwen2
from hf_reference import TINY_QWEN3_CONFIGS, hf_logits, left_padded_batch, make_hf_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
forward = jax.jit(qwen2.forward, static_argnums=0)


@pytest.fixture(scope="module", params=sorted(TINY_QWEN3_CONFIGS))
def tiny(request, tmp_path_factory):
    """(name, transformers model, its save dir, our config and params loaded from that save by load_hf)."""
    model = make_hf_model(request.param, init_std=0.2)  # logits of a few units: q/k norms matter
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    config, params = hf_io.load_hf(str(path))
    return request.param, model, path, config, params


def test_config_and_params_read_from_a_transformers_save(tiny):
    name, model, path, config, params = tiny
    expect = TINY_QWEN3_CONFIGS[name]
    saved = json.load(open(path / "config.json"))
    assert saved["model_type"] == "qwen3" and config.family == "qwen3"
    assert config.rope_theta == expect["rope_theta"]  # transformers 5 writes it inside rope_parameters
    assert config.head_dim == expect["head_dim"] != expect["hidden_size"] // expect["num_attention_heads"]
    assert (
        config.tie_word_embeddings == expect["tie_word_embeddings"]
        and ("lm_head" in params) != expect["tie_word_embeddings"]
    )
    assert config.num_params() == sum(p.numel() for p in model.parameters())
    attn, hf_attn = params["layers_1"]["attn"], model.model.layers[1].self_attn
    assert "qkv_bias" not in attn
    np.testing.assert_array_equal(attn["q_norm"]["scale"], hf_attn.q_norm.weight.detach().numpy())
    np.testing.assert_array_equal(attn["k_norm"]["scale"], hf_attn.k_norm.weight.detach().numpy())
    # what init_params builds (a random-init run's policy, which save_hf then writes) has the same tree
    shapes = jax.eval_shape(lambda: qwen2.init_params(config, jax.random.PRNGKey(0)))
    assert jax.tree.map(lambda a: a.shape, shapes) == jax.tree.map(np.shape, params)


def test_logits_match_transformers_left_padded(tiny):
    _, model, _, config, params = tiny
    ids, mask = left_padded_batch(config.vocab_size, [12, 7, 3, 12], seed=1)
    ref = hf_logits(model, ids, mask)
    ours = np.asarray(forward(config, params, ids, mask))
    valid = mask.astype(bool)
    assert np.abs(ref[valid]).max() > 1.0  # logits of a few units, not ~0
    assert np.abs(ours - ref)[valid].max() <= 1e-4
    # a left-padded row equals the same row unpadded
    short = np.asarray(forward(config, params, ids[2:3, -3:], mask[2:3, -3:]))
    np.testing.assert_allclose(ours[2, -3:], short[0], atol=1e-5)


def test_kv_cache_decode_matches_transformers(tiny):
    """Prefill left-padded prompts into a cache, decode greedy tokens one step at a time (the sampler's path:
    `for_decoding` params, `decode_step`); every step's logits equal transformers' over the sequence so far."""
    _, model, _, config, params = tiny
    ids, mask = left_padded_batch(config.vocab_size, [9, 4, 6], seed=2)
    dconfig, dparams = qwen2.for_decoding(config, params)
    logits, cache = jax.jit(qwen2.prefill, static_argnums=(0, 4))(config, params, ids, mask, 32)
    step = jax.jit(qwen2.decode_step, static_argnums=0)
    seq, seq_mask = ids, mask
    for i in range(6):
        ref = hf_logits(model, seq, seq_mask)[:, -1]
        np.testing.assert_allclose(np.asarray(logits), ref, atol=1e-4, err_msg=f"step {i}")
        tok = np.asarray(jnp.argmax(logits, -1))
        seq = np.concatenate([seq, tok[:, None]], 1)
        seq_mask = np.concatenate([seq_mask, np.ones_like(tok)[:, None]], 1)
        logits, cache = step(dconfig, dparams, cache, tok)
    assert len({tuple(r) for r in seq[:, ids.shape[1] :]}) > 1  # the rows decoded different tokens
    np.testing.assert_array_equal(np.asarray(cache.lengths), mask.sum(1) + 6)


def test_save_hf_loads_in_transformers_as_qwen3(tiny, tmp_path):
    """load_hf -> save_hf -> Qwen3ForCausalLM.from_pretrained gives the original tensors and logits bit for bit;
    load_hf of the save gives the same config and params."""
    _, model, _, config, params = tiny
    hf_io.save_hf(config, params, str(tmp_path / "out"))
    saved = json.load(open(tmp_path / "out" / "config.json"))
    assert saved["architectures"] == ["Qwen3ForCausalLM"] and saved["attention_bias"] is False
    reloaded = Qwen3ForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert sorted(reloaded.state_dict()) == sorted(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, reloaded.state_dict()[name]), name
    ids, mask = left_padded_batch(config.vocab_size, [9, 4], seed=0)
    np.testing.assert_array_equal(hf_logits(reloaded, ids, mask), hf_logits(model, ids, mask))
    config2, params2 = hf_io.load_hf(str(tmp_path / "out"))
    assert config2 == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)


def test_presets_param_counts_equal_transformers():
    names = [n for n in qwen2.PRESETS if n.startswith("qwen3")]
    assert names == [
        "qwen3-0.6b",
        "qwen3-1.7b",
        "qwen3-4b",
        "qwen3-8b",
        "qwen3-14b",
        "qwen3-4b-instruct-2507",
    ]
    for name in names:
        config = qwen2.PRESETS[name]
        hf = {k: v for k, v in config.to_hf_dict().items() if k not in ("architectures", "torch_dtype")}
        with torch.device("meta"):
            model = Qwen3ForCausalLM(HFQwen3Config(**hf))
        assert config.num_params() == sum(p.numel() for p in model.parameters()), name
    # the sizes Hugging Face shows for the checkpoints (huggingface.co/Qwen/Qwen3-*: "Model size ... params")
    sizes = {"qwen3-0.6b": 0.6, "qwen3-4b": 4.02, "qwen3-8b": 8.19, "qwen3-14b": 14.8}
    for name, billions in sizes.items():
        assert round(qwen2.preset(name).num_params() / 1e9, len(str(billions).split(".")[1])) == billions, (
            name
        )


def test_config_json_of_another_family_or_with_biases_is_an_error_naming_the_field(tmp_path):
    base = dict(
        vocab_size=10, hidden_size=8, intermediate_size=16, num_attention_heads=2, num_hidden_layers=1
    )
    with pytest.raises(ValueError, match="model_type='llama'"):
        qwen2.Qwen2Config.from_hf_dict({**base, "model_type": "llama"})
    with pytest.raises(ValueError, match="attention_bias"):
        qwen2.Qwen2Config.from_hf_dict({**base, "model_type": "qwen3", "attention_bias": True})
    # a Qwen2 checkpoint whose config.json claims qwen3: the tensors it lacks are named
    make_hf_model("tied_gqa4_mqa").save_pretrained(tmp_path)
    cfg = json.load(open(tmp_path / "config.json"))
    json.dump({**cfg, "model_type": "qwen3"}, open(tmp_path / "config.json", "w"))
    with pytest.raises(hf_io.CheckpointError, match="missing tensor.*self_attn.k_norm.weight"):
        hf_io.load_hf(str(tmp_path))


def test_tiny_qwen3_config_trains_end_to_end(tmp_path):
    """configs/tiny_cpu_qwen3.py through the real trainer, shortened (no SFT, one GRPO step of 4 x 2 rows, a
    1-layer model, no held-out evaluation; fsdp over the session's CPU devices): the engine and sampler roll it out, the update runs, and the exported
    policy is a Qwen3 (q/k norms, no biases) whose q/k norm scales the update moved."""
    sys.path.insert(0, ROOT)  # the configs package
    from configs import tiny_cpu_qwen3
    from jaxsearch import parallel
    from jaxsearch.agent.policy import load_policy
    from jaxsearch.config import RunConfig
    from jaxsearch.models import orbax_io
    from jaxsearch.rl import pipeline, trainer

    c = tiny_cpu_qwen3.get_config()
    c.update(dict(total_steps=1, eval_every=0, save_every=1))
    c.sft.steps = 0
    c.data.update(dict(batch_size=4, group_size=2))
    c.rollout.update(dict(max_turns=1, max_segment_tokens=8, cache_len=256))
    c.mesh.update(dict(fsdp=-1))  # the test session's CPU devices
    c.model.update(dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, head_dim=16))
    cfg = pipeline.prepare_world(RunConfig.from_dict(c), str(tmp_path))
    cfg = cfg.replace(data=dataclasses.replace(cfg.data, eval={}))  # evaluation compiles programs of its own
    metrics = trainer.train(cfg, str(tmp_path), progress=False)
    assert metrics["policy_tokens"] > 0 and np.isfinite(metrics["loss"]) and metrics["update_skipped"] == 0
    config, params = orbax_io.restore_params(str(tmp_path / "params"))
    assert (config.family, config.head_dim) == ("qwen3", 16) and "qkv_bias" not in params["layers_0"]["attn"]
    _, init = load_policy(cfg.model, cfg.seed, parallel.make_mesh({"fsdp": -1}))
    for norm in ("q_norm", "k_norm"):
        before, after = (np.asarray(p["layers_0"]["attn"][norm]["scale"]) for p in (init, params))
        assert after.shape == (16,) and not np.array_equal(before, after), norm
