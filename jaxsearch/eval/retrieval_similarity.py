"""R-S, Graph-R1's retrieval similarity: how close everything an episode retrieved is to the gold passages.

    rs = RetrievalSimilarity(Encoder("minilm"))
    scores = rs(gold_texts, retrieved_texts)     # per example: list of passages each side -> float or None

As EKA computes it (yxzwang/EarlyKnowledgeAlignment `evaluation/rsim.py`, `eval_r.py`): per example, the gold
passages are joined into one text and all retrieved passages into another (newline separated, in order), both
SQuAD-normalized (lowercase, no punctuation, no articles, collapsed whitespace); R-S is the cosine of the two
embeddings under a sentence encoder (`Encoder("simcse")`, princeton-nlp/sup-simcse-roberta-large, for the real
benchmarks; any `retrieval.encoders` spec works). 0.0 when nothing was retrieved (rsim.py scores an empty
retrieval 0); None when the example has no gold passages. The encoder truncates each text to its `max_length`
tokens (SimCSE: 128, as EKA's `simcse/tool.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxsearch.scoring.metrics import normalize_answer


class RetrievalSimilarity:
    """R-S per example under `encoder` (anything with `encode_passages(texts) -> [n, dim]`)."""

    def __init__(self, encoder):
        self.encoder = encoder

    def __call__(
        self, gold: Sequence[Sequence[str]], retrieved: Sequence[Sequence[str]]
    ) -> list[float | None]:
        """gold[i], retrieved[i]: passage texts of example i -> cosine of the joined texts; 0.0 without
        retrieved passages, None without gold passages."""
        if len(gold) != len(retrieved):
            raise ValueError(f"{len(gold)} gold lists for {len(retrieved)} retrieved lists")
        scored = [i for i, (g, r) in enumerate(zip(gold, retrieved)) if g and r]
        out: list[float | None] = [0.0 if g else None for g in gold]
        if not scored:
            return out
        joined = lambda passages: normalize_answer("\n".join(passages))
        texts = [joined(gold[i]) for i in scored] + [joined(retrieved[i]) for i in scored]
        emb = np.asarray(self.encoder.encode_passages(texts), np.float64)
        emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        n = len(scored)
        cosines = (emb[:n] * emb[n:]).sum(axis=1)
        for i, c in zip(scored, cosines):
            out[i] = float(c)
        return out
