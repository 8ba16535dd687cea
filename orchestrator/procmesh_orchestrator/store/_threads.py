"""Threads and messages in both stores: the checks, encodings and SQL they share."""

from __future__ import annotations

from typing import Any

from procmesh_orchestrator.errors import InvalidMemoryInputError
from procmesh_orchestrator.store._checks import check_count, check_id, encode_json, label
from procmesh_orchestrator.store.threads import Message

MAX_TITLE_CHARS = 1024
SIGNAL_ROLE = "signal"


def thread_key(store: str, thread_id: object, resource_id: object) -> tuple[str, str]:
    """A thread's key, ``(resource_id, thread_id)``: thread ids are scoped by resource. Both ids
    are checked (the thread's first)."""
    thread = check_id(store, "thread", thread_id)
    return check_id(store, "resource", resource_id), thread


def encode_turn(
    store: str, thread_id: str, resource_id: str, messages: object, max_bytes: int
) -> list[tuple[str, str, str]]:
    """The turn as ``(id, role, body)`` rows, every message checked before any is written."""
    if not isinstance(messages, list):
        raise InvalidMemoryInputError(
            f"memory store {store}: thread {label(thread_id)}: a turn is a list of messages, "
            f"not {type(messages).__name__}"
        )
    rows = []
    for index, message in enumerate(messages):
        where = f"thread {label(thread_id)}: message {index}"
        if not isinstance(message, dict):
            raise InvalidMemoryInputError(
                f"memory store {store}: {where} must be an object, not {type(message).__name__}"
            )
        message_id = check_id(store, f"{where}:", message.get("id"))
        role = message.get("role")
        if not isinstance(role, str) or not role or len(role) > 64:
            raise InvalidMemoryInputError(f"memory store {store}: {where} has no valid role: {label(role)}")
        stored: Message = {**message, "threadId": thread_id, "resourceId": resource_id}
        rows.append((message_id, role, encode_json(store, where, stored, max_bytes)))
    return rows


def check_thread_fields(store: str, title: object, metadata: object, max_bytes: int) -> tuple[str, str]:
    """A thread's title and metadata (as JSON text), checked."""
    if not isinstance(title, str) or len(title) > MAX_TITLE_CHARS:
        raise InvalidMemoryInputError(
            f"memory store {store}: a thread title must be a string of at most {MAX_TITLE_CHARS} characters"
        )
    if not isinstance(metadata, dict):
        raise InvalidMemoryInputError(
            f"memory store {store}: thread metadata must be an object, not {type(metadata).__name__}"
        )
    return title, encode_json(store, "thread metadata", metadata, max_bytes)


def messages_query(
    store: str, thread_id: str, resource_id: str, last: int | None, include_signals: bool, placeholder: str
) -> tuple[str, tuple[Any, ...]]:
    """The SQL and arguments that read a resource's thread's messages, oldest first (all, or the
    `last` N), in one statement filtered on the resource: another resource's thread of the same id
    is never read. The backends differ only in their placeholder (``?`` or ``%s``)."""
    p = placeholder
    where = f"resource_id = {p} AND thread_id = {p}"
    args: tuple[Any, ...] = (resource_id, thread_id)
    if not include_signals:
        where, args = f"{where} AND role <> {p}", (*args, SIGNAL_ROLE)
    if last is None:
        return f"SELECT body FROM messages WHERE {where} ORDER BY seq", args
    args = (*args, check_count(store, "last", last, low=0, high=2**62))
    sql = (
        f"SELECT body FROM (SELECT seq, body FROM messages WHERE {where} "
        f"ORDER BY seq DESC LIMIT {p}) AS window_ ORDER BY seq"
    )
    return sql, args
