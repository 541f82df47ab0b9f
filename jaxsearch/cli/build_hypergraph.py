"""Build Graph-R1's knowledge hypergraph of a JSONL corpus (serve it with launch/serve_retriever.py).

    # the synthetic world, offline: facts read from the world itself, MiniLM embeddings
    python launch/build_hypergraph.py --world runs/tiny_cpu/world --encoder minilm --out indexes/world_hg
    # a benchmark corpus, facts by an OpenAI-compatible model (Graph-R1: gpt-4o-mini; or a vLLM server)
    OPENAI_API_KEY=... python launch/build_hypergraph.py --corpus datasets/2WikiMultiHopQA/corpus.jsonl \\
        --llm-url https://api.openai.com/v1 --llm-model gpt-4o-mini --out indexes/2wiki_hg
    python launch/serve_retriever.py --retriever hypergraph --index indexes/2wiki_hg --port 8001

Chunks of 1,200 tokens overlapping by 100; per chunk, n-ary facts (a knowledge segment with a completeness
score 0-10 and its entities: name, type, description, key score 0-100) in Graph-R1's record grammar, with up
to 2 gleaning passes; entities merged by upper-cased name; entities and hyperedges embedded (default
BAAI/bge-large-en-v1.5, Graph-R1's) into FAISS inner-product indexes.

The previous graph at --out stays loadable until the new one is complete (the build writes <out>.partial/
and renames at the end); --out must be absent, empty or a graph this project wrote (anything else is refused,
never deleted). Rerun the same command after an interruption: chunks already extracted are not
extracted again, embeddings resume from their last batch, and the model's replies are cached in
<out>.llm_cache.jsonl (--llm-cache), so a rebuild asks the model nothing it was asked before.
"""
import argparse
import os
import sys

# FAISS's OpenMP threads spin between calls and starve its BLAS threads (bench/retrieval.py). Must be set
# before faiss is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from jaxsearch.data.world.extractor import WorldExtractor  # noqa: E402
from jaxsearch.models.tokenizer import QwenTokenizer  # noqa: E402
from jaxsearch.retrieval import hypergraph_build, hypergraph_extract  # noqa: E402

