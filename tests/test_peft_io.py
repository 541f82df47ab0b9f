"""peft adapter directories <-> our LoRA adapters, against peft's own forward over transformers' models:
adapters we save give our logits in peft, peft's give its logits here, merged exports equal its
merge_and_unload."""

import json
import os
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from jaxsearch.cli import convert_checkpoint
from jaxsearch.models import hf_io, lora, peft_io, qwen2
from hf_reference import hf_logits, left_padded_batch, make_hf_model
from tiny_models import tiny_qwen2_config

forward = jax.jit(qwen2.forward, static_argnums=0)


def _lora_forward(config, spec, params, adapters, ids, mask):
    params = lora.with_adapters(params, adapters)
    return np.asarray(forward(lora.lora_config(config, spec), params, ids, mask))


def _batch(config):
    """Three rows, two of them left-padded."""
    return left_padded_batch(config.vocab_size, [10, 6, 3], seed=7)


def _assert_logits_close(ours, ref, mask, atol=2e-5):
    valid = mask.astype(bool)
    assert np.abs(ours - ref)[valid].max() <= atol


def _random_b(adapters, seed):
    """`adapters` with every B drawn ~ N(0, 0.05^2) (init_adapters' B = 0 would make any mapping pass)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda kp, x: jnp.asarray(rng.normal(size=x.shape) * 0.05, jnp.float32) if kp[-1].key == "b" else x,
        adapters,
    )


def _peft_warnings(record):
    return [str(w.message) for w in record if "peft" in w.filename]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(base_dir written by hf_io.save_hf, our config, our params) of a random 3-layer Qwen2 with biases."""
    src, base_dir = tmp_path_factory.mktemp("src"), str(tmp_path_factory.mktemp("base") / "hf")
    make_hf_model("untied_gqa2_hd32", seed=5).save_pretrained(src)
    config, params = hf_io.load_hf(str(src))
    hf_io.save_hf(config, params, base_dir)
    return base_dir, config, params


@pytest.mark.parametrize(
    "targets, rslora",
    [(("q_proj", "v_proj", "down_proj"), False), (lora.TARGETS, True)],
    ids=["qvd", "all-rslora"],
)
def test_saved_adapters_give_our_logits_in_peft(base, targets, rslora, tmp_path):
    base_dir, config, params = base
    spec = lora.LoraSpec(rank=4, alpha=8.0, targets=targets, rslora=rslora)
    adapters = _random_b(lora.init_adapters(config, spec, jax.random.PRNGKey(1)), seed=2)
    out = str(tmp_path / "adapter")
    peft_io.save_peft(out, config, spec, adapters, base_model_name_or_path=base_dir)
    with open(os.path.join(out, peft_io.CONFIG_FILE)) as f:
        assert json.load(f)["target_modules"] == sorted(targets)

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(Qwen2ForCausalLM.from_pretrained(base_dir), out).eval()
    assert not _peft_warnings(record)
    ids, mask = _batch(config)
    ref = hf_logits(model, ids, mask)
    _assert_logits_close(_lora_forward(config, spec, params, adapters, ids, mask), ref, mask)
    # the adapters change the logits (a test that would pass with them ignored proves nothing)
    with model.disable_adapter():
        assert np.abs(hf_logits(model, ids, mask) - ref)[mask.astype(bool)].max() > 1e-2

    spec_back, adapters_back = peft_io.load_peft(out, config)
    assert spec_back == spec
    jax.tree_util.tree_map(np.testing.assert_array_equal, adapters_back, adapters)


# (transformers model, target_modules, use_rslora): a Qwen2 with k without v and up without gate (merge's
# half-adapted fused kernels), a Qwen3 (head_dim 32 != 48 / 4) with all of them
PEFT_CASES = {
    "qwen2-kou": ("untied_gqa2_hd32", ["k_proj", "o_proj", "up_proj"], False),
    "qwen3-all-linear-rslora": ("qwen3_tied_gqa2_hd32", "all-linear", True),
}


