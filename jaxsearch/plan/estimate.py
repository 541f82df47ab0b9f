"""Seconds per RL step of a config on N chips, from FLOPs and bytes (no compilation, no measurement)."""

from __future__ import annotations

from jaxsearch.agent.policy import model_config
from jaxsearch.config import RunConfig

# Per chip: dense bf16 FLOP/s, HBM bytes/s, and the bytes/s one chip receives in an all-gather over its
# interconnect (v5p: 4,800 Gbps ICI = 600 GB/s; H100 SXM: NVLink 900 GB/s bidirectional = 450 GB/s in).
HARDWARE = {
    "v5p": dict(flops=459e12, hbm=2.765e12, gather=600e9),
    "h100": dict(flops=989e12, hbm=3.35e12, gather=450e9),
}


def step_time_estimate(
    cfg,
    chips: int,
    hardware: str,
    mfu: float = 0.4,
    seq_len: int = 2048,
    decode_steps: int | None = None,
    tensor: int = 1,
) -> dict:
    """Seconds per RL step of config `cfg` on `chips` chips, from FLOPs and bytes (no measurement):

    update    (6 + 2 remat) N T for fwd + bwd per token, + 2 x 2 N T for the old-policy and reference
              log-prob passes (4 when kl_coef = 0 and a single epoch: no reference); T = rows x seq_len;
              at `mfu` of the chips' peak
    rollout   `decode_steps` sequential steps (default max_turns x max_segment_tokens, every segment running
              to its budget: an upper bound) per rollout micro-batch; each step is bound by the slowest of
              all-gathering the bf16 weights (decode layout "train": the sampler reads the fsdp-sharded
              params), reading the KV cache (split over the chips) and the weights from HBM (a chip reads
              1 / chips of them in the train layout, all of them replicated, 1 / tensor of them
              tensor-parallel over a `tensor` axis of that size), and its FLOPs
    """
    cfg = RunConfig.from_dict(cfg)
    config = model_config(cfg.model)
    hw = HARDWARE[hardware]
    n = config.num_params()
    rows = cfg.data.batch_size * cfg.data.group_size
    tokens = rows * seq_len
    passes = 8 + 2 + (2 if (cfg.algo.kl_coef or cfg.algo.kl_in_reward) else 0)
    if cfg.algo.advantage == "gae":
        passes *= 2  # the critic: its own forward, backward and value pass
    update_flops = passes * n * tokens
    update_s = update_flops / (chips * hw["flops"] * mfu)

    steps = decode_steps or cfg.rollout.max_turns * cfg.rollout.max_segment_tokens
    micro = cfg.rollout.micro_batch or rows
    n_micro = -(-rows // micro)
    weight_bytes = 2 * n  # bf16
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
    kv_bytes = micro * seq_len * kv_per_token  # the cache read by each step (average context seq_len)
    layout = cfg.rollout.decode_layout
    gather_s = weight_bytes * (chips - 1) / chips / hw["gather"] if layout == "train" else 0.0
    weights_read = {
        "train": weight_bytes / chips,
        "replicated": weight_bytes,
        "tensor": weight_bytes / tensor,
    }
    hbm_s = (weights_read[layout] + kv_bytes / chips) / hw["hbm"]
    flops_s = 2 * n * micro / (chips * hw["flops"])
    per_step = max(gather_s, hbm_s, flops_s)
    rollout_s = n_micro * steps * per_step
    return dict(
        chips=chips,
        hardware=hardware,
        update_tflop=update_flops / 1e12,
        update_s=update_s,
        decode_step_ms=per_step * 1e3,
        decode_bound="all-gather" if per_step == gather_s else ("hbm" if per_step == hbm_s else "flops"),
        rollout_s=rollout_s,
        step_s=update_s + rollout_s,
        assumptions=dict(
            mfu=mfu, seq_len=seq_len, decode_steps=steps, rollout_micro_batches=n_micro, decode_layout=layout
        ),
    )


def format_estimate(e: dict) -> str:
    a = e["assumptions"]
    return (
        f"estimated step on {e['chips']} x {e['hardware']}: {e['step_s']:.0f} s = update {e['update_s']:.0f} s "
        f"({e['update_tflop'] / 1e3:.0f} PFLOP at {a['mfu']:.0%} MFU) + rollout <= {e['rollout_s']:.0f} s "
        f"({a['rollout_micro_batches']} x {a['decode_steps']} decode steps of {e['decode_step_ms']:.1f} ms, "
        f"{e['decode_bound']}-bound, decode layout {a['decode_layout']}); {a['seq_len']} tokens per row on average"
    )