MEMORY_NOTES = f"""memory:
{hypergraph_build.MEMORY}
the stored graph (E entities, H hyperedges, M entity-hyperedge incidences, d embedding dims): FAISS flat
indexes 4*d*(E+H) bytes, incidence arrays 12*M + 16*E + 12*H bytes; texts stay on disk (bench/RESULTS.md).
"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, epilog=MEMORY_NOTES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=None, help="JSONL corpus: {id, contents} or {id, title, text} per line "
                   "(default with --world: the world's corpus.jsonl)")
    p.add_argument("--world", default=None, help="a synthetic world's directory (launch/make_world.py): extract its "
                   "facts by rule, no model")
    p.add_argument("--out", required=True, help="hypergraph directory to write: absent, empty or a graph built here before")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    g = p.add_argument_group("chunking")
    g.add_argument("--chunk-tokens", type=int, default=hypergraph_build.CHUNK_TOKENS, help="tokens per chunk (1200)")
    g.add_argument("--chunk-overlap", type=int, default=hypergraph_build.CHUNK_OVERLAP, help="overlap (100)")
    g.add_argument("--chunk-tokenizer", default="qwen", help="qwen (shipped) or a tiktoken encoding, e.g. o200k_base "
                   "(Graph-R1's gpt-4o-mini tokens; tiktoken downloads its file once)")
    g = p.add_argument_group("LLM extractor (an OpenAI-compatible chat endpoint)")
    g.add_argument("--llm-url", default=None, help="base URL, e.g. http://127.0.0.1:8000/v1 (vLLM) or "
                   "https://api.openai.com/v1")
    g.add_argument("--llm-model", default="gpt-4o-mini", help="model name (default gpt-4o-mini, Graph-R1's)")
    g.add_argument("--llm-api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    g.add_argument("--llm-cache", default=None, help="reply cache file (default <out>.llm_cache.jsonl)")
    g.add_argument("--llm-concurrency", type=int, default=hypergraph_extract.LLM_CONCURRENCY,
                   help="chunks extracted at once (16, Graph-R1's)")
    g.add_argument("--llm-attempts", type=int, default=hypergraph_extract.LLM_ATTEMPTS,
                   help="attempts per request on connection errors, timeouts, 429 and 5xx (3, Graph-R1's)")
    g.add_argument("--llm-timeout", type=float, default=300.0, help="seconds per request")
    g.add_argument("--llm-temperature", type=float, default=None, help="sampling temperature (default: the "
                   "endpoint's, as Graph-R1 sends none)")
    g.add_argument("--llm-max-tokens", type=int, default=None, help="reply token limit (default: the endpoint's)")
    g.add_argument("--max-gleaning", type=int, default=hypergraph_extract.MAX_GLEANING,
                   help="extra 'continue' passes per chunk (2, Graph-R1's)")
    g.add_argument("--prompt-file", default=None, help="extraction prompt with {input_text} where the chunk goes "
                   "(default: ours, asking for Graph-R1's record grammar)")
    g = p.add_argument_group("embeddings")
    g.add_argument("--encoder", default="bge-large", help="bge-large (BAAI/bge-large-en-v1.5 with its query "
                   "instruction, Graph-R1's) | minilm | bge | e5 | a sentence-transformers model id or dir")
    g.add_argument("--batch-size", type=int, default=256, help="texts per encoder batch")
    g.add_argument("--device", default=None, help="encoder device, e.g. cuda or cpu (default: auto)")
    g.add_argument("--fp16", action="store_true", help="encode in float16 on CUDA")
    args = p.parse_args(argv)
    if bool(args.world) == bool(args.llm_url):
        p.error("give --world DIR (rule extractor) or --llm-url URL (LLM extractor), one of them")
    if not args.corpus and not args.world:
        p.error("--corpus is required with --llm-url")
    return args


def make_extractor(args):
    if args.world:
        return WorldExtractor.from_dir(args.world)
    prompt = hypergraph_extract.EXTRACTION_PROMPT
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            prompt = f.read()
    return hypergraph_extract.OpenAIExtractor(
        args.llm_url, args.llm_model, args.llm_cache or args.out.rstrip("/") + ".llm_cache.jsonl",
        api_key=os.environ.get(args.llm_api_key_env), concurrency=args.llm_concurrency,
        attempts=args.llm_attempts, timeout=args.llm_timeout, max_gleaning=args.max_gleaning,
        temperature=args.llm_temperature, max_tokens=args.llm_max_tokens, prompt=prompt)


def main(argv=None) -> int:
    args = parse_args(argv)
    from jaxsearch.retrieval.corpus import CorpusError
    from jaxsearch.retrieval.encoders import Encoder
    from jaxsearch.retrieval.hypergraph import hypergraph_encoder_spec

    from jaxsearch.retrieval.build import claim_out

    corpus = args.corpus or os.path.join(args.world, "corpus.jsonl")
    extractor = None
    try:
        claim_out(args.out, inputs=(corpus, args.world or ""))
        if not os.path.isfile(corpus):
            raise FileNotFoundError(f"{corpus}: no such corpus file")
        tokenizer = QwenTokenizer() if args.chunk_tokenizer == "qwen" else None
        chunker = hypergraph_build.TokenChunker(args.chunk_tokenizer, args.chunk_tokens, args.chunk_overlap, tokenizer)
        extractor = make_extractor(args)
        encoder = Encoder(hypergraph_encoder_spec(args.encoder), device=args.device, fp16=args.fp16)
        summary = hypergraph_build.build_hypergraph(corpus, args.out, extractor, encoder, chunker,
                                                    batch_size=args.batch_size, progress=not args.no_progress)
    except (CorpusError, ValueError, FileNotFoundError, OSError, hypergraph_extract.ExtractorUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the previous graph at {args.out} is untouched; rerun the same command to resume",
              file=sys.stderr)
        return 130
    finally:
        if extractor is not None:
            extractor.close()
    seconds = ", ".join(f"{stage} {s:.1f}s" for stage, s in summary["seconds"].items())
    print(f"wrote a hypergraph of {summary['num_hyperedges']} hyperedges, {summary['num_entities']} entities and "
          f"{summary['num_incidences']} incidences from {summary['num_chunks']} chunks to {args.out} ({seconds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
