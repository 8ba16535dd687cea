"""The memory HTTP API that @mastra/client-js 1.47 calls: threads, their messages, status, saves.

Routes and shapes follow the client (``MastraClient.listMemoryThreads``, ``createMemoryThread``,
``getMemoryThread(...).get/update/delete/listMessages``, ``getMemoryStatus``, ``getMemoryConfig``,
``saveMessageToMemory``). Every route acts for ONE resource, the caller's (`_Scope.resource`):
the resource its API key is bound to, or, for an operator key (or any caller when no key is
configured), the one the request names (``resourceId``, required then: thread ids are scoped by
resource, so a thread id alone names no thread); never the request context. Another resource's
thread of the same id is another thread, so it is answered exactly like a thread that does not
exist (404): a caller learns nothing about other resources' threads, not even that they exist. A
store error reaches the client without the store's address or the driver's text
(`client_message`); the log has the whole error.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.errors import (
    InvalidMemoryInputError,
    MemoryStoreError,
    StoreUnavailableError,
    ThreadNotFoundError,
)
from procmesh_orchestrator.service._auth import caller_of
from procmesh_orchestrator.service._errors import BadRequestError, ServiceError
from procmesh_orchestrator.service.api.messages import db_message
from procmesh_orchestrator.service.api.results import dumps
from procmesh_orchestrator.store import MAX_ID_CHARS, MAX_PAGE, MemoryStore, Thread, client_message, label

if TYPE_CHECKING:
    from procmesh_orchestrator.service.api.core import ServiceCore

log = logging.getLogger(__name__)
ReadJson = Callable[[Request], Awaitable[Any]]

RESOURCE_ID_KEY = "mastra__resourceId"
"""The reference's request-context key for whose memory a request is: reserved, never a caller's
(`_trust.RESERVED`: a request sending it is a 400)."""
DEFAULT_MESSAGES_PER_PAGE = 40
"""The reference server's page of messages when the client names none."""
DEFAULT_THREADS_PER_PAGE = 100
"""The reference server's page of threads (what the client assumes for an unpaged answer)."""


class MemoryNotFoundError(ServiceError):
    """No such thread, agent memory or resource for this caller (another resource's look the same)."""

    http_status = 404


class MemoryForbiddenError(ServiceError):
    """The server has no way to know the caller's resource, so it shows no memory at all."""

    http_status = 403


class MemoryStoreDownError(ServiceError):
    """The store cannot be reached now; retrying later may work."""

    http_status = 503


def _json(body: Any, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type="application/json")


