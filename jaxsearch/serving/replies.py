"""OpenAI's reply objects for a served request, from its rows' `agent.requests.RowSummary`s and events.

completion(model, summaries, request_id, created)      # chat.completion (n choices)
chunk(model, request_id, created, choice, delta)       # one chat.completion.chunk of a stream
event_delta(event)                                     # a streamed engine event as delta.search_agent
usage(summaries)                                       # prompt / completion / total / retrieved tokens
"""

from __future__ import annotations


def _doc(doc) -> dict:
    return {"id": doc.id, "title": doc.title, "text": doc.text}


def search_agent(summary) -> dict:
    """A choice's `search_agent` field: turns, each search's query (as the engine parsed it from the policy
    segment that asked for it) and retrieved docs, EKA's initial docs, the whole response, cache truncation."""
    searches = [
        {"query": q, "docs": [_doc(d) for d in docs]} for q, docs in zip(summary.queries, summary.docs)
    ]
    return {
        "turns": summary.turns,
        "searches": searches,
        "initial_docs": [_doc(d) for d in summary.initial_docs],
        "response": summary.response,
        "truncated": summary.truncated,
    }


def usage(summaries) -> dict:
    """OpenAI's usage of a request's rows: the prompt once (the n choices share it), completion tokens = the
    tokens the policy sampled over all choices, total = their sum; `retrieved_tokens` (ours) = the
    observation and hint tokens appended to the choices' contexts, counted in neither."""
    prompt = summaries[0].prompt_tokens
    completion_tokens = sum(s.policy_tokens for s in summaries)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
        "retrieved_tokens": sum(s.retrieved_tokens for s in summaries),
    }


def completion(model: str, summaries, request_id: str, created: int) -> dict:
    """OpenAI's chat.completion of a request's rows (one choice each)."""
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": s.answer or ""},
            "finish_reason": s.finish_reason,
            "search_agent": search_agent(s),
        }
        for i, s in enumerate(summaries)
    ]
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(summaries),
    }


def chunk(
    model: str,
    request_id: str,
    created: int,
    choice: int | None,
    delta: dict | None = None,
    finish_reason=None,
    **extra,
) -> dict:
    """One `chat.completion.chunk`: choice `choice`'s delta (choice None: no choices, e.g. the usage chunk);
    `extra` goes beside the choice's fields (search_agent) or, without a choice, the chunk's (usage)."""
    body = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
    if choice is None:
        return {**body, "choices": [], **extra}
    return {
        **body,
        "choices": [{"index": choice, "delta": delta or {}, "finish_reason": finish_reason, **extra}],
    }


def event_delta(event) -> dict:
    """A streamed engine event as `delta.search_agent`: {"type": "policy" | "observation" | "hint", "text"}
    (the response's text as it is appended: these texts concatenate to `search_agent.response`) or
    {"type": "search", "query", "docs"} (a search's query and retrieved docs, before its observation)."""
    if event.kind == "search":
        return {"type": "search", "query": event.query, "docs": [_doc(d) for d in event.docs]}
    return {"type": event.kind, "text": event.text}
