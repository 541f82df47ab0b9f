"""Orbax checkpoints of the trainer's resumable state (a model's params with its config: `models.orbax_io`).

`TrainCheckpointer` keeps the trainer's state (the trainer saves {"policy": TrainState[, "critic":
TrainState]}: params, optimizer state, update and skip counts) plus JSON metadata (the trainer saves the
data iterator's position) in `WORKDIR/checkpoints/<step>/` with an orbax CheckpointManager: async saves,
keep the last N, resume from the newest readable step. Nothing else is needed to resume: the reference
policy is the starting policy again, and sampling keys derive from (config.seed, step).
`install_sigterm_handler` turns a preemption signal into a flag the training loop polls.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
from typing import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils


log = logging.getLogger(__name__)

# Orbax writes this file into a step directory just before renaming it from its tmp name.
COMMIT_MARKER = "commit_success.txt"


STATE_ITEM = "state"
META_ITEM = "meta"


class TrainCheckpointer:
    """Periodic, async, keep-last-N checkpoints of the trainer state under `workdir/checkpoints`.

    Each step directory holds `state/` (any pytree of jax arrays, typed `jax.random.key` arrays included;
    the trainer's TrainStates) and `meta/` (JSON; the trainer's data-iterator position).
    Orbax writes a step into `<step>.orbax-checkpoint-tmp-*` and renames it once complete, so a
    crash mid-save (even SIGKILL) leaves only a tmp directory, which is ignored and removed on the
    next start.
    """

    def __init__(self, workdir: str, *, save_every: int, max_to_keep: int = 3, async_save: bool = True):
        if save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {save_every}")
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=(STATE_ITEM, META_ITEM)
        )

    def should_save(self, step: int) -> bool:
        """Whether `step` is a periodic save step (every `save_every` steps)."""
        return step > 0 and step % self.save_every == 0

    def save(self, step: int, state, meta: dict, force: bool = False) -> bool:
        """Start saving `state` and `meta` at `step` if it is a save step (or `force`); return whether it did.

        Returns once the arrays are copied off the devices (they may then be donated or changed) and `meta`
        is copied; the files are written in the background; `wait()` blocks until they are. A step already saved is
        skipped.
        """
        if not (force or self.should_save(step)) or step in self._manager.all_steps():
            return False
        # a meta that is not JSON fails here, in the caller, not in the writer thread; and the writer gets a copy:
        # it serializes later, after the caller may have changed its lists and dicts (the SFT loop's losses)
        meta = json.loads(json.dumps(meta))
        args = ocp.args.Composite(
            **{STATE_ITEM: ocp.args.StandardSave(state), META_ITEM: ocp.args.JsonSave(meta)}
        )
        return self._manager.save(step, args=args, force=True)

    def wait(self) -> None:
        """Block until every started save is on disk (raises what a background save raised)."""
        self._manager.wait_until_finished()

    def all_steps(self) -> list[int]:
        """The saved steps, ascending: those on disk when opened or restored, plus those saved since."""
        return sorted(self._manager.all_steps())

    def restore_latest(self, abstract_state, shardings=None):
        """Restore the newest readable checkpoint as `(step, state, meta)`, or None if there is none.

        abstract_state: a pytree like the saved state, of `jax.ShapeDtypeStruct` (or arrays) whose
        `.sharding` says where each leaf goes (None: the sharding it was saved with); shardings: a
        matching pytree of shardings that overrides them. Each array is read straight onto its devices. A
        checkpoint that fails to restore (no commit marker, missing or truncated files) is logged with a
        warning and the previous one is tried; once an older one restores, the unreadable newer ones are
        renamed `<step>.corrupt` so the resumed run can save those steps again; it prints `resumed from step
        N (checkpoint DIR)`. If none restores (e.g. `abstract_state` does not match what was saved), nothing
        is renamed and a RuntimeError lists every reason.
        """
        abstract_state = _abstract(abstract_state, shardings)
        self.wait()
        self._manager.reload()  # finished steps on disk; tmp directories of unfinished saves are not steps
        failures = []
        for step in reversed(self.all_steps()):
            try:
                state, meta = self._restore(step, abstract_state)
            except Exception as e:  # noqa: BLE001 - any failure to read means: fall back to the previous step
                reason = _plain_reason(e)
                log.warning(
                    "checkpoint step %d (%s) is unreadable: %s; trying the previous one",
                    step,
                    os.path.join(self.directory, str(step)),
                    reason,
                )
                failures.append((step, reason))
                continue
            for bad_step, _ in failures:
                self._move_aside(bad_step)
            if jax.process_index() == 0:  # shown at any log level: which checkpoint a run continues from
                print(f"resumed from step {step} (checkpoint {os.path.join(self.directory, str(step))})",
                      file=sys.stderr, flush=True)
            return step, state, meta
        if failures:
            reasons = "; ".join(f"step {step}: {reason}" for step, reason in failures)
            raise RuntimeError(f"{self.directory}: no checkpoint restores: {reasons}")
        return None

    def close(self) -> None:
        """Wait for pending saves and release orbax's threads."""
        self._manager.close()

    def _restore(self, step: int, abstract_state):
        step_dir = os.path.join(self.directory, str(step))
        if not os.path.exists(os.path.join(step_dir, COMMIT_MARKER)):
            raise FileNotFoundError(f"no {COMMIT_MARKER}: the save of step {step} did not finish")
        args = ocp.args.Composite(
            **{STATE_ITEM: ocp.args.StandardRestore(abstract_state), META_ITEM: ocp.args.JsonRestore()}
        )
        restored = self._manager.restore(step, args=args)
        return restored[STATE_ITEM], restored[META_ITEM]

    def _move_aside(self, step: int) -> None:
        if jax.process_index() == 0:
            src = os.path.join(self.directory, str(step))
            dst = src + ".corrupt"
            n = 1
            while os.path.exists(dst):
                dst, n = f"{src}.corrupt{n}", n + 1
            os.rename(src, dst)
            log.warning("moved unreadable checkpoint %s to %s", src, dst)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"jaxsearch_checkpoint_move_aside_{step}")
        self._manager.reload()


