"""The policy a run starts from, by its config's `model` section: an HF checkpoint, an orbax params dir, or a
seeded random init, placed on the mesh by the logical-axis rules.

    config, params = load_policy(cfg.model, cfg.seed, mesh)
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from jaxsearch.models import hf_io, orbax_io, qwen2
from jaxsearch.models.sharding import param_shardings


def _runtime_fields(m) -> dict:
    """Qwen2Config fields that a config sets whatever the checkpoint says (how to run, not what the model is)."""
    return dict(
        remat=m.remat,
        logprob_chunk=m.logprob_chunk,
        attention_chunk=m.attention_chunk,
        attention_impl=m.attention_impl,
        scan_layers=m.scan_layers,
    )


def model_config(m) -> qwen2.Qwen2Config:
    """The architecture of a random init from config.model (the HF / orbax paths carry their own config):
    explicit sizes when `vocab_size` is set, else the named `preset`. `m`: a `config.ModelConfig`."""
    numerics = dict(dtype=m.dtype, param_dtype=m.param_dtype, **_runtime_fields(m))
    if m.vocab_size is not None:
        return qwen2.Qwen2Config(
            vocab_size=m.vocab_size,
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads,
            num_hidden_layers=m.num_hidden_layers,
            tie_word_embeddings=m.tie_word_embeddings,
            head_dim=m.head_dim or None,
            family=m.family,
            **numerics,
        )
    if m.preset is None:
        raise ValueError(
            "config.model: set a preset, explicit sizes (vocab_size, hidden_size, ...) or a checkpoint path"
        )
    return qwen2.preset(m.preset, **numerics)


def load_policy(m, seed: int, mesh) -> tuple[qwen2.Qwen2Config, dict]:
    """(model config, params on the mesh) from config.model: hf_path, orbax_path, or a random init from `seed`."""
    overrides = _runtime_fields(m)
    if m.hf_path or m.orbax_path:
        # shardings need only the shapes in config.json: read each checkpoint once, onto its devices
        path = m.hf_path or m.orbax_path
        shardings = param_shardings(
            qwen2.Qwen2Config.from_hf_json(os.path.join(path, "config.json")), mesh
        )
        if m.hf_path:
            config, params = hf_io.load_hf(path, jnp.dtype(m.param_dtype), shardings, overrides)
        else:
            config, params = orbax_io.restore_params(path, dtype=m.param_dtype, shardings=shardings)
            config = config.replace(**overrides)
    else:
        config = model_config(m)
        shardings = param_shardings(config, mesh)
        params = jax.jit(lambda k: qwen2.init_params(config, k), out_shardings=shardings)(
            jax.random.PRNGKey(seed)
        )
    return config.replace(dtype=m.dtype), params
