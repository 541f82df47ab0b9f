"""HF checkpoint I/O: save_hf -> transformers, sharded checkpoints, placement by sharding, clear errors."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import Qwen2ForCausalLM

from jaxsearch import parallel
from jaxsearch.models import hf_io, qwen2
from jaxsearch.models.sharding import param_shardings
from hf_reference import hf_logits, left_padded_batch, make_hf_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A transformers-saved untied checkpoint and what load_hf makes of it."""
    model = make_hf_model("untied_gqa2_hd32", seed=3)
    path = str(tmp_path_factory.mktemp("hf"))
    model.save_pretrained(path)
    config, params = hf_io.load_hf(path)
    return model, path, config, params


@pytest.mark.parametrize("name", ["tied_gqa4_mqa", "untied_gqa2_hd32"])
def test_save_hf_loads_in_transformers_with_identical_logits(name, tmp_path):
    model = make_hf_model(name, seed=4)
    model.save_pretrained(tmp_path / "src")
    config, params = hf_io.load_hf(str(tmp_path / "src"))
    hf_io.save_hf(config, params, str(tmp_path / "out"))
    reloaded = Qwen2ForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids, mask = left_padded_batch(config.vocab_size, [9, 4], seed=0)
    np.testing.assert_array_equal(hf_logits(reloaded, ids, mask), hf_logits(model, ids, mask))
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1


def test_sharded_save_has_index_and_loads_in_both(saved, tmp_path):
    model, _, config, params = saved
    out = str(tmp_path / "sharded")
    hf_io.save_hf(config, params, out, max_shard_bytes=20_000)
    index = json.load(open(os.path.join(out, hf_io.INDEX_FILE)))
    shards = set(index["weight_map"].values())
    assert len(shards) > 3 and all(os.path.exists(os.path.join(out, s)) for s in shards)
    ids, mask = left_padded_batch(config.vocab_size, [7, 7], seed=1)
    ref = hf_logits(model, ids, mask)
    np.testing.assert_array_equal(hf_logits(Qwen2ForCausalLM.from_pretrained(out).eval(), ids, mask), ref)
    config2, params2 = hf_io.load_hf(out)
    assert config2 == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)


def test_bf16_save_and_load(saved, tmp_path):
    model, _, config, params = saved
    hf_io.save_hf(config, params, str(tmp_path / "bf16"), dtype=jnp.bfloat16)
    reloaded = Qwen2ForCausalLM.from_pretrained(tmp_path / "bf16")
    assert reloaded.model.embed_tokens.weight.dtype == torch.bfloat16
    config16, params16 = hf_io.load_hf(str(tmp_path / "bf16"), dtype=jnp.bfloat16)
    assert config16.dtype == "bfloat16" and params16["embedding"].dtype == jnp.bfloat16
    ref = model.model.embed_tokens.weight.detach().to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(np.asarray(params16["embedding"], np.float32), ref)


def test_load_places_each_tensor_on_its_sharding(saved):
    _, path, config, params = saved
    mesh = parallel.make_mesh({"fsdp": 4, "tensor": 2})
    shardings = param_shardings(config, mesh)
    _, placed = hf_io.load_hf(path, shardings=shardings)
    qkv = placed["layers_0"]["attn"]["qkv_kernel"]  # [E=48, K=2, G+2=4, D=32]: embed over fsdp, kv heads over tensor
    assert qkv.sharding == shardings["layers_0"]["attn"]["qkv_kernel"]
    assert qkv.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None, None)
    assert {s.data.shape for s in qkv.addressable_shards} == {(12, 1, 4, 32)}
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), placed, params)
    # sharded forward equals the unsharded one
    ids, mask = left_padded_batch(config.vocab_size, [6, 3, 6, 6, 2, 6, 5, 6], seed=2)
    out = jax.jit(qwen2.forward, static_argnums=0)(config, placed, ids, mask)
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(qwen2.forward(config, params, ids, mask)), atol=1e-5
    )