@pytest.fixture(scope="module", params=sorted(PEFT_CASES))
def peft_made(request, tmp_path_factory):
    """An adapter made and saved by peft (random B) over a transformers model: {case, base_dir, adapter_dir,
    logits (peft's), merged_logits (its merge_and_unload's), ids, mask, rslora}."""
    name, target_modules, rslora = PEFT_CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    base_dir, adapter_dir = str(root / "base"), str(root / "adapter")
    model = make_hf_model(name, seed=6)
    model.save_pretrained(base_dir)
    peft_config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=target_modules,
        use_rslora=rslora,
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, peft_config).eval()
    peft_model.save_pretrained(adapter_dir)
    ids, mask = left_padded_batch(model.config.vocab_size, [10, 6, 3], seed=7)
    logits = hf_logits(peft_model, ids, mask)
    merged_logits = hf_logits(peft_model.merge_and_unload(), ids, mask)
    return dict(
        case=request.param,
        base_dir=base_dir,
        adapter_dir=adapter_dir,
        logits=logits,
        merged_logits=merged_logits,
        ids=ids,
        mask=mask,
        rslora=rslora,
    )


def test_peft_adapters_give_peft_logits_here(peft_made):
    config, params = hf_io.load_hf(peft_made["base_dir"])
    spec, adapters = peft_io.load_peft(peft_made["adapter_dir"], config)
    assert (spec.rank, spec.alpha, spec.rslora) == (4, 8.0, peft_made["rslora"])
    ids, mask = peft_made["ids"], peft_made["mask"]
    _assert_logits_close(_lora_forward(config, spec, params, adapters, ids, mask), peft_made["logits"], mask)


