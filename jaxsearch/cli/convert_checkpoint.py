"""Convert a Qwen2 checkpoint between a HF safetensors directory and a jaxsearch orbax directory.

  python launch/convert_checkpoint.py --to orbax --src HF_DIR --dst ORBAX_DIR [--dtype bfloat16]
  python launch/convert_checkpoint.py --to hf --src ORBAX_DIR --dst HF_DIR [--dtype bfloat16] [--max-shard-gb 5]

The HF side is what transformers' Qwen2ForCausalLM (and vLLM) load; the orbax side is what
`jaxsearch.models.orbax_io.restore_params` (and launch/eval.py) read. The destination is replaced only once
the new checkpoint is complete, and only if it is absent, empty or a checkpoint this project wrote: anything
else is refused before any work, and never deleted.
"""

import argparse
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
    args = parser.parse_args(argv)

    from jaxsearch.models import orbax_io
    from jaxsearch.models import hf_io

    try:
        # an orbax params directory is this project's layout; an HF directory counts as ours only with the marker
        legacy = [("config.json", "params")] if args.to == "orbax" else []
        claim_output_dir(args.dst, "--dst", legacy=legacy, inputs=(args.src,), create=False)
        if args.to == "orbax":
            config, params = hf_io.load_hf(args.src, dtype=jnp.dtype(args.dtype or "float32"))
            orbax_io.save_params(args.dst, config, params)
        else:
            config, params = orbax_io.restore_params(args.src, dtype=args.dtype)
            hf_io.save_hf(config, params, args.dst, max_shard_bytes=int(args.max_shard_gb * 1024**3))
        mark(args.dst)
    except (ValueError, FileNotFoundError) as e:
        print(f"convert_checkpoint: error: {e}", file=sys.stderr)
        return 2
    n = config.num_params()
    print(f"wrote {args.dst} ({args.to}, {n / 1e6:.1f}M params, {config.param_dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
