"""The memory HTTP API that @mastra/client-js 1.47 calls: threads, their messages, status, saves.

Routes and shapes follow the client (``MastraClient.listMemoryThreads``, ``createMemoryThread``,
``getMemoryThread(...).get/update/delete/listMessages/deleteMessages/clone``, ``getMemoryStatus``,
``getMemoryConfig``, ``saveMessageToMemory``). Every route acts for ONE resource, the caller's:
whose it is, the thread of it a route names and the store's errors as answers are `api.memory`'s.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.run.framework.working_memory import working_memory_config
from procmesh_orchestrator.service._auth import caller_of
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.memory import (
    DEFAULT_MESSAGES_PER_PAGE,
    DEFAULT_THREADS_PER_PAGE,
    MemoryNotFoundError,
    check_id,
    every_thread,
    owned,
    scope,
    store_errors,
    thread_json,
    ui_message,
)
from procmesh_orchestrator.service.api.message_keys import Keys, count_ignored, ignored_labels
from procmesh_orchestrator.service.api.messages import db_message
from procmesh_orchestrator.service.api.results import dumps
from procmesh_orchestrator.service.http.bodies import (
    DuplicateKeyError,
    decode_json,
    query_context,
    refuse_unknown,
    route,
)
from procmesh_orchestrator.store import MAX_PAGE, MemoryStore, Thread, ThreadOrder, label

ReadJson = Callable[[Request], Awaitable[Any]]

_SCOPE = ("agentId", "resourceId", "requestContext")
"""The query every memory route takes: the agent whose memory it is, the resource claimed and the
request context (`scope`); any other parameter is a 400 naming it (`takes_query`)."""
_THREADS_QUERY = ("page", "perPage", "orderBy[field]", "orderBy[direction]", "metadata")
_MESSAGES_QUERY = ("page", "perPage", "orderBy", "filter", "include", "includeSystemReminders")


def _json(body: Any, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type="application/json")


def _int(name: str, raw: str | None, default: int, *, low: int, high: int) -> int:
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:  # '²' isdigit, not int
        raise BadRequestError(f"{name}: must be an integer from {low} to {high}, got {label(raw)}")
    return int(raw)


def _flag(raw: str | None, name: str) -> bool:
    """A boolean query parameter as client-js writes it (``true`` / ``false``); any other value is
    a 400 naming it, never read as false."""
    if raw not in (None, "", "true", "false"):
        raise BadRequestError(f"{name}: must be true or false, got {label(raw)}")
    return raw == "true"


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: a boolean is never a number (Python's ``True == 1`` is not JSON's),
    numbers by value (``1`` and ``1.0``), objects and arrays member by member. A listing by
    metadata matches each key so (a key the thread lacks matches nothing, ``null`` included)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_json, a, b))
    return not isinstance(b, (dict, list)) and bool(a == b)


def _json_param(request: Request, name: str) -> Any:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        return decode_json(raw)
    except DuplicateKeyError as exc:
        raise BadRequestError(f"{name}: {exc}") from None
    except ValueError:
        raise BadRequestError(f"{name}: must be JSON") from None


class MemoryRoutes:
    """The ``/api/memory/*`` routes; `read_json` reads a body within the service's limits."""

    def __init__(self, core: ServiceCore, read_json: ReadJson) -> None:
        self.core = core
        self._read_json = read_json

    def routes(self) -> list[Route]:
        """The routes, in the order the route table takes them."""
        return [
            route("/api/memory/status", self.status, "GET", *_SCOPE, "threadId"),
            route("/api/memory/config", self.config, "GET", "agentId", "requestContext"),
            route("/api/memory/threads", self.list_threads, "GET", *_SCOPE, *_THREADS_QUERY),
            route("/api/memory/threads", self.create_thread, "POST", *_SCOPE),
            route("/api/memory/threads/{thread_id}", self.get_thread, "GET", *_SCOPE),
            route("/api/memory/threads/{thread_id}", self.update_thread, "PATCH", *_SCOPE),
            route("/api/memory/threads/{thread_id}", self.delete_thread, "DELETE", *_SCOPE),
            route(
                "/api/memory/threads/{thread_id}/messages",
                self.list_messages,
                "GET",
                *_SCOPE,
                *_MESSAGES_QUERY,
            ),
            route("/api/memory/save-messages", self.save_messages, "POST", *_SCOPE),
            route("/api/memory/messages/delete", self.delete_messages, "POST", *_SCOPE),
            route("/api/memory/threads/{thread_id}/clone", self.clone_thread, "POST", *_SCOPE),
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
            request_context=lambda: query_context(request),
            agent_required=agent_required,
        )

    async def _body(self, request: Request, allowed: Collection[str], hint: str = "") -> dict[str, Any]:
        """The body as a JSON object of the `allowed` keys only (a 400 names any other), and the
        copies of the query's ``agentId`` and ``requestContext`` that @mastra/client-js puts in
        some bodies (``createMemoryThread``, ``saveMessageToMemory``: ``body: params``) checked
        against the query's: the query's are the ones used, so a body's that differs is a 400
        rather than ignored."""
        body = await self._read_json(request)
        if not isinstance(body, dict):
            raise BadRequestError("the body must be a JSON object")
        refuse_unknown(body, allowed, hint)
        if "agentId" in body and body["agentId"] != request.query_params.get("agentId"):
            raise BadRequestError("agentId: the body's differs from the query's agentId (the one used)")
        if "requestContext" in body and (body["requestContext"] or {}) != query_context(request):
            raise BadRequestError(
                "requestContext: the body's differs from the query's (base64 JSON), the one used"
            )
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
        config: dict[str, Any] = {"lastMessages": memory.last_messages, "readOnly": memory.read_only}
        if memory.last_messages is None:  # a token budget without a window: the reference omits it
            del config["lastMessages"]
        if (budget := memory.message_history) is not None:
            config["messageHistory"] = budget.as_json()
        working = memory.working_memory
        config["workingMemory"] = {"enabled": False} if working is None else working_memory_config(working)
        return _json({"memoryType": "local", "config": config})

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
        key: ThreadOrder = "created_at" if field == "createdAt" else "updated_at"
        descending = direction == "DESC"
        if metadata:
            # The store cannot match metadata: every thread of the resource is read and filtered
            # here (the reference server filters too), then ordered and paged.
            with store_errors(store, "listing threads"):
                threads = await every_thread(store, resource)
            threads = [
                t
                for t in threads
                if all(k in t.metadata and same_json(t.metadata[k], v) for k, v in metadata.items())
            ]
            threads.sort(key=lambda t: getattr(t, key), reverse=descending)
            total, shown = len(threads), threads[page * per_page : (page + 1) * per_page]
        else:  # ordered, paged and counted by the store: one page read, whatever the resource holds
            with store_errors(store, "listing threads"):
                total = await store.count_threads(resource)
                shown = await store.list_threads(
                    resource, limit=per_page, offset=page * per_page, order_by=key, descending=descending
                )
        return _json(
            {
                "threads": [thread_json(t) for t in shown],
                "total": total,
                "page": page,
                "perPage": per_page,
                "hasMore": (page + 1) * per_page < total,
            }
        )

    async def create_thread(self, request: Request) -> Response:
        body = await self._body(request, _THREAD_KEYS | {"threadId", *_ECHOES})
        store, resource = self._scope(request, claimed=body.get("resourceId"), agent_required=True)
        thread_id = body.get("threadId") or str(uuid.uuid4())
        title, metadata = _title(body) or "", _metadata(body) or {}
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
        body = await self._body(request, _THREAD_KEYS | set(_ECHOES))
        store, resource = self._scope(request, claimed=body.get("resourceId"), agent_required=True)
        thread_id = check_id("threadId", request.path_params["thread_id"])
        title, metadata = _title(body), _metadata(body)
        with store_errors(store, "updating the thread", thread_id):
            # One statement, on the caller's resource's thread only (none: 404).
            updated = await store.update_thread(thread_id, resource, title=title, metadata=metadata)
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
        roles = _roles(filters.get("roles"))
        # Persisted signals stay hidden from default recall, as in the run's UI messages.
        signals = _flag(query.get("includeSystemReminders"), "includeSystemReminders")
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
        body = await self._body(request, {"messages", *_ECHOES})
        items = body.get("messages")
        if not isinstance(items, list) or not items:
            raise BadRequestError("messages: a non-empty list of messages, each with its threadId")
        claims = {m.get("resourceId") for m in items if isinstance(m, dict) and m.get("resourceId")}
        if len(claims) > 1:
            raise BadRequestError("messages: all must belong to one resource")
        store, resource = self._scope(request, claimed=next(iter(claims), None), agent_required=True)
        turns: dict[str, list[dict[str, Any]]] = {}
        ignored: list[tuple[Keys, str]] = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise BadRequestError(f"messages.{i}: must be an object")
            thread_id = check_id(f"messages.{i}.threadId", item.get("threadId"))
            message = db_message(item, f"messages.{i}", ignored)
            if item.get("id"):  # the caller's id makes a retried save replace, not duplicate
                message["id"] = check_id(f"messages.{i}.id", item["id"])
            if isinstance(item.get("createdAt"), str):
                message["createdAt"] = item["createdAt"]
            turns.setdefault(thread_id, []).append(message)
        count_ignored(self.core.metrics, "a memory save's", ignored_labels(ignored))
        saved: list[dict[str, Any]] = []
        for thread_id, messages in turns.items():
            # one transaction per thread: all of a thread's messages or none of them
            with store_errors(store, "saving the messages", thread_id):
                await store.save_turn(thread_id, resource, messages)
            saved += [{**m, "threadId": thread_id, "resourceId": resource} for m in messages]
        return _json({"messages": saved})

    async def delete_messages(self, request: Request) -> Response:
        """``{messageIds}``: ids, ``{id}`` objects, or one of either; the caller's resource's only."""
        body = await self._body(request, {"messageIds", *_ECHOES})
        raw = body.get("messageIds")
        if raw is None:
            raise BadRequestError("messageIds is required")
        items = raw if isinstance(raw, list) else [raw]
        ids = [
            check_id(f"messageIds.{i}", m.get("id") if isinstance(m, dict) else m)
            for i, m in enumerate(items)
        ]
        store, resource = self._scope(request, agent_required=True)
        with store_errors(store, "deleting messages"):
            await store.delete_messages(resource, ids)
        count = len(items)
        return _json(
            {"success": True, "message": f"{count} message{'' if count == 1 else 's'} deleted successfully"}
        )

    async def clone_thread(self, request: Request) -> Response:
        """The reference's ``cloneThread``: a new thread of the caller's resource with copies of the
        source's messages (new ids; ``options.messageLimit`` keeps the last N, ``messageFilter``
        by ``messageIds``, ``startDate``, ``endDate``), ``metadata.clone`` naming the source, and a
        thread-scoped working memory copied. ``{thread, clonedMessages, messageIdMap}``."""
        body = await self._body(request, {"newThreadId", *_THREAD_KEYS, "options", *_ECHOES})
        store, resource = self._scope(request, claimed=body.get("resourceId"), agent_required=True)
        source = await owned(store, request.path_params["thread_id"], resource)
        new_id = check_id("newThreadId", body.get("newThreadId") or str(uuid.uuid4()))
        with store_errors(store, "cloning the thread", source.id):
            if await store.get_thread(new_id, resource) is not None:
                raise BadRequestError(f"Thread with id {label(new_id)} already exists")
            messages = _cloned(await store.messages(source.id, resource), body.get("options"))
            id_map = {m["id"]: str(uuid.uuid4()) for m in messages}
            copies = [{**m, "id": id_map[m["id"]]} for m in messages]
            clone: dict[str, Any] = {"sourceThreadId": source.id, "clonedAt": _now()}
            if messages:
                clone["lastMessageId"] = messages[-1]["id"]
            metadata = _metadata(body) or {}
            title = _title(body) or (f"Clone of {source.title}" if source.title else "")
            thread = await store.create_thread(
                Thread(id=new_id, resource_id=resource, title=title, metadata={**metadata, "clone": clone})
            )
            try:
                if copies:
                    await store.save_turn(new_id, resource, copies)
                await _copy_thread_working_memory(self.core, request, store, resource, source.id, new_id)
            except BaseException:
                await store.delete_thread(new_id, resource)  # no half clone is left behind
                raise
            cloned = await store.messages(new_id, resource)
        return _json({"thread": thread_json(thread), "clonedMessages": cloned, "messageIdMap": id_map})


_THREAD_KEYS = frozenset({"resourceId", "title", "metadata"})
_ECHOES = ("agentId", "requestContext")
"""The query's keys @mastra/client-js may copy into a body (`MemoryRoutes._body` checks them)."""


_ROLES = ("user", "assistant", "system", "tool", "signal")
"""The roles a stored message has: what ``filter.roles`` may name."""


def _roles(value: Any) -> list[str] | None:
    """``filter.roles`` as a list of roles: a role no message has (a typo) is a 400 naming it,
    never a filter that silently matches nothing."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise BadRequestError(f"filter.roles: a list of roles ({', '.join(_ROLES)})")
    if unknown := sorted(set(value) - set(_ROLES)):
        names = ", ".join(label(r) for r in unknown)
        raise BadRequestError(f"filter.roles: no message has the role {names} (roles: {', '.join(_ROLES)})")
    return value


def _title(body: dict[str, Any]) -> str | None:
    title = body.get("title")
    if title is not None and not isinstance(title, str):
        raise BadRequestError("title: must be a string")
    return title


def _metadata(body: dict[str, Any]) -> dict[str, Any] | None:
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequestError("metadata: must be an object")
    return metadata


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cloned(messages: list[dict[str, Any]], options: Any) -> list[dict[str, Any]]:
    """The source's messages a clone copies (the reference's ``messageFilter`` and ``messageLimit``)."""
    if options is None:
        return messages
    if not isinstance(options, dict) or set(options) - {"messageLimit", "messageFilter"}:
        raise BadRequestError("options: {messageLimit?, messageFilter?: {messageIds?, startDate?, endDate?}}")
    found = options.get("messageFilter") or {}
    if not isinstance(found, dict) or set(found) - {"messageIds", "startDate", "endDate"}:
        raise BadRequestError("options.messageFilter: {messageIds?, startDate?, endDate?}")
    if found.get("messageIds"):
        wanted = set(found["messageIds"])
        messages = [m for m in messages if m["id"] in wanted]
    if found.get("startDate"):
        start = _instant(found["startDate"], "options.messageFilter.startDate")
        messages = [m for m in messages if _instant(m.get("createdAt"), "createdAt") >= start]
    if found.get("endDate"):
        end = _instant(found["endDate"], "options.messageFilter.endDate")
        messages = [m for m in messages if _instant(m.get("createdAt"), "createdAt") <= end]
    limit = options.get("messageLimit")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise BadRequestError("options.messageLimit: a whole number")
    return messages[-limit:] if limit else messages


def _instant(value: Any, name: str) -> datetime:
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise BadRequestError(f"{name}: an ISO 8601 date") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


async def _copy_thread_working_memory(
    core: ServiceCore, request: Request, store: MemoryStore, resource: str, source: str, target: str
) -> None:
    """A thread-scoped working memory goes with its thread's clone (a resource's stays shared)."""
    memory = core.agent(request.query_params["agentId"]).spec.memory
    settings = memory.working_memory if memory is not None else None
    if settings is None or settings.scope != "thread":
        return
    stored = await store.get_working_memory(resource, source)
    if stored is not None:
        await store.update_working_memory(resource, target, lambda old: stored.text)
