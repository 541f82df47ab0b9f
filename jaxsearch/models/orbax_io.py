"""A params checkpoint directory <-> (config, params): `config.json` (the HF-style Qwen2 config) and `params/`
(an orbax PyTree checkpoint), for conversion, evaluation and the trainer's final policy. The trainer's resumable
state is `jaxsearch.checkpoint.TrainCheckpointer`'s."""

from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp

from jaxsearch import files, multihost
from jaxsearch.models import qwen2

# what a params checkpoint holds (what versions before the `files.MARKER` wrote, recognised as ours)
CHECKPOINT_LAYOUT = [("config.json", "params")]


def save_params(path: str, config: qwen2.Qwen2Config, params) -> None:
    """Write config + params to `path` (replaced only once the new checkpoint is complete, and only if it
    is a params checkpoint or marked `files.MARKER`: else an OutputDirError, the new save kept in
    `<path>.tmp-save`).

    With several processes every one must call it (each writes the shards it holds); process 0 alone
    touches the directories and config.json.
    """
    path = os.path.abspath(path)
    tmp = path + ".tmp-save"
    primary = jax.process_index() == 0
    if primary:
        files.fresh_save_dir(tmp, legacy=CHECKPOINT_LAYOUT)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config.to_hf_dict(), f, indent=2)
    multihost.sync(f"jaxsearch_save_params_start:{path}")
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.join(tmp, "params"), params)
    checkpointer.wait_until_finished()
    multihost.sync(f"jaxsearch_save_params_written:{path}")
    if primary:
        files.replace_dir(tmp, path, legacy=CHECKPOINT_LAYOUT)
    multihost.sync(f"jaxsearch_save_params_done:{path}")


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
