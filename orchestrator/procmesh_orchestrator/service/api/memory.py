"""Memory as the API serves it, whatever carries the request: whose memory a request may touch
(`scope`: ONE resource, the caller's), a thread of that resource (`owned`), the store's errors as
the API's answers, and threads and messages in the reference server's shapes.

The resource is the one the caller's API key is bound to, or, for an operator key (or any caller
when no key is configured), the one the request names (``resourceId``, required then: thread ids
are scoped by resource, so a thread id alone names no thread); never the request context. Another
resource's thread of the same id is another thread, so it is answered exactly like a thread that
does not exist (404): a caller learns nothing about other resources' threads, not even that they
exist. A store error reaches the client without the store's address or the driver's text
(`client_message`); the log has the whole error.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc

from procmesh_orchestrator.errors import (
    InvalidMemoryInputError,
    MemoryStoreError,
    StoreUnavailableError,
    ThreadNotFoundError,
)
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError, ServiceError
from procmesh_orchestrator.store import MAX_ID_CHARS, MAX_PAGE, MemoryStore, Thread, client_message, label

if TYPE_CHECKING:
    from procmesh_orchestrator.service.api.core import ServiceCore

log = logging.getLogger(__name__)

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
    grpc_code = grpc.StatusCode.NOT_FOUND


class MemoryForbiddenError(ServiceError):
    """The server has no way to know the caller's resource, so it shows no memory at all."""

    http_status = 403
    grpc_code = grpc.StatusCode.PERMISSION_DENIED


class MemoryStoreDownError(ServiceError):
    """The store cannot be reached now; retrying later may work."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE


def check_id(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS or not value.isprintable():
        raise BadRequestError(f"{name}: must be a printable id of 1 to {MAX_ID_CHARS} characters")
    return value


@contextlib.contextmanager
def store_errors(store: MemoryStore, doing: str, thread_id: str = "") -> Iterator[None]:
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


@contextlib.contextmanager
def input_errors() -> Iterator[None]:
    """A refused input that names itself (`InvalidMemoryInputError` raised before the store is
    reached: no store address in it) as a 400 with its own words."""
    try:
        yield
    except InvalidMemoryInputError as exc:
        raise BadRequestError(str(exc)) from None


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


def scope(
    service: ServiceCore,
    caller: Caller,
    *,
    agent_id: str | None,
    claimed: Any,
    request_context: Callable[[], dict[str, Any]],
    agent_required: bool = False,
) -> tuple[MemoryStore, str]:
    """The store and the caller's resource: the key's, or for an operator the one `claimed`
    (``resourceId``); `agent_id`, when given, must have memory. `request_context` gives the
    request's context, checked to hold no reserved key (and, for an operator, only keys it may send)."""
    if agent_id:
        memory = service.agent(agent_id).spec.memory
        if memory is None:
            raise MemoryNotFoundError(f"agent {label(agent_id)} has no memory")
    elif agent_required:
        raise BadRequestError("agentId: required (the agent whose memory this is)")
    store = service.app.store
    if store is None:
        raise MemoryNotFoundError("no agent of this server has memory")
    claim = claimed
    if claim is not None and claim != "":
        claim = check_id("resourceId", claim)
    if caller.resource is not None:
        if claim and claim != caller.resource:
            raise MemoryNotFoundError(f"resource {label(claim)} is not this API key's")
        # The key names the resource and the memory routes read no other context key; a reserved
        # one is still refused, naming it, as on every route: it never comes from a caller.
        service.trust.check_reserved(request_context())
        return store, caller.resource
    if not caller.operator:  # a @gateway key never gets here (the HTTP boundary refuses it)
        raise MemoryForbiddenError("the memory API needs a key bound to a resource, or an operator key")
    # A reserved key (RESOURCE_ID_KEY among them) never comes from a caller: 400 naming it.
    service.trust.check(caller, request_context())
    if not claim:
        raise BadRequestError("resourceId: required (an operator key names the resource it acts for)")
    return store, str(claim)


async def owned(store: MemoryStore, thread_id: str, resource: str) -> Thread:
    """The caller's resource's thread of this id (404 when it has none, whoever else has one)."""
    thread_id = check_id("threadId", thread_id)
    with store_errors(store, "reading the thread", thread_id):
        thread = await store.get_thread(thread_id, resource)
    if thread is None:
        raise MemoryNotFoundError(f"no thread {label(thread_id)}")
    return thread


async def every_thread(store: MemoryStore, resource: str) -> list[Thread]:
    """Every thread of the resource, most recently updated first, read `MAX_PAGE` at a time (the
    most the store gives at once): a listing that counts, filters and pages them itself must see
    them all, never the first `MAX_PAGE` passed off as the whole (a wrong ``total``, the rest
    hidden). The store pages by offset in recency order, so a write between two reads shifts the
    rows: a thread seen twice is listed once, but one updated (moved above the rows read) or one
    deleted before the next read can make a thread go unlisted in this answer."""
    threads: dict[str, Thread] = {}
    offset = 0
    while True:
        page = await store.list_threads(resource, limit=MAX_PAGE, offset=offset)
        for thread in page:
            threads.setdefault(thread.id, thread)
        if len(page) < MAX_PAGE:
            return list(threads.values())
        offset += len(page)
