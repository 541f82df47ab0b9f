"""Qwen2 / Qwen2.5 / Qwen3 architecture config: `Qwen2Config` (sizes and numerics, from and to transformers'
config.json) and the Qwen2.5 and Qwen3 presets (from their published config.json).

    config = preset("qwen2.5-0.5b", dtype="bfloat16")
    config = preset("qwen3-4b")
    config = Qwen2Config.from_hf_json("ckpt/config.json")      # model_type "qwen2" or "qwen3"

The two families share one decoder (`models/qwen2.py`); `family` selects what differs:
    qwen2: q/k/v projections with biases
    qwen3: no q/k/v biases; q and k each RMS-normalised per head over head_dim (own scales [D]) before RoPE

The model (`models/qwen2.py`) re-exports these names: `qwen2.Qwen2Config`, `qwen2.preset`, `qwen2.PRESETS`.
"""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp

from jaxsearch.models.attention import IMPLS

FAMILIES = ("qwen2", "qwen3")  # transformers' model_type of each


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    """Architecture and numerics of a Qwen2 or Qwen3 decoder. Frozen: usable as a static jit argument."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    dtype: str = "float32"  # compute dtype of matmuls and activations
    param_dtype: str = "float32"
    remat: bool = False  # rematerialise each decoder layer in the backward pass
    logprob_chunk: int = 256  # sequence chunk of `token_logprobs` (bounds the [B, chunk, V] temporary)
    attention_chunk: int = 0  # > 0: queries in chunks of this many, each rematerialised (bounds the
    #                           [B, H, chunk, S] scores of a long training forward); 0: dense
    scan_layers: bool = False  # cache-free passes run the layers in a lax.scan over stacked params: each
    #                            layer's gathered (fsdp) weights and gradients live for one iteration only
    family: str = "qwen2"  # qwen2 | qwen3 (FAMILIES): see the module docstring
    attention_impl: str = "auto"  # prefill / training attention: reference | xla | cudnn | auto (IMPLS)
    # LoRA adapters passed with the params (`models/lora.py`): their scale and the dropout on their input in a
    # training forward (`lora.lora_config` sets both); unused without adapters
    lora_scale: float = 0.0
    lora_dropout: float = 0.0

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"Qwen2Config.family={self.family!r}: expected one of {', '.join(FAMILIES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size={self.hidden_size} is not a multiple of "
                    f"num_attention_heads={self.num_attention_heads}; set head_dim"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.attention_impl not in IMPLS:
            raise ValueError(
                f"Qwen2Config.attention_impl={self.attention_impl!r}: expected one of {', '.join(IMPLS)}"
            )
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in ("float32", "bfloat16", "float16"):
                raise ValueError(
                    f"Qwen2Config.{field}={getattr(self, field)!r}: expected float32, bfloat16 or float16"
                )

    @property
    def qkv_bias(self) -> bool:
        """q/k/v projections carry biases (Qwen2)."""
        return self.family == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """q and k are RMS-normalised per head before RoPE (Qwen3)."""
        return self.family == "qwen3"

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def weight_dtype(self):
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes) -> "Qwen2Config":
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        e, f, h, k, d, v = (
            self.hidden_size,
            self.intermediate_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.vocab_size,
        )
        attn = e * h * d + 2 * e * k * d + h * d * e
        if self.qkv_bias:
            attn += h * d + 2 * k * d
        if self.qk_norm:
            attn += 2 * d
        layer = attn + 3 * e * f + 2 * e
        return v * e * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * layer + e

    @classmethod
    def from_hf_dict(cls, cfg: dict, **overrides) -> "Qwen2Config":
        """From a transformers config.json dict: `model_type` qwen2 (the default when absent) or qwen3;
        rope_theta top-level or inside `rope_parameters` (transformers 5 writes it there)."""
        family = cfg.get("model_type", "qwen2")
        if family not in FAMILIES:
            raise ValueError(
                f"config.json field model_type={family!r}: expected one of {', '.join(FAMILIES)}"
            )
        if family == "qwen3" and cfg.get("attention_bias", False):
            raise ValueError(
                "config.json field attention_bias=true: only Qwen3 without attention biases is supported"
            )
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None:
            rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        missing = [
            k
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_attention_heads",
                "num_hidden_layers",
            )
            if k not in cfg
        ]
        if missing:
            raise ValueError(f"config.json lacks field(s) {missing}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json field hidden_act={cfg['hidden_act']!r}: only 'silu' is supported")
        kwargs = dict(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            num_hidden_layers=cfg["num_hidden_layers"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            head_dim=cfg.get("head_dim"),
            family=family,
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    @classmethod
    def from_hf_json(cls, path: str, **overrides) -> "Qwen2Config":
        with open(path) as f:
            try:
                cfg = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
        try:
            return cls.from_hf_dict(cfg, **overrides)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def to_hf_dict(self) -> dict:
        """The config.json that transformers' Qwen2ForCausalLM (or Qwen3ForCausalLM) reads."""
        out = {
            "architectures": ["Qwen3ForCausalLM" if self.family == "qwen3" else "Qwen2ForCausalLM"],
            "model_type": self.family,
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "use_cache": True,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "torch_dtype": self.param_dtype,
            "initializer_range": 0.02,
        }
        if self.family == "qwen3":
            out["attention_bias"] = False
        return out


