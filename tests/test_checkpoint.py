"""Trainer checkpoints: bit-exact round trip, restore onto a mesh, keep-last-N, fallback past a corrupt
step, SIGKILL mid-save, SIGTERM preemption."""

import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxsearch import checkpoint
from jaxsearch.checkpoint import TrainCheckpointer
from hang import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_state(seed=0):
    """Params, adamw state after one update, reference params and PRNG keys (typed and raw uint32)."""
    rng = np.random.default_rng(seed)
    params = {
        "w": jnp.asarray(rng.standard_normal((8, 4)), jnp.float32),
        "b": jnp.asarray(rng.standard_normal(4), jnp.bfloat16),
    }
    opt = optax.adamw(1e-2)
    opt_state = opt.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return {
        "params": optax.apply_updates(params, updates),
        "opt_state": opt_state,
        "ref_params": params,
        "key": jax.random.key(seed),
        "keys": jax.random.split(jax.random.key(seed + 1), 8),
        "raw_key": jax.random.PRNGKey(seed + 2),
    }


def host_bits(x):
    """(dtype name, shape, raw bytes) of a leaf; typed PRNG keys by their key data and implementation."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return (str(jax.random.key_impl(x)), x.shape, np.asarray(jax.random.key_data(x)).tobytes())
    return (x.dtype.name, x.shape, np.asarray(x).tobytes())


def assert_bitwise_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        assert host_bits(x) == host_bits(y), jax.tree_util.keystr(path)


def abstract_of(state):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def test_round_trip_is_bit_exact(tmp_path):
    state = make_state()
    meta = {"data": {"epoch": 1, "position": 37}, "config": {"lr": 1e-6, "name": "tiny"}, "counters": [1, 2]}
    ckpt = TrainCheckpointer(str(tmp_path), save_every=5)
    assert ckpt.restore_latest(abstract_of(state)) is None
    assert ckpt.save(5, state, meta)
    ckpt.wait()
    ckpt.close()

    step, restored, restored_meta = TrainCheckpointer(str(tmp_path), save_every=5).restore_latest(
        abstract_of(make_state(seed=9))
    )
    assert step == 5 and restored_meta == meta
    assert_bitwise_equal(restored, state)
    # The typed key still works as a key: same stream as the original.
    np.testing.assert_array_equal(
        jax.random.normal(restored["key"], (3,)), jax.random.normal(jax.random.key(0), (3,))
    )


def test_async_save_keeps_what_was_passed_when_the_state_is_then_donated(tmp_path):
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("fsdp", "tensor"))
    params = {"w": jax.device_put(jnp.arange(512 * 256.0).reshape(512, 256), NamedSharding(mesh, P("fsdp")))}
    expected = np.arange(512 * 256.0, dtype=np.float32).reshape(512, 256)
    ckpt = TrainCheckpointer(str(tmp_path), save_every=1)
    ckpt.save(1, params, {})
    update = jax.jit(lambda p: jax.tree.map(lambda x: x * 0 - 1, p), donate_argnums=0)
    for _ in range(3):
        params = update(params)
    ckpt.wait()
    _, restored, _ = ckpt.restore_latest(abstract_of(params))
    np.testing.assert_array_equal(np.asarray(restored["w"]), expected)


def test_async_save_keeps_the_meta_as_passed_when_the_caller_then_changes_it(tmp_path, monkeypatch):
    """The SFT loop extends its list of losses in place after saving it: the checkpoint holds the list as it
    was at the save (the writer serializes later: a step-6 checkpoint got 7 losses under load, and its
    resume refused it)."""
    handed = []  # what the background writer is given to serialize
    json_save = checkpoint.ocp.args.JsonSave
    monkeypatch.setattr(checkpoint.ocp.args, "JsonSave", lambda item: handed.append(item) or json_save(item))
    ckpt = TrainCheckpointer(str(tmp_path), save_every=1)
    losses, position = [0.5, 0.25], {"epoch": 1}
    ckpt.save(1, {"w": jnp.zeros(4)}, {"losses": losses, "data": position})
    losses += [0.125]
    position["epoch"] = 2
    assert handed == [{"losses": [0.5, 0.25], "data": {"epoch": 1}}]
    ckpt.wait()
    _, _, meta = ckpt.restore_latest({"w": jax.ShapeDtypeStruct((4,), jnp.float32)})
    assert meta == {"losses": [0.5, 0.25], "data": {"epoch": 1}}


def test_restore_places_each_leaf_on_the_requested_mesh_sharding(tmp_path):
    state = make_state()
    ckpt = TrainCheckpointer(str(tmp_path), save_every=1)
    ckpt.save(1, state, {})
    ckpt.wait()

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("fsdp", "tensor"))
    specs = {2: P("fsdp", "tensor"), 1: P("tensor")}

    def sharding_for(path, x):
        name = jax.tree_util.keystr(path)
        if "keys" in name:
            return NamedSharding(mesh, P("fsdp"))
        if "raw_key" in name or x.ndim == 0:
            return NamedSharding(mesh, P())
        return NamedSharding(mesh, specs[x.ndim])

    shardings = jax.tree_util.tree_map_with_path(sharding_for, state)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    step, restored, _ = TrainCheckpointer(str(tmp_path), save_every=1).restore_latest(abstract, shardings)
    assert step == 1
    assert_bitwise_equal(restored, state)
    for (path, leaf), want in zip(jax.tree_util.tree_leaves_with_path(restored), jax.tree.leaves(shardings)):
        assert leaf.sharding == want, jax.tree_util.keystr(path)
    w = restored["params"]["w"]
    assert {s.data.shape for s in w.addressable_shards} == {(2, 2)} and len(w.addressable_shards) == 8


def test_should_save_force_and_keep_last_n(tmp_path):
    ckpt = TrainCheckpointer(str(tmp_path), save_every=2, max_to_keep=2)
    state = {"x": jnp.zeros(3)}
    saved = [step for step in range(1, 10) if ckpt.save(step, {"x": jnp.full(3, step)}, {"step": step})]
    assert saved == [2, 4, 6, 8]
    assert ckpt.save(9, state, {"step": 9}, force=True)
    assert not ckpt.save(9, state, {"step": 9}, force=True)  # already saved
    ckpt.wait()
    assert ckpt.all_steps() == [8, 9]
    assert sorted(os.listdir(ckpt.directory)) == ["8", "9"]
    step, restored, meta = ckpt.restore_latest(abstract_of(state))
    assert (step, meta) == (9, {"step": 9})


def _biggest_file(directory):
    """The largest file under `directory`: with random values, the array data."""
    files = [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs]
    return max(files, key=os.path.getsize)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


CORRUPTIONS = {
    "truncated array file": lambda d: _truncate(_biggest_file(os.path.join(d, "state"))),
    "deleted array file": lambda d: os.remove(_biggest_file(os.path.join(d, "state"))),
    "no commit marker": lambda d: os.remove(os.path.join(d, "commit_success.txt")),
    "truncated meta": lambda d: _truncate(os.path.join(d, "meta", "metadata")),
    "missing state item": lambda d: shutil.rmtree(os.path.join(d, "state")),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_corrupt_latest_falls_back_to_previous_with_warning(corruption, tmp_path, caplog):
    ckpt = TrainCheckpointer(str(tmp_path), save_every=1)
    states = {step: {"w": jax.random.normal(jax.random.key(step), (64, 64))} for step in (1, 2)}
    for step, state in states.items():
        ckpt.save(step, state, {"step": step})
    ckpt.wait()
    CORRUPTIONS[corruption](os.path.join(ckpt.directory, "2"))

    resumed = TrainCheckpointer(str(tmp_path), save_every=1)
    with caplog.at_level(logging.WARNING, logger="jaxsearch.checkpoint"):
        step, state, meta = resumed.restore_latest(abstract_of(states[1]))
    assert (step, meta) == (1, {"step": 1})
    assert_bitwise_equal(state, states[1])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step 2" in w and "unreadable" in w for w in warnings), warnings
    if corruption == "no commit marker":
        assert any("commit_success.txt" in w for w in warnings), warnings
    # The bad step is kept aside, and the resumed run can save step 2 again.
    assert sorted(os.listdir(resumed.directory)) == ["1", "2.corrupt"]
    assert resumed.save(2, states[2], {"step": 2})
    resumed.wait()
    assert resumed.restore_latest(abstract_of(states[1]))[0] == 2


def test_no_restorable_checkpoint_raises_and_renames_nothing(tmp_path):
    ckpt = TrainCheckpointer(str(tmp_path), save_every=1)
    ckpt.save(1, {"w": jnp.zeros(4)}, {})
    ckpt.wait()
    with pytest.raises(RuntimeError, match="step 1"):
        ckpt.restore_latest({"w": jax.ShapeDtypeStruct((5,), jnp.float32)})  # a state that does not match
    assert os.listdir(ckpt.directory) == ["1"]


def _run_script(body, workdir):
    script = textwrap.dedent(
        """
        import sys, time
        import jax, jax.numpy as jnp
        from jaxsearch.checkpoint import TrainCheckpointer, install_sigterm_handler
        workdir = sys.argv[1]
        """
    ) + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    return subprocess.Popen(
        [sys.executable, "-c", script, workdir],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_for_line(proc, prefix, timeout=HANG_S):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"no line {prefix!r}; stderr: {proc.stderr.read()[-2000:]}")


def test_sigkill_during_async_saves_leaves_a_restorable_latest(tmp_path):
    # Saves every step, each of an 8 MB state filled with its step number, so a save is almost always
    # in flight; the kill lands while an orbax tmp directory exists.
    proc = _run_script(
        """
        ckpt = TrainCheckpointer(workdir, save_every=1, max_to_keep=3)
        step = 0
        while True:
            step += 1
            ckpt.save(step, {"w": jnp.full((2048, 1024), step, jnp.float32), "key": jax.random.key(step)},
                      {"step": step})
            print("saving", step, flush=True)
        """,
        str(tmp_path),
    )
    _wait_for_line(proc, "saving 3")
    directory = os.path.join(tmp_path, "checkpoints")
    deadline = time.time() + HANG_S
    while (
        not any(".orbax-checkpoint-tmp" in name for name in os.listdir(directory)) and time.time() < deadline
    ):
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=HANG_S)
    proc.stdout.close()
    proc.stderr.close()
    left = os.listdir(directory)
    assert any(".orbax-checkpoint-tmp" in name for name in left), left

    abstract = {
        "w": jax.ShapeDtypeStruct((2048, 1024), jnp.float32),
        "key": jax.eval_shape(jax.random.key, 0),
    }
    ckpt = TrainCheckpointer(str(tmp_path), save_every=1)
    finished = [int(name) for name in left if name.isdigit()]
    step, state, meta = ckpt.restore_latest(abstract)
    assert step == max(finished) >= 2 and meta == {"step": step}
    np.testing.assert_array_equal(np.asarray(state["w"]), np.full((2048, 1024), step, np.float32))
    np.testing.assert_array_equal(
        jax.random.key_data(state["key"]), jax.random.key_data(jax.random.key(step))
    )
    assert not any(".orbax-checkpoint-tmp" in name for name in os.listdir(directory))  # cleaned on start


def test_sigterm_saves_and_exits_cleanly(tmp_path):
    proc = _run_script(
        """
        preempted = install_sigterm_handler()
        ckpt = TrainCheckpointer(workdir, save_every=1000)
        state = {"w": jnp.zeros(16)}
        step = 0
        while True:
            step += 1
            state = {"w": state["w"] + 1}
            time.sleep(0.02)
            print("step", step, flush=True)
            if preempted():
                ckpt.save(step, state, {"step": step, "reason": "preempted"}, force=True)
                ckpt.wait()
                print("saved", step, flush=True)
                sys.exit(0)
        """,
        str(tmp_path),
    )
    _wait_for_line(proc, "step 3")
    proc.send_signal(signal.SIGTERM)
    saved = int(_wait_for_line(proc, "saved").split()[1])
    assert proc.wait(timeout=HANG_S) == 0
    proc.stdout.close()
    proc.stderr.close()
    step, state, meta = TrainCheckpointer(str(tmp_path), save_every=1000).restore_latest(
        {"w": jax.ShapeDtypeStruct((16,), jnp.float32)}
    )
    assert step == saved >= 3 and meta == {"step": saved, "reason": "preempted"}
    np.testing.assert_array_equal(np.asarray(state["w"]), np.full(16, saved, np.float32))
