"""A small word-level tokenizer for fast CPU training on the synthetic world (implements `Tokenizer`).

Vocabulary, in id order: the control tokens (`<pad>`=0, `<unk>`=1, `<|endoftext|>`, `<|im_start|>`,
`<|im_end|>`), the agent tags (`<think>` ... `</information_source>`) and the same tags preceded by a space,
every printable ASCII character plus newline and tab, then the words (letter runs and digit runs) of the texts
it was built from, most frequent first, each also with a leading space (" Velmar").

Encoding splits text into pieces: a tag, a word, a digit run or one other character, each optionally preceded
by one space; or one whitespace character. A piece in the vocabulary is one token (tags always are); a spaced
piece not in it becomes a space then the piece; a piece still unknown becomes its characters.

Normalisation: "\\r\\n" and "\\r" become "\\n". Then `decode(encode(s)) == s` for every string of printable
ASCII, spaces, newlines and tabs; any other character becomes `<unk>`. Control-token text becomes its control
id only with `allow_special=True` (otherwise it is spelled out), so user content cannot forge a turn boundary;
tags are ordinary tokens, as in Qwen's vocabulary, and `decode(..., skip_special=True)` keeps them.
"""

from __future__ import annotations

import collections
import json
import os
import re
from collections.abc import Iterable, Sequence


from jaxsearch.models.tokenizer import ChatBatchingMixin

CONTROL_TOKENS = ("<pad>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
TAGS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
    "<knowledge>",
    "</knowledge>",
    "<evidence>",
    "</evidence>",
    "<information_source>",
    "</information_source>",
)
CHARACTERS = ("\n", "\t", *(chr(c) for c in range(32, 127)))
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
ALWAYS_INCLUDED = f"system user assistant {DEFAULT_SYSTEM_PROMPT}"  # what `apply_chat_template` adds
FORMAT = "jaxsearch.word_tokenizer.v1"

_WORD = re.compile(r"[A-Za-z]+|[0-9]+")
_PIECE = re.compile(r" ?(?:<\|[a-z_]+\|>|</?[a-z_]+>|[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9])|\s")


class WordTokenizer(ChatBatchingMixin):
    """Word-level tokenizer; build it with `WordTokenizer.build(texts)`, persist with `save` / `load`."""

    def __init__(self, tokens: Sequence[str]):
        fixed = (*CONTROL_TOKENS, *TAGS, *(" " + t for t in TAGS), *CHARACTERS)
        if tuple(tokens[: len(fixed)]) != fixed:
            raise ValueError("tokens must start with the control tokens, tags, spaced tags and characters")
        self._tokens = list(tokens)
        self._ids = {token: i for i, token in enumerate(self._tokens)}
        if len(self._ids) != len(self._tokens):
            duplicates = [t for t, n in collections.Counter(self._tokens).items() if n > 1]
            raise ValueError(f"duplicate tokens: {duplicates[:5]}")
        self._control_ids = frozenset(self._ids[t] for t in CONTROL_TOKENS)
        self.vocab_size: int = len(self._tokens)
        self.pad_id: int = self._ids["<pad>"]
        self.default_system_prompt = DEFAULT_SYSTEM_PROMPT
        self.unk_id: int = self._ids["<unk>"]
        self.eos_id: int = self._ids["<|im_end|>"]

    @classmethod
    def build(cls, texts: Iterable[str], min_count: int = 1) -> WordTokenizer:
        """The vocabulary of `texts`: words seen at least `min_count` times, and the chat template's words.

        Pass every text the model will see: corpus, questions, answers and the protocol's prompt and
        observation templates. Words left out still round-trip, one character per token.
        """
        counts = collections.Counter(_WORD.findall(ALWAYS_INCLUDED))
        for text in texts:
            counts.update(_WORD.findall(text))
        words = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
        tokens = [*CONTROL_TOKENS, *TAGS, *(" " + t for t in TAGS), *CHARACTERS]
        for word in words:  # a one-character word is already a character token
            tokens += [word, " " + word] if len(word) > 1 else [" " + word]
        return cls(tokens)

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Text -> ids (see the module docstring for pieces and normalisation)."""
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        ids: list[int] = []
        for piece in _PIECE.findall(text):
            core = piece[1:] if len(piece) > 1 and piece[0] == " " else piece
            if core in CONTROL_TOKENS and not allow_special:
                ids.extend(self._ids.get(c, self.unk_id) for c in piece)
            elif piece in self._ids:
                ids.append(self._ids[piece])
            elif core in self._ids:
                ids += [self._ids[" "], self._ids[core]]
            else:
                ids.extend(self._ids.get(c, self.unk_id) for c in piece)
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Ids -> text; control tokens give their text unless `skip_special` (tags are always kept)."""
        ids = [self._check_id(i) for i in ids]
        return "".join(self._tokens[i] for i in ids if not (skip_special and i in self._control_ids))

    def token_to_id(self, token: str) -> int:
        try:
            return self._ids[token]
        except KeyError:
            raise KeyError(f"unknown token {token!r}") from None

    def id_to_token(self, token_id: int) -> str:
        return self._tokens[self._check_id(token_id)]

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes of one token's text; `decode(ids)` is the decoding of their concatenation."""
        return self.id_to_token(token_id).encode("utf-8")

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, "tokens": self._tokens}, f, ensure_ascii=False, indent=0)

    @classmethod
    def load(cls, path: str | os.PathLike) -> WordTokenizer:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{os.fspath(path)}: not a word tokenizer file (expected format {FORMAT!r})")
        return cls(data["tokens"])

    def _check_id(self, token_id: int) -> int:
        token_id = int(token_id)
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is out of range [0, {self.vocab_size})")
        return token_id
