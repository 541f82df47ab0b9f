"""Builds tiny transformers Qwen2 and Qwen3 models with random weights: the independent reference of the model
tests."""

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

# Three tiny configs that differ in tying, GQA ratio (1 kv head included), head dim and rope theta.
TINY_CONFIGS = {
    "tied_gqa4_mqa": dict(
        vocab_size=311,
        hidden_size=64,
        intermediate_size=160,
        num_attention_heads=4,
        num_key_value_heads=1,
        num_hidden_layers=2,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    ),
    "untied_gqa2_hd32": dict(
        vocab_size=257,
        hidden_size=48,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=3,
        head_dim=32,
        tie_word_embeddings=False,
        rope_theta=1e6,
    ),
    "untied_mha_theta500": dict(
        vocab_size=199,
        hidden_size=96,
        intermediate_size=128,
        num_attention_heads=6,
        num_key_value_heads=6,
        num_hidden_layers=2,
        tie_word_embeddings=False,
        rope_theta=500.0,
        rms_norm_eps=1e-5,
    ),
}


# Two tiny Qwen3 configs, tied and untied, whose head_dim is not hidden_size / heads (larger, then smaller).
TINY_QWEN3_CONFIGS = {
    "qwen3_tied_gqa2_hd32": dict(
        vocab_size=211,
        hidden_size=48,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        head_dim=32,
        tie_word_embeddings=True,
        rope_theta=1e6,
    ),
    "qwen3_untied_mqa_hd8": dict(
        vocab_size=173,
        hidden_size=64,
        intermediate_size=80,
        num_attention_heads=6,
        num_key_value_heads=1,
        num_hidden_layers=2,
        head_dim=8,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
    ),
}


def make_hf_model(name: str, seed: int = 0, init_std: float = 0.02) -> Qwen2ForCausalLM | Qwen3ForCausalLM:
    """A random transformers Qwen2 (a TINY_CONFIGS name) or Qwen3 (a TINY_QWEN3_CONFIGS name) with non-zero
    biases and non-unit norm weights (q/k norms included), fp32, eval mode.

    init_std 0.2 gives a model whose greedy output varies (at 0.02 it repeats one or two tokens).
    """
    torch.manual_seed(seed)
    qwen3 = name in TINY_QWEN3_CONFIGS
    config_cls, model_cls = (Qwen3Config, Qwen3ForCausalLM) if qwen3 else (Qwen2Config, Qwen2ForCausalLM)
    sizes = TINY_QWEN3_CONFIGS[name] if qwen3 else TINY_CONFIGS[name]
    cfg = config_cls(max_position_embeddings=512, initializer_range=init_std, **sizes)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.5)
            elif "norm" in pname:
                p.copy_(1.0 + torch.randn_like(p) * 0.2)
    return model


def hf_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return (
            model(
                input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
            )
            .logits.float()
            .numpy()
        )


def left_padded_batch(vocab: int, lengths, seed: int = 0):
    """Random ids [B, T] with row b left-padded to max(lengths); mask [B, T]."""
    rng = np.random.default_rng(seed)
    t = max(lengths)
    ids = rng.integers(0, vocab, size=(len(lengths), t))
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        mask[b, t - n :] = 1
        ids[b, : t - n] = 0
    return ids, mask
