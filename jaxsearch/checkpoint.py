"""Orbax checkpoints of model params (with their config), for conversion and evaluation.

A params checkpoint directory holds `config.json` (the HF-style Qwen2 config) and `params/` (an orbax
PyTree checkpoint). The trainer's full state (optimizer, step, PRNG, data position) builds on the same
orbax machinery with a CheckpointManager.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import orbax.checkpoint as ocp

from jaxsearch.models import qwen2


def save_params(path: str, config: qwen2.Qwen2Config, params) -> None:
    """Write config + params to `path` (replaced only once the new checkpoint is complete)."""
    path = os.path.abspath(path)
    tmp = path + ".tmp-save"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config.to_hf_dict(), f, indent=2)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.join(tmp, "params"), params)
    checkpointer.wait_until_finished()
    if os.path.exists(path):
        shutil.rmtree(path)
    os.rename(tmp, path)


def restore_params(path: str, dtype=None, shardings=None):
    """Read (config, params) from a `save_params` directory.

    dtype: cast the params (and the config's dtypes) to this; shardings: a pytree of shardings like the
    params, where each array is restored directly onto its devices.
    """
    path = os.path.abspath(path)
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path) or not os.path.isdir(os.path.join(path, "params")):
        raise FileNotFoundError(f"{path}: not a jaxsearch params checkpoint (needs config.json and params/)")
    with open(cfg_path) as f:
        stored = json.load(f).get("torch_dtype", "float32")
    name = jax.numpy.dtype(dtype).name if dtype is not None else stored
    config = qwen2.Qwen2Config.from_hf_json(cfg_path, dtype=name, param_dtype=name)
    abstract = jax.eval_shape(lambda: qwen2.init_params(config, jax.random.PRNGKey(0)))
    if shardings is not None:
        abstract = jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
        )
    params = ocp.StandardCheckpointer().restore(os.path.join(path, "params"), abstract)
    return config, params
