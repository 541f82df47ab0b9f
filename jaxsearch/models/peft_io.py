"""LoRA adapters (`models/lora.py`) <-> a peft adapter directory, which `peft.PeftModel.from_pretrained` loads
over the base model (transformers' Qwen2ForCausalLM / Qwen3ForCausalLM).

A peft LoRA adapter directory is `adapter_config.json` (peft's LoraConfig: r, lora_alpha, target_modules, ...)
and `adapter_model.safetensors`, whose tensors map to the adapters (a [in, r], b [r, out]; `lora.features`) as

    base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_A.weight [r, in]  -> layers_i/attn/*/a.T
    base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_B.weight [out, r] -> layers_i/attn/*/b.T
    base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.weight      -> layers_i/mlp/*/{a,b}.T

lora_alpha / r (/ sqrt(r) with use_rslora) is the scale. Only plain LoRA of those seven projections in every
layer loads: DoRA, biases, per-module ranks, extra trained modules and the like are refused, naming the field.
"""

from __future__ import annotations

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from jaxsearch import files, multihost
from jaxsearch.models import hf_io, lora

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
HF_MODULE = {"attn": "self_attn", "mlp": "mlp"}  # lora.MODULE_OF's module -> transformers' submodule name
_KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_(A|B)\.weight")

# adapter_config.json fields whose non-default (truthy) value means a model these adapters cannot hold
UNSUPPORTED = {
    "use_dora": "DoRA (weight-decomposed LoRA)",
    "lora_bias": "a bias on lora_B",
    "fan_in_fan_out": "Conv1D-layout (GPT-2) weights",
    "modules_to_save": "fully trained extra modules",
    "layers_to_transform": "adapters on some layers only",
    "rank_pattern": "per-module ranks",
    "alpha_pattern": "per-module alphas",
    "exclude_modules": "excluded modules",
    "layer_replication": "replicated layers",
    "target_parameters": "adapters on parameters",
    "trainable_token_indices": "trained token embeddings",
    "alora_invocation_tokens": "activated LoRA",
}


def key(i: int, name: str, half: str) -> str:
    """peft's tensor name of layer i's projection `name` ("q_proj", ...), half "A" or "B"."""
    return f"base_model.model.model.layers.{i}.{HF_MODULE[lora.MODULE_OF[name]]}.{name}.lora_{half}.weight"


def _expected_shapes(config, spec: lora.LoraSpec) -> dict[str, tuple[int, int]]:
    """Every tensor name of `spec`'s adapters on `config`'s model -> its shape in peft's layout."""
    out = {}
    for i in range(config.num_hidden_layers):
        for name in spec.targets:
            n_in, n_out = lora.features(config, name)
            out[key(i, name, "A")], out[key(i, name, "B")] = (spec.rank, n_in), (n_out, spec.rank)
    return out


def save_peft(path: str, config, spec: lora.LoraSpec, adapters, base_model_name_or_path: str | None = None):
    """Write `adapters` (`lora.init_adapters`' layout) of `config`'s model as a peft adapter directory at
    `path`, the tensors in fp32.

    Written to `<path>.tmp-save` and moved into place at the end, so a crash leaves no partial adapter at
    `path`; an existing `path` is replaced only if jaxsearch wrote it (`files.MARKER`). With several processes
    every one must call it (the adapters are gathered to each host); process 0 writes.
    """
    host = jax.tree_util.tree_map(multihost.to_host, adapters)
    if jax.process_index() == 0:
        _write_peft(path, config, spec, host, base_model_name_or_path)
    multihost.sync(f"jaxsearch_save_peft:{os.path.abspath(path)}")


def _write_peft(path: str, config, spec: lora.LoraSpec, host, base_model_name_or_path) -> None:
    tensors = {}
    for i in range(config.num_hidden_layers):
        layer = host.get(f"layers_{i}", {})
        names = {n for module in layer.values() for n in module}
        if names != set(spec.targets):
            raise ValueError(f"adapters of layer {i} adapt {sorted(names)}; spec: {sorted(spec.targets)}")
        for name in spec.targets:
            ad = layer[lora.MODULE_OF[name]][name]
            tensors[key(i, name, "A")], tensors[key(i, name, "B")] = ad["a"].T, ad["b"].T
    expected = _expected_shapes(config, spec)
    for name, arr in tensors.items():
        if tuple(arr.shape) != expected[name]:
            raise ValueError(f"adapters give {name!r} shape {arr.shape}, config and spec: {expected[name]}")
    tensors = {n: np.ascontiguousarray(a, dtype=np.float32) for n, a in tensors.items()}
    peft_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": sorted(spec.targets),
        "bias": "none",
        "use_rslora": spec.rslora,
        "use_dora": False,
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "base_model_name_or_path": base_model_name_or_path,
        "revision": None,
        "inference_mode": True,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    tmp = path.rstrip("/") + ".tmp-save"
    files.fresh_save_dir(tmp)
    with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
        json.dump(peft_config, f, indent=2)
    save_file(tensors, os.path.join(tmp, WEIGHTS_FILE), metadata={"format": "pt"})
    files.replace_dir(tmp, path)


