"""orbax_io.save_params and hf_io.save_hf never delete a directory jaxsearch did not write: neither the
destination nor a leftover `<dst>.tmp-save`; a save over its own earlier output, or after an interrupted save,
still works and round-trips the params."""

import os

import jax
import numpy as np
import pytest

from jaxsearch.files import MARKER, OutputDirError
from jaxsearch.models import hf_io, orbax_io, qwen2
from tiny_models import tiny_qwen2_config


@pytest.fixture(scope="module")
def tiny():
    config = tiny_qwen2_config(64)
    return config, qwen2.init_params(config, jax.random.PRNGKey(0))


def save_and_load(kind, config, params, path):
    if kind == "orbax":
        orbax_io.save_params(path, config, params)
        return orbax_io.restore_params(path)[1]
    hf_io.save_hf(config, params, path)
    return hf_io.load_hf(path)[1]


def same(a, b):
    flat_a, flat_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(flat_a) == len(flat_b) and all(np.array_equal(x, y) for x, y in zip(flat_a, flat_b))


@pytest.mark.parametrize("kind", ["orbax", "hf"])
def test_user_files_are_never_deleted(tiny, tmp_path, kind):
    config, params = tiny
    user_dst = tmp_path / "mine"
    user_dst.mkdir()
    (user_dst / "notes.txt").write_text("keep me")
    with pytest.raises(OutputDirError, match="did not write"):
        save_and_load(kind, config, params, str(user_dst))
    assert (user_dst / "notes.txt").read_text() == "keep me" and os.listdir(user_dst) == ["notes.txt"]
    kept = tmp_path / "mine.tmp-save"  # the new save is kept where the message says
    assert (kept / "config.json").exists() and (kept / MARKER).exists()

    # a user's directory that happens to sit at <dst>.tmp-save is not cleared either
    dst = tmp_path / "out"
    (tmp_path / "out.tmp-save").mkdir()
    (tmp_path / "out.tmp-save" / "data.csv").write_text("1,2")
    with pytest.raises(OutputDirError, match="temporary"):
        save_and_load(kind, config, params, str(dst))
    assert (tmp_path / "out.tmp-save" / "data.csv").read_text() == "1,2" and not dst.exists()


@pytest.mark.parametrize("kind", ["orbax", "hf"])
def test_saves_over_their_own_output_and_leftovers(tiny, tmp_path, kind):
    config, params = tiny
    dst = str(tmp_path / "out")
    assert same(save_and_load(kind, config, params, dst), params)
    other = jax.tree.map(lambda x: x + 1, params)
    assert same(save_and_load(kind, config, other, dst), other)  # replaces its own earlier save
    # an interrupted save's leftover (marked when it was made) is cleared by the next save
    os.makedirs(dst + ".tmp-save")
    open(os.path.join(dst + ".tmp-save", MARKER), "w").close()
    open(os.path.join(dst + ".tmp-save", "partial.bin"), "w").close()
    assert same(save_and_load(kind, config, params, dst), params)
    assert not os.path.exists(dst + ".tmp-save") and os.path.isfile(os.path.join(dst, MARKER))
