"""The memory HTTP API that @mastra/client-js 1.47 calls: threads, their messages, status, saves.

Routes and shapes follow the client (``MastraClient.listMemoryThreads``, ``createMemoryThread``,
``getMemoryThread(...).get/update/delete/listMessages``, ``getMemoryStatus``, ``getMemoryConfig``,
``saveMessageToMemory``). Every route acts for ONE resource, the caller's: whose it is, the
thread of it a route names and the store's errors as answers are `api.memory`'s.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.service._auth import caller_of
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.memory import (
    DEFAULT_MESSAGES_PER_PAGE,
    DEFAULT_THREADS_PER_PAGE,
    MemoryNotFoundError,
    check_id,
    owned,
    scope,
    store_errors,
    thread_json,
    ui_message,
)
from procmesh_orchestrator.service.api.messages import db_message
from procmesh_orchestrator.service.api.results import dumps
from procmesh_orchestrator.store import MAX_PAGE, MemoryStore, Thread, label

ReadJson = Callable[[Request], Awaitable[Any]]


def _json(body: Any, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type="application/json")


def _int(name: str, raw: str | None, default: int, *, low: int, high: int) -> int:
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise BadRequestError(f"{name}: must be an integer from {low} to {high}, got {label(raw)}")
    return int(raw)


def _json_param(request: Request, name: str) -> Any:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise BadRequestError(f"{name}: must be JSON") from None


def _request_context(request: Request) -> dict[str, Any]:
    """The ``requestContext`` query parameter as client-js sends it: base64 of its JSON."""
    raw = request.query_params.get("requestContext")
    if not raw:
        return {}
    try:
        context = json.loads(base64.b64decode(raw, validate=True))
    except (ValueError, binascii.Error):
        raise BadRequestError("requestContext: must be base64 of a JSON object") from None
    if not isinstance(context, dict):
        raise BadRequestError("requestContext: must be base64 of a JSON object")
    return context


class MemoryRoutes:
    """The ``/api/memory/*`` routes; `read_json` reads a body within the service's limits."""

    def __init__(self, core: ServiceCore, read_json: ReadJson) -> None:
        self.core = core
        self._read_json = read_json

    def routes(self) -> list[Route]:
        """The routes, in the order the route table takes them."""
        return [
            Route("/api/memory/status", self.status, methods=["GET"]),
            Route("/api/memory/config", self.config, methods=["GET"]),
            Route("/api/memory/threads", self.list_threads, methods=["GET"]),
            Route("/api/memory/threads", self.create_thread, methods=["POST"]),
            Route("/api/memory/threads/{thread_id}", self.get_thread, methods=["GET"]),
            Route("/api/memory/threads/{thread_id}", self.update_thread, methods=["PATCH"]),
            Route("/api/memory/threads/{thread_id}", self.delete_thread, methods=["DELETE"]),
            Route("/api/memory/threads/{thread_id}/messages", self.list_messages, methods=["GET"]),
            Route("/api/memory/save-messages", self.save_messages, methods=["POST"]),
        ]

    def _scope(
        self, request: Request, *, claimed: Any = None, agent_required: bool = False
    ) -> tuple[MemoryStore, str]:
        """The store and the caller's resource (claims from the query and, for writes, the body)."""
        return scope(
            self.core,
            caller_of(request),
            agent_id=request.query_params.get("agentId"),
            claimed=claimed if claimed is not None else request.query_params.get("resourceId"),
            request_context=lambda: _request_context(request),
            agent_required=agent_required,
        )

    async def _body(self, request: Request) -> dict[str, Any]:
        body = await self._read_json(request)
        if not isinstance(body, dict):
            raise BadRequestError("the body must be a JSON object")
        return body

    async def status(self, request: Request) -> Response:
        agent_id = request.query_params.get("agentId")
        if not agent_id:
            raise BadRequestError("agentId: required")
        return _json({"result": self.core.agent(agent_id).spec.memory is not None, "memoryType": "local"})

    async def config(self, request: Request) -> Response:
        agent_id = request.query_params.get("agentId")
        if not agent_id:
            raise BadRequestError("agentId: required")
        memory = self.core.agent(agent_id).spec.memory
        if memory is None:
            raise MemoryNotFoundError(f"agent {label(agent_id)} has no memory")
        return _json({"memoryType": "local", "config": {"lastMessages": memory.last_messages}})

    async def list_threads(self, request: Request) -> Response:
        store, resource = self._scope(request)
        query = request.query_params
        page = _int("page", query.get("page"), 0, low=0, high=MAX_PAGE)
        per_page = _int("perPage", query.get("perPage"), DEFAULT_THREADS_PER_PAGE, low=1, high=MAX_PAGE)
        field = query.get("orderBy[field]") or "createdAt"
        direction = (query.get("orderBy[direction]") or "DESC").upper()
        if field not in ("createdAt", "updatedAt") or direction not in ("ASC", "DESC"):
            raise BadRequestError("orderBy: field createdAt or updatedAt, direction ASC or DESC")
        metadata = _json_param(request, "metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequestError("metadata: must be a JSON object")
        with store_errors(store, "listing threads"):
            # A resource's threads, at most MAX_PAGE of them, are ordered and paged here: the store's
            # contract pages by recency only, and the reference server also filters by metadata.
            threads = await store.list_threads(resource, limit=MAX_PAGE)
        if metadata:
            threads = [t for t in threads if all(t.metadata.get(k) == v for k, v in metadata.items())]
        key = "created_at" if field == "createdAt" else "updated_at"
        threads.sort(key=lambda t: getattr(t, key), reverse=direction == "DESC")
        shown = threads[page * per_page : (page + 1) * per_page]
        return _json(
            {
                "threads": [thread_json(t) for t in shown],
                "total": len(threads),
                "page": page,
                "perPage": per_page,
                "hasMore": (page + 1) * per_page < len(threads),
            }
        )

    async def create_thread(self, request: Request) -> Response:
        body = await self._body(request)
        store, resource = self._scope(request, claimed=body.get("resourceId"), agent_required=True)
        thread_id = body.get("threadId") or str(uuid.uuid4())
        title, metadata = body.get("title") or "", body.get("metadata") or {}
        with store_errors(store, "creating the thread"):
            thread = await store.create_thread(
                Thread(
                    id=check_id("threadId", thread_id), resource_id=resource, title=title, metadata=metadata
                )
            )
        return _json(thread_json(thread))

    async def get_thread(self, request: Request) -> Response:
        store, resource = self._scope(request)
        return _json(thread_json(await owned(store, request.path_params["thread_id"], resource)))

    async def update_thread(self, request: Request) -> Response:
        body = await self._body(request)
        store, resource = self._scope(request, claimed=body.get("resourceId"), agent_required=True)
        thread_id = check_id("threadId", request.path_params["thread_id"])
        with store_errors(store, "updating the thread", thread_id):
            # One statement, on the caller's resource's thread only (none: 404).
            updated = await store.update_thread(
                thread_id, resource, title=body.get("title"), metadata=body.get("metadata")
            )
        return _json(thread_json(updated))

    async def delete_thread(self, request: Request) -> Response:
        store, resource = self._scope(request, agent_required=True)
        thread = await owned(store, request.path_params["thread_id"], resource)
        with store_errors(store, "deleting the thread", thread.id):
            await store.delete_thread(thread.id, resource)
        return _json({"result": "Thread deleted"})

    async def list_messages(self, request: Request) -> Response:
        store, resource = self._scope(request)
        query = request.query_params
        page = _int("page", query.get("page"), 0, low=0, high=2**31)
        all_pages = query.get("perPage") == "false"
        per_page = (
            0
            if all_pages
            else _int("perPage", query.get("perPage"), DEFAULT_MESSAGES_PER_PAGE, low=1, high=MAX_PAGE)
        )
        order = _json_param(request, "orderBy") or {}
        direction = str(order.get("direction", "ASC")).upper() if isinstance(order, dict) else ""
        if direction not in ("ASC", "DESC") or (
            isinstance(order, dict) and order.get("field", "createdAt") != "createdAt"
        ):
            raise BadRequestError('orderBy: {"field": "createdAt", "direction": "ASC" or "DESC"}')
        if _json_param(request, "include") is not None:
            raise BadRequestError("include: not supported by this server (page through the thread instead)")
        filters = _json_param(request, "filter") or {}
        if not isinstance(filters, dict) or set(filters) - {"roles"}:
            raise BadRequestError('filter: only {"roles": [...]} is supported by this server')
        roles = filters.get("roles")
        # Persisted signals stay hidden from default recall, as in the run's UI messages.
        signals = query.get("includeSystemReminders") == "true"
        thread = await owned(store, request.path_params["thread_id"], resource)
        with store_errors(store, "reading the messages", thread.id):
            messages = await store.messages(thread.id, resource, include_signals=signals)
        if roles:
            messages = [m for m in messages if m.get("role") in roles]
        if direction == "DESC":
            messages.reverse()
        total = len(messages)
        shown = messages if all_pages else messages[page * per_page : (page + 1) * per_page]
        return _json(
            {
                "messages": shown,
                "uiMessages": [ui_message(m) for m in shown],
                "total": total,
                "page": page,
                "perPage": False if all_pages else per_page,
                "hasMore": not all_pages and (page + 1) * per_page < total,
            }
        )

    async def save_messages(self, request: Request) -> Response:
        body = await self._body(request)
        items = body.get("messages")
        if not isinstance(items, list) or not items:
            raise BadRequestError("messages: a non-empty list of messages, each with its threadId")
        claims = {m.get("resourceId") for m in items if isinstance(m, dict) and m.get("resourceId")}
        if len(claims) > 1:
            raise BadRequestError("messages: all must belong to one resource")
        store, resource = self._scope(request, claimed=next(iter(claims), None), agent_required=True)
        turns: dict[str, list[dict[str, Any]]] = {}
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise BadRequestError(f"messages.{i}: must be an object")
            thread_id = check_id(f"messages.{i}.threadId", item.get("threadId"))
            message = db_message(item, f"messages.{i}")
            if item.get("id"):  # the caller's id makes a retried save replace, not duplicate
                message["id"] = check_id(f"messages.{i}.id", item["id"])
            if isinstance(item.get("createdAt"), str):
                message["createdAt"] = item["createdAt"]
            turns.setdefault(thread_id, []).append(message)
        saved: list[dict[str, Any]] = []
        for thread_id, messages in turns.items():
            # one transaction per thread: all of a thread's messages or none of them
            with store_errors(store, "saving the messages", thread_id):
                await store.save_turn(thread_id, resource, messages)
            saved += [{**m, "threadId": thread_id, "resourceId": resource} for m in messages]
        return _json({"messages": saved})