def _targets(where: str, target_modules) -> tuple[str, ...]:
    """`target_modules` of adapter_config.json -> projection names in `lora.TARGETS` order. peft matches a
    list entry as a module-name suffix (a name, or a full path such as "model.layers.0.self_attn.q_proj",
    which peft itself writes for "all-linear"), and a string as a regex over full module names."""
    if target_modules == "all-linear":
        return lora.TARGETS
    if isinstance(target_modules, str):
        raise ValueError(
            f"{where}: target_modules={target_modules!r} is a regex, which is not supported; "
            f"expected a list of {list(lora.TARGETS)} or 'all-linear'"
        )
    if not isinstance(target_modules, list) or not target_modules:
        raise ValueError(f"{where}: target_modules={target_modules!r}: expected a list or 'all-linear'")
    names = {str(m).rsplit(".", 1)[-1] for m in target_modules}
    unknown = sorted(names - set(lora.TARGETS))
    if unknown:
        raise ValueError(f"{where}: target_modules names {unknown}, which are not among {list(lora.TARGETS)}")
    return tuple(t for t in lora.TARGETS if t in names)


def _spec(where: str, cfg: dict) -> lora.LoraSpec:
    """The LoraSpec of adapter_config.json `where` (read as `cfg`), refusing what the adapters cannot hold."""
    if cfg.get("peft_type") != "LORA":
        raise ValueError(f"{where}: peft_type={cfg.get('peft_type')!r}, only 'LORA' is supported")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"{where}: bias={cfg['bias']!r} (trained biases) is not supported; expected 'none'")
    for field, what in UNSUPPORTED.items():
        if cfg.get(field):
            raise ValueError(f"{where}: {field}={cfg[field]!r} ({what}) is not supported")
    for field in ("r", "lora_alpha"):
        if not isinstance(cfg.get(field), (int, float)):
            raise ValueError(f"{where}: {field}={cfg.get(field)!r}: expected a number")
    targets = _targets(where, cfg.get("target_modules"))
    try:
        return lora.LoraSpec(
            rank=int(cfg["r"]),
            alpha=float(cfg["lora_alpha"]),
            dropout=float(cfg.get("lora_dropout") or 0.0),
            targets=targets,
            rslora=bool(cfg.get("use_rslora", False)),
        )
    except ValueError as e:  # r < 1, lora_dropout outside [0, 1)
        raise ValueError(f"{where}: {e}") from None


def load_peft(path: str, config) -> tuple[lora.LoraSpec, dict]:
    """Read a peft LoRA adapter directory for `config`'s model.

    Returns (spec, adapters): adapters in fp32, `lora.init_adapters`' layout
    `{"layers_i": {"attn": {"q_proj": {"a": [in, r], "b": [r, out]}, ...}, "mlp": {...}}}`. Raises ValueError
    naming the file and the field or tensor for what these adapters cannot hold (UNSUPPORTED), a tensor of a
    layer or module the model lacks, a missing tensor, or a shape that does not match the config.
    """
    cfg_path, weights = os.path.join(path, CONFIG_FILE), os.path.join(path, WEIGHTS_FILE)
    for fname in (cfg_path, weights):
        if not os.path.isfile(fname):
            raise ValueError(f"{path}: no {os.path.basename(fname)}: not a peft adapter directory")
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path}: not valid JSON ({e})") from None
    spec = _spec(cfg_path, cfg)

    header = hf_io.read_safetensors_header(weights)
    for name in sorted(header):
        m = _KEY.fullmatch(name)
        if m is None:
            raise ValueError(f"{weights}: tensor {name!r} is not a LoRA A/B of a decoder layer's projection")
        i, module, proj = int(m[1]), m[2], m[3]
        if proj not in lora.MODULE_OF or HF_MODULE[lora.MODULE_OF[proj]] != module:
            raise ValueError(f"{weights}: tensor {name!r} names module {module}.{proj}, not in the model")
        if i >= config.num_hidden_layers:
            n = config.num_hidden_layers
            raise ValueError(f"{weights}: tensor {name!r} names layer {i}, the model has {n} layers")
        if proj not in spec.targets:
            raise ValueError(f"{weights}: tensor {name!r} adapts {proj}, which target_modules does not name")
    expected = _expected_shapes(config, spec)
    missing = sorted(set(expected) - set(header))
    if missing:
        raise ValueError(
            f"{weights}: missing tensor(s) {missing[:4]}{' ...' if len(missing) > 4 else ''} "
            f"(target_modules {list(spec.targets)} on all {config.num_hidden_layers} layers)"
        )
    for name, shape in expected.items():
        if tuple(header[name]["shape"]) != shape:
            raise ValueError(
                f"{weights}: tensor {name!r} has shape {tuple(header[name]['shape'])}, expected {shape} "
                f"(r={spec.rank} and the model's config)"
            )

    reader = hf_io._Reader(dict.fromkeys(header, weights))
    adapters = {}
    for i in range(config.num_hidden_layers):
        layer = adapters[f"layers_{i}"] = {}
        for name in spec.targets:
            a, b = (np.asarray(reader.get(key(i, name, h)), dtype=np.float32).T for h in "AB")
            layer.setdefault(lora.MODULE_OF[name], {})[name] = {"a": jnp.asarray(a), "b": jnp.asarray(b)}
    return spec, adapters