def test_merged_export_equals_merge_and_unload(peft_made, tmp_path):
    config, params = hf_io.load_hf(peft_made["base_dir"])
    spec, adapters = peft_io.load_peft(peft_made["adapter_dir"], config)
    hf_io.save_hf(config, lora.merge(config, spec, params, adapters), str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    mask = peft_made["mask"]
    _assert_logits_close(hf_logits(merged, peft_made["ids"], mask), peft_made["merged_logits"], mask)


def test_convert_checkpoint_merges_adapter(peft_made, tmp_path, capsys):
    """--adapter with an HF source and with an orbax one: transformers loads peft's merge_and_unload."""
    if peft_made["case"] != "qwen2-kou":
        pytest.skip("the command is the same for Qwen3; one model is enough")
    src, ad = peft_made["base_dir"], peft_made["adapter_dir"]
    orbax_dir, from_hf, from_orbax = (str(tmp_path / n) for n in ("orbax", "from_hf", "from_orbax"))
    for argv in (
        ["--to", "hf", "--src", src, "--adapter", ad, "--dst", from_hf],
        ["--to", "orbax", "--src", src, "--dst", orbax_dir],
        ["--to", "hf", "--src", orbax_dir, "--adapter", ad, "--dst", from_orbax],
    ):
        assert convert_checkpoint.main(argv) == 0, capsys.readouterr().err
    assert "merged" in capsys.readouterr().out
    ids, mask = peft_made["ids"], peft_made["mask"]
    for out in (from_hf, from_orbax):
        merged = Qwen2ForCausalLM.from_pretrained(out).eval()
        _assert_logits_close(hf_logits(merged, ids, mask), peft_made["merged_logits"], mask)
    bad = ["--to", "hf", "--src", src, "--adapter", str(tmp_path / "none"), "--dst", str(tmp_path / "x")]
    assert convert_checkpoint.main(bad) == 2
    assert "adapter_config.json" in capsys.readouterr().err


# the bad-input tests: a 2-layer tiny Qwen2 and adapters of all seven projections, no model run
SMALL = tiny_qwen2_config(100, num_hidden_layers=2)
SMALL_SPEC = lora.LoraSpec(rank=2, alpha=4.0)


@pytest.fixture(scope="module")
def small_adapter(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("small") / "adapter")
    peft_io.save_peft(path, SMALL, SMALL_SPEC, lora.init_adapters(SMALL, SMALL_SPEC, jax.random.PRNGKey(0)))
    return path


def _edited(src, dst, config_edit=None, tensors_edit=None):
    """A copy of adapter dir `src` at `dst` with its config updated by `config_edit`, its tensors by
    `tensors_edit(tensors)`."""
    shutil.copytree(src, dst)
    if config_edit:
        cfg_path = os.path.join(dst, peft_io.CONFIG_FILE)
        with open(cfg_path) as f:
            cfg = json.load(f)
        with open(cfg_path, "w") as f:
            json.dump(cfg | config_edit, f)
    if tensors_edit:
        weights = os.path.join(dst, peft_io.WEIGHTS_FILE)
        tensors = load_file(weights)
        tensors_edit(tensors)
        save_file(tensors, weights)
    return str(dst)


@pytest.mark.parametrize(
    "edit, match",
    [
        ({"use_dora": True}, r"adapter_config\.json: use_dora=True \(DoRA"),
        ({"target_modules": ".*_proj"}, r"adapter_config\.json: target_modules='\.\*_proj' is a regex"),
        ({"target_modules": ["q_proj", "lm_head"]}, r"target_modules names \['lm_head'\]"),
        ({"peft_type": "IA3"}, r"adapter_config\.json: peft_type='IA3'"),
        ({"bias": "lora_only"}, r"adapter_config\.json: bias='lora_only'"),
        ({"rank_pattern": {"q_proj": 8}}, r"adapter_config\.json: rank_pattern="),
        ({"modules_to_save": ["lm_head"]}, r"adapter_config\.json: modules_to_save="),
        ({"r": 0}, r"adapter_config\.json: LoRA rank=0"),
    ],
)
def test_load_refuses_config_it_cannot_hold(small_adapter, tmp_path, edit, match):
    path = _edited(small_adapter, tmp_path / "bad", config_edit=edit)
    with pytest.raises(ValueError, match=match):
        peft_io.load_peft(path, SMALL)


def test_load_names_the_bad_tensor(small_adapter, tmp_path):
    b0 = peft_io.key(0, "k_proj", "B")  # [K*D, r]: 2 kv heads of 8 here, 4 in the model
    with pytest.raises(ValueError, match=rf"tensor '{b0}' has shape \(16, 2\), expected \(32, 2\)"):
        peft_io.load_peft(small_adapter, tiny_qwen2_config(100, num_hidden_layers=2, num_key_value_heads=4))
    with pytest.raises(ValueError, match=r"\.layers\.1\..*' names layer 1, the model has 1 layers"):
        peft_io.load_peft(small_adapter, tiny_qwen2_config(100, num_hidden_layers=1))
    b1 = peft_io.key(1, "v_proj", "B")
    missing = _edited(small_adapter, tmp_path / "missing", tensors_edit=lambda t: t.pop(b1))
    with pytest.raises(ValueError, match=rf"adapter_model\.safetensors: missing tensor\(s\) \['{b1}'\]"):
        peft_io.load_peft(missing, SMALL)
    narrowed = _edited(small_adapter, tmp_path / "narrowed", config_edit={"target_modules": ["q_proj"]})
    not_named = r"down_proj\.lora_A\.weight' adapts down_proj, which target_modules does not name"
    with pytest.raises(ValueError, match=not_named):
        peft_io.load_peft(narrowed, SMALL)
    # "all-linear" (peft's name for every linear layer but the head) is all seven
    all_linear = _edited(small_adapter, tmp_path / "all_linear", config_edit={"target_modules": "all-linear"})
    assert peft_io.load_peft(all_linear, SMALL)[0] == SMALL_SPEC


def test_failed_save_keeps_previous_adapter(small_adapter, tmp_path):
    path = str(tmp_path / "adapter")
    shutil.copytree(small_adapter, path)
    before = open(os.path.join(path, peft_io.WEIGHTS_FILE), "rb").read()
    adapters = lora.init_adapters(SMALL, SMALL_SPEC, jax.random.PRNGKey(3))
    wrong = lora.LoraSpec(rank=3, alpha=4.0)  # adapters of rank 2
    with pytest.raises(ValueError, match="q_proj.lora_A.weight"):
        peft_io.save_peft(path, SMALL, wrong, adapters)
    assert open(os.path.join(path, peft_io.WEIGHTS_FILE), "rb").read() == before
    peft_io.save_peft(path, SMALL, SMALL_SPEC, adapters)  # a save of ours is replaced
    assert open(os.path.join(path, peft_io.WEIGHTS_FILE), "rb").read() != before
