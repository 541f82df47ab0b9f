"""HF safetensors checkpoint directory <-> (Qwen2Config, params pytree), for Qwen2 / Qwen2.5 and Qwen3.

A transformers Qwen2 or Qwen3 checkpoint is `config.json` (its `model_type` names the family) plus
`model.safetensors`, or several shards named by `model.safetensors.index.json`. The mapping to jaxsearch's
layout (see `qwen2.py`):

    model.embed_tokens.weight               [V, E]  -> embedding
    model.layers.{i}.self_attn.{q,k,v}_proj.weight [H*D | K*D, E] -> layers_i/attn/qkv_kernel [E, K, G+2, D]
        (kv head j: its G query heads, its k, its v; + .bias -> qkv_bias [K, G+2, D]: Qwen2)
    model.layers.{i}.self_attn.{q,k}_norm.weight [D] -> layers_i/attn/{q,k}_norm/scale        (Qwen3)
    model.layers.{i}.self_attn.o_proj.weight [E, H*D] -> layers_i/attn/o_kernel [H, D, E]
    model.layers.{i}.mlp.{gate,up}_proj.weight [F, E] -> layers_i/mlp/gate_up_kernel [E, 2, F]
    model.layers.{i}.mlp.down_proj.weight    [E, F] -> layers_i/mlp/down_kernel [F, E]
    model.layers.{i}.{input,post_attention}_layernorm.weight -> layers_i/{input,post_attn}_norm/scale
    model.norm.weight -> final_norm/scale;   lm_head.weight [V, E] -> lm_head [E, V] (absent if tied)

Loading reads one layer's tensors at a time and, given target shardings, places each converted
tensor on its devices at once, so a large checkpoint never needs two full host copies.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from jaxsearch import files, multihost
from jaxsearch.models import qwen2

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# a `save_hf` temporary dir left by a version before `files.MARKER` (an export dir itself is replaced only when
# marked: an unmarked HF checkpoint may be the user's own download)
HF_TMP_LAYOUTS = [("config.json",)]


class CheckpointError(ValueError):
    """A checkpoint directory that does not match what its config.json promises."""


def _hf_shapes(config: qwen2.Qwen2Config) -> dict[str, tuple[int, ...]]:
    """Every tensor name a transformers Qwen2 / Qwen3 checkpoint of this config holds, with its shape."""
    e, f, h, k, d, v = (
        config.hidden_size,
        config.intermediate_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.vocab_size,
    )
    shapes = {"model.embed_tokens.weight": (v, e), "model.norm.weight": (e,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, e)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        if config.qkv_bias:
            shapes.update(
                {p + "self_attn.q_proj.bias": (h * d,)}
                | {p + f"self_attn.{n}_proj.bias": (k * d,) for n in "kv"}
            )
        if config.qk_norm:
            shapes.update({p + f"self_attn.{n}_norm.weight": (d,) for n in "qk"})
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (h * d, e),
                p + "self_attn.k_proj.weight": (k * d, e),
                p + "self_attn.v_proj.weight": (k * d, e),
                p + "self_attn.o_proj.weight": (e, h * d),
                p + "mlp.gate_proj.weight": (f, e),
                p + "mlp.up_proj.weight": (f, e),
                p + "mlp.down_proj.weight": (e, f),
                p + "input_layernorm.weight": (e,),
                p + "post_attention_layernorm.weight": (e,),
            }
        )
    return shapes


def _layer_to_params(config, get: Callable[[str], np.ndarray], i: int) -> dict:
    """Convert layer i's HF tensors (fetched by name with `get`) to jaxsearch's layer params."""
    e, h, k, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    p = f"model.layers.{i}."
    g = h // k

    def fused_qkv(suffix: str, *tail: int) -> np.ndarray:
        """q_proj, k_proj, v_proj's `suffix` tensors as [K, G + 2, D, *tail]: kv head j's G query heads
        (transformers' q heads j*G .. j*G+G-1), its k, its v."""
        heads = {"q": g, "k": 1, "v": 1}
        parts = [get(p + f"self_attn.{n}_proj.{suffix}").reshape(k, heads[n], d, *tail) for n in "qkv"]
        return np.concatenate(parts, axis=1)

    attn = {
        "qkv_kernel": fused_qkv("weight", e).transpose(3, 0, 1, 2),
        "o_kernel": get(p + "self_attn.o_proj.weight").reshape(e, h, d).transpose(1, 2, 0),
    }
    if config.qkv_bias:
        attn["qkv_bias"] = fused_qkv("bias")
    if config.qk_norm:
        attn.update({f"{n}_norm": {"scale": get(p + f"self_attn.{n}_norm.weight")} for n in "qk"})
    return {
        "input_norm": {"scale": get(p + "input_layernorm.weight")},
        "post_attn_norm": {"scale": get(p + "post_attention_layernorm.weight")},
        "attn": attn,
        "mlp": {
            "gate_up_kernel": np.stack(
                [get(p + "mlp.gate_proj.weight").T, get(p + "mlp.up_proj.weight").T], axis=1
            ),
            "down_kernel": get(p + "mlp.down_proj.weight").T,
        },
    }


def _layer_to_hf(config, layer: dict, i: int) -> dict[str, np.ndarray]:
    e, h, k, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    p = f"model.layers.{i}."
    a, m = layer["attn"], layer["mlp"]
    q, k_w, v = _split_qkv(a["qkv_kernel"].transpose(1, 2, 3, 0), h // k)  # from [K, G + 2, D, E]
    out = {
        p + "input_layernorm.weight": layer["input_norm"]["scale"],
        p + "post_attention_layernorm.weight": layer["post_attn_norm"]["scale"],
        p + "self_attn.q_proj.weight": q,
        p + "self_attn.k_proj.weight": k_w,
        p + "self_attn.v_proj.weight": v,
        p + "self_attn.o_proj.weight": a["o_kernel"].transpose(2, 0, 1).reshape(e, h * d),
        p + "mlp.gate_proj.weight": m["gate_up_kernel"][:, 0].T,
        p + "mlp.up_proj.weight": m["gate_up_kernel"][:, 1].T,
        p + "mlp.down_proj.weight": m["down_kernel"].T,
    }
    if config.qkv_bias:
        out.update({p + f"self_attn.{n}_proj.bias": b for n, b in zip("qkv", _split_qkv(a["qkv_bias"], h // k))})
    if config.qk_norm:
        out.update({p + f"self_attn.{n}_norm.weight": a[f"{n}_norm"]["scale"] for n in "qk"})
    return out


def _split_qkv(fused: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v of a fused [K, G + 2, D, ...] array, each as transformers' [heads * D, ...]."""
    tail = fused.shape[3:]
    return tuple(part.reshape(-1, *tail) for part in (fused[:, :g], fused[:, g], fused[:, g + 1]))


_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_safetensors_header(fname: str) -> dict[str, dict]:
    """The tensor table of a safetensors file: name -> {dtype, shape, data_offsets}.

    Read by hand rather than through `safetensors.safe_open`, whose numpy backend cannot return
    bfloat16; errors name the file.
    """
    try:
        size = os.path.getsize(fname)
        with open(fname, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or 8 + n > size:
                raise ValueError(f"header length {n} does not fit in a file of {size} bytes")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{fname}: not a readable safetensors file ({e})") from None
    header.pop("__metadata__", None)
    data_size = size - 8 - n
    for name, info in header.items():
        begin, stop = info["data_offsets"]
        if info["dtype"] not in _ST_DTYPES:
            raise CheckpointError(f"{fname}: tensor {name!r} has unsupported dtype {info['dtype']}")
        nbytes = int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(_ST_DTYPES[info["dtype"]]).itemsize
        if stop > data_size or stop - begin != nbytes:
            raise CheckpointError(
                f"{fname}: tensor {name!r} data {begin}..{stop} does not fit the file "
                f"({data_size} data bytes; shape {info['shape']} needs {nbytes}): truncated?"
            )
        info["_start"] = 8 + n + begin
    return header


def _tensor_files(path: str) -> dict[str, str]:
    """Map tensor name -> safetensors file holding it."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            try:
                weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({e})") from None
        out = {}
        for name, fname in weight_map.items():
            full = os.path.join(path, fname)
            if not os.path.exists(full):
                raise CheckpointError(f"{index}: tensor {name!r} is in shard {fname!r}, which does not exist")
            out[name] = full
        return out
    single = os.path.join(path, SINGLE_FILE)
    if not os.path.exists(single):
        raise CheckpointError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
    return {name: single for name in read_safetensors_header(single)}


class _Reader:
    """Reads tensors by name from a set of safetensors files through memory maps (lazy, no copy)."""

    def __init__(self, files: dict[str, str]):
        self._files = files
        self._headers: dict[str, dict] = {}

    def get(self, name: str) -> np.ndarray:
        fname = self._files[name]
        if fname not in self._headers:
            self._headers[fname] = read_safetensors_header(fname)
        info = self._headers[fname].get(name)
        if info is None:
            raise CheckpointError(f"{fname}: the index says it holds tensor {name!r}, but it does not")
        return np.memmap(
            fname,
            dtype=_ST_DTYPES[info["dtype"]],
            mode="r",
            offset=info["_start"],
            shape=tuple(info["shape"]),
        )


def load_hf(path: str, dtype=jnp.float32, shardings=None, config_overrides: dict | None = None):
    """Load a transformers Qwen2 / Qwen2.5 / Qwen3 checkpoint directory (the family from config.json's
    `model_type`).

    Args:
      path: directory with config.json and model.safetensors (or shards + model.safetensors.index.json).
      dtype: dtype of the returned params (and of the config's compute / param dtypes).
      shardings: optional pytree of `jax.sharding.Sharding` matching the params; each tensor is placed
        with `jax.device_put` as soon as it is converted.
      config_overrides: Qwen2Config fields to override (e.g. remat=True).
    Returns:
      (config, params).
    Raises:
      CheckpointError naming the tensor (and both shapes) for a missing, extra or mis-shaped tensor.
    """
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"{path}: no config.json")
    dtype = jnp.dtype(dtype)
    config = qwen2.Qwen2Config.from_hf_json(
        cfg_path, dtype=dtype.name, param_dtype=dtype.name, **(config_overrides or {})
    )
    files = _tensor_files(path)
    expected = _hf_shapes(config)
    # Tied checkpoints may still carry lm_head.weight (equal to the embedding): accept and ignore it.
    present = set(files) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    missing = sorted(set(expected) - present)
    extra = sorted(n for n in present - set(expected) if not n.endswith("rotary_emb.inv_freq"))
    if missing:
        raise CheckpointError(
            f"{path}: missing tensor(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}"
            f" required by config.json"
        )
    if extra:
        raise CheckpointError(
            f"{path}: unexpected tensor(s) {extra[:5]}{' ...' if len(extra) > 5 else ''}"
            f" not in a {config.family} model of this config.json"
        )

    reader = _Reader(files)

    def get(name):  # host fp32 copy of one tensor; converted layouts are built from these
        arr = np.asarray(reader.get(name), dtype=np.float32)
        if arr.shape != expected[name]:
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {tuple(arr.shape)}, config.json implies {expected[name]}"
            )
        return arr

    def place(arr, sharding):
        arr = np.asarray(arr).astype(dtype) if dtype != np.float32 else np.ascontiguousarray(arr)
        return jax.device_put(arr, sharding) if sharding is not None else jnp.asarray(arr)

    def shard_of(*keys):
        node = shardings
        for key in keys:
            if node is None:
                return None
            node = node[key]
        return node

    params = {
        "embedding": place(get("model.embed_tokens.weight"), shard_of("embedding")),
        "final_norm": {"scale": place(get("model.norm.weight"), shard_of("final_norm", "scale"))},
    }
    if not config.tie_word_embeddings:
        params["lm_head"] = place(get("lm_head.weight").T, shard_of("lm_head"))
    for i in range(config.num_hidden_layers):
        layer = _layer_to_params(config, get, i)
        params[f"layers_{i}"] = jax.tree_util.tree_map_with_path(
            lambda kp, x: place(x, shard_of(f"layers_{i}", *(k.key for k in kp))), layer
        )
    return config, params


def save_hf(
    config: qwen2.Qwen2Config, params, path: str, dtype=None, max_shard_bytes: int = 5 * 1024**3
) -> None:
    """Write a directory that transformers' `Qwen2ForCausalLM.from_pretrained` (`Qwen3ForCausalLM` for a
    Qwen3 config) loads.

    dtype: None keeps the params' dtype; float32 or bfloat16 converts. Above `max_shard_bytes` the
    tensors are split into `model-0000i-of-0000n.safetensors` shards with an index file. Files are
    written to a temporary directory and moved into place at the end, so a crash leaves no partial
    checkpoint at `path`. An existing `path` is replaced only if jaxsearch wrote it (`files.MARKER`): else an
    OutputDirError, the new save kept in `<path>.tmp-save`.
    """
    out_dtype = (
        np.dtype(ml_dtypes.bfloat16)
        if jnp.dtype(dtype or config.param_dtype) == jnp.bfloat16
        else np.dtype(np.float32)
    )
    # every process reads the params back whole (a collective when they span processes); process 0 writes
    host = jax.tree_util.tree_map(multihost.to_host, params)
    if jax.process_index() == 0:
        _write_hf(config, host, path, out_dtype, max_shard_bytes)
    multihost.sync("save_hf")


def _write_hf(config: qwen2.Qwen2Config, host, path: str, out_dtype, max_shard_bytes: int) -> None:
    tensors = {
        "model.embed_tokens.weight": host["embedding"],
        "model.norm.weight": host["final_norm"]["scale"],
    }
    if not config.tie_word_embeddings:
        tensors["lm_head.weight"] = host["lm_head"].T
    for i in range(config.num_hidden_layers):
        tensors.update(_layer_to_hf(config, host[f"layers_{i}"], i))
    expected = _hf_shapes(config)
    for name, arr in tensors.items():
        if tuple(arr.shape) != expected[name]:
            raise ValueError(f"params give {name!r} shape {arr.shape}, config implies {expected[name]}")
    tensors = {n: np.ascontiguousarray(a.astype(out_dtype)) for n, a in tensors.items()}

    # Greedy sharding in name order.
    shards, current, size = [], {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].nbytes
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensors[name]
        size += nbytes
    shards.append(current)

    tmp = path.rstrip("/") + ".tmp-save"
    files.fresh_save_dir(tmp, legacy=HF_TMP_LAYOUTS)
    hf_cfg = config.to_hf_dict()
    hf_cfg["torch_dtype"] = hf_cfg["dtype"] = "bfloat16" if out_dtype != np.float32 else "float32"
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], os.path.join(tmp, SINGLE_FILE), metadata=metadata)
    else:
        weight_map = {}
        for j, shard in enumerate(shards):
            fname = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, os.path.join(tmp, fname), metadata=metadata)
            weight_map.update({name: fname for name in shard})
        total = sum(a.nbytes for a in tensors.values())
        with open(os.path.join(tmp, INDEX_FILE), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    files.replace_dir(tmp, path)
