"""``GET /api/memory/search`` (client-js ``searchMemory``) in the reference server's shape:
``{results: [{id, role, content, createdAt, threadId, threadTitle, score?, context}], count,
query, searchScope, searchType}``.

With semantic recall configured it is the recall's search (`run.framework.recall.search_messages`:
the agent's embedder, ``topK`` and scope); without, the reference's text search: the messages whose
text holds the query, case-insensitively. Either way only the caller's resource is searched, its
one thread when a ``threadId`` is given and the scope is ``thread``, newest first, at most
``limit`` (20) results, each with up to two messages before and after it in its thread.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.run.framework.recall import message_text, search_messages
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service.api.memory import MemoryStoreDownError, every_thread, owned, store_errors
from procmesh_orchestrator.service.http.bodies import route
from procmesh_orchestrator.service.http.memory import _SCOPE, MemoryRoutes, _int, _json
from procmesh_orchestrator.store import MAX_PAGE, MemoryStore, Thread

log = logging.getLogger(__name__)
Message = dict[str, Any]
CONTEXT = 2
"""Messages before and after each result, as the reference's search shows them."""


class MemorySearchRoutes(MemoryRoutes):
    """``GET /api/memory/search``."""

    def routes(self) -> list[Route]:
        query = (*_SCOPE, "searchQuery", "threadId", "limit", "memoryConfig")
        return [route("/api/memory/search", self.search, "GET", *query)]

    async def search(self, request: Request) -> Response:
        query = request.query_params
        text = query.get("searchQuery") or ""
        if not text.strip():
            raise BadRequestError("searchQuery: required")
        if query.get("memoryConfig"):
            raise BadRequestError("memoryConfig: not taken per search (the agent's memory config applies)")
        limit = _int("limit", query.get("limit"), 20, low=1, high=MAX_PAGE)
        store, resource = self._scope(request, agent_required=True)
        memory = self.core.agent(query["agentId"]).spec.memory
        recall = memory.recall if memory is not None else None
        resource_scope = recall is not None and recall.config.scope == "resource"
        thread_id = query.get("threadId") or ""
        scope = "resource" if resource_scope or not thread_id else "thread"
        threads = (
            [await owned(store, thread_id, resource)]
            if scope == "thread"
            else await _threads(store, resource)
        )
        titles = {t.id: t.title or t.id for t in threads}
        with store_errors(store, "searching memory"):
            found = {t.id: await store.messages(t.id, resource, include_signals=False) for t in threads}
        hits: list[tuple[str, Message, float | None]]
        if recall is None:
            needle = text.lower()
            hits = [(t, m, None) for t, ms in found.items() for m in ms if needle in message_text(m).lower()]
        else:
            try:
                recalled = await search_messages(
                    recall, text, resource_id=resource, thread_id=thread_id if scope == "thread" else None
                )
            except APICallError as exc:
                log.error("memory search: the embedder failed: %s", exc)
                raise MemoryStoreDownError("searching memory: the embedder failed") from None
            by_id = {(t, m["id"]): m for t, ms in found.items() for m in ms}
            hits = [
                (h.thread_id, by_id[h.thread_id, h.message_id], h.score)
                for h in recalled.hits
                if (h.thread_id, h.message_id) in by_id
            ]
        results = [_result(thread, message, score, titles, found[thread]) for thread, message, score in hits]
        results.sort(key=lambda r: str(r["createdAt"]), reverse=True)
        results = results[:limit]
        return _json(
            {
                "results": results,
                "count": len(results),
                "query": text,
                "searchScope": scope,
                "searchType": "text" if recall is None else "semantic",
            }
        )


async def _threads(store: MemoryStore, resource: str) -> list[Thread]:
    with store_errors(store, "listing threads"):
        return await every_thread(store, resource)


def _result(
    thread: str, message: Message, score: float | None, titles: dict[str, str], around: list[Message]
) -> dict[str, Any]:
    at = next(i for i, m in enumerate(around) if m["id"] == message["id"])
    result: dict[str, Any] = {
        "id": message["id"],
        "role": message.get("role"),
        "content": message_text(message),
        "createdAt": message.get("createdAt"),
        "threadId": thread,
        "threadTitle": titles.get(thread, thread),
        "context": {
            "before": [_brief(m) for m in around[max(0, at - CONTEXT) : at]],
            "after": [_brief(m) for m in around[at + 1 : at + 1 + CONTEXT]],
        },
    }
    if score is not None:
        result["score"] = score
    return result


def _brief(message: Message) -> dict[str, Any]:
    return {k: message.get(k) for k in ("id", "role", "content", "createdAt")}
