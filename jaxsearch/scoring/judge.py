"""Chat-model backends for model-backed rewards: R-Search's evidence answerer and SOAR's judge (host side).

One small interface, `ChatModel.chat(batch, max_tokens, temperature, top_p) -> list[str]` (one reply per
conversation of OpenAI-style `{"role", "content"}` messages), with two backends:

    OpenAIChatModel(base_url, model)      an OpenAI-compatible /v1/chat/completions server (vLLM, sglang):
                                          concurrent requests, retries with exponential backoff
    LocalChatModel(config, params, tok, cache_len, max_new_tokens)   an in-process jaxsearch model,
                                          batched through the jitted sampler in fixed-size chunks
    make_chat_model("openai" | "local", **kwargs)                    pick one from a config

and the adapters the rewards take (`jaxsearch.scoring.rewards`):

    ChatJudge(chat_model)                 implements `Judge` (SOAR's evidence-fabrication judge)
    ChatEvidenceAnswerer(chat_model)      implements `EvidenceAnswerer` with R-Search's evidence prompt

Source: R-Search (seed 002; QingFei1/R-Search `scripts/evidence.yaml`, `reward_score/qa_f1.py` call_llm): the
frozen answerer (Llama-3.2-3B-Instruct behind vLLM) gets one user message with the prompt below,
max_tokens 512, temperature 0.1, top_p 0.9, and its whole reply is the answer scored by F1.
"""

from __future__ import annotations

import os
import string
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import httpx
import jax.numpy as jnp

from jaxsearch.models.word_tokenizer import WordTokenizer
from jaxsearch.models import hf_io, orbax_io
from jaxsearch.models.tokenizer import QwenTokenizer
from jaxsearch.scoring import rewards as rewards_lib
from jaxsearch.scoring.rewards import extract_answer
from jaxsearch.agent.sampler import Sampler, SamplingParams, StopTable

RSEARCH_EVIDENCE_PROMPT = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nThe following are given passages:\n{evidence}\n\nQuestion: {question}\nAnswer:"
)


class ChatModel(Protocol):
    """A chat model: one reply per conversation."""

    def chat(
        self, batch: list[list[dict]], max_tokens: int, temperature: float, top_p: float = 1.0
    ) -> list[str]: ...


# -------------------------------------------------------------------------------- OpenAI backend


class ChatModelUnavailable(RuntimeError):
    """The chat server did not answer (connection errors, timeouts, 5xx, 429) through every retry."""


def chat_completions_url(base_url: str) -> str:
    """`http://h:p`, `http://h:p/v1` or the full `.../v1/chat/completions` -> the full endpoint."""
    url = base_url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")


class OpenAIChatModel:
    """Client of an OpenAI-compatible `/v1/chat/completions` server (vLLM / sglang serve one).

    A batch is sent as concurrent requests, at most `max_concurrency` at once. Each request is retried
    on connection errors, timeouts, 5xx and 429, waiting `backoff * 2**i` seconds before retry i + 1,
    and raises `ChatModelUnavailable` naming the URL and the attempts after `retries` retries. Any other
    4xx raises ValueError at once with the server's message.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_concurrency: int = 16,
    ):
        self.url, self.model = chat_completions_url(base_url), model
        self.retries, self.backoff, self.max_concurrency = retries, backoff, max_concurrency
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
        self._http = httpx.Client(timeout=timeout, headers=headers, limits=limits)

    def chat(
        self, batch: list[list[dict]], max_tokens: int, temperature: float, top_p: float = 1.0
    ) -> list[str]:
        if not batch:
            return []
        payloads = [
            {
                "model": self.model,
                "messages": list(m),
                "max_tokens": int(max_tokens),
                "temperature": float(temperature),
                "top_p": float(top_p),
            }
            for m in batch
        ]
        with ThreadPoolExecutor(min(self.max_concurrency, len(payloads))) as pool:
            futures = [pool.submit(self._complete, p) for p in payloads]
            try:
                return [f.result() for f in futures]
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise

    def _complete(self, payload: dict) -> str:
        """One request with retries -> the reply's text."""
        start, error = time.monotonic(), ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self._http.post(self.url, json=payload)
            except httpx.TransportError as e:
                error = f"{type(e).__name__}: {e}"
                continue
            if response.status_code >= 500 or response.status_code == 429:
                error = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                raise ValueError(
                    f"{self.url} rejected the request (HTTP {response.status_code}): {response.text[:500]}"
                )
            return self._reply_text(response)
        raise ChatModelUnavailable(
            f"chat server {self.url} is down: {self.retries + 1} attempts over "
            f"{time.monotonic() - start:.1f}s failed; last error: {error}. Is it running at this base_url?"
        )

    def _reply_text(self, response: httpx.Response) -> str:
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ValueError(
                f"{self.url}: expected a chat completion with choices[0].message.content, "
                f"got {response.text[:200]!r}"
            ) from None
        return content or ""

    def close(self) -> None:
        self._http.close()


