"""Convert a Qwen2 checkpoint between a HF safetensors directory and a jaxsearch orbax directory, optionally
merging a peft LoRA adapter into it.

  python launch/convert_checkpoint.py --to orbax --src HF_DIR --dst ORBAX_DIR [--dtype bfloat16]
  python launch/convert_checkpoint.py --to hf --src ORBAX_DIR --dst HF_DIR [--dtype bfloat16] [--max-shard-gb 5]
  python launch/convert_checkpoint.py --to hf --src HF_OR_ORBAX_DIR --adapter PEFT_DIR --dst HF_DIR

The HF side is what transformers' Qwen2ForCausalLM (and vLLM) load; the orbax side is what
`jaxsearch.models.orbax_io.restore_params` (and launch/eval.py) read. --src may be either, told apart by its
files (model.safetensors or model.safetensors.index.json: HF; params/: orbax). --adapter: a peft LoRA adapter
directory (adapter_config.json + adapter_model.safetensors, as LoRA training writes) of the model at --src,
merged into its weights (W + scale * A @ B): the destination is a plain full checkpoint. The destination is
replaced only once the new checkpoint is complete, and only if it is absent, empty or a checkpoint this
project wrote: anything else is refused before any work, and never deleted.
"""

import argparse
import os
import sys

import jax.numpy as jnp

from jaxsearch.files import claim_output_dir, mark


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--to", choices=["orbax", "hf"], required=True, help="format of the destination")
    parser.add_argument("--src", required=True, help="source checkpoint directory")
    parser.add_argument("--dst", required=True, help="destination directory: absent, empty or written here before (replaced when complete)")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="dtype of the written params (default: as stored)",
    )
    parser.add_argument("--max-shard-gb", type=float, default=5.0, help="HF shard size limit in GB")
    parser.add_argument("--adapter", default=None, help="peft LoRA adapter directory to merge into --src")
    args = parser.parse_args(argv)

    from jaxsearch.models import hf_io, lora, orbax_io, peft_io

    try:
        # an orbax params directory is this project's layout; an HF directory counts as ours only with the marker
        legacy = [("config.json", "params")] if args.to == "orbax" else []
        inputs = (args.src, args.adapter) if args.adapter else (args.src,)
        claim_output_dir(args.dst, "--dst", legacy=legacy, inputs=inputs, create=False)
        if _source_format(args.src, args.to) == "hf":
            config, params = hf_io.load_hf(args.src, dtype=jnp.dtype(args.dtype or "float32"))
        else:
            config, params = orbax_io.restore_params(args.src, dtype=args.dtype)
        if args.adapter:
            spec, adapters = peft_io.load_peft(args.adapter, config)
            params = lora.merge(config, spec, params, adapters)
        if args.to == "orbax":
            orbax_io.save_params(args.dst, config, params)
        else:
            hf_io.save_hf(config, params, args.dst, max_shard_bytes=int(args.max_shard_gb * 1024**3))
        mark(args.dst)
    except (ValueError, FileNotFoundError) as e:
        print(f"convert_checkpoint: error: {e}", file=sys.stderr)
        return 2
    n = config.num_params()
    merged = f", {args.adapter} merged" if args.adapter else ""
    print(f"wrote {args.dst} ({args.to}, {n / 1e6:.1f}M params, {config.param_dtype}{merged})")
    return 0


def _source_format(src: str, to: str) -> str:
    """'hf' or 'orbax', by the files in `src`; neither: the format --to converts from (whose loader then
    names what is missing)."""
    from jaxsearch.models import hf_io

    if any(os.path.exists(os.path.join(src, f)) for f in (hf_io.SINGLE_FILE, hf_io.INDEX_FILE)):
        return "hf"
    if os.path.isdir(os.path.join(src, "params")):
        return "orbax"
    return "hf" if to == "orbax" else "orbax"


if __name__ == "__main__":
    sys.exit(main())
