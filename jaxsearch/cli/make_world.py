"""Generate a synthetic fictional world (corpus, multi-hop QA splits, word tokenizer) to train search agents.

  python launch/make_world.py --out DIR [--seed N] [--size tiny|small] [--overwrite]

Writes into DIR (FlashRAG layout):
  corpus.jsonl             passages {"id", "contents": "\\"Title\\"\\ntext"} (index with launch/build_index.py)
  {train,dev,test}.jsonl   {"id", "question", "golden_answers", "metadata": {"supporting_ids", "hops", ...}}
  world_config.json        the WorldConfig used (same config -> same files)
  tokenizer.json           a WordTokenizer built from the world's text

DIR must be absent, empty or a world this project wrote: anything else is refused, and never overwritten.
"""

import argparse
import collections
import os
import sys

from jaxsearch.data.world.generator import SIZES, generate_world, world_config
from jaxsearch.files import OutputDirError, claim_output_dir
from jaxsearch.models.word_tokenizer import WordTokenizer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="world seed (default 0)")
    parser.add_argument(
        "--size", choices=sorted(SIZES), default="tiny", help="world size preset (default tiny)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a world already in --out")
    args = parser.parse_args(argv)

    if os.path.exists(os.path.join(args.out, "corpus.jsonl")) and not args.overwrite:
        print(
            f"make_world: error: {args.out} already holds a world; pass --overwrite to replace it",
            file=sys.stderr,
        )
        return 2
    try:
        # a world written before the marker file: its config and tokenizer
        claim_output_dir(args.out, "--out", legacy=[("world_config.json", "tokenizer.json")])
    except OutputDirError as e:
        print(f"make_world: error: {e}", file=sys.stderr)
        return 2
    world = generate_world(world_config(args.size, args.seed))
    world.write(args.out)
    tokenizer = WordTokenizer.build(world.texts())
    tokenizer.save(os.path.join(args.out, "tokenizer.json"))

    n_entities = collections.Counter(
        e.kind + (" (distractor)" if e.distractor else "") for e in world.entities.values()
    )
    print(f"wrote {args.out}: {len(world.passages)} passages, vocab {tokenizer.vocab_size}")
    print("entities: " + ", ".join(f"{k} {n}" for k, n in sorted(n_entities.items())))
    for split, examples in world.questions.items():
        by_type = collections.Counter(f"{q.metadata['hops']}-hop {q.metadata['type']}" for q in examples)
        print(
            f"{split}: {len(examples)} questions: "
            + ", ".join(f"{k} {n}" for k, n in sorted(by_type.items()))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
