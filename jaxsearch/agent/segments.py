"""Segment ids for tokens: which tag (`<think>`, `<search>`, `<information>` ...) each token sits in.

The labels come from the bytes of the tokens, never from re-encoded text, so a tag split over several
tokens (`"<"`, `"think"`, `">"`) or a token holding text on both sides of a tag (`"ing</"`, `">\\n\\n"`)
is handled exactly.

The rule, on the concatenated bytes of a sequence:

- A segment runs from the `<` of its opening tag to the `>` of its closing tag, both tags included; an
  unclosed segment runs to the end. Bytes outside every segment are "other".
- Segments do not nest: while one is open, only its own closing tag ends it, and any other tag inside is
  text (an observation that quotes `<answer>` stays "information"). Closing tags with nothing open are
  text.
- A token gets the segment of its first byte. A token whose first byte is "other" but which holds the
  `<` of an opening tag (`" <answer>"`, `"\\n<"`) belongs to the segment it opens. So the tokens of a tag
  belong to the segment they open or close, and a token that both closes one segment and opens the next
  (`">\\n<"`) belongs to the one it closes.

Label the generated part of a trajectory (policy segments and observations): the method prompts quote
tags in their instructions, some unclosed (SOAR's "<think> , <search> ... sequences"). A rollout labels
each observation on its own (`trajectories.response_segments`), so a tag the policy left open ends there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np

SEGMENT_IDS = {
    "other": 0,
    "think": 1,
    "search": 2,
    "answer": 3,
    "evidence": 4,
    "information_source": 5,
    "information": 6,
    "knowledge": 7,
}

_TAG = re.compile(r"<([A-Za-z_][A-Za-z0-9_\-]*)>")


def label_token_segments(token_texts: Sequence[bytes], tags: Mapping[str, str]) -> np.ndarray:
    """Segment id [T] int32 per token; `tags` maps an opening tag ("<query>") to a segment name ("search")."""
    names = _tag_segments(tags)
    offsets = np.cumsum([0] + [len(t) for t in token_texts])
    text = b"".join(token_texts)
    spans = _segment_spans(text, names)
    byte_segment = np.zeros(len(text) + 1, np.int32)
    for start, end, segment in spans:
        byte_segment[start:end] = segment
    token_start, token_end = offsets[:-1], offsets[1:]
    labels = byte_segment[token_start]
    if spans:
        span_starts = np.array([start for start, _, _ in spans])
        span_segments = np.array([segment for _, _, segment in spans], np.int32)
        nxt = np.searchsorted(span_starts, token_start)
        has_next = nxt < len(spans)
        nxt = np.minimum(nxt, len(spans) - 1)
        opens = (labels == 0) & has_next & (span_starts[nxt] < token_end)
        labels = np.where(opens, span_segments[nxt], labels)
    return labels.astype(np.int32)


def label_batch(
    token_ids: np.ndarray,
    lengths: Sequence[int],
    token_bytes: Callable[[int], bytes],
    tags: Mapping[str, str],
) -> np.ndarray:
    """Segment ids [B, T] int32 for right-padded rows of token ids [B, T]; positions >= lengths[b] get 0.

    `token_bytes` is the tokenizer's id -> bytes (e.g. `QwenTokenizer.token_bytes`).
    """
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2 or len(lengths) != token_ids.shape[0]:
        raise ValueError(
            f"token_ids must be [B, T] with one length per row, got {token_ids.shape}, {len(lengths)} lengths"
        )
    cache: dict[int, bytes] = {}
    out = np.zeros(token_ids.shape, np.int32)
    for row, length in enumerate(lengths):
        if not 0 <= length <= token_ids.shape[1]:
            raise ValueError(f"lengths[{row}]={length} is outside [0, {token_ids.shape[1]}]")
        ids = [int(i) for i in token_ids[row, :length]]
        for i in ids:
            if i not in cache:
                cache[i] = token_bytes(i)
        out[row, :length] = label_token_segments([cache[i] for i in ids], tags)
    return out


def _tag_segments(tags: Mapping[str, str]) -> dict[bytes, int]:
    """Tag name (b"query") -> segment id, with a clear error for a malformed tag or an unknown segment."""
    names = {}
    for tag, segment in tags.items():
        match = _TAG.fullmatch(tag)
        if match is None:
            raise ValueError(f"tag {tag!r} is not an opening tag like '<think>'")
        if segment not in SEGMENT_IDS:
            raise ValueError(f"tag {tag!r}: unknown segment {segment!r}; known: {sorted(SEGMENT_IDS)}")
        names[match.group(1).encode()] = SEGMENT_IDS[segment]
    return names


def _segment_spans(text: bytes, names: Mapping[bytes, int]) -> list[tuple[int, int, int]]:
    """(start, end, segment id) of each segment in `text`, in order, by the rule in the module docstring."""
    if not names:
        return []
    pattern = re.compile(rb"<(/?)(" + b"|".join(re.escape(n) for n in names) + rb")>")
    spans, open_name, open_start = [], None, 0
    for match in pattern.finditer(text):
        closing, name = match.group(1) == b"/", match.group(2)
        if open_name is None and not closing:
            open_name, open_start = name, match.start()
        elif open_name == name and closing:
            spans.append((open_start, match.end(), names[name]))
            open_name = None
    if open_name is not None:
        spans.append((open_start, len(text), names[open_name]))
    return spans
