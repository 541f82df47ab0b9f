"""What a training step logs: `StepTimer` (seconds per section) and `MetricWriter` (JSONL + TensorBoard).

timer = StepTimer()
with timer("rollout"): ...
metrics.update(timer.metrics())     # time/rollout_s, ..., time/step_s, time/other_s
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time


class StepTimer:
    """Wall-clock seconds per named section of one step; `metrics()` also gives the whole step and the part
    no section claims (`time/other_s`), so every second of a step is attributed."""

    def __init__(self):
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def metrics(self) -> dict[str, float]:
        total = self.elapsed()
        out = {f"time/{k}_s": v for k, v in self.seconds.items()}
        out["time/other_s"] = max(total - sum(self.seconds.values()), 0.0)
        out["time/step_s"] = total
        return out


class MetricWriter:
    """One JSON object per logged step in WORKDIR/metrics.jsonl (+ TensorBoard if tensorboardX is there)."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = None
        if enabled:
            try:
                SummaryWriter = _tensorboardx_writer()
                self._tb = SummaryWriter(os.path.join(workdir, "tb"))
            except ImportError:
                pass

    def write(self, step: int, values: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: float(v) for k, v in values.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, float(v), step)
            self._tb.flush()

    def drop_after(self, step: int) -> None:
        """Forget rows logged after `step` (a resumed run redoes those steps)."""
        if not (self.enabled and os.path.exists(self.path)):
            return
        with open(self.path) as f:
            rows = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        with open(self.path, "w") as f:
            f.writelines(rows)


def _tensorboardx_writer():
    """tensorboardX's SummaryWriter, imported without torch: tensorboardX imports torch wherever it is installed
    (3 s of a 2-core machine's start-up, in every training process) only to accept torch tensors, and we log
    floats. Raises ImportError without tensorboardX."""
    block = "torch" not in sys.modules  # imported already: nothing to save
    if block:
        sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX takes as "no torch"
    try:
        from tensorboardX import SummaryWriter
    finally:
        if block:
            del sys.modules["torch"]
    return SummaryWriter
