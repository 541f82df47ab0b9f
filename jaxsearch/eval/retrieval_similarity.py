"""R-S, Graph-R1's retrieval similarity: how close everything an episode retrieved is to the gold passages.

    rs = RetrievalSimilarity(Encoder("minilm"))
    scores = rs(gold_texts, retrieved_texts)     # per example: list of passages each side -> float or None

Per example, the gold passages are joined into one text and all retrieved passages into another (newline
separated, in order); R-S is the cosine of the two embeddings under a sentence encoder (Graph-R1 used SimCSE;
any `retrieval.encoders` spec works). None when either side is empty. The encoder truncates each joined text
to its `max_length` tokens (256 by default), as SimCSE truncates at 512.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class RetrievalSimilarity:
    """R-S per example under `encoder` (anything with `encode_passages(texts) -> [n, dim]`)."""

    def __init__(self, encoder):
        self.encoder = encoder

    def __call__(
        self, gold: Sequence[Sequence[str]], retrieved: Sequence[Sequence[str]]
    ) -> list[float | None]:
        """gold[i], retrieved[i]: passage texts of example i -> cosine of the joined texts, or None."""
        if len(gold) != len(retrieved):
            raise ValueError(f"{len(gold)} gold lists for {len(retrieved)} retrieved lists")
        scored = [i for i, (g, r) in enumerate(zip(gold, retrieved)) if g and r]
        out: list[float | None] = [None] * len(gold)
        if not scored:
            return out
        texts = ["\n".join(gold[i]) for i in scored] + ["\n".join(retrieved[i]) for i in scored]
        emb = np.asarray(self.encoder.encode_passages(texts), np.float64)
        emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        n = len(scored)
        cosines = (emb[:n] * emb[n:]).sum(axis=1)
        for i, c in zip(scored, cosines):
            out[i] = float(c)
        return out
