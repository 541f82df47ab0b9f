"""Shared pieces of the benchmarks: the anchor model sizes and timing."""

import statistics
import time

from jaxsearch.models.qwen2 import preset

# The sizes of ../shared/anchors (same shapes, so the figures can be read side by side).
SIZES = {
    "S": dict(
        vocab_size=8192,
        hidden_size=128,
        num_hidden_layers=4,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "M": dict(
        vocab_size=32000,
        hidden_size=512,
        num_hidden_layers=8,
        intermediate_size=1408,
        num_attention_heads=8,
        num_key_value_heads=2,
    ),
}
# Qwen2.5-0.5B's shape, from jaxsearch's preset (its published config.json), for the GPU measurement
_QWEN_05B = preset("qwen2.5-0.5b").to_hf_dict()
SIZES["0.5B"] = {k: _QWEN_05B[k] for k in (*SIZES["S"], "rope_theta", "rms_norm_eps")}


def hf_model(size: str, seed: int = 0):
    """A random transformers Qwen2 of a size in SIZES (fp32, eval, tied embeddings)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(**SIZES[size], tie_word_embeddings=True, max_position_embeddings=4096)
    return Qwen2ForCausalLM(cfg).eval()


def median_time(fn, reps: int) -> float:
    """Median wall time in seconds of `fn()` over `reps` calls (after one untimed warm-up call)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def alternated(runs: dict, reps: int) -> dict:
    """{name: the results of `reps` calls} of the callables `runs` {name: fn}, called in turn, round after
    round, after one untimed call each, so that a machine whose speed drifts slows them alike; each fn times
    itself (its result is what it measured)."""
    for fn in runs.values():
        fn()
    results = {name: [] for name in runs}
    for _ in range(reps):
        for name, fn in runs.items():
            results[name].append(fn())
    return results