def _copy_checkpoint(src, dst, edit):
    """Copy a checkpoint dir, letting `edit(tensors)` change the tensor dict."""
    from safetensors.numpy import load_file, save_file

    os.makedirs(dst)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    edit(tensors)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f, open(os.path.join(dst, "config.json"), "w") as g:
        g.write(f.read())


def test_missing_extra_and_misshaped_tensors_are_named(saved, tmp_path):
    _, path, _, _ = saved
    name = "model.layers.1.mlp.down_proj.weight"
    _copy_checkpoint(path, tmp_path / "missing", lambda t: t.pop(name))
    with pytest.raises(hf_io.CheckpointError, match=r"missing tensor.*layers\.1\.mlp\.down_proj"):
        hf_io.load_hf(str(tmp_path / "missing"))
    _copy_checkpoint(
        path, tmp_path / "extra", lambda t: t.update({"model.layers.9.foo": np.zeros(2, np.float32)})
    )
    with pytest.raises(hf_io.CheckpointError, match=r"unexpected tensor.*layers\.9\.foo"):
        hf_io.load_hf(str(tmp_path / "extra"))
    _copy_checkpoint(path, tmp_path / "shape", lambda t: t.update({name: np.zeros((48, 95), np.float32)}))
    with pytest.raises(hf_io.CheckpointError, match=r"down_proj.*\(48, 95\).*\(48, 96\)"):
        hf_io.load_hf(str(tmp_path / "shape"))


def test_truncated_file_and_bad_config_fail_clearly(saved, tmp_path):
    _, path, _, _ = saved
    bad = tmp_path / "truncated"
    os.makedirs(bad)
    data = open(os.path.join(path, "model.safetensors"), "rb").read()
    open(bad / "model.safetensors", "wb").write(data[: len(data) // 2])
    open(bad / "config.json", "w").write(open(os.path.join(path, "config.json")).read())
    with pytest.raises(hf_io.CheckpointError, match=r"model\.safetensors.*truncated"):
        hf_io.load_hf(str(bad))
    open(bad / "config.json", "w").write("{not json")
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON"):
        hf_io.load_hf(str(bad))
    with pytest.raises(hf_io.CheckpointError, match="no config.json"):
        hf_io.load_hf(str(tmp_path / "nowhere"))


def test_failed_save_keeps_previous_checkpoint(saved, tmp_path):
    _, _, config, params = saved
    out = str(tmp_path / "ckpt")
    hf_io.save_hf(config, params, out)
    before = open(os.path.join(out, "model.safetensors"), "rb").read()
    broken = dict(params, embedding=params["embedding"][:-1])  # wrong shape: refused before writing
    with pytest.raises(ValueError, match="embed_tokens"):
        hf_io.save_hf(config, broken, out)
    assert open(os.path.join(out, "model.safetensors"), "rb").read() == before


def test_convert_checkpoint_round_trip_through_orbax(saved, tmp_path):
    """HF -> orbax -> HF with the command line tool; transformers reads the result unchanged."""
    import subprocess
    import sys

    model, path, config, _ = saved
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tool = os.path.join(root, "launch", "convert_checkpoint.py")
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    for args in (
        ["--to", "orbax", "--src", path, "--dst", str(tmp_path / "orbax")],
        ["--to", "hf", "--src", str(tmp_path / "orbax"), "--dst", str(tmp_path / "hf")],
    ):
        done = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
    ids, mask = left_padded_batch(config.vocab_size, [5, 8], seed=3)
    back = Qwen2ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    np.testing.assert_array_equal(hf_logits(back, ids, mask), hf_logits(model, ids, mask))
    bad = subprocess.run(
        [sys.executable, tool, "--to", "hf", "--src", str(tmp_path / "none"), "--dst", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 2 and "not a jaxsearch params checkpoint" in bad.stderr
    assert (
        "--max-shard-gb"
        in subprocess.run([sys.executable, tool, "--help"], capture_output=True, text=True, env=env).stdout
    )