# --------------------------------------------------------------------------------- local backend


class LocalChatModel:
    """An in-process jaxsearch model as a chat model (greedy when temperature is 0).

    Conversations are rendered with the tokenizer's chat template and decoded by the jitted sampler in
    chunks of `batch_size` rows; the last chunk is padded with copies of a prompt (which decode nothing),
    so shapes stay static. A reply ends at the tokenizer's eos or after `max_tokens`, capped by
    `max_new_tokens` (the decode loop's static length). Each temperature gets its own compiled sampler;
    the one for `temperature` (top_p 1) is built here. Sampled chunks use seeds `seed`, `seed + 1`, ... in call order.

    tokenizer: a Tokenizer, "qwen" for Qwen2.5's, or the path of a word-tokenizer JSON file.
    """

    def __init__(
        self,
        config,
        params,
        tokenizer,
        cache_len: int,
        max_new_tokens: int,
        temperature: float = 0.0,
        batch_size: int = 8,
        seed: int = 0,
    ):
        tokenizer = _tokenizer(tokenizer)
        self.config, self.params, self.tokenizer = config, params, tokenizer
        self.cache_len, self.max_new_tokens, self.batch_size = cache_len, max_new_tokens, batch_size
        self.table = StopTable.build(tokenizer, [], [tokenizer.eos_id], config.vocab_size)
        self._samplers: dict[tuple[float, float], Sampler] = {}
        self._next_seed = seed
        self.sampler(temperature)

    @classmethod
    def load(cls, path: str, tokenizer, dtype=jnp.float32, **kwargs) -> LocalChatModel:
        """From a checkpoint dir: jaxsearch params (config.json + params/) or HF safetensors."""
        if os.path.isdir(os.path.join(path, "params")):
            config, params = orbax_io.restore_params(path, dtype=dtype)
        else:
            config, params = hf_io.load_hf(path, dtype=dtype)
        return cls(config, params, tokenizer, **kwargs)

    def sampler(self, temperature: float, top_p: float = 1.0) -> Sampler:
        """The sampler decoding at `temperature` and `top_p` (built and cached on first use)."""
        key = (float(temperature), float(top_p) if temperature else 1.0)
        if key not in self._samplers:
            self._samplers[key] = Sampler(
                self.config, self.table, self.cache_len, self.max_new_tokens, SamplingParams(*key)
            )
        return self._samplers[key]

    def chat(
        self, batch: list[list[dict]], max_tokens: int, temperature: float, top_p: float = 1.0
    ) -> list[str]:
        tok = self.tokenizer
        budget = min(int(max_tokens), self.max_new_tokens)
        prompts = [
            tok.encode(tok.apply_chat_template(m, add_generation_prompt=True), allow_special=True)
            for m in batch
        ]
        for i, p in enumerate(prompts):
            if len(p) + budget > self.cache_len:
                raise ValueError(
                    f"conversation {i}: {len(p)} prompt tokens + {budget} new tokens "
                    f"exceed cache_len={self.cache_len}"
                )
        sampler = self.sampler(temperature, top_p)
        replies = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            new = sampler.complete(self.params, chunk, self._next_seed, budget, rows=self.batch_size)
            self._next_seed += 1
            replies += [tok.decode(ids, skip_special=True) for ids in new]
        return replies


def _tokenizer(spec):
    """A Tokenizer as given, "qwen" -> QwenTokenizer(), a path -> WordTokenizer.load(path)."""
    if not isinstance(spec, (str, os.PathLike)):
        return spec
    return QwenTokenizer() if spec == "qwen" else WordTokenizer.load(spec)


# ---------------------------------------------------------------------------------------- factory

CHAT_MODEL_KINDS = ("openai", "local")


def make_chat_model(kind: str, **kwargs) -> ChatModel:
    """openai: `OpenAIChatModel(**kwargs)` (base_url, model, ...).
    local:  `LocalChatModel.load(**kwargs)` given path= (and tokenizer=, cache_len=, max_new_tokens=, ...),
            else `LocalChatModel(**kwargs)` (config, params, tokenizer, ...).
    """
    if kind == "openai":
        return OpenAIChatModel(**kwargs)
    if kind == "local":
        return LocalChatModel.load(**kwargs) if "path" in kwargs else LocalChatModel(**kwargs)
    raise ValueError(f"unknown chat model kind {kind!r}; choose from {CHAT_MODEL_KINDS}")


# --------------------------------------------------------------------------------------- adapters


