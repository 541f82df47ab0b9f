"""RSTool (seed 002 §1, §6): R-Search's evidence step offered as a search tool. `POST /v1/rstool` takes a
question, runs the served policy's whole reasoning-search episode (the rollout a chat request runs, batched
with them) and returns the evidence the policy distilled from what it retrieved, for a downstream model to
answer from ("costly reasoning-search interactions ... offloaded to local models", §1).

    request = parse_rstool_request(raw, model_name, defaults)   # a ChatRequest, or a RequestError
    reply = rstool_reply(model_name, question, summary, protocol, request_id, created)

Request: `{"model": M, "question": str}` and optionally `temperature`, `top_p`, `max_tokens` /
`max_completion_tokens`, `seed` (as for chat completions); any other field is a 400 naming it.

Reply (`object` "rstool.evidence"): `evidence`, the last evidence block the policy wrote outside the
observations, stripped (`protocol.parse_evidence`: `<evidence>`, or `<original_evidence>` under
rsearch_eval), null when it wrote none (R-Search's prompt omits the evidence when nothing was searched);
`reader_prompt`, that evidence and the question in R-Search's reader prompt (scripts/evidence.yaml PROMPT:
what its frozen reader answers from in training), one user message for a downstream model, null without
evidence; the policy's own `answer` and `finish_reason`; `search_agent` and `usage` as in a chat completion.

QingFei1/R-Search (commit ecba08d) ships no RSTool code; the paper names its input (a question) and output
(the evidence) only. Only a protocol whose prompt asks for evidence (`writes_evidence`) serves it.
"""

from __future__ import annotations

from jaxsearch.scoring.judge import RSEARCH_EVIDENCE_PROMPT
from jaxsearch.serving.chat_request import (
    ChatRequest,
    Defaults,
    RequestError,
    check_model,
    json_object,
    sampling_fields,
)
from jaxsearch.serving.replies import search_agent, usage

RSTOOL_PATH = "/v1/rstool"
FIELDS = ("model", "question", "temperature", "top_p", "max_tokens", "max_completion_tokens", "seed")


def check_protocol(protocol) -> None:
    """A 404 unless the served protocol writes evidence (rsearch, rsearch_eval)."""
    if not getattr(protocol, "writes_evidence", False):
        message = (
            f"POST {RSTOOL_PATH} serves an R-Search policy's evidence; this server's protocol "
            f"{getattr(protocol, 'name', '?')!r} writes none (serve one trained with protocol rsearch)"
        )
        raise RequestError(404, message, None, code="rstool_unavailable")


def parse_rstool_request(raw: bytes, model_name: str, defaults: Defaults = Defaults()) -> ChatRequest:
    """An RSTool body as the one-row `ChatRequest` the batcher runs; a RequestError names a bad field."""
    body = json_object(raw)
    check_model(body, model_name)
    for name in body:
        if name not in FIELDS:
            message = f"{name}: unknown field (RSTool takes: {', '.join(FIELDS)})"
            raise RequestError(400, message, name)
    question = body.get("question")
    if not isinstance(question, str):
        got = "nothing" if question is None else type(question).__name__
        raise RequestError(400, f"question: expected a string, got {got}", "question")
    if not question.strip():
        raise RequestError(400, "question: the question is empty", "question")
    temperature, top_p, max_tokens, seed = sampling_fields(body, defaults)
    return ChatRequest(
        question,
        question_field="question",
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        seed=seed,
    )


def rstool_reply(model: str, question: str, summary, protocol, request_id: str, created: int) -> dict:
    """The reply to an RSTool request for `question` from its row's `agent.requests.RowSummary`."""
    evidence = protocol.parse_evidence(summary.response)
    # as R-Search's evidence reward asks its reader (qa_f1.py evidence_eval: the stripped question, the
    # formatted prompt stripped; scoring.rewards.evidence_reward and judge.ChatEvidenceAnswerer.prompt)
    reader_prompt = None
    if evidence:
        reader_prompt = RSEARCH_EVIDENCE_PROMPT.format(evidence=evidence, question=question.strip()).strip()
    return {
        "id": request_id,
        "object": "rstool.evidence",
        "created": created,
        "model": model,
        "question": question,
        "evidence": evidence,
        "reader_prompt": reader_prompt,
        "answer": summary.answer,
        "finish_reason": summary.finish_reason,
        "search_agent": search_agent(summary),
        "usage": usage([summary]),
    }