def _plain_reason(e: BaseException) -> str:
    """Why a restore failed, in one short line: the root cause, without the TensorStore spec that orbax's own
    message carries (a repr of hundreds of lines)."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = (str(e).strip().splitlines() or [""])[0]
    # TensorStore: 'OUT_OF_RANGE: Error reading "w/0.0" in OCDBT database at local file "DIR/state/": DETAIL'
    array = re.match(r'[A-Z_]+: Error reading "([^"]*)" in \w+ database at [^:]*: (.*)', text)
    if array:
        return f"array data {array.group(1)!r} is truncated or damaged ({array.group(2)})"
    missing = re.search(r'Item "(\w+)" was not found', text)
    if missing:
        return f"its {missing.group(1)}/ is missing"
    if isinstance(e, json.JSONDecodeError):
        return f"its {META_ITEM}/ is not valid JSON ({text})"
    if "TensorStore" in text:
        text = text.split("TensorStore")[0].rstrip(" :.(<")
    return f"{type(e).__name__}: {text}"[:300]


def _abstract(tree, shardings):
    """ShapeDtypeStructs for `tree`'s leaves, with `shardings` (if given) replacing their own."""
    if shardings is None:
        shardings = jax.tree.map(lambda x: getattr(x, "sharding", None), tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def install_sigterm_handler() -> Callable[[], bool]:
    """Catch SIGTERM (preemption) and return `preempted()`, True once it has arrived.

    The handler only sets a flag; the training loop polls `preempted()` once per step, saves with
    `force=True`, calls `wait()` and exits. With several processes `preempted()` is a collective (every
    process must call it at the same step) and is True on all of them once any one got SIGTERM, so
    they save the same step together. Call from the main thread.
    """
    received = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: received.set())

    def preempted() -> bool:
        if jax.process_count() == 1:
            return received.is_set()
        return bool(multihost_utils.process_allgather(np.array(received.is_set())).any())

    return preempted
