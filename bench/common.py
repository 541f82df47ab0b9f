"""Shared pieces of the benchmarks: the anchor model sizes and timing."""

import statistics
import time

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
    # Qwen2.5-0.5B's shape (its config.json on the Hugging Face hub: vocab 151936, hidden 896, 24 layers,
    # intermediate 4864, 14 / 2 heads, tied embeddings, rope_theta 1e6); for the GPU measurement
    "0.5B": dict(
        vocab_size=151936,
        hidden_size=896,
        num_hidden_layers=24,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        rope_theta=1000000.0,
    ),
}


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