def _preset(hidden, inter, heads, kv, layers, eps, tied, vocab, **more) -> Qwen2Config:
    fields = dict(rope_theta=1e6, max_position_embeddings=32768)
    fields.update(more)
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        num_hidden_layers=layers,
        rms_norm_eps=eps,
        tie_word_embeddings=tied,
        **fields,
    )


def _qwen3(hidden, inter, heads, layers, tied, **more) -> Qwen2Config:
    """Every Qwen3 dense checkpoint: 8 kv heads of 128 dims, eps 1e-6, vocab 151936, rope_theta 1e6, 40960
    positions (their config.json files; see PRESETS)."""
    more.setdefault("max_position_embeddings", 40960)
    return _preset(hidden, inter, heads, 8, layers, 1e-6, tied, 151936, family="qwen3", head_dim=128, **more)


# From the published config.json of each checkpoint. Qwen3: huggingface.co/Qwen/Qwen3-{0.6B,1.7B,4B,8B,14B}
# config.json, as copied in lightning-ai/litgpt litgpt/config.py (each entry cites its URL) and
# citsjtu2020/LLM-Prof sglang/Model_Config.md (4B, 8B, 14B verbatim); tied: 0.6B, 1.7B, 4B.
PRESETS: dict[str, Qwen2Config] = {
    "qwen2.5-0.5b": _preset(896, 4864, 14, 2, 24, 1e-6, True, 151936),
    "qwen2.5-1.5b": _preset(1536, 8960, 12, 2, 28, 1e-6, True, 151936),
    "qwen2.5-3b": _preset(2048, 11008, 16, 2, 36, 1e-6, True, 151936),
    "qwen2.5-7b": _preset(3584, 18944, 28, 4, 28, 1e-6, False, 152064),
    "qwen2.5-14b": _preset(5120, 13824, 40, 8, 48, 1e-5, False, 152064),
    "qwen3-0.6b": _qwen3(1024, 3072, 16, 28, True),
    "qwen3-1.7b": _qwen3(2048, 6144, 16, 28, True),
    "qwen3-4b": _qwen3(2560, 9728, 32, 36, True),
    "qwen3-8b": _qwen3(4096, 12288, 32, 36, False),
    "qwen3-14b": _qwen3(5120, 17408, 40, 40, False),
    # EKA's Qwen3 backbone (seed 000 appendix B.1): Qwen3-4B's shapes with a 262,144-position rope of theta
    # 5e6 (huggingface.co/Qwen/Qwen3-4B-Instruct-2507 config.json, as copied in akougkas/warpio-cli
    # warpio-docs/ai-docs/model_cards/qwen3:4b.md)
    "qwen3-4b-instruct-2507": _qwen3(
        2560, 9728, 32, 36, True, rope_theta=5e6, max_position_embeddings=262144
    ),
}


def preset(name: str, **overrides) -> Qwen2Config:
    if name not in PRESETS:
        raise KeyError(f"unknown Qwen2 / Qwen3 preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)
