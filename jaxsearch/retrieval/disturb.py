"""Disturbed retrieval for training: SOAR's "w/ disturb" runs (seed 001, Table 5 "QA Stability in Corrupted
Training", Table 6 "Evidence Fabrication in Corrupted Training").

SOAR trains SOAR, Search-R1, AutoRefine and IKEA "w/ disturb" but does not say what is disturbed nor how much
(neither the seed nor any public page we found states it). Table 6 disturbs methods that have no internal
stream (Search-R1, AutoRefine), so the disturbance must sit on the external side, the retrieved passages. Our
reading, the most literal one we can defend: in training rollouts only, a share `rate` of the passages each
search returns is replaced by passages retrieved for another training question (a "donor"): well-formed
evidence that does not answer the query. Evaluation never disturbs (`agent.build.for_evaluation` unwraps it).

Per query q, deterministic in (seed, q) alone: the same whatever the batch, scheduler, micro-batch or host:

    rng = numpy.random.default_rng(sha256(f"{seed}\\0{q}"))
    m = floor(rate * n) + (1 with probability frac(rate * n))    n = passages returned for q; m = rate * n on
                                                                  average, exactly when rate * n is an integer
    ranks = rng.choice(n, m, replace=False)                       the ranks replaced
    donor = donors[rng.integers(len(donors))]                      (the next one when it is q itself)
    the donor's top passages, best first, skipping any that q already returned, fill those ranks in order

The donors' passages come from one extra `search` call per call (all the call's donors, batched). Fewer
than m passages are replaced only when the donor's list runs short. The wrapper sees the policy's queries,
not its rows' questions: a donor that is the row's own question is not excluded (about 1 in len(donors)).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

from jaxsearch.retrieval.base import Doc, Retriever


class DisturbedRetriever:
    """`inner` with `rate` of each query's passages replaced by a donor question's (see the module docstring).

    inner: any `Retriever`; rate in [0, 1]; seed: the disturbance's own seed; donors: the questions whose
    passages stand in (the training questions)."""

    def __init__(self, inner: Retriever, rate: float, seed: int, donors: Sequence[str]):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"disturb rate {rate}: expected a share in [0, 1]")
        if rate > 0 and not donors:
            raise ValueError("a disturbed retriever needs donor questions (the training questions)")
        self.inner, self.rate, self.seed, self.donors = inner, float(rate), int(seed), list(donors)

    def plan(self, query: str, n: int) -> tuple[list[int], str | None]:
        """(the ranks to replace among n passages, the donor question) for `query`; ([], None) when none."""
        rng = np.random.default_rng(_seed_of(self.seed, query))
        share = round(self.rate * n, 9)  # 0.3 * 10 is 3.0000000000000004: exact shares stay exact
        whole = math.floor(share)
        m = whole + int(rng.random() < share - whole)
        if m == 0 or not self.donors:
            return [], None
        ranks = sorted(int(r) for r in rng.choice(n, size=m, replace=False))
        i = int(rng.integers(len(self.donors)))
        if self.donors[i] == query:
            i = (i + 1) % len(self.donors)
        return (ranks, self.donors[i]) if self.donors[i] != query else ([], None)

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """The inner retriever's top-k per query, each query's planned ranks swapped for donor passages."""
        results = self.inner.search(queries, k)
        plans = [self.plan(q, len(docs)) for q, docs in zip(queries, results)]
        donors = list(dict.fromkeys(d for _, d in plans if d is not None))
        if not donors:
            return results
        donor_docs = dict(zip(donors, self.inner.search(donors, k)))
        out = []
        for docs, (ranks, donor) in zip(results, plans):
            docs = list(docs)
            if donor is not None:
                own = {d.id for d in docs}
                spare = iter(d for d in donor_docs[donor] if d.id not in own)
                for rank, doc in zip(ranks, spare):
                    docs[rank] = doc
            out.append(docs)
        return out


def undisturbed(retriever):
    """The retriever without its disturbance (itself when it has none): what evaluation searches."""
    return retriever.inner if isinstance(retriever, DisturbedRetriever) else retriever


def _seed_of(seed: int, query: str) -> int:
    """A 64-bit seed from (seed, query), stable across processes and hosts (unlike Python's `hash`)."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{query}".encode()).digest()[:8], "little")