class ChatJudge:
    """`Judge` over a chat model: one reply per conversation (the rewards build the system and user messages)."""

    def __init__(self, chat_model: ChatModel, max_tokens: int = 512, temperature: float = 0.0):
        self.chat_model, self.max_tokens, self.temperature = chat_model, max_tokens, temperature

    def judge(self, conversations: list[list[dict]]) -> list[str]:
        return self.chat_model.chat(conversations, self.max_tokens, self.temperature)


class ChatEvidenceAnswerer:
    """`EvidenceAnswerer` over a chat model: R-Search's evidence prompt as one user message.

    prompt_template: a `str.format` template with `{evidence}` and `{question}` (double literal braces).
    The answer is the last complete `<answer>...</answer>` of the reply when the template mentions
    `<answer>` ("" when the reply has none), else the stripped reply.
    """

    def __init__(
        self,
        chat_model: ChatModel,
        prompt_template: str = RSEARCH_EVIDENCE_PROMPT,
        max_tokens: int = 512,
        temperature: float = 0.1,
        top_p: float = 0.9,
    ):
        fields = {name for _, name, _, _ in string.Formatter().parse(prompt_template) if name is not None}
        if fields != {"evidence", "question"}:
            raise ValueError(
                f"prompt_template must have the fields {{evidence}} and {{question}}, got {sorted(fields)}"
            )
        self.chat_model, self.prompt_template = chat_model, prompt_template
        self.max_tokens, self.temperature, self.top_p = max_tokens, temperature, top_p
        self.tagged = "<answer>" in prompt_template

    def prompt(self, question: str, evidence: str) -> str:
        return self.prompt_template.format(evidence=evidence, question=question).strip()

    def answer(self, questions: list[str], evidences: list[str]) -> list[str]:
        if len(questions) != len(evidences):
            raise ValueError(f"{len(questions)} questions but {len(evidences)} evidences")
        batch = [[{"role": "user", "content": self.prompt(q, e)}] for q, e in zip(questions, evidences)]
        replies = self.chat_model.chat(batch, self.max_tokens, self.temperature, self.top_p)
        if not self.tagged:
            return [r.strip() for r in replies]
        return [extract_answer(r) or "" for r in replies]


# --------------------------------------------------------------------------------------- from a config


def chat_model_from_config(mcfg) -> ChatModel:
    """A judge / evidence model from its config section: kind openai (base_url, model), local (path,
    tokenizer) or world (the synthetic world's rule-based judge and evidence reader)."""
    if mcfg.kind == "openai":
        return make_chat_model("openai", base_url=mcfg.base_url, model=mcfg.model)
    if mcfg.kind == "local":
        return make_chat_model(
            "local",
            path=mcfg.path,
            tokenizer=mcfg.tokenizer,
            cache_len=mcfg.cache_len,
            max_new_tokens=mcfg.max_new_tokens,
        )
    if mcfg.kind == "world":
        from jaxsearch.scoring.world_chat import WorldChatModel

        return WorldChatModel()
    raise ValueError(f"config: chat model kind {mcfg.kind!r}: expected 'openai', 'local' or 'world'")


def chat_judge(j) -> ChatJudge | None:
    """SOAR's judge (fabrication, and source consistency by a judge) from config.judge (a
    `config.ChatModelConfig`); None without one."""
    if j is None:
        return None
    return ChatJudge(chat_model_from_config(j), max_tokens=j.max_new_tokens, temperature=j.temperature)


def reward_fn_from_config(cfg) -> rewards_lib.WeightedSum:
    """config.reward.terms -> one reward function, its terms named as in the config. Names come from the
    rewards registry, plus the model-backed `evidence` (R-Search, needs config.evidence_model), `grounded`
    (SOAR's fabrication judge) and `source_consistency_judge` (SOAR's Table 7 check by a judge; both need
    config.judge)."""
    terms = []
    for name, weight in cfg.reward.terms:
        if name == "evidence":
            e = cfg.evidence_model
            if e is None:
                raise ValueError(
                    "config.reward.terms: 'evidence' needs config.evidence_model (kind openai, local or world)"
                )
            answerer = ChatEvidenceAnswerer(
                chat_model_from_config(e),
                max_tokens=e.max_new_tokens,
                temperature=e.temperature,
                top_p=e.top_p,
            )
            fn = rewards_lib.evidence_reward(answerer)
        elif name in ("grounded", "source_consistency_judge"):
            judge = chat_judge(cfg.judge)
            if judge is None:
                raise ValueError(
                    f"config.reward.terms: {name!r} needs config.judge (kind openai, local or world)"
                )
            make = (
                rewards_lib.fabrication_reward
                if name == "grounded"
                else rewards_lib.source_consistency_judge_reward
            )
            fn = make(judge)
        else:
            fn = rewards_lib.get_reward(name)
        terms.append((name, fn, float(weight)))
    return rewards_lib.WeightedSum(tuple(terms))