def _check_id(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS or not value.isprintable():
        raise BadRequestError(f"{name}: must be a printable id of 1 to {MAX_ID_CHARS} characters")
    return value


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


@contextlib.contextmanager
def _store_errors(store: MemoryStore, doing: str, thread_id: str = "") -> Iterator[None]:
    """The store's errors as HTTP answers: 400 for refused input, 404 for a thread the caller's
    resource does not have, 503 for a store that is down, 500 for any other failure; what the
    client reads names the operation, never the store's address (that goes to the log)."""
    try:
        yield
    except InvalidMemoryInputError as exc:
        raise BadRequestError(client_message(exc, _name(store))) from None
    except ThreadNotFoundError:
        raise MemoryNotFoundError(f"no thread {label(thread_id)}") from None
    except MemoryStoreError as exc:
        log.error("memory API: %s failed: %s", doing, exc)
        kind = MemoryStoreDownError if isinstance(exc, StoreUnavailableError) else ServiceError
        raise kind(f"{doing}: {client_message(exc, _name(store))}") from None


def _name(store: MemoryStore) -> str:
    """How the store names itself in its errors."""
    return str(getattr(store, "name", "") or "")


def thread_json(thread: Thread) -> dict[str, Any]:
    """A thread as the reference server returns it (``StorageThreadType``)."""
    return {
        "id": thread.id,
        "title": thread.title,
        "resourceId": thread.resource_id,
        "createdAt": thread.created_at,
        "updatedAt": thread.updated_at,
        "metadata": thread.metadata,
    }


def ui_message(message: dict[str, Any]) -> dict[str, Any]:
    """A stored message as an AI SDK UI message (``{id, role, parts, metadata}``)."""
    content = message.get("content") or {}
    return {
        "id": message.get("id"),
        "role": message.get("role"),
        "parts": content.get("parts") or [],
        "metadata": {**(content.get("metadata") or {}), "createdAt": message.get("createdAt")},
    }


def memory_routes(service: ServiceCore, read_json: ReadJson) -> list[Route]:
    """The ``/api/memory/*`` routes of `service`; `read_json` reads a body within the service's limits."""

    def scope(
        request: Request, *, claimed: Any = None, agent_required: bool = False
    ) -> tuple[MemoryStore, str]:
        """The store and the caller's resource (claims from the query and, for writes, the body)."""
        agent_id = request.query_params.get("agentId")
        if agent_id:
            memory = service.agent(agent_id).spec.memory
            if memory is None:
                raise MemoryNotFoundError(f"agent {label(agent_id)} has no memory")
        elif agent_required:
            raise BadRequestError("agentId: required (the agent whose memory this is)")
        store = service.app.store
        if store is None:
            raise MemoryNotFoundError("no agent of this server has memory")
        claim = claimed if claimed is not None else request.query_params.get("resourceId")
        if claim is not None and claim != "":
            claim = _check_id("resourceId", claim)
        caller = caller_of(request)
        if caller.resource is not None:
            if claim and claim != caller.resource:
                raise MemoryNotFoundError(f"resource {label(claim)} is not this API key's")
            return store, caller.resource
        if not caller.operator:  # a @gateway key never gets here (the HTTP boundary refuses it)
            raise MemoryForbiddenError("the memory API needs a key bound to a resource, or an operator key")
        # A reserved key (RESOURCE_ID_KEY among them) never comes from a caller: 400 naming it.
        service.trust.check(caller, _request_context(request))
        if not claim:
            raise BadRequestError("resourceId: required (an operator key names the resource it acts for)")
        return store, str(claim)

    async def owned(store: MemoryStore, thread_id: str, resource: str) -> Thread:
        """The caller's resource's thread of this id (404 when it has none, whoever else has one)."""
        thread_id = _check_id("threadId", thread_id)
        with _store_errors(store, "reading the thread", thread_id):
            thread = await store.get_thread(thread_id, resource)
        if thread is None:
            raise MemoryNotFoundError(f"no thread {label(thread_id)}")
        return thread

    async def body_of(request: Request) -> dict[str, Any]:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise BadRequestError("the body must be a JSON object")
        return body

    async def status(request: Request) -> Response:
        agent_id = request.query_params.get("agentId")
        if not agent_id:
            raise BadRequestError("agentId: required")
        return _json({"result": service.agent(agent_id).spec.memory is not None, "memoryType": "local"})

    async def config(request: Request) -> Response:
        agent_id = request.query_params.get("agentId")
        if not agent_id:
            raise BadRequestError("agentId: required")
        memory = service.agent(agent_id).spec.memory
        if memory is None:
            raise MemoryNotFoundError(f"agent {label(agent_id)} has no memory")
        return _json({"memoryType": "local", "config": {"lastMessages": memory.last_messages}})

    async def list_threads(request: Request) -> Response:
        store, resource = scope(request)
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
        with _store_errors(store, "listing threads"):
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

    async def create_thread(request: Request) -> Response:
        body = await body_of(request)
        store, resource = scope(request, claimed=body.get("resourceId"), agent_required=True)
        thread_id = body.get("threadId") or str(uuid.uuid4())
        title, metadata = body.get("title") or "", body.get("metadata") or {}
        with _store_errors(store, "creating the thread"):
            thread = await store.create_thread(
                Thread(
                    id=_check_id("threadId", thread_id), resource_id=resource, title=title, metadata=metadata
                )
            )
        return _json(thread_json(thread))

    async def get_thread(request: Request) -> Response:
        store, resource = scope(request)
        return _json(thread_json(await owned(store, request.path_params["thread_id"], resource)))

    async def update_thread(request: Request) -> Response:
        body = await body_of(request)
        store, resource = scope(request, claimed=body.get("resourceId"), agent_required=True)
        thread_id = _check_id("threadId", request.path_params["thread_id"])
        with _store_errors(store, "updating the thread", thread_id):
            # One statement, on the caller's resource's thread only (none: 404).
            updated = await store.update_thread(
                thread_id, resource, title=body.get("title"), metadata=body.get("metadata")
            )
        return _json(thread_json(updated))

    async def delete_thread(request: Request) -> Response:
        store, resource = scope(request, agent_required=True)
        thread = await owned(store, request.path_params["thread_id"], resource)
        with _store_errors(store, "deleting the thread", thread.id):
            await store.delete_thread(thread.id, resource)
        return _json({"result": "Thread deleted"})

    async def list_messages(request: Request) -> Response:
        store, resource = scope(request)
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
        with _store_errors(store, "reading the messages", thread.id):
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

    async def save_messages(request: Request) -> Response:
        body = await body_of(request)
        items = body.get("messages")
        if not isinstance(items, list) or not items:
            raise BadRequestError("messages: a non-empty list of messages, each with its threadId")
        claims = {m.get("resourceId") for m in items if isinstance(m, dict) and m.get("resourceId")}
        if len(claims) > 1:
            raise BadRequestError("messages: all must belong to one resource")
        store, resource = scope(request, claimed=next(iter(claims), None), agent_required=True)
        turns: dict[str, list[dict[str, Any]]] = {}
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise BadRequestError(f"messages.{i}: must be an object")
            thread_id = _check_id(f"messages.{i}.threadId", item.get("threadId"))
            message = db_message(item, f"messages.{i}")
            if item.get("id"):  # the caller's id makes a retried save replace, not duplicate
                message["id"] = _check_id(f"messages.{i}.id", item["id"])
            if isinstance(item.get("createdAt"), str):
                message["createdAt"] = item["createdAt"]
            turns.setdefault(thread_id, []).append(message)
        saved: list[dict[str, Any]] = []
        for thread_id, messages in turns.items():
            # one transaction per thread: all of a thread's messages or none of them
            with _store_errors(store, "saving the messages", thread_id):
                await store.save_turn(thread_id, resource, messages)
            saved += [{**m, "threadId": thread_id, "resourceId": resource} for m in messages]
        return _json({"messages": saved})

    return [
        Route("/api/memory/status", status, methods=["GET"]),
        Route("/api/memory/config", config, methods=["GET"]),
        Route("/api/memory/threads", list_threads, methods=["GET"]),
        Route("/api/memory/threads", create_thread, methods=["POST"]),
        Route("/api/memory/threads/{thread_id}", get_thread, methods=["GET"]),
        Route("/api/memory/threads/{thread_id}", update_thread, methods=["PATCH"]),
        Route("/api/memory/threads/{thread_id}", delete_thread, methods=["DELETE"]),
        Route("/api/memory/threads/{thread_id}/messages", list_messages, methods=["GET"]),
        Route("/api/memory/save-messages", save_messages, methods=["POST"]),
    ]
