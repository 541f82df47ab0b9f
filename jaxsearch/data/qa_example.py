"""`QAExample`, one question with its golden answers (plain strings, or `Regex` patterns), and `QADataError`, the error for a QA source that cannot
be used: what every QA reader returns or raises (`qa` for FlashRAG / Search-R1 files, `tfds_source` for
tensorflow-datasets builders).
"""

from __future__ import annotations

import dataclasses
import re


class Regex(str):
    """A golden answer that is a regular expression (curatedtrec), matched case-insensitively."""

    @property
    def pattern(self) -> re.Pattern:
        return re.compile(self, re.IGNORECASE)


class QADataError(ValueError):
    """A QA file that cannot be used; the message names the file, line (or row) and field."""


@dataclasses.dataclass
class QAExample:
    """One question. `supporting_ids`: ids of the gold passages (None when the dataset has none);
    `prompt`: the row's own chat messages (Search-R1 parquet), None when it has none."""

    id: str
    question: str
    golden_answers: list[str]
    supporting_ids: list[str] | None = None
    metadata: dict = dataclasses.field(default_factory=dict)
    prompt: list[dict] | None = None

    @property
    def data_source(self) -> str | None:
        """Search-R1's `data_source` (nq, triviaqa, ...), None for rows without one."""
        return self.metadata.get("data_source")

    @property
    def key(self) -> tuple[str | None, str]:
        """(data_source, id): what identifies an example in a merged Search-R1 test set."""
        return self.data_source, self.id

    def to_json(self) -> dict:
        """The FlashRAG row; `supporting_ids` goes into `metadata` when present, `prompt` when not None."""
        metadata = dict(self.metadata)
        if self.supporting_ids is not None:
            metadata["supporting_ids"] = list(self.supporting_ids)
        row = {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "metadata": metadata,
        }
        if self.prompt is not None:
            row["prompt"] = [dict(m) for m in self.prompt]
        return row
